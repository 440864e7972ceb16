# Sourced by scripts/gpu/build.sh and bench/gpu/run.sh on the GPU machine: the
# library path of Zettatron's binaries there - the .debs unpacked into
# /tmp/zt-prefix, then the PyTorch wheels' cuDNN, NVRTC (cuDNN loads its
# engines and runtime-compiled attention by name) and NCCL - and the
# tokenizer files carried in .cache/zettatron (prepare_lease.sh).
zt_wheel_libs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
dirs = []
for root in nvidia.__path__:
    for pattern in ("libcudnn.so.9", "libnvrtc.so.*", "libnccl.so.2"):
        dirs += [os.path.dirname(f) for f in glob.glob(os.path.join(root, "**", pattern), recursive=True)]
print(":".join(dict.fromkeys(dirs)))
PY
)
zt_prefix_lib=/tmp/zt-prefix/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$zt_prefix_lib/openblas-openmp:$zt_prefix_lib:${zt_wheel_libs:+$zt_wheel_libs:}${LD_LIBRARY_PATH:-}
# (An if, not [ ] &&: a false test as the last line would make `source`
# fail, and build.sh under set -e stop without a word.)
if [ -d .cache/zettatron/tokenizers ]; then export ZT_CACHE_DIR=$PWD/.cache/zettatron; fi
