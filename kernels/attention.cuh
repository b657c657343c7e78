// Launchers of the fused causal attention kernels (attention.cu). CPU reference and contract:
// include/pipeline/ops/attention.hpp — per (batch, head): S = Q Kᵀ / √Dh (entries j > i masked
// when causal), P = softmax_rows(S), O = P V.
//
// Layout: q, k, v are row-major [B·T, *] float32 device memory; row (b, t) of head h starts at
// column h·Dh of row b·T + t, consecutive rows `in_stride` floats apart (C for separate tensors,
// 3C for a packed qkv). out and dout rows are `out_stride` apart, dq/dk/dv rows `grad_stride`
// apart, with the same column offset. lse and the backward's workspace are [B, H, T].
// Preconditions (the op checks them): 1 <= head_dim <= kAttentionMaxHeadDim, steps < 2^31 and
// batch·heads·⌈steps/64⌉ < 2^31. Asynchronous on `stream`; an empty problem launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

// Head dimensions up to this are supported (compiled for padded widths 32, 64 and 128).
constexpr std::int64_t kAttentionMaxHeadDim = 128;

struct AttentionProblem {
  std::int64_t batch = 0, steps = 0, heads = 0, head_dim = 0;
  bool causal = true;
  // q, k, v (and dout) hold bf16 values: on compute capability 8.0 and later the launchers run
  // tensor-core kernels, elsewhere the float32 ones (same results up to rounding): those of
  // attention_bf16.cu, or with `mma` those of attention_mma.cu (below).
  bool bf16_operands = false;
  bool mma = false;
  // With `mma`: P and dS rounded to bf16 before the products that read them (FlashAttention's and
  // torch.autocast's numerics, half those products' tensor-core work) instead of split in two
  // bf16 halves (fp32-exact on the rounded operands).
  bool rounded_probabilities = false;
};

// O = softmax(Q Kᵀ / √Dh) V, and lse[b, h, t] = log Σ_j exp(S[t, j]) (over the unmasked j), the
// only statistic the backward needs to rebuild P.
void attention_forward(cudaStream_t stream, const AttentionProblem& p, const float* q,
                       const float* k, const float* v, std::int64_t in_stride, float* out,
                       std::int64_t out_stride, float* lse);

// float32 elements of device workspace attention_backward() needs (the row dots D = rowsum(dO⊙O)).
inline std::int64_t attention_backward_workspace_floats(const AttentionProblem& p) {
  return p.batch * p.heads * p.steps;
}

// dq, dk and dv (overwritten) from q, k, v, the forward's out and lse, and dout. Deterministic:
// no atomics (dK/dV and dQ are accumulated by separate passes, each element by one thread).
void attention_backward(cudaStream_t stream, const AttentionProblem& p, const float* q,
                        const float* k, const float* v, std::int64_t in_stride, const float* out,
                        const float* dout, std::int64_t out_stride, const float* lse, float* dq,
                        float* dk, float* dv, std::int64_t grad_stride, float* workspace);

// delta[b, h, t] = Σ_d dout[b, t, h, d] · out[b, t, h, d] ([B, H, T], the backward's row dots;
// every backward below computes it into its workspace first).
void attention_row_dots(cudaStream_t stream, const AttentionProblem& p, const float* out,
                        const float* dout, std::int64_t out_stride, float* delta);

// Whether the tensor-core kernels can run on the current device (sm_80 or later): the two
// launchers above take them when bf16_operands is set (attention_common.cuh).
bool attention_bf16_supported();

// Whether the launchers below can read q, k and v held in bf16 at these addresses, read as they
// are (half the bytes, no float32 copy) by the register-fragment kernels: bf16_operands and mma
// set, a device attention_bf16_supported() accepts, head_dim and in_stride multiples of 4 and
// every pointer 8-byte aligned. Otherwise the caller widens them to float32.
bool attention_reads_bf16(const AttentionProblem& p, const void* q, const void* k, const void* v,
                          std::int64_t in_stride);

// The two launchers above with q, k and v in bf16 (their 16 bits, std::uint16_t), the same
// layout and strides in elements; out, dout, lse and the gradients float32 as above.
// Precondition: attention_reads_bf16(p, q, k, v, in_stride) (the op checks it).
void attention_forward(cudaStream_t stream, const AttentionProblem& p, const std::uint16_t* q,
                       const std::uint16_t* k, const std::uint16_t* v, std::int64_t in_stride,
                       float* out, std::int64_t out_stride, float* lse);
void attention_backward(cudaStream_t stream, const AttentionProblem& p, const std::uint16_t* q,
                        const std::uint16_t* k, const std::uint16_t* v, std::int64_t in_stride,
                        const float* out, const float* dout, std::int64_t out_stride,
                        const float* lse, float* dq, float* dk, float* dv, std::int64_t grad_stride,
                        float* workspace);

}  // namespace pipeline::kernels
