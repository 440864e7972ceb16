#!/usr/bin/env python3
"""An independent safetensors writer (standard library only) for Zettatron's tests.

It lays files out the way Python's `safetensors` package does (since 0.3.0):
tensors sorted by dtype, widest alignment first (the reverse order of the
package's Dtype enum), then by name; the header is compact JSON (no spaces,
non-ASCII written raw) with "__metadata__" first when metadata is given, each
entry's keys in the order dtype, shape, data_offsets; the header is padded
with spaces to a multiple of 8 bytes; then the tensor bytes back to back.

Usage: write_safetensors.py SPEC.json OUT.safetensors
SPEC: {"metadata": {str: str} or null,
       "tensors": [{"name": str, "dtype": "F32", "shape": [int, ...], "hex": "<bytes>"}]}
"""
import json
import struct
import sys

# dtype -> (element size in bytes, position in safetensors' Dtype enum)
DTYPES = {
    "BOOL": (1, 0), "U8": (1, 4), "I8": (1, 5), "F8_E5M2": (1, 6), "F8_E4M3": (1, 7),
    "I16": (2, 11), "U16": (2, 12), "F16": (2, 13), "BF16": (2, 14),
    "I32": (4, 15), "U32": (4, 16), "F32": (4, 17), "F64": (8, 19), "I64": (8, 20), "U64": (8, 21),
}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    tensors = list(spec["tensors"])
    names = [t["name"] for t in tensors]
    if len(set(names)) != len(names):
        sys.exit("duplicate tensor names")
    # Python compares str by code point, which is the UTF-8 byte order; encode anyway to be explicit.
    tensors.sort(key=lambda t: (-DTYPES[t["dtype"]][1], t["name"].encode("utf-8")))

    header = {}
    if spec.get("metadata") is not None:
        header["__metadata__"] = spec["metadata"]
    data = bytearray()
    for t in tensors:
        size = DTYPES[t["dtype"]][0]
        raw = bytes.fromhex(t["hex"])
        count = 1
        for d in t["shape"]:
            count *= d
        if len(raw) != count * size:
            sys.exit(f"tensor {t['name']!r}: {len(raw)} bytes for shape {t['shape']} x {t['dtype']}")
        header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"],
                             "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw

    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(sys.argv[2], "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


if __name__ == "__main__":
    main()
