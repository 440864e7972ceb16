#!/usr/bin/env bash
# Builds the safetensors parser's libFuzzer target with clang (ASan + UBSan,
# every UBSan finding fatal) and fuzzes it for a time budget over the seed
# corpus tests/ckpt/fuzz/corpus/ (read-only; new inputs go to a temporary
# directory). Fails on any crash, sanitizer report, leak or timeout.
#
#   scripts/fuzz_safetensors.sh [SECONDS]      default: $ZT_FUZZ_SECONDS or 30
#
# Environment: ZT_FUZZ_BUILD_DIR (default build/fuzz): binary, log, crash
# artifacts; ZT_FUZZ_CXX: the clang++ to use; ZT_FUZZ_JOBS: parallel compiles.
# Exit status: 0 clean, 1 a finding (or a build failure), 77 skipped because
# clang++ or its libFuzzer/sanitizer runtimes (Debian: clang,
# libclang-rt-14-dev; scripts/install_deps.sh installs both) are missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-${ZT_FUZZ_SECONDS:-30}}"
out="${ZT_FUZZ_BUILD_DIR:-$root/build/fuzz}"
corpus="$root/tests/ckpt/fuzz/corpus"
dict="$root/tests/ckpt/fuzz/safetensors.dict"

cxx="${ZT_FUZZ_CXX:-}"
if [ -z "$cxx" ]; then
  for c in clang++ clang++-14 clang++-15 clang++-16 clang++-17 clang++-18 clang++-19; do
    if command -v "$c" >/dev/null 2>&1; then cxx="$c"; break; fi
  done
fi
if [ -z "$cxx" ]; then
  echo "SKIPPED: clang++ not found; the fuzz target needs clang's libFuzzer (install clang libclang-rt-14-dev, e.g. scripts/install_deps.sh)"
  exit 77
fi

mkdir -p "$out/obj" "$out/artifacts"
probe="$out/probe.cpp"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe" -o "$out/probe" >"$out/probe.log" 2>&1; then
  echo "SKIPPED: $cxx cannot link -fsanitize=fuzzer,address,undefined (libFuzzer/sanitizer runtimes missing: install libclang-rt-14-dev)"
  sed 's/^/  /' "$out/probe.log" | head -5
  exit 77
fi

bin="$out/safetensors_fuzz"
srcs=("$root"/src/core/*.cpp "$root"/src/ckpt/*.cpp "$root/tests/ckpt/fuzz/safetensors_fuzz.cpp")
stale=1
if [ -x "$bin" ] && [ -z "$(find "$root/src/core" "$root/src/ckpt" "$root/tests/ckpt/fuzz" "${BASH_SOURCE[0]}" \
                                 -newer "$bin" -print -quit)" ]; then
  stale=0
fi
if [ "$stale" = 1 ]; then
  echo "fuzz: building $bin with $cxx"
  # rng.cpp's OpenMP pragmas are ignored (no -fopenmp): the parser does not use them.
  cflags="-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
          -fno-sanitize-recover=all -Wno-unknown-pragmas -I$root/src"
  rm -f "$out"/obj/*.o
  export cxx cflags out
  printf '%s\0' "${srcs[@]}" | xargs -0 -P "${ZT_FUZZ_JOBS:-2}" -n 1 sh -c \
    'exec $cxx $cflags -c "$1" -o "$out/obj/$(basename "$(dirname "$1")")_$(basename "$1").o"' sh
  "$cxx" -fsanitize=fuzzer,address,undefined "$out"/obj/*.o -o "$bin.tmp"
  mv "$bin.tmp" "$bin"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log="$out/fuzz.log"
echo "fuzz: $bin for ${seconds}s over $corpus (log: $log)"
set +e
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  "$bin" "$work" "$corpus" -dict="$dict" -max_total_time="$seconds" -max_len=8192 -timeout=10 \
  -rss_limit_mb=2048 -error_exitcode=1 -timeout_exitcode=1 -artifact_prefix="$out/artifacts/" \
  -print_final_stats=1 >"$log" 2>&1
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  tail -n 60 "$log"
  echo "FAIL: the fuzzer found a problem (exit $rc); reproduce with: $bin <artifact>; artifacts:"
  ls -1 "$out/artifacts/" | sed "s|^|  $out/artifacts/|"
  exit 1
fi
grep -E '^Done [0-9]+ runs|stat::number_of_executed_units|cov:' "$log" | tail -n 3
echo "fuzz: clean"
