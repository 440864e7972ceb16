"""The benches' JSON-lines files (kernels_bench, attention_bench, their PyTorch peers; bench/gpu/run.sh)."""
import json
import sys


def json_rows(path):
    """Every JSON line of path, in order. A line that is not JSON (a library's own output on stdout) is left out and
    counted on stderr, so that one stray line does not lose a whole table."""
    rows, bad = [], 0
    for line in open(path):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            bad += 1
    if bad:
        print(f"({bad} line(s) of {path} are not JSON: left out)", file=sys.stderr)
    return rows
