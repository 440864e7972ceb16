"""bench/gpu/ncu_table.py on a raw CSV page laid out as Nsight Compute writes
one (ncu --import R --csv --page raw): lines of its own before the header, a
units row, numbers with thousands separators, units to convert; each kernel
placed next to the kernel bench row it ran for.

  usage: python3 tests/bench/ncu_table_test.py REPO_ROOT
"""
import contextlib
import io
import os
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(sys.argv.pop(1) if len(sys.argv) > 1 else ".", "bench", "gpu"))
import ncu_table  # noqa: E402

HEADER = ['"ID"', '"Process ID"', '"Kernel Name"', '"Block Size"', '"Grid Size"', '"gpu__time_duration.sum"',
          '"dram__bytes_read.sum"', '"dram__bytes_write.sum"', '"launch__registers_per_thread"',
          '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"',
          '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"',
          '"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio"',
          '"smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio"',
          '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"',
          # A total over the kernel (cycles), not a per-issue stall: not a column of the table.
          '"smsp__average_warp_latency_issue_stalled_barrier.ratio"',
          '"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"',
          '"sm__throughput.avg.pct_of_peak_sustained_elapsed"']
UNITS = ['""', '""', '""', '""', '""', '"usecond"', '"Mbyte"', '"Kbyte"', '"register/thread"',
         '"ratio"', '"ratio"', '"ratio"', '"ratio"', '"ratio"', '"cycle"', '"%"', '"%"']


def kernel(i, name, grid, us, read_mb, write_kb, regs, stalls, dram_pct="", sm_pct=""):
    return [f'"{i}"', '"4242"', f'"{name}"', '"(512, 1, 1)"', f'"({grid}, 1, 1)"', f'"{us}"', f'"{read_mb}"',
            f'"{write_kb}"', f'"{regs}"'] + [f'"{s}"' for s in stalls] + ['"4,782,348"', f'"{dram_pct}"', f'"{sm_pct}"']


class NcuTableTest(unittest.TestCase):
    def write(self, d, n, lines, log_rows, ops):
        with open(os.path.join(d, f"ncu-{n}.csv"), "w") as f:
            f.write("==PROF== Disconnected from process 4242\n")
            f.write("\n".join(",".join(line) for line in lines) + "\n")
        with open(os.path.join(d, f"ncu-{n}.log"), "w") as f:
            f.write('{"copy_gbps": 3000.0, "device": "cuda", "environment": ""}\n{"gemm_tflops": 790.0}\n')
            f.write("==PROF== Profiling \"swiglu_backward_kernel\": 0%....50%....100% - 41 passes\n")
            for op, shape in log_rows:
                f.write(f'{{"model": "llama3-1b", "op": "{op}", "shape": "{shape}", "ms": 9.9}}\n')
        with open(os.path.join(d, f"ncu-{n}.ops"), "w") as f:
            f.write(ops + "\n")
        return os.path.join(d, f"ncu-{n}.csv")

    def table(self, paths):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            ncu_table.main(paths)
        return [line for line in out.getvalue().splitlines()[2:]]

    def test_kernels_next_to_their_rows_in_base_units(self):
        with tempfile.TemporaryDirectory() as d:
            name = "void zt::cuda::act_kernels::swiglu_backward_kernel<__nv_bfloat16, 8>(T1 *, const T1 *, long)"
            path = self.write(d, 1, [HEADER, UNITS,
                                     kernel(0, name, 4224, "1,096.5", "3,221.2", "2,147,483.6", 32,
                                            [12.5, 0.5, 1.0, 3.25, 2.0], "71.34", "43.96"),
                                     kernel(1, name, 4224, "2,540.0", "6,442.5", "4,294,967.3", 32,
                                            [30.0, 0.1, 1.0, 9.0, 2.0])],
                              [("swiglu_backward", "32768x16384"), ("swiglu_backward", "65536x16384")],
                              "llama3-1b/swiglu_(backward|forward)$")
            rows = self.table([path])
        self.assertEqual(len(rows), 2)
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", rows[0])[1:-1]]  # columns: pipes not escaped
        self.assertEqual(cells[0], "llama3-1b/swiglu_(backward\\|forward)$")
        self.assertEqual(cells[1], "llama3-1b swiglu_backward 32768x16384")
        self.assertEqual(cells[2], "swiglu_backward_kernel")
        self.assertEqual(cells[3], "(4224, 1, 1) x (512, 1, 1)")
        self.assertEqual(cells[4], "32")
        self.assertEqual(cells[5], "1096.5")
        # 3221.2 MB read + 2147.4836 MB written, over 1096.5 us.
        self.assertEqual(cells[6], "5368.7")
        self.assertEqual(cells[7], f"{(3221.2e6 + 2147483.6e3) / 1096.5e-6 / 1e9:.0f}")
        self.assertEqual(cells[8], "71.3")
        self.assertEqual(cells[9], "44.0")
        self.assertEqual(cells[10:12], ["-", "- / -"])  # metrics this report lacks
        # Largest first; "selected" is not a stall.
        self.assertEqual(cells[12], "long_scoreboard 12.5, lg_throttle 3.2, wait 2.0")
        self.assertIn("65536x16384", rows[1])

    def test_rows_unmatched_when_kernel_counts_differ(self):
        with tempfile.TemporaryDirectory() as d:
            path = self.write(d, 2, [HEADER, UNITS] + [kernel(i, "k", 1, "1", "1", "1", 8, [1, 1, 1, 1, 1])
                                                      for i in range(3)],
                              [("a", "1"), ("b", "2")], "x")
            rows = self.table([path])
        self.assertEqual(len(rows), 4)
        self.assertTrue(all(r.split("|")[2].strip() == "-" for r in rows[:3]))
        self.assertIn("rows in order: llama3-1b a 1; llama3-1b b 2 (3 kernels)", rows[3])

    def test_a_page_without_a_units_row_keeps_its_first_kernel(self):
        with tempfile.TemporaryDirectory() as d:
            path = self.write(d, 4, [HEADER] + [kernel(i, "k", 1, "1", "1", "1", 8, [1, 1, 1, 1, 1]) for i in range(2)],
                              [("a", "1"), ("b", "2")], "z")
            rows = self.table([path])
        self.assertEqual(len(rows), 2)
        self.assertIn("llama3-1b a 1", rows[0])
        self.assertEqual(rows[0].split("|")[6].strip(), "-")  # no unit to convert the duration from

    def test_a_report_without_kernels_says_so(self):
        with tempfile.TemporaryDirectory() as d:
            path = self.write(d, 3, [["==ERROR== the profiler could not read the counters"]], [("a", "1")], "y")
            rows = self.table([path, os.path.join(d, "ncu-9.csv")])  # the second was never written
        self.assertEqual(len(rows), 2)
        self.assertIn("no kernels in the report", rows[0])
        self.assertIn("no report", rows[1])


if __name__ == "__main__":
    unittest.main()
