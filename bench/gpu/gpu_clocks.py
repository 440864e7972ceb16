"""The GPU's clock and power in each training run of bench/gpu/run.sh (bench,
ab): whether a run held the clock at which the device's GEMM rate was
measured, or a power or thermal limit pulled it down. Reads the half-second
samples run.sh takes while the runs train and the windows it marks.

  usage: python3 bench/gpu/gpu_clocks.py SAMPLES WINDOWS
  SAMPLES: lines "epoch_seconds, sm_clock_mhz, power_w, temperature_c, utilization_pct"
           (nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,utilization.gpu
           --format=csv,noheader,nounits, each line prefixed with `date +%s.%N`)
  WINDOWS: lines "epoch_seconds start|end NAME", a run's end after its start

Only samples with the GPU busy (utilization >= BUSY_PCT) count: a run's
start-up and PyTorch's compilation leave it idle, and an idle clock says
nothing about the run.
"""
import statistics
import sys

BUSY_PCT = 90.0


def read_samples(path):
    samples = []
    for line in open(path, errors="replace"):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            continue
        try:
            samples.append(tuple(float(f) for f in fields))
        except ValueError:  # "[N/A]" or a half-written line
            continue
    return samples


def read_windows(path):
    """(name, start, end) per run, in the order they started; a run without an end is left out."""
    started, windows = {}, []
    for line in open(path, errors="replace"):
        parts = line.rstrip("\n").split(" ", 2)
        if len(parts) != 3:
            continue
        when, what, name = parts
        if what == "start":
            started[name] = float(when)
        elif what == "end" and name in started:
            windows.append((name, started.pop(name), float(when)))
    return sorted(windows, key=lambda w: w[1])


def main(samples_path, windows_path):
    samples, windows = read_samples(samples_path), read_windows(windows_path)
    print(f"GPU clock and power while each run trained (samples every 0.5 s with utilization >= {BUSY_PCT:.0f}%)")
    print("| run | seconds | busy samples | median SM MHz | lowest SM MHz | median W | highest W | highest C |")
    print("|---|---|---|---|---|---|---|---|")
    for name, start, end in windows:
        busy = [s for s in samples if start <= s[0] <= end and s[4] >= BUSY_PCT]
        if not busy:
            print(f"| {name} | {end - start:.0f} | 0 | - | - | - | - | - |")
            continue
        clocks, watts = [s[1] for s in busy], [s[2] for s in busy]
        print(f"| {name} | {end - start:.0f} | {len(busy)} | {statistics.median(clocks):.0f} | {min(clocks):.0f} | "
              f"{statistics.median(watts):.0f} | {max(watts):.0f} | {max(s[3] for s in busy):.0f} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 bench/gpu/gpu_clocks.py SAMPLES WINDOWS")
    main(sys.argv[1], sys.argv[2])
