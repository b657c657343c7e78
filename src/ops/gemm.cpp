#include <pipeline/ops/bias.hpp>
#include <pipeline/ops/convert.hpp>
#include <pipeline/ops/gemm.hpp>
#include <pipeline/ops/precision.hpp>

#include "eigen_maps.hpp"
#include "short_product.hpp"
#include "split_product.hpp"

#if PIPELINE_WITH_CUDA
#include <pipeline/cuda/blas.hpp>

#include "cuda_dispatch.hpp"
#endif

namespace pipeline::ops {

using detail::as_matrix;

namespace {

struct GemmShape {
  std::int64_t m, n, k;
};

GemmShape gemm_shape(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                     const Tensor& c) {
  PIPELINE_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2,
                 "gemm needs matrices, got {}, {} and {}", a.shape(), b.shape(), c.shape());
  const std::int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const std::int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const std::int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  const std::int64_t n = trans_b ? b.dim(0) : b.dim(1);
  PIPELINE_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n,
                 "gemm shapes do not agree: op(A) is {}x{}, op(B) is {}x{}, C is {}", m, k, kb, n,
                 c.shape());
  return {m, n, k};
}

#if PIPELINE_WITH_CUDA
// The product on cuBLASLt: bf16 tensor cores under a bf16 compute dtype, else fp32 (TF32 where
// allowed); `bias` non-null: C = op(A) op(B) + bias in the epilogue (beta 0).
void gemm_cuda(Device d, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
               GemmShape s, float alpha, float beta, const float* bias) {
  const detail::CudaScope cuda(d);
  const cuda::GemmEpilogue epilogue = bias ? cuda::GemmEpilogue::Bias : cuda::GemmEpilogue::None;
  if (compute_dtype() == DType::BFloat16) {  // the bf16 tensor cores
    const Tensor a16 = to_dtype(a, DType::BFloat16), b16 = to_dtype(b, DType::BFloat16);
    cuda::gemm_bf16(cuda.stream(), d.index, trans_a, trans_b, s.m, s.n, s.k, alpha,
                    a16.device_data<std::uint16_t>(), a.dim(1), b16.device_data<std::uint16_t>(),
                    b.dim(1), beta, c.device_data<float>(), c.dim(1), epilogue, bias);
    return;
  }
  const Tensor a32 = product_operand(a), b32 = product_operand(b);
  cuda::gemm_f32(cuda.stream(), d.index, trans_a, trans_b, s.m, s.n, s.k, alpha,
                 a32.device_data<float>(), a.dim(1), b32.device_data<float>(), b.dim(1), beta,
                 c.device_data<float>(), c.dim(1), epilogue, bias);
}
#endif

// C in bf16 (beta 0): on CUDA under a bf16 compute dtype written by the product itself, rounded
// once as it is stored; elsewhere, or where cuBLASLt has no algorithm for it, computed in float32
// and rounded (to_dtype): the same values up to the order of accumulation.
void gemm_bf16_result(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                      const Tensor* bias, Tensor& c, GemmShape s, float alpha, float beta) {
  PIPELINE_CHECK(beta == 0.f,
                 "gemm: a bfloat16 result is written, never accumulated into (beta {})", beta);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device(bias ? "gemm_bias" : "gemm", {&a, &b, bias, &c});
      d.is_cuda() && compute_dtype() == DType::BFloat16) {
    const detail::CudaScope cuda(d);
    const Tensor a16 = to_dtype(a, DType::BFloat16), b16 = to_dtype(b, DType::BFloat16);
    if (cuda::gemm_bf16_out(cuda.stream(), d.index, trans_a, trans_b, s.m, s.n, s.k, alpha,
                            a16.device_data<std::uint16_t>(), a.dim(1),
                            b16.device_data<std::uint16_t>(), b.dim(1),
                            c.device_data<std::uint16_t>(), c.dim(1),
                            bias ? cuda::GemmEpilogue::Bias : cuda::GemmEpilogue::None,
                            bias ? bias->device_data<float>() : nullptr))
      return;
  }
#endif
  compute_rounded(c, [&](Tensor& c32) {
    if (bias)
      gemm_bias(a, trans_a, b, trans_b, *bias, c32);
    else
      gemm(a, trans_a, b, trans_b, c32, alpha, 0.f);
  });
}

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
          float beta) {
  const auto [m, n, k] = gemm_shape(a, trans_a, b, trans_b, c);
  if (c.dtype() == DType::BFloat16)
    return gemm_bf16_result(a, trans_a, b, trans_b, nullptr, c, {m, n, k}, alpha, beta);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("gemm", {&a, &b, &c}); d.is_cuda()) {
    gemm_cuda(d, a, trans_a, b, trans_b, c, {m, n, k}, alpha, beta, nullptr);
    return;
  }
#endif
  auto C = as_matrix(c);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.f) C.setZero(); else C *= beta;
    return;
  }
  // Under a bf16 compute dtype the operands are read rounded (ops/precision.hpp).
  const Tensor a32 = product_operand(a), b32 = product_operand(b);
  // A Linear layer's products over a short batch (x · Wᵀ, dy · W, dyᵀ · x): AVX-512 kernels that
  // read the weight once, in its own order (short_product.hpp); Eigen where they do not apply.
  if (detail::short_product(trans_a, trans_b, m, n, k, alpha, a32.data<float>(), a32.dim(1),
                            b32.data<float>(), b32.dim(1), beta, c.data<float>(), c.dim(1)))
    return;
  auto A = as_matrix(a32);
  auto B = as_matrix(b32);
  // Eigen's packed gemm kernel on blocks of C, one per thread (detail::split_product); the four
  // transpose cases are spelled out so that each maps to that kernel without a temporary.
  if (beta != 0.f && beta != 1.f) C *= beta;
  const auto into = beta == 0.f ? detail::Into::Overwrite : detail::Into::Accumulate;
  if (!trans_a && !trans_b)
    detail::split_product(C, A, B, alpha, into);
  else if (trans_a && !trans_b)
    detail::split_product(C, A.transpose(), B, alpha, into);
  else if (!trans_a && trans_b)
    detail::split_product(C, A, B.transpose(), alpha, into);
  else
    detail::split_product(C, A.transpose(), B.transpose(), alpha, into);
}

void gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
               Tensor& c) {
  const GemmShape s = gemm_shape(a, trans_a, b, trans_b, c);
  PIPELINE_CHECK(bias.dtype() == DType::Float32 && bias.numel() == s.n,
                 "gemm_bias: the bias must be {} float32 values (one per column of C), got {} {}",
                 s.n, bias.numel(), dtype_name(bias.dtype()));
  if (c.dtype() == DType::BFloat16)
    return gemm_bf16_result(a, trans_a, b, trans_b, &bias, c, s, 1.f, 0.f);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("gemm_bias", {&a, &b, &bias, &c}); d.is_cuda()) {
    gemm_cuda(d, a, trans_a, b, trans_b, c, s, 1.f, 0.f, bias.device_data<float>());
    return;
  }
#endif
  gemm(a, trans_a, b, trans_b, c);
  add_bias(c, bias);
}

Tensor matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b) {
  PIPELINE_CHECK(a.rank() == 2 && b.rank() == 2, "matmul needs matrices, got {} and {}", a.shape(),
                 b.shape());
  Tensor c = Tensor::empty({trans_a ? a.dim(1) : a.dim(0), trans_b ? b.dim(0) : b.dim(1)},
                           DType::Float32, a.device());
  gemm(a, trans_a, b, trans_b, c, 1.f, 0.f);
  return c;
}

}  // namespace pipeline::ops
