// What the three attention implementations share (attention.cu: float32; attention_bf16.cu and
// attention_mma.cu: bf16 tensor cores): the kernels' arguments, the block-to-tile mapping, the
// mask, and the launch helpers. Every implementation owns 64-row tiles, one block each, and pads
// the head dimension to 32, 64 or 128. Included only by those .cu files.
#pragma once

#include "attention.cuh"

#include <pipeline/cuda/check.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace pipeline::kernels::attention {

constexpr int kOwnRows = 64;  // rows a block owns, in every kernel

struct Params {
  const float* q;
  const float* k;
  const float* v;
  std::int64_t in_stride;
  const float* out;  // backward: the forward's output
  const float* dout;
  float* o;  // forward: the output
  std::int64_t out_stride;
  float* lse_out;
  const float* lse;
  float* delta;
  float* dq;
  float* dk;
  float* dv;
  std::int64_t grad_stride;
  int steps, heads, head_dim, tiles;
  float scale;
  bool causal;
  // q, k and v held in bf16 (set instead of q, k, v): read as they are by the register-fragment
  // kernels (attention_mma.cu).
  const std::uint16_t* q16 = nullptr;
  const std::uint16_t* k16 = nullptr;
  const std::uint16_t* v16 = nullptr;
};

inline bool empty(const AttentionProblem& pr) {
  return pr.batch <= 0 || pr.steps <= 0 || pr.heads <= 0 || pr.head_dim <= 0;
}

inline Params problem_params(const AttentionProblem& pr) {
  Params p{};
  p.steps = static_cast<int>(pr.steps);
  p.heads = static_cast<int>(pr.heads);
  p.head_dim = static_cast<int>(pr.head_dim);
  p.tiles = static_cast<int>((pr.steps + kOwnRows - 1) / kOwnRows);
  p.scale = 1.f / std::sqrt(static_cast<float>(pr.head_dim));  // as the CPU op: 1 / √Dh in float
  p.causal = pr.causal;
  return p;
}

inline Params forward_params(const AttentionProblem& pr, const float* q, const float* k,
                             const float* v, std::int64_t in_stride, float* out,
                             std::int64_t out_stride, float* lse) {
  Params p = problem_params(pr);
  p.q = q;
  p.k = k;
  p.v = v;
  p.in_stride = in_stride;
  p.o = out;
  p.out_stride = out_stride;
  p.lse_out = lse;
  return p;
}

// `delta` is the backward's workspace, filled by attention_row_dots.
inline Params backward_params(const AttentionProblem& pr, const float* q, const float* k,
                              const float* v, std::int64_t in_stride, const float* out,
                              const float* dout, std::int64_t out_stride, const float* lse,
                              float* dq, float* dk, float* dv, std::int64_t grad_stride,
                              float* delta) {
  Params p = problem_params(pr);
  p.q = q;
  p.k = k;
  p.v = v;
  p.in_stride = in_stride;
  p.out = out;
  p.dout = dout;
  p.out_stride = out_stride;
  p.lse = lse;
  p.delta = delta;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.grad_stride = grad_stride;
  return p;
}

// One block per owned tile of every (batch, head).
inline unsigned tile_blocks(const AttentionProblem& pr) {
  return static_cast<unsigned>(pr.batch * pr.heads * ((pr.steps + kOwnRows - 1) / kOwnRows));
}

// f(std::integral_constant<int, D>) for the padded head width D (32, 64 or 128).
template <typename F>
void with_padded_head_dim(std::int64_t head_dim, F&& f) {
  if (head_dim <= 32)
    f(std::integral_constant<int, 32>{});
  else if (head_dim <= 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}

// kernel<<<blocks, threads, smem, stream>>>(p), opting into dynamic shared memory beyond the
// default 48 KiB (per kernel).
template <typename Kernel>
void launch(Kernel* kernel, unsigned blocks, int threads, std::size_t smem, cudaStream_t stream,
            const Params& p) {
  PIPELINE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  kernel<<<blocks, threads, smem, stream>>>(p);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

// The bf16 tensor-core implementations behind attention.cu's launchers, given the arguments
// those build once (the backward's row dots already in p.delta): the WMMA kernels of
// attention_bf16.cu and the register-fragment kernels of attention_mma.cu
// (AttentionProblem::mma chooses; `rounded`: its rounded_probabilities).
void forward_wmma(cudaStream_t stream, const Params& p, std::int64_t head_dim, unsigned blocks);
void backward_wmma(cudaStream_t stream, const Params& p, std::int64_t head_dim, unsigned blocks);
void forward_mma(cudaStream_t stream, const Params& p, std::int64_t head_dim, unsigned blocks,
                 bool rounded);
void backward_mma(cudaStream_t stream, const Params& p, std::int64_t head_dim, unsigned blocks,
                  bool rounded);

// Which (batch, head) and which owned tile a block works on. Causal query tiles near the end see
// the most keys, key tiles near the start the most queries: `reversed` starts the heaviest first.
struct Block {
  int b, h, bh, tile;
};

__device__ __forceinline__ Block block_of(const Params& p, bool reversed) {
  const int idx = static_cast<int>(blockIdx.x);
  const int bh = idx / p.tiles, t = idx % p.tiles;
  return {bh / p.heads, bh % p.heads, bh, reversed ? p.tiles - 1 - t : t};
}

// Offset of row 0 of (b, head h) in a [B·T, *] matrix whose rows are `stride` apart.
__device__ __forceinline__ std::int64_t head_offset(const Params& p, int b, int h,
                                                    std::int64_t stride) {
  return static_cast<std::int64_t>(b) * p.steps * stride +
         static_cast<std::int64_t>(h) * p.head_dim;
}

__device__ __forceinline__ bool visible(const Params& p, int query, int key) {
  return query < p.steps && key < p.steps && (!p.causal || key <= query);
}

}  // namespace pipeline::kernels::attention
