// Shared by the mpirun tests of parallel/: the fortunes corpus, prepared
// once per job by rank 0 into a directory every rank knows.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace zt::test {

inline const std::filesystem::path& fortunes_dataset() {
  static const std::filesystem::path dir = [] {
    comm::ProcessGroup& w = comm::world();
    Tensor id = Tensor::empty(Shape{1}, DType::i64);
    id.data<int64_t>()[0] = w.rank() == 0 ? int64_t(::getpid()) : 0;
    w.all_reduce(id)->wait();  // rank 0's pid names the directory
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("zt_parallel_data_" + std::to_string(id.data<int64_t>()[0]));
    if (w.rank() == 0) {
      const std::string cmd = std::string(ZT_BINARY_DIR) +
                              "/bin/zettatron prepare --force --tokenizer gpt2 --input /usr/share/games/fortunes "
                              "--doc-split percent --val-fraction 0.05 --output " + d.string() + " > /dev/null";
      if (std::system(cmd.c_str()) != 0) std::abort();
    }
    w.barrier()->wait();
    return d;
  }();
  return dir;
}

}  // namespace zt::test
