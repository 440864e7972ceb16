// Environment overrides (contract: core/env.h).
#include "core/env.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace zt {

std::optional<int64_t> env_whole_number(const char* name, int64_t least, const char* what) {
  const char* env = std::getenv(name);
  if (!env || !*env) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  const std::string wanted = least == 1 ? "a positive whole number" : "a whole number >= " + std::to_string(least);
  ZT_CHECK(*end == '\0' && errno == 0 && v >= least, name, " = '", env, "' is not ", wanted, " (", what,
           "); unset it for the default");
  return int64_t(v);
}

bool env_switch(const char* name, const char* what, bool unset) {
  const std::optional<int64_t> v = env_whole_number(name, 0, what);
  ZT_CHECK(!v || *v <= 1, name, " = '", *v, "' is not 0 or 1 (", what, "); unset it for the default");
  return v ? *v == 1 : unset;
}

}  // namespace zt
