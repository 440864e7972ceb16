"""The table of bench/gpu/run.sh ncu: one line per profiled kernel from Nsight
Compute's raw CSV pages (ncu --import R --csv --page raw > ncu-<n>.csv), next
to the kernel bench row it ran for (ncu-<n>.log holds the bench's JSON rows in
launch order; each row's kernels are its share of the report's, in order,
where every row launched as many).

  usage: python3 bench/gpu/ncu_table.py OUT/ncu-1.csv [OUT/ncu-2.csv ...]

Columns are found by metric name, so sections a version of ncu lacks only
leave their cells as "-". Values are converted from the units row (ncu writes
"1,234.5 usecond" style numbers as a value and a unit in separate rows).
"""
import csv
import json
import os
import re
import sys

SECONDS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
           "second": 1.0, "s": 1.0}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
         "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1024.0, "MiB": 1024.0 ** 2, "GiB": 1024.0 ** 3}
# SpeedOfLight's "DRAM Throughput", as newer and older versions name it, and
# its "Compute (SM) Throughput" (a product's kernel: how near the SMs' peak).
DRAM_PEAK_PCT = ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed")
SM_PEAK_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
COLUMNS = ("entry", "bench row", "kernel", "grid x block", "regs", "us", "DRAM MB read + written", "DRAM GB/s",
           "DRAM % of peak", "SM % of peak", "L2 hit %", "warps: achieved / theoretical %",
           "top stalls (cycles per issue)")
# Cycles per issue by stall reason (smsp__average_warps_issue_stalled_<reason>_
# per_issue_active.ratio), not the kernel's total cycles by reason
# (smsp__average_warp_latency_issue_stalled_<reason>.ratio, millions).
STALL = re.compile(r"warps_issue_stalled_(.+?)_per_issue_active\.ratio$")


def number(text):
    """ncu's number (thousands separators allowed), or None."""
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_report(path):
    """The kernels of one raw CSV page: a list of {metric: (value, unit)}."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # ncu may print lines of its own before the header ("==PROF==" ones).
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        return []
    header = rows[start]
    # The units row, where there is one (its first cell is not a kernel's ID).
    has_units = len(rows) > start + 1 and rows[start + 1] and number(rows[start + 1][0]) is None
    units = rows[start + 1] if has_units else []
    kernels = []
    for r in rows[start + (2 if has_units else 1):]:
        if not r or number(r[0]) is None:  # a note of ncu's, not a kernel
            continue
        kernels.append({name: (value, units[i] if i < len(units) else "")
                        for i, (name, value) in enumerate(zip(header, r))})
    return kernels


def value(k, names, scale=None):
    """The first of metric `names` (one name, or a tuple: the same metric as
    versions of ncu name it) kernel k has, as a float in base units (scale: a
    unit table), or None."""
    name = next((n for n in ((names,) if isinstance(names, str) else names) if n in k), None)
    if name is None:
        return None
    text, unit = k[name]
    v = number(text)
    if v is None:
        return None
    if scale is not None:
        if unit not in scale:
            return None
        v *= scale[unit]
    return v


def short_name(name):
    """A kernel's name without its namespaces, template arguments and parameters."""
    name = re.sub(r"^void ", "", name)
    depth, out = 0, []
    for c in name:  # drop everything inside <...> and (...)
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out).split("::")[-1].strip() or name


def first(k, *names):
    for n in names:
        if n in k and k[n][0] != "":
            return k[n][0]
    return None


def bench_rows(csv_path):
    """The kernel bench's rows (op, shape) of the run behind csv_path, in order."""
    log = re.sub(r"\.csv$", ".log", csv_path)
    rows = []
    if os.path.exists(log):
        for line in open(log, errors="replace"):
            line = line.strip()
            if line.startswith("{") and '"op"' in line:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                rows.append(f"{r['model']} {r['op']} {r['shape']}")
    return rows


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def line(*cells):
    """A table line: `cells`, then empty cells to the table's width."""
    return "| " + " | ".join(list(cells) + [""] * (len(COLUMNS) - len(cells))) + " |"


def main(paths):
    print(line(*COLUMNS))
    print("|" + "---|" * len(COLUMNS))
    for path in paths:
        entry = re.sub(r"\.csv$", ".ops", path)
        label = open(entry).read().strip() if os.path.exists(entry) else os.path.basename(path)
        label = label.replace("|", "\\|")  # a regex's alternatives, not the table's columns
        rows = bench_rows(path)
        if not os.path.exists(path):
            print(line(label, "; ".join(rows) or "-", "no report: ncu failed or ran out of time (its log)"))
            continue
        kernels = read_report(path)
        per_row = len(kernels) // len(rows) if rows and kernels and len(kernels) % len(rows) == 0 else 0
        if not kernels:
            print(line(label, "; ".join(rows) or "-", "no kernels in the report"))
            continue
        for i, k in enumerate(kernels):
            seconds = value(k, "gpu__time_duration.sum", SECONDS)
            read, written = value(k, "dram__bytes_read.sum", BYTES), value(k, "dram__bytes_write.sum", BYTES)
            moved = read + written if read is not None and written is not None else None
            rate = moved / seconds / 1e9 if moved is not None and seconds else None
            stalls = sorted(((value(k, n), m.group(1)) for n in k if (m := STALL.search(n))),
                            key=lambda s: -(s[0] or 0))
            stalls = [f"{why} {v:.1f}" for v, why in stalls if v and why not in ("selected", "not_selected")][:3]
            grid = first(k, "launch__grid_size", "Grid Size")
            block = first(k, "launch__block_size", "Block Size")
            achieved = value(k, "sm__warps_active.avg.pct_of_peak_sustained_active")
            theoretical = value(k, "sm__maximum_warps_per_active_cycle_pct")
            print(line(label, rows[i // per_row] if per_row else "-", short_name(first(k, "Kernel Name") or "?"),
                       f"{grid or '-'} x {block or '-'}", fmt(value(k, "launch__registers_per_thread"), ".0f"),
                       fmt(seconds * 1e6 if seconds is not None else None, ".1f"),
                       fmt(moved / 1e6 if moved is not None else None, ".1f"), fmt(rate, ".0f"),
                       fmt(value(k, DRAM_PEAK_PCT), ".1f"), fmt(value(k, SM_PEAK_PCT), ".1f"),
                       fmt(value(k, "lts__t_sector_hit_rate.pct"), ".1f"),
                       f"{fmt(achieved, '.1f')} / {fmt(theoretical, '.1f')}", ", ".join(stalls) or "-"))
        if rows and not per_row:
            print(line(label, f"rows in order: {'; '.join(rows)} ({len(kernels)} kernels)"))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python3 bench/gpu/ncu_table.py OUT/ncu-1.csv [OUT/ncu-2.csv ...]")
    main(sys.argv[1:])
