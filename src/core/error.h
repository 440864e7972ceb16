// Two tiers of errors.
//   ZT_CHECK(cond, msg...)  - a user error (bad config, bad shapes, bad file):
//                             throws zt::Error whose message says what is wrong
//                             and how to fix it. Never includes file:line noise.
//   ZT_ASSERT(cond, msg...) - a broken internal invariant (a Zettatron bug):
//                             throws zt::InternalError with file:line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace zt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const std::string& msg);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace zt

#define ZT_CHECK(cond, ...)                                          \
  do {                                                               \
    if (!(cond)) [[unlikely]]                                        \
      ::zt::detail::throw_error(::zt::detail::concat(__VA_ARGS__));  \
  } while (0)

#define ZT_FAIL(...) ::zt::detail::throw_error(::zt::detail::concat(__VA_ARGS__))

#define ZT_ASSERT(cond, ...)                                                            \
  do {                                                                                  \
    if (!(cond)) [[unlikely]]                                                           \
      ::zt::detail::throw_internal(__FILE__, __LINE__, #cond,                           \
                                   ::zt::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
