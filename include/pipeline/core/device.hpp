// Where a tensor's storage lives. The CPU is always available; CUDA devices only in builds with
// PIPELINE_WITH_CUDA. The tag travels with every tensor so that ops can dispatch and check.
#pragma once

#include <pipeline/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

namespace pipeline {

enum class DeviceKind { Cpu, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceKind::Cuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::Cpu; }
  bool is_cuda() const { return kind == DeviceKind::Cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }
};

// "cpu", "cuda" (cuda:0) or "cuda:N"; ConfigError naming the accepted spellings otherwise.
inline Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  const std::string_view digits = text.substr(std::min<std::size_t>(5, text.size()));
  bool ok = text.substr(0, 5) == "cuda:" && !digits.empty() && digits.size() <= 4;
  int index = 0;
  for (char c : digits) {
    ok = ok && std::isdigit(static_cast<unsigned char>(c));
    index = index * 10 + (c - '0');
  }
  PIPELINE_CHECK_AS(ConfigError, ok, "unknown device '{}': use cpu, cuda or cuda:N", text);
  return Device::cuda(index);
}

// CUDA devices this process sees: 0 in a build without CUDA, without a driver or without a GPU
// (never throws).
int cuda_device_count();

}  // namespace pipeline
