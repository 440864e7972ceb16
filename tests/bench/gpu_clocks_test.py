"""bench/gpu/gpu_clocks.py on samples and windows as run.sh writes them: only
busy samples inside a run's window count, a run without an end is left out,
and lines nvidia-smi could not fill ("[N/A]") are skipped.

  usage: python3 tests/bench/gpu_clocks_test.py REPO_ROOT
"""
import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(sys.argv.pop(1) if len(sys.argv) > 1 else ".", "bench", "gpu"))
import gpu_clocks  # noqa: E402


class GpuClocksTest(unittest.TestCase):
    def table(self, samples, windows):
        with tempfile.TemporaryDirectory() as d:
            s, w = os.path.join(d, "samples.csv"), os.path.join(d, "windows.txt")
            with open(s, "w") as f:
                f.write("\n".join(samples) + "\n")
            with open(w, "w") as f:
                f.write("\n".join(windows) + "\n")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                gpu_clocks.main(s, w)
        return [[c.strip() for c in line.split("|")[1:-1]] for line in out.getvalue().splitlines()[3:]]

    def test_busy_samples_inside_each_window(self):
        samples = [
            "100.0, 1980, 300.5, 40, 100",  # before any run
            "101.0, 1500, 120.0, 45, 10",   # idle inside the first run: start-up
            "102.0, 1800, 650.2, 60, 100",
            "103.0, 1700, 699.9, 66, 95",
            "104.0, 1750, 690.0, 64, 98",
            "104.5, [N/A], [N/A], 64, 98",  # nvidia-smi could not read it
            "106.0, 1900, 600.0, 58, 99",   # the second run
            "107.0, 1980, 500.0, 50, 97",   # the third run never ended
        ]
        windows = ["100.5 start zettatron llama", "104.8 end zettatron llama",
                   "105.5 start pytorch llama B=64", "106.5 end pytorch llama B=64",
                   "106.8 start zettatron llama, tuned plans"]
        rows = self.table(samples, windows)
        self.assertEqual(len(rows), 2)
        self.assertEqual(rows[0], ["zettatron llama", "4", "3", "1750", "1700", "690", "700", "66"])
        self.assertEqual(rows[1], ["pytorch llama B=64", "1", "1", "1900", "1900", "600", "600", "58"])

    def test_a_window_without_busy_samples(self):
        rows = self.table(["1.0, 1980, 100.0, 40, 5"], ["0.5 start A/B gpt2: as configured",
                                                         "1.5 end A/B gpt2: as configured"])
        self.assertEqual(rows, [["A/B gpt2: as configured", "1", "0", "-", "-", "-", "-", "-"]])


if __name__ == "__main__":
    unittest.main()
