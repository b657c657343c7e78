#include <pipeline/ops/convert.hpp>
#include <pipeline/ops/precision.hpp>

#include <cstdlib>
#include <string_view>

#include "../core/parallel.hpp"
#include "cuda_dispatch.hpp"

#if PIPELINE_WITH_CUDA
#include "convert.cuh"
#endif

namespace pipeline::ops {

namespace {

thread_local DType t_compute_dtype = DType::Float32;

// Rounding is one pass over memory: a piece per thread from 64 Ki floats on.
constexpr std::int64_t kMinPiece = std::int64_t{1} << 16;
constexpr std::int64_t kPieceAlign = 16;

}  // namespace

DType compute_dtype() {
  return t_compute_dtype;
}

void check_compute_dtype(DType dtype) {
  PIPELINE_CHECK_AS(ConfigError, dtype == DType::Float32 || dtype == DType::BFloat16,
                    "products compute in float32 or bfloat16, not {}", dtype_name(dtype));
}

ComputeDTypeScope::ComputeDTypeScope(DType dtype) : m_previous(t_compute_dtype) {
  check_compute_dtype(dtype);
  t_compute_dtype = dtype;
}

ComputeDTypeScope::~ComputeDTypeScope() {
  t_compute_dtype = m_previous;
}

DType parse_compute_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return DType::Float32;
  if (name == "bf16" || name == "bfloat16") return DType::BFloat16;
  PIPELINE_FAIL(ConfigError,
                "unknown compute dtype '{}': use float32, or bf16 for bfloat16 products with "
                "float32 accumulation and master weights",
                name);
}

Tensor round_to_bf16(const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), DType::Float32, x.device());
  round_to_bf16(x, y);
  return y;
}

void round_to_bf16(const Tensor& x, Tensor& y) {
  PIPELINE_CHECK(x.dtype() == DType::Float32 && y.dtype() == DType::Float32,
                 "round_to_bf16: needs float32 tensors, got {} into {}", dtype_name(x.dtype()),
                 dtype_name(y.dtype()));
  PIPELINE_CHECK(y.shape() == x.shape() && y.device() == x.device(),
                 "round_to_bf16: the output is {} on {}, the input {} on {}", y.shape(),
                 y.device().str(), x.shape(), x.device().str());
  const std::int64_t n = x.numel();
#if PIPELINE_WITH_CUDA
  if (x.device().is_cuda()) {
    const detail::CudaScope cuda(x.device());
    kernels::round_to_bf16(cuda.stream(), y.device_data<float>(), x.device_data<float>(), n);
    return;
  }
#endif
  const float* in = x.data<float>();
  float* out = y.data<float>();
  pipeline::detail::for_each_piece(n, kMinPiece, kPieceAlign, [&](std::int64_t b, std::int64_t c) {
#pragma omp simd
    for (std::int64_t i = b; i < b + c; ++i) out[i] = bf16_to_float(float_to_bf16(in[i]));
  });
}

// PIPELINE_BF16_OUTPUTS=0 writes every output in float32 (the products then convert them): the
// same results, for comparing the two data flows' speed and memory.
bool bf16_outputs_for_products() {
  static const bool on = [] {
    const char* v = std::getenv("PIPELINE_BF16_OUTPUTS");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return on;
}

DType output_dtype(OutputAs as) {
  return as == OutputAs::ProductOperand && bf16_outputs_for_products() ? t_compute_dtype
                                                                       : DType::Float32;
}

Tensor saved_product_operand(const Tensor& x) {
  if (t_compute_dtype == DType::BFloat16 && x.dtype() == DType::Float32)
    return to_dtype(x, DType::BFloat16);
  return x;
}

Tensor product_operand(const Tensor& x) {
  if (x.dtype() == DType::BFloat16) return to_dtype(x, DType::Float32);
  if (t_compute_dtype == DType::BFloat16) return round_to_bf16(x);
  return x;
}

}  // namespace pipeline::ops
