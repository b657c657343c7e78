// Fused causal (or full) attention on the bf16 tensor cores: the contract of attention.cuh for
// operands that hold bf16 values (a bf16 compute dtype rounded them, ops/precision.hpp), chosen
// by AttentionProblem::bf16_operands on GPUs of compute capability 8.0 and later (unless
// AttentionProblem::mma asks for attention_mma.cu's).
//
// What differs from the float32 kernels of attention.cu: every tile product runs as 16×16×16 bf16
// WMMA operations with fp32 accumulation. Q, K, V and dO are converted to bf16 as they are loaded
// (exact: they already hold bf16 values). The softmax, its statistics and every accumulator stay
// fp32. P and dS, which are fp32 results, enter their products split in two bf16 halves
// (hi = bf16(x), lo = bf16(x − hi): 16 significant bits, relative error below 2^-17), so the
// results stay the CPU's fp32 computation on the rounded operands to ~1e-5 (tests/gpu), at twice
// the tensor-core work of those products, which the kernels have to spare.
//
// Tiling: a block of 4 warps owns 64 rows (each warp 16) and streams 64-row tiles of the other
// side through shared memory (bf16 rows padded by 8 elements against bank conflicts). Each warp
// writes its 16×64 score tile (and dP tile) to shared memory, where lane pairs (one row, 32
// columns each) apply the mask and the softmax; the forward keeps its output accumulator in
// shared memory, rescaled there by the online softmax before the next P·V product accumulates
// into it. The backward keeps its dK, dV and dQ accumulators in registers (no rescaling). As in
// attention.cu the backward runs a dK/dV pass and a dQ pass, so every gradient element is summed
// in a fixed order (deterministic, no atomics).
#include "attention.cuh"
#include "attention_common.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

#include <cuda_bf16.h>
#include <math_constants.h>
#include <mma.h>

#include <cstddef>

namespace pipeline::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kTcThreads = kWarps * detail::kWarp;
constexpr int kTile = 64;        // rows a block owns, and rows of each streamed tile
static_assert(kTile == attention::kOwnRows, "the grid has one block per owned 64-row tile");
constexpr int kSub = 16;         // the WMMA tile edge
constexpr int kSLd = kTile + 4;  // floats per row of a warp's 16×64 score tile
constexpr int kPLd = kTile + 8;  // bf16 per row of a warp's 16×64 P or dS tile

template <int D>
constexpr int kRowLd = D + 8;  // bf16 per row of a Q, K, V or dO tile
template <int D>
constexpr int kAccLd = D + 4;  // floats per row of a warp's 16×D accumulator

using attention::Block;
using attention::block_of;
using attention::head_offset;
using attention::Params;
using attention::visible;

// Rows [row0, row0 + 64) of one head into dst[64][D + 8] as bf16: zero past `steps` and past
// head_dim. Consecutive threads read consecutive columns (coalesced).
template <int D>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, const float* head,
                                          std::int64_t stride, int row0, int steps, int head_dim) {
  for (int i = threadIdx.x; i < kTile * D; i += kTcThreads) {
    const int r = i / D, d = i % D;
    const bool inside = row0 + r < steps && d < head_dim;
    dst[r * kRowLd<D> + d] =
        __float2bfloat16_rn(inside ? head[static_cast<std::int64_t>(row0 + r) * stride + d] : 0.f);
  }
}

// x as hi + lo, two bf16 values.
__device__ __forceinline__ void split(float x, __nv_bfloat16* hi, __nv_bfloat16* lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  *hi = h;
  *lo = __float2bfloat16_rn(x - __bfloat162float(h));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, kSub, kSub, kSub, __nv_bfloat16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kSub, kSub, kSub, __nv_bfloat16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kSub, kSub, kSub, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kSub, kSub, kSub, float>;

// out[16][64] (floats, row stride kSLd) = A[16][D] · B[64][D]ᵀ, both bf16 row-major tiles.
template <int D>
__device__ __forceinline__ void product_abt(float* out, const __nv_bfloat16* a,
                                            const __nv_bfloat16* b) {
#pragma unroll
  for (int n = 0; n < kTile / kSub; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < D / kSub; ++kk) {
      FragA fa;
      FragBCol fb;  // Bᵀ[d][row] is B read column-major
      wmma::load_matrix_sync(fa, a + kk * kSub, kRowLd<D>);
      wmma::load_matrix_sync(fb, b + n * kSub * kRowLd<D> + kk * kSub, kRowLd<D>);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * kSub, acc, kSLd, wmma::mem_row_major);
  }
}

