// Multi-head scaled-dot-product attention (causal by default) and its gradient.
//
// q, k, v, out: float32 [B, T, H·Dh] (head h owns columns [h·Dh, (h+1)·Dh)); probs: [B, H, T, T].
// For each (batch, head): S = Q Kᵀ / √Dh, entries j > i masked to −∞ when causal,
// P = softmax_rows(S), O = P V. The forward writes P into probs (exactly 0 above the diagonal
// when causal), and the backward takes it back instead of recomputing it:
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ⊙ (dP − rowsum(dP ⊙ P)),  dQ = dS K / √Dh,  dK = dSᵀ Q / √Dh.
// dq, dk, dv are overwritten. (batch, head) pairs run in parallel on OpenMP threads, each with
// Eigen's gemm on strided views (no copies of the heads).
//
// The packed forms take qkv [B, T, 3·C] with q, k and v side by side along the last dimension
// (the output of one Linear(C, 3C)), and write dqkv in the same layout.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <cstdint>

namespace pipeline::ops {

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t heads,
                       Tensor& out, Tensor& probs, bool causal = true);
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const Tensor& dout, std::int64_t heads, Tensor& dq, Tensor& dk, Tensor& dv);

void attention_forward_packed(const Tensor& qkv, std::int64_t heads, Tensor& out, Tensor& probs,
                              bool causal = true);
void attention_backward_packed(const Tensor& qkv, const Tensor& probs, const Tensor& dout,
                               std::int64_t heads, Tensor& dqkv);

// Forward FLOPs of attention over [B, T, C] (the two T×T×C products; a multiply-add counts 2).
inline double attention_flops(std::int64_t batch, std::int64_t steps, std::int64_t channels) {
  return 4.0 * static_cast<double>(batch) * static_cast<double>(steps) *
         static_cast<double>(steps) * static_cast<double>(channels);
}

}  // namespace pipeline::ops
