// Device: where a tensor's bytes live. "cpu" or "cuda:N".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zt {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // GPU ordinal for cuda; 0 for cpu

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i) { return {DeviceType::cuda, i}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:1"
};

// Parses "cpu", "cuda" (= cuda:0), "cuda:N"; throws zt::Error otherwise.
Device parse_device(std::string_view s);

}  // namespace zt
