#include "core/device.h"

#include <charconv>

#include "core/error.h"

namespace zt {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.starts_with("cuda:")) {
    int idx = -1;
    auto digits = s.substr(5);
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), idx);
    if (ec == std::errc() && p == digits.data() + digits.size() && idx >= 0) return Device::cuda(idx);
  }
  ZT_FAIL("unknown device '", s, "'; use 'cpu', 'cuda' or 'cuda:N'");
}

}  // namespace zt
