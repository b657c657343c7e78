// Element types. Float32 is what layers compute in; Int32 holds class labels and token ids; Int64
// is storage only (PyTorch's batch-norm `num_batches_tracked` in weight files); the 16-bit float
// types are reserved so that files and plans already carry the field and mixed
// precision can be added without a format change.
#pragma once

#include <pipeline/core/error.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace pipeline {

enum class DType { Float32, Int32, Int64, BFloat16, Float16 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
  }
  return 0;
}

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
  }
  return "?";
}

inline DType parse_dtype(std::string_view s) {
  if (s == "float32" || s == "F32") return DType::Float32;
  if (s == "int32" || s == "I32") return DType::Int32;
  if (s == "int64" || s == "I64") return DType::Int64;
  if (s == "bfloat16" || s == "BF16") return DType::BFloat16;
  if (s == "float16" || s == "F16") return DType::Float16;
  PIPELINE_FAIL(ConfigError, "unknown dtype '{}': use float32, int32, int64, bfloat16 or float16", s);
}

}  // namespace pipeline
