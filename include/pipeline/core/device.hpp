// Where a tensor's storage lives. The CPU is always available; CUDA devices only in builds with
// PIPELINE_WITH_CUDA. The tag travels with every tensor so that ops can dispatch and check.
#pragma once

#include <fmt/format.h>

#include <string>

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

}  // namespace pipeline
