// The tuned matmul choices file (backend/cuda/matmul_plans.h): its lines
// read and written, comments, the first line for a product winning, and a
// malformed line or an unwritable file named with the fix. No GPU needed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/cuda/matmul_plans.h"
#include "core/error.h"

namespace zt {
namespace {

using cuda::MatmulChoice;
using cuda::MatmulPlanFile;

// A fresh path in the test's temporary directory (removed first).
std::string scratch_path(const std::string& name) {
  const std::string path = ::testing::TempDir() + "zt_matmul_plans_" + std::to_string(::getpid()) + "_" + name;
  std::remove(path.c_str());
  return path;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(MatmulPlans, ChoicesFormatAndParse) {
  EXPECT_EQ(cuda::format_matmul_choice(MatmulChoice{.cublas = true}), "cublas");
  EXPECT_EQ(cuda::format_matmul_choice(MatmulChoice{.candidate = 7}), "lt 7");
  EXPECT_EQ(cuda::parse_matmul_choice("cublas"), MatmulChoice{.cublas = true});
  EXPECT_EQ(cuda::parse_matmul_choice("lt 0"), MatmulChoice{.candidate = 0});
  EXPECT_EQ(cuda::parse_matmul_choice("lt 15"), MatmulChoice{.candidate = 15});
  for (const char* bad : {"", "lt", "lt ", "lt -1", "lt 3x", "lt 1 ", "LT 1", "cuBLAS", "lt 16", "lt 99999999999"})
    EXPECT_FALSE(cuda::parse_matmul_choice(bad).has_value()) << "'" << bad << "'";
}

TEST(MatmulPlans, RecordedChoicesAreReadBackAndTheFirstWins) {
  const std::string path = scratch_path("roundtrip.tsv");
  {
    MatmulPlanFile file(path);  // no file yet: no choices
    EXPECT_FALSE(file.find("GPU | cuBLASLt 1 | M 8").has_value());
    file.record("GPU | cuBLASLt 1 | M 8", MatmulChoice{.candidate = 3});
    file.record("GPU | cuBLASLt 1 | M 16", MatmulChoice{.cublas = true});
    file.record("GPU | cuBLASLt 1 | M 8", MatmulChoice{.candidate = 5});  // a second tuning: kept out
    EXPECT_EQ(file.find("GPU | cuBLASLt 1 | M 8"), MatmulChoice{.candidate = 3});
  }
  EXPECT_EQ(read_all(path), "lt 3\tGPU | cuBLASLt 1 | M 8\ncublas\tGPU | cuBLASLt 1 | M 16\n");
  // Another process's view: comments and blank lines pass; of two lines for
  // one product (two runs that tuned at once), the first.
  {
    std::ofstream out(path, std::ios::app);
    out << "# a comment\n\nlt 9\tGPU | cuBLASLt 1 | M 8\nlt 2\tGPU | cuBLASLt 1 | M 32\n";
  }
  const MatmulPlanFile again(path);
  EXPECT_EQ(again.find("GPU | cuBLASLt 1 | M 8"), MatmulChoice{.candidate = 3});
  EXPECT_EQ(again.find("GPU | cuBLASLt 1 | M 16"), MatmulChoice{.cublas = true});
  EXPECT_EQ(again.find("GPU | cuBLASLt 1 | M 32"), MatmulChoice{.candidate = 2});
  EXPECT_FALSE(again.find("GPU | cuBLASLt 2 | M 8").has_value());
  std::remove(path.c_str());
}

// A file whose last line (written by hand) has no newline: the next choice
// goes on a line of its own, and both read back.
TEST(MatmulPlans, ARecordAfterALastLineWithoutNewlineStartsItsOwn) {
  const std::string path = scratch_path("no_newline.tsv");
  {
    std::ofstream out(path, std::ios::trunc);
    out << "cublas\tGPU | M 4";
  }
  {
    MatmulPlanFile file(path);
    file.record("GPU | M 8", MatmulChoice{.candidate = 2});
  }
  EXPECT_EQ(read_all(path), "cublas\tGPU | M 4\nlt 2\tGPU | M 8\n");
  const MatmulPlanFile again(path);
  EXPECT_EQ(again.find("GPU | M 4"), MatmulChoice{.cublas = true});
  EXPECT_EQ(again.find("GPU | M 8"), MatmulChoice{.candidate = 2});
  std::remove(path.c_str());
}

TEST(MatmulPlans, AMalformedLineIsNamedWithTheFix) {
  const std::string path = scratch_path("bad.tsv");
  for (const char* bad : {"lt 3 GPU | M 8", "fast\tGPU | M 8", "lt 3\t"}) {
    {
      std::ofstream out(path, std::ios::trunc);
      out << "# made by hand\nlt 1\tGPU | M 4\n" << bad << "\n";
    }
    try {
      const MatmulPlanFile file(path);
      ADD_FAILURE() << "'" << bad << "' was read";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path + ":3: expected \"lt <n>\" or \"cublas\", a tab, then the product"), std::string::npos)
          << what;
      EXPECT_NE(what.find("delete the line (or the file)"), std::string::npos) << what;
    }
  }
  std::remove(path.c_str());
}

TEST(MatmulPlans, AnUnwritableFileIsNamed) {
  const std::string dir = scratch_path("no_such_dir");
  MatmulPlanFile file(dir + "/plans.tsv");  // reading a missing file is fine
  try {
    file.record("GPU | M 8", MatmulChoice{.candidate = 1});
    ADD_FAILURE() << "wrote into a directory that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open for appending"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("point ZT_CUDA_MATMUL_PLANS at a writable file"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zt