// acc[dn] (16 × D as D/16 fragments) += (hi + lo)[16][64] · B[64][D] (bf16 row-major tile).
template <int D>
__device__ __forceinline__ void accumulate_split(FragC* acc, const __nv_bfloat16* hi,
                                                 const __nv_bfloat16* lo, const __nv_bfloat16* b) {
#pragma unroll
  for (int kk = 0; kk < kTile / kSub; ++kk) {
    FragA fh, fl;
    wmma::load_matrix_sync(fh, hi + kk * kSub, kPLd);
    wmma::load_matrix_sync(fl, lo + kk * kSub, kPLd);
#pragma unroll
    for (int dn = 0; dn < D / kSub; ++dn) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + kk * kSub * kRowLd<D> + dn * kSub, kRowLd<D>);
      wmma::mma_sync(acc[dn], fh, fb, acc[dn]);
      wmma::mma_sync(acc[dn], fl, fb, acc[dn]);
    }
  }
}

// Writes a warp's 16 × D accumulator (times `scale`) into rows row0.. of a [B·T, *] head
// through the warp's float scratch (16 × (D + 4)); rows past steps and columns past head_dim
// are left alone.
template <int D>
__device__ __forceinline__ void store_rows(const Params& p, FragC* acc, float* scratch, float* head,
                                           std::int64_t stride, int row0, float scale) {
  __syncwarp();
#pragma unroll
  for (int dn = 0; dn < D / kSub; ++dn)
    wmma::store_matrix_sync(scratch + dn * kSub, acc[dn], kAccLd<D>, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % detail::kWarp;
  for (int i = lane; i < kSub * D; i += detail::kWarp) {
    const int r = i / D, d = i % D;
    if (row0 + r < p.steps && d < p.head_dim)
      head[static_cast<std::int64_t>(row0 + r) * stride + d] = scratch[r * kAccLd<D> + d] * scale;
  }
  __syncwarp();
}
#endif

template <int D>
constexpr std::size_t forward_tc_smem() {
  return 3 * kTile * kRowLd<D> * sizeof(__nv_bfloat16) +
         kWarps * kSub * (kSLd + kAccLd<D>)*sizeof(float) +
         2 * kWarps * kSub * kPLd * sizeof(__nv_bfloat16);
}

template <int D>
__global__ __launch_bounds__(kTcThreads) void attention_forward_tc_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LB = kRowLd<D>, LA = kAccLd<D>;
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* ks = qs + kTile * LB;
  __nv_bfloat16* vs = ks + kTile * LB;
  auto* scores = reinterpret_cast<float*>(vs + kTile * LB);  // [warp][16][kSLd]
  float* outs = scores + kWarps * kSub * kSLd;               // [warp][16][LA]
  auto* p_hi = reinterpret_cast<__nv_bfloat16*>(outs + kWarps * kSub * LA);
  __nv_bfloat16* p_lo = p_hi + kWarps * kSub * kPLd;

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const Block blk = block_of(p, /*reversed=*/true);
  const int q0 = blk.tile * kTile;
  const std::int64_t in_head = head_offset(p, blk.b, blk.h, p.in_stride);
  load_tile<D>(qs, p.q + in_head, p.in_stride, q0, p.steps, p.head_dim);

  float* sw = scores + warp * kSub * kSLd;
  float* ow = outs + warp * kSub * LA;
  __nv_bfloat16* hw = p_hi + warp * kSub * kPLd;
  __nv_bfloat16* lw = p_lo + warp * kSub * kPLd;
  const __nv_bfloat16* qw = qs + warp * kSub * LB;
  // Lane pairs own a row: lane / 2 is the row, lane % 2 the half of its columns.
  const int r = lane / 2, half = lane % 2;
  const int query = q0 + warp * kSub + r;
  for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) ow[r * LA + c] = 0.f;
  float m = -CUDART_INF_F, l = 0.f;

  const int key_tiles = p.causal ? min(blk.tile + 1, p.tiles) : p.tiles;
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K and V
    load_tile<D>(ks, p.k + in_head, p.in_stride, k0, p.steps, p.head_dim);
    load_tile<D>(vs, p.v + in_head, p.in_stride, k0, p.steps, p.head_dim);
    __syncthreads();
    product_abt<D>(sw, qw, ks);
    __syncwarp();

    // Online softmax over this tile's 64 keys (32 per lane of the pair).
    float tile_max = -CUDART_INF_F;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const float s = visible(p, query, k0 + c) ? sw[r * kSLd + c] * p.scale : -CUDART_INF_F;
      sw[r * kSLd + c] = s;
      tile_max = fmaxf(tile_max, s);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(detail::kFullMask, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float base = m_new == -CUDART_INF_F ? 0.f : m_new;  // a row with nothing visible yet
    const float alpha = expf(m - base);
    float sum = 0.f;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const float e = expf(sw[r * kSLd + c] - base);
      sum += e;
      split(e, &hw[r * kPLd + c], &lw[r * kPLd + c]);
    }
    sum += __shfl_xor_sync(detail::kFullMask, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) ow[r * LA + c] *= alpha;
    __syncwarp();

    // O += P V, the accumulator read from and written back to shared memory.
    FragC acc[D / kSub];
