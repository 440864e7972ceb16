#include "cli/errors.h"

#include <cstdio>
#include <new>

#include "comm/process_group.h"

namespace zt::cli {

void print_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "error: out of host memory outside the tensor allocator; `zettatron info CONFIG` shows what a config "
                 "needs (lower train.micro_batch, or use train.recompute or parallel.zero_stage)\n");
  } catch (const std::exception& e) {  // ours (zt::Error) or not (the standard library, a dependency): one line
    std::fprintf(stderr, "error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "error: an unknown exception\n");
  }
}

void end_job_on_error() {
  if (!comm::in_multi_process_job()) return;  // also when the error came from creating the world
  print_error(std::current_exception());
  comm::abort_job_after_error(1);
}

}  // namespace zt::cli
