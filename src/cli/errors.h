// How the commands report an error that ends them: one line on stderr, and in
// a job of several processes the whole job ended at once (MPI_Abort), so no
// rank waits in a collective for one that has stopped.
#pragma once

#include <exception>

namespace zt::cli {

// "error: <what>" on stderr (std::bad_alloc: what to change in the config).
void print_error(std::exception_ptr error);

// Inside a handler (catch (...)) of a scope that owns process groups: in a
// job of several processes, prints the error and ends the job here, while
// the groups still live - their destructors would wait for operations or
// peers that never come (a GPU's comm stream, ncclCommDestroy), and the
// message would not show until then. Returns (the caller rethrows) in a
// single process, where main() reports it.
void end_job_on_error();

}  // namespace zt::cli