#pragma unroll
    for (int dn = 0; dn < D / kSub; ++dn)
      wmma::load_matrix_sync(acc[dn], ow + dn * kSub, LA, wmma::mem_row_major);
    accumulate_split<D>(acc, hw, lw, vs);
#pragma unroll
    for (int dn = 0; dn < D / kSub; ++dn)
      wmma::store_matrix_sync(ow + dn * kSub, acc[dn], LA, wmma::mem_row_major);
    __syncwarp();
  }

  if (query < p.steps) {
    const float inv = 1.f / l;
    const std::int64_t at = head_offset(p, blk.b, blk.h, p.out_stride) +
                            static_cast<std::int64_t>(query) * p.out_stride;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c)
      if (c < p.head_dim) p.o[at + c] = ow[r * LA + c] * inv;
    if (half == 0) p.lse_out[static_cast<std::int64_t>(blk.bh) * p.steps + query] = m + logf(l);
  }
#endif
}

template <int D>
constexpr std::size_t dkv_tc_smem() {
  return 4 * kTile * kRowLd<D> * sizeof(__nv_bfloat16) + 2 * kTile * sizeof(float) +
         kWarps * 2 * kSub * kSLd * sizeof(float) +
         4 * kWarps * kSub * kPLd * sizeof(__nv_bfloat16);
}

