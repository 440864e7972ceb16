#!/usr/bin/env bash
# Run HERE (a machine with apt access): downloads the Debian packages the build
# needs into .debs/ (git-ignored), so they can travel to a GPU machine that
# reaches no package registry (device tool: carry [".debs"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .debs
cd .debs
pkgs=(libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libgfortran5
      libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libtomlplusplus3
      libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian)
apt-get download "${pkgs[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
# Each package here, or a clear stop now: a missing one would surface on the
# GPU machine as a library that does not load, minutes into a lease.
missing=()
for p in "${pkgs[@]}"; do compgen -G "${p}_*.deb" > /dev/null || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] || { echo "fetch_debs: could not download ${missing[*]} (apt-get update, then again)"; exit 1; }
ls *.deb | wc -l
