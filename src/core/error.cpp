#include "core/error.h"

namespace zt::detail {

void throw_error(const std::string& msg) { throw Error(msg); }

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  std::ostringstream os;
  os << "internal error (a Zettatron bug, please report it): " << file << ":" << line
     << ": assertion `" << cond << "` failed";
  if (!msg.empty()) os << ": " << msg;
  throw InternalError(os.str());
}

}  // namespace zt::detail