// A block owns 64 keys and streams the query tiles that see them: dV = Pᵀ dO, dK = dSᵀ Q · scale.
template <int D>
__global__ __launch_bounds__(kTcThreads) void attention_dkv_tc_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LB = kRowLd<D>;
  auto* ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* vs = ks + kTile * LB;
  __nv_bfloat16* qs = vs + kTile * LB;
  __nv_bfloat16* dos = qs + kTile * LB;
  auto* lses = reinterpret_cast<float*>(dos + kTile * LB);
  float* deltas = lses + kTile;
  float* work = deltas + kTile;  // [warp][2][16][kSLd]: scores, then dP
  auto* tiles16 = reinterpret_cast<__nv_bfloat16*>(work + kWarps * 2 * kSub * kSLd);

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const Block blk = block_of(p, /*reversed=*/false);
  const int k0 = blk.tile * kTile;
  const std::int64_t in_head = head_offset(p, blk.b, blk.h, p.in_stride);
  const std::int64_t out_head = head_offset(p, blk.b, blk.h, p.out_stride);
  load_tile<D>(ks, p.k + in_head, p.in_stride, k0, p.steps, p.head_dim);
  load_tile<D>(vs, p.v + in_head, p.in_stride, k0, p.steps, p.head_dim);

  float* sw = work + warp * 2 * kSub * kSLd;
  float* dpw = sw + kSub * kSLd;
  __nv_bfloat16* p_hi = tiles16 + (warp * 4 + 0) * kSub * kPLd;
  __nv_bfloat16* p_lo = tiles16 + (warp * 4 + 1) * kSub * kPLd;
  __nv_bfloat16* ds_hi = tiles16 + (warp * 4 + 2) * kSub * kPLd;
  __nv_bfloat16* ds_lo = tiles16 + (warp * 4 + 3) * kSub * kPLd;
  const int r = lane / 2, half = lane % 2;
  const int key = k0 + warp * kSub + r;

  FragC dv[D / kSub], dk[D / kSub];
#pragma unroll
  for (int dn = 0; dn < D / kSub; ++dn) {
    wmma::fill_fragment(dv[dn], 0.f);
    wmma::fill_fragment(dk[dn], 0.f);
  }
  const float* lse_head = p.lse + static_cast<std::int64_t>(blk.bh) * p.steps;
  const float* delta_head = p.delta + static_cast<std::int64_t>(blk.bh) * p.steps;
  for (int qt = p.causal ? blk.tile : 0; qt < p.tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // every warp is done with the previous Q and dO
    load_tile<D>(qs, p.q + in_head, p.in_stride, q0, p.steps, p.head_dim);
    load_tile<D>(dos, p.dout + out_head, p.out_stride, q0, p.steps, p.head_dim);
    for (int i = threadIdx.x; i < kTile; i += kTcThreads) {
      const bool inside = q0 + i < p.steps;
      lses[i] = inside ? lse_head[q0 + i] : 0.f;
      deltas[i] = inside ? delta_head[q0 + i] : 0.f;
    }
    __syncthreads();
    product_abt<D>(sw, ks + warp * kSub * LB, qs);    // Sᵀ: this warp's keys × 64 queries
    product_abt<D>(dpw, vs + warp * kSub * LB, dos);  // dPᵀ = V dOᵀ
    __syncwarp();
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const float pr = visible(p, q0 + c, key) ? expf(sw[r * kSLd + c] * p.scale - lses[c]) : 0.f;
      split(pr, &p_hi[r * kPLd + c], &p_lo[r * kPLd + c]);
      split(pr * (dpw[r * kSLd + c] - deltas[c]), &ds_hi[r * kPLd + c], &ds_lo[r * kPLd + c]);
    }
    __syncwarp();
    accumulate_split<D>(dv, p_hi, p_lo, dos);   // dV += Pᵀ dO
    accumulate_split<D>(dk, ds_hi, ds_lo, qs);  // dK += dSᵀ Q
  }
  const std::int64_t grad_head = head_offset(p, blk.b, blk.h, p.grad_stride);
  store_rows<D>(p, dv, sw, p.dv + grad_head, p.grad_stride, k0 + warp * kSub, 1.f);
  store_rows<D>(p, dk, sw, p.dk + grad_head, p.grad_stride, k0 + warp * kSub, p.scale);
#endif
}

template <int D>
constexpr std::size_t dq_tc_smem() {
  return 4 * kTile * kRowLd<D> * sizeof(__nv_bfloat16) + kWarps * 2 * kSub * kSLd * sizeof(float) +
         2 * kWarps * kSub * kPLd * sizeof(__nv_bfloat16);
}

