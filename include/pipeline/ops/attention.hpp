// Multi-head scaled-dot-product attention (causal by default) and its gradient.
//
// q, k, v, out: float32 [B, T, H·Dh] (head h owns columns [h·Dh, (h+1)·Dh)). For each
// (batch, head): S = Q Kᵀ / √Dh, entries j > i masked to −∞ when causal, P = softmax_rows(S),
// O = P V. The gradient is
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ⊙ (dP − rowsum(dP ⊙ P)),  dQ = dS K / √Dh,  dK = dSᵀ Q / √Dh,
// with rowsum(dP ⊙ P) = rowsum(dO ⊙ O). dq, dk, dv are overwritten.
//
// What the forward keeps for the backward (`saved`) depends on the device; allocate it with the
// shape attention_saved_shape() gives for the tensors' device:
//   - CPU: the probabilities P, [B, H, T, T] (exactly 0 above the diagonal when causal); the
//     backward takes them back instead of recomputing them. (batch, head) pairs run in parallel
//     on OpenMP threads, each with Eigen's gemm on strided views (no copies of the heads).
//   - CUDA: the log-sum-exp of each row of S, [B, H, T]: fused flash-style kernels
//     (kernels/attention.cu) never write a T×T matrix to device memory; the backward rebuilds P
//     tile by tile as exp(S − lse). Head dims up to 128 (ConfigError beyond).
// The backward takes the forward's `out` too (the CUDA path needs rowsum(dO ⊙ O); the CPU path
// only checks its shape) and the forward's `causal` (the CPU path reads the mask from P).
// All tensors of one call must be on one device (ConfigError naming both otherwise). Under a bf16
// compute dtype (ops/precision.hpp) q, k, v and dout are read rounded to bf16; the softmax and
// the accumulations stay fp32. On CUDA (sm_80 and later) the products then run on the bf16
// tensor cores, by one of two kernel sets (Bf16AttentionKernel below).
//
// The packed forms take qkv [B, T, 3·C] with q, k and v side by side along the last dimension
// (the output of one Linear(C, 3C)), and write dqkv in the same layout.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <cstdint>

namespace pipeline::ops {

// The shape of `saved` for attention over [batch, steps, ·] with `heads` heads on `device`:
// [batch, heads, steps, steps] on the CPU, [batch, heads, steps] on CUDA.
Shape attention_saved_shape(Device device, std::int64_t batch, std::int64_t heads,
                            std::int64_t steps);

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t heads,
                       Tensor& out, Tensor& saved, bool causal = true);
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& saved, const Tensor& dout, std::int64_t heads, Tensor& dq,
                        Tensor& dk, Tensor& dv, bool causal = true);

void attention_forward_packed(const Tensor& qkv, std::int64_t heads, Tensor& out, Tensor& saved,
                              bool causal = true);
void attention_backward_packed(const Tensor& qkv, const Tensor& out, const Tensor& saved,
                               const Tensor& dout, std::int64_t heads, Tensor& dqkv,
                               bool causal = true);

// The tensor-core attention under a bf16 compute dtype on CUDA: Mma (kernels/attention_mma.cu,
// FlashAttention-2's register layout; the default) or Wmma (kernels/attention_bf16.cu, scores
// through shared memory: the same results, 1.3x slower on the transformer-lm step). Both split P
// and dS, fp32 results that are operands of the second products, in two bf16 halves, so they
// equal the CPU's fp32 computation on the rounded operands to ~1e-5. MmaRounded is Mma with P and
// dS rounded to bf16 instead, as FlashAttention and torch.autocast round them: half the tensor-core
// work of those products, results within bf16 rounding (~1e-2) of the CPU's. All are tested
// against the CPU. Process-wide; the environment variable
// PIPELINE_BF16_ATTENTION=mma|mma-rounded|wmma sets the initial choice.
enum class Bf16AttentionKernel { Wmma, Mma, MmaRounded };
void set_bf16_attention_kernel(Bf16AttentionKernel kernel);
Bf16AttentionKernel bf16_attention_kernel();

// Forward FLOPs of attention over [B, T, C] (the two T×T×C products; a multiply-add counts 2).
inline double attention_flops(std::int64_t batch, std::int64_t steps, std::int64_t channels) {
  return 4.0 * static_cast<double>(batch) * static_cast<double>(steps) *
         static_cast<double>(steps) * static_cast<double>(channels);
}

}  // namespace pipeline::ops
