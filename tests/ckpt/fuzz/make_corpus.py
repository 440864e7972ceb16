#!/usr/bin/env python3
"""Regenerates the seed corpus for the safetensors fuzz target (tests/ckpt/fuzz/corpus/).

Small valid files (every dtype, metadata, scalars, zero-size tensors, headers
in another order or pretty-printed) and one invalid file per kind of mistake.
Usage: make_corpus.py [OUT_DIR]
"""
import json
import os
import struct
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I32": 4, "I64": 8, "U16": 2, "U32": 4}


def pack(header_text, data=b"", pad=True):
    h = header_text.encode("utf-8")
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def layout(tensors, metadata=None):
    """tensors: list of (name, dtype, shape); data filled with a byte pattern."""
    header, data = {}, bytearray()
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((len(data) + i) * 37 % 251 for i in range(n))
    return header, bytes(data)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    files = {}

    files["valid_empty"] = pack("{}")
    h, d = layout([("w", "F32", [2, 3])])
    files["valid_one_f32"] = pack(compact(h), d)
    h, d = layout([(f"t.{dt.lower()}", dt, [3, 1]) for dt in SIZES], {"format": "pt"})
    files["valid_every_dtype"] = pack(compact(h), d)
    h, d = layout([("scalar", "I64", []), ("empty", "F32", [0, 4]), ("one", "BF16", [1, 1, 1])])
    files["valid_scalar_and_empty"] = pack(compact(h), d)
    h, d = layout([("a", "F16", [2]), ("b", "F16", [2])], {"k": "v", "\u00e9": "\"q\"\n"})
    files["valid_metadata_escapes"] = pack(compact(h), d)
    h, d = layout([("x", "U32", [1]), ("y", "U32", [1])])
    files["valid_header_reordered"] = pack(compact({"y": h["y"], "x": h["x"]}), d)
    h, d = layout([("p", "I32", [2])], {})
    files["valid_pretty"] = pack(json.dumps(h, indent=2) + "\n", d)
    files["valid_unpadded"] = pack(compact(h), d, pad=False)

    h, d = layout([("a", "F32", [2]), ("b", "F32", [2])])
    bad = json.loads(compact(h))
    bad["b"]["data_offsets"] = [4, 12]
    files["bad_overlap"] = pack(compact(bad), d[:12])
    bad = json.loads(compact(h))
    bad["b"]["data_offsets"] = [12, 20]
    files["bad_gap"] = pack(compact(bad), d + b"\0" * 4)
    files["bad_truncated"] = pack(compact(h), d)[:-3]
    bad = json.loads(compact(h))
    bad["a"]["shape"] = [3]
    files["bad_size_mismatch"] = pack(compact(bad), d)
    bad = json.loads(compact(h))
    bad["a"]["dtype"] = "F64"
    files["bad_dtype"] = pack(compact(bad), d)
    bad = json.loads(compact(h))
    bad["a"]["shape"] = [1099511627776, 1099511627776]
    files["bad_overflow"] = pack(compact(bad), d)
    files["bad_duplicate"] = pack(compact(h)[:-1] + "," + compact({"a": h["a"]})[1:], d)
    files["bad_json"] = pack(compact(h)[:-2], d)
    files["bad_header_length"] = struct.pack("<Q", 1 << 40) + b"{}"

    for name, content in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(content)


if __name__ == "__main__":
    main()