// A block owns 64 queries and streams the key tiles they see: dQ = dS K · scale.
template <int D>
__global__ __launch_bounds__(kTcThreads) void attention_dq_tc_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LB = kRowLd<D>;
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* dos = qs + kTile * LB;
  __nv_bfloat16* ks = dos + kTile * LB;
  __nv_bfloat16* vs = ks + kTile * LB;
  auto* work = reinterpret_cast<float*>(vs + kTile * LB);  // [warp][2][16][kSLd]
  auto* tiles16 = reinterpret_cast<__nv_bfloat16*>(work + kWarps * 2 * kSub * kSLd);

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const Block blk = block_of(p, /*reversed=*/true);
  const int q0 = blk.tile * kTile;
  const std::int64_t in_head = head_offset(p, blk.b, blk.h, p.in_stride);
  load_tile<D>(qs, p.q + in_head, p.in_stride, q0, p.steps, p.head_dim);
  load_tile<D>(dos, p.dout + head_offset(p, blk.b, blk.h, p.out_stride), p.out_stride, q0, p.steps,
               p.head_dim);

  float* sw = work + warp * 2 * kSub * kSLd;
  float* dpw = sw + kSub * kSLd;
  __nv_bfloat16* ds_hi = tiles16 + (warp * 2 + 0) * kSub * kPLd;
  __nv_bfloat16* ds_lo = tiles16 + (warp * 2 + 1) * kSub * kPLd;
  const int r = lane / 2, half = lane % 2;
  const int query = q0 + warp * kSub + r;
  const std::int64_t stat = static_cast<std::int64_t>(blk.bh) * p.steps + query;
  const float lse = query < p.steps ? p.lse[stat] : 0.f;
  const float delta = query < p.steps ? p.delta[stat] : 0.f;

  FragC dq[D / kSub];
#pragma unroll
  for (int dn = 0; dn < D / kSub; ++dn) wmma::fill_fragment(dq[dn], 0.f);
  const int key_tiles = p.causal ? min(blk.tile + 1, p.tiles) : p.tiles;
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    load_tile<D>(ks, p.k + in_head, p.in_stride, k0, p.steps, p.head_dim);
    load_tile<D>(vs, p.v + in_head, p.in_stride, k0, p.steps, p.head_dim);
    __syncthreads();
    product_abt<D>(sw, qs + warp * kSub * LB, ks);    // S
    product_abt<D>(dpw, dos + warp * kSub * LB, vs);  // dP = dO Vᵀ
    __syncwarp();
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const float pr = visible(p, query, k0 + c) ? expf(sw[r * kSLd + c] * p.scale - lse) : 0.f;
      split(pr * (dpw[r * kSLd + c] - delta), &ds_hi[r * kPLd + c], &ds_lo[r * kPLd + c]);
    }
    __syncwarp();
    accumulate_split<D>(dq, ds_hi, ds_lo, ks);  // dQ += dS K
  }
  store_rows<D>(p, dq, sw, p.dq + head_offset(p, blk.b, blk.h, p.grad_stride), p.grad_stride,
                q0 + warp * kSub, p.scale);
#endif
}

}  // namespace

bool attention_bf16_supported() {
  int device = 0, major = 0;
  PIPELINE_CUDA_CHECK(cudaGetDevice(&device));
  PIPELINE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 8;
}

namespace attention {

void forward_wmma(cudaStream_t stream, const Params& p, std::int64_t head_dim, unsigned blocks) {
  with_padded_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    launch(attention_forward_tc_kernel<D>, blocks, kTcThreads, forward_tc_smem<D>(), stream, p);
  });
}

void backward_wmma(cudaStream_t stream, const Params& p, std::int64_t head_dim, unsigned blocks) {
  with_padded_head_dim(head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    launch(attention_dkv_tc_kernel<D>, blocks, kTcThreads, dkv_tc_smem<D>(), stream, p);
    launch(attention_dq_tc_kernel<D>, blocks, kTcThreads, dq_tc_smem<D>(), stream, p);
  });
}

}  // namespace attention

}  // namespace pipeline::kernels
