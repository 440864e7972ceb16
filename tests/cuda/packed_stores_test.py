#!/usr/bin/env python3
"""The 16-byte packs of the bandwidth-bound kernels stay 16-byte memory
instructions in the code nvcc makes for sm_90a (no GPU needed: it reads PTX).

As struct copies, NVVM split some 16-byte pack stores into eight 2-byte ones
(one of SwiGLU's backward's two stores, two of the classifier's four unrolled
ones; CUDA 13.0), and the staged classifier read its shared-memory slots two
bytes at a time. store_pack's st.v4.b32 and the slots' copy through
keep_packed (backend/cuda/cuda_common.cuh) fixed both; this test fails if a
change to those kernels or to the compiler brings the narrow accesses back.

Usage: packed_stores_test.py NVCC SOURCE_DIR [SCRATCH_DIR]
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

# Kernels with 2-byte elements in 16-byte packs (8 per pack): every store to
# memory a 16-byte one (the f32 losses and statistics aside).
PACKED = {
    "activation.cu": [r"gelu_fwd_kernelI13__nv_bfloat16Li8E", r"gelu_bwd_kernelI13__nv_bfloat16Li8E",
                      r"swiglu_fwd_kernelI13__nv_bfloat16Li8E", r"swiglu_bwd_kernelI13__nv_bfloat16Li8E",
                      r"swiglu_bwd_kernelI6__halfLi8E"],
    "norm.cu": [r"norm_forward_kernelI13__nv_bfloat16S3_Li8E", r"norm_dx_kernelI13__nv_bfloat16S3_Li8E",
                r"norm_backward_fused_kernelI13__nv_bfloat16Li8E"],
    "cross_entropy.cu": [r"ce_kernelI13__nv_bfloat16Li8ELi1E", r"ce_kernelI13__nv_bfloat16Li8ELi2E",
                         r"ce_kernelI13__nv_bfloat16Li8ELi4E", r"ce_staged_kernelI13__nv_bfloat16E",
                         r"ce_staged_kernelI6__halfE"],
}
# Any integer store narrower than the pack: 1, 2, 4 or 8 bytes (a split pack;
# the f32 losses and statistics are st.global.f32).
NARROW_STORE = re.compile(r"\bst(?:\.global)?(?:\.wb|\.cs|\.cg)?\.(?:v2\.)?[bu](?:8|16|32)\b")
WIDE_STORE = re.compile(r"\bst(?:\.global)?(?:\.wb|\.cs|\.cg)?\.v4\.(?:b32|u32|f32)\b")
NARROW_SHARED_LOAD = re.compile(r"\bld\.shared\.(?:v2\.)?[bu](?:8|16)\b")


def kernels(ptx):
    """{mangled name: body} of each .entry in a PTX file."""
    found = {}
    entries = list(re.finditer(r"\.entry\s+(\S+)\(", ptx))
    for i, m in enumerate(entries):
        end = entries[i + 1].start() if i + 1 < len(entries) else len(ptx)
        found[m.group(1)] = ptx[m.end():end]
    return found


def main():
    nvcc, source = sys.argv[1], sys.argv[2]
    scratch = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="zt_ptx_")
    os.makedirs(scratch, exist_ok=True)
    failures = []
    for unit, patterns in PACKED.items():
        ptx_path = os.path.join(scratch, unit + ".ptx")
        cmd = [nvcc, "-O3", "-DNDEBUG", "-DZT_WITH_CUDA=1", "-arch=sm_90a", "-ptx", "--expt-relaxed-constexpr",
               "-std=c++20", "-I" + os.path.join(source, "src"), os.path.join(source, "src/backend/cuda", unit),
               "-o", ptx_path]
        subprocess.run(cmd, check=True)
        with open(ptx_path) as f:
            entries = kernels(f.read())
        for pattern in patterns:
            matched = [name for name in entries if re.search(pattern, name)]
            if not matched:
                failures.append(f"{unit}: no kernel matches {pattern} (renamed? update this test)")
            for name in matched:
                body = entries[name]
                narrow = collections.Counter(NARROW_STORE.findall(body))
                wide = len(WIDE_STORE.findall(body))
                shared = collections.Counter(NARROW_SHARED_LOAD.findall(body))
                print(f"{unit}: {name[:90]}: {wide} 16-byte stores, narrow stores {dict(narrow)}, "
                      f"narrow shared loads {dict(shared)}")
                if narrow:
                    failures.append(f"{unit}: {name} stores packs in pieces: {dict(narrow)}")
                if wide == 0:
                    failures.append(f"{unit}: {name} has no 16-byte store")
                if shared:
                    failures.append(f"{unit}: {name} reads shared memory in pieces: {dict(shared)}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
