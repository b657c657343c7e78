// Fused (flash-style) multi-head attention, causal or not, forward and backward, in float32.
//
// What: per (batch, head), O = softmax(Q Kᵀ / √Dh) V with future keys masked when causal, and its
// gradient. Why fused: the T×T score and probability matrices are never written to device
// memory. The forward keeps, per query row, only the log-sum-exp of its scores (lse, [B, H, T]),
// and the backward rebuilds each tile of P = exp(S − lse) from q and k on chip. Memory per head
// is O(T) instead of O(T²): at T = 1024 with 16 heads and batch 16 the probabilities alone would
// be 1 GiB per layer, kept from forward to backward.
//
// Tiling: 256 threads form a 16 × 16 grid (ty, tx); a block owns a tile of 64 rows on one side
// (queries in the forward and the dQ pass, keys in the dK/dV pass) and streams 64- or 32-row
// tiles of the other side through shared memory. Thread (ty, tx) holds a register micro-tile of
// the scores: owned rows ty + 16·i and streamed rows tx + 16·j (interleaved, so the 16 threads
// of a half-warp read 16 consecutive rows of a [rows][D + 1] shared array: distinct banks), and
// of its accumulators (O, dK, dV or dQ): owned rows ty + 16·i, columns tx + 16·k. The head
// dimension is padded with zeros to the kernel's width D (32, 64 or 128), and rows past T with
// zeros, so tails of T and of Dh need no branches in the inner products; masks (key past T, key
// after query) are applied to the scores.
//
// Forward (one block per 64 queries): online softmax over key tiles with a running max m and
// sum l per row (rescaling O by exp(m_old − m_new)); under the causal mask key tiles entirely
// above the diagonal are never visited. A row's max and sum are combined over the 16 threads
// that share it with xor-shuffles inside a half-warp. Output O / l and lse = m + log l.
//
// Backward (FlashAttention-2): first D_i = rowsum(dO_i ⊙ O_i) (= rowsum(dP ⊙ P), one warp per
// row), then two passes, so that every gradient element is summed by one thread in a fixed order
// (deterministic, no atomics): the dK/dV pass owns a key tile and streams the query tiles at or
// below the diagonal (dV += Pᵀ dO, dK += dSᵀ Q · scale, with dP = dO Vᵀ and dS = P ⊙ (dP − D));
// the dQ pass owns a query tile and streams the key tiles (dQ += dS K · scale). That recomputes
// S and dP once more than a single pass with atomic dQ updates would: 7 tile products instead of
// 5, the price of bitwise-reproducible gradients.
#include "attention.cuh"
#include "attention_common.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

#include <math_constants.h>

#include <cstddef>

namespace pipeline::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 16;      // threads sharing an owned row (tx), and owned-row groups (ty)
constexpr int kFwdStream = 64;  // key rows per streamed tile in the forward
constexpr int kBwdStream = 32;  // streamed rows per tile in the backward passes (more arrays)

using attention::Block;
using attention::block_of;
using attention::head_offset;
using attention::kOwnRows;
using attention::Params;
using attention::visible;

// Rows [row0, row0 + Rows) of one head into dst[Rows][D + 1]: zero past `steps` and past
// head_dim. Consecutive threads read consecutive columns (coalesced).
template <int D, int Rows>
__device__ __forceinline__ void load_rows(float* dst, const float* head, std::int64_t stride,
                                          int row0, int steps, int head_dim) {
  constexpr int kLd = D + 1;
  for (int i = threadIdx.x; i < Rows * D; i += kThreads) {
    const int r = i / D, d = i % D;
    const bool inside = row0 + r < steps && d < head_dim;
    dst[r * kLd + d] = inside ? head[static_cast<std::int64_t>(row0 + r) * stride + d] : 0.f;
  }
}

// Entries [row0, row0 + Rows) of a per-row statistic of one head ([T] floats), zero past steps.
template <int Rows>
__device__ __forceinline__ void load_stat(float* dst, const float* src, int row0, int steps) {
  for (int i = threadIdx.x; i < Rows; i += kThreads)
    dst[i] = row0 + i < steps ? src[row0 + i] : 0.f;
}

// Reductions over the 16 threads (one half-warp, consecutive tx) that share an owned row.
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(detail::kFullMask, v, offset));
  return v;
}

__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(detail::kFullMask, v, offset);
  return v;
}

template <int D, int BN>
constexpr std::size_t forward_smem_bytes() {
  return sizeof(float) * (kOwnRows * (D + 1) + BN * (D + 1) + kOwnRows * BN);
}

template <int D, int BN>
constexpr std::size_t dkv_smem_bytes() {
  return sizeof(float) * (2 * kOwnRows * (D + 1) + 2 * BN * (D + 1) + 2 * kOwnRows * BN + 2 * BN);
}

template <int D, int BN>
constexpr std::size_t dq_smem_bytes() {
  return sizeof(float) * (2 * kOwnRows * (D + 1) + 2 * BN * (D + 1) + kOwnRows * BN + 2 * kOwnRows);
}

}  // namespace

// One block per (batch·head, 64-query tile).
template <int D, int BN>
static __global__ __launch_bounds__(kThreads) void attention_forward_kernel(const Params p) {
  constexpr int BM = kOwnRows, TM = BM / kGroup, TN = BN / kGroup, TD = D / kGroup, kLd = D + 1;
  extern __shared__ float smem[];
  float* qs = smem;            // [BM][kLd]
  float* kvs = qs + BM * kLd;  // [BN][kLd]: K, then V of the current key tile
  float* ps = kvs + BN * kLd;  // [BM][BN]: probabilities of the tile (unnormalised)

  const Block bt = block_of(p, /*reversed=*/true);
  const int ty = threadIdx.x / kGroup, tx = threadIdx.x % kGroup;
  const int q0 = bt.tile * BM;
  const std::int64_t in_head = head_offset(p, bt.b, bt.h, p.in_stride);
  load_rows<D, BM>(qs, p.q + in_head, p.in_stride, q0, p.steps, p.head_dim);

  float o[TM][TD], m[TM], l[TM];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    m[i] = -CUDART_INF_F;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < TD; ++c) o[i][c] = 0.f;
  }

  // Causal: keys up to the tile's last query only.
  const int key_end = p.causal ? min(p.steps, q0 + BM) : p.steps;
  for (int k0 = 0; k0 < key_end; k0 += BN) {
    __syncthreads();  // the previous tile's readers of kvs and ps are done (and qs is loaded)
    load_rows<D, BN>(kvs, p.k + in_head, p.in_stride, k0, p.steps, p.head_dim);
    __syncthreads();

    float s[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) s[i][j] = 0.f;
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = qs[(ty + i * kGroup) * kLd + d];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = kvs[(tx + j * kGroup) * kLd + d];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) s[i][j] = fmaf(a[i], b[j], s[i][j]);
    }

    // Online softmax, row by row; every thread of the block runs the shuffles.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int row = ty + i * kGroup;
      float tile_max = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const bool keep = visible(p, q0 + row, k0 + tx + j * kGroup) || q0 + row >= p.steps;
        // Rows past T are padding: keep them finite (their keys are real), never written.
        s[i][j] = keep && k0 + tx + j * kGroup < p.steps ? s[i][j] * p.scale : -CUDART_INF_F;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      const float m_new = fmaxf(m[i], group_max(tile_max));
      // A row with nothing visible yet keeps m = −∞; exp(x − 0) of −∞ scores is then 0, no NaN.
      const float base = m_new == -CUDART_INF_F ? 0.f : m_new;
      const float alpha = expf(m[i] - base);
      float row_sum = 0.f;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        s[i][j] = expf(s[i][j] - base);
        row_sum += s[i][j];
      }
      l[i] = l[i] * alpha + group_sum(row_sum);
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < TD; ++c) o[i][c] *= alpha;
#pragma unroll
      for (int j = 0; j < TN; ++j) ps[row * BN + tx + j * kGroup] = s[i][j];
    }
    __syncthreads();  // every score of the tile was computed from K; P is complete
    load_rows<D, BN>(kvs, p.v + in_head, p.in_stride, k0, p.steps, p.head_dim);
    __syncthreads();

#pragma unroll 4
    for (int c = 0; c < BN; ++c) {
      float a[TM], b[TD];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = ps[(ty + i * kGroup) * BN + c];
#pragma unroll
      for (int k = 0; k < TD; ++k) b[k] = kvs[c * kLd + tx + k * kGroup];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int k = 0; k < TD; ++k) o[i][k] = fmaf(a[i], b[k], o[i][k]);
    }
  }

  const std::int64_t out_head = head_offset(p, bt.b, bt.h, p.out_stride);
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int t = q0 + ty + i * kGroup;
    if (t >= p.steps) continue;
    const float inv = 1.f / l[i];
    float* orow = p.o + out_head + static_cast<std::int64_t>(t) * p.out_stride;
#pragma unroll
    for (int k = 0; k < TD; ++k) {
      const int d = tx + k * kGroup;
      if (d < p.head_dim) orow[d] = o[i][k] * inv;
    }
    if (tx == 0) p.lse_out[static_cast<std::int64_t>(bt.bh) * p.steps + t] = m[i] + logf(l[i]);
  }
}

// delta[b, h, t] = Σ_d dO[b, t, h, d] · O[b, t, h, d]: one warp per row, grid-stride.
static __global__ void attention_delta_kernel(const Params p, std::int64_t rows) {
  const int lane = threadIdx.x % detail::kWarp;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / detail::kWarp);
  for (std::int64_t w =
           (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / detail::kWarp;
       w < rows; w += warps) {
    const std::int64_t bh = w / p.steps;
    const int t = static_cast<int>(w % p.steps);
    const int b = static_cast<int>(bh / p.heads), h = static_cast<int>(bh % p.heads);
    const std::int64_t at =
        head_offset(p, b, h, p.out_stride) + static_cast<std::int64_t>(t) * p.out_stride;
    float acc = 0.f;
    for (int d = lane; d < p.head_dim; d += detail::kWarp) acc += p.dout[at + d] * p.out[at + d];
    acc = detail::warp_sum(acc);
    if (lane == 0) p.delta[w] = acc;
  }
}

// dK and dV of one 64-key tile: streams the query tiles that can see it.
template <int D, int BN>
static __global__ __launch_bounds__(kThreads) void attention_dkv_kernel(const Params p) {
  constexpr int BM = kOwnRows, TM = BM / kGroup, TN = BN / kGroup, TD = D / kGroup, kLd = D + 1;
  extern __shared__ float smem[];
  float* ks = smem;              // [BM][kLd] owned keys
  float* vs = ks + BM * kLd;     // [BM][kLd] owned values
  float* qs = vs + BM * kLd;     // [BN][kLd] streamed queries
  float* dos = qs + BN * kLd;    // [BN][kLd] their output gradients
  float* pts = dos + BN * kLd;   // [BM][BN] Pᵀ of the tile
  float* dsts = pts + BM * BN;   // [BM][BN] dSᵀ of the tile
  float* lses = dsts + BM * BN;  // [BN]
  float* deltas = lses + BN;     // [BN]

  const Block bt = block_of(p, /*reversed=*/false);
  const int ty = threadIdx.x / kGroup, tx = threadIdx.x % kGroup;
  const int k0 = bt.tile * BM;
  const std::int64_t in_head = head_offset(p, bt.b, bt.h, p.in_stride);
  const std::int64_t out_head = head_offset(p, bt.b, bt.h, p.out_stride);
  const float* lse = p.lse + static_cast<std::int64_t>(bt.bh) * p.steps;
  const float* delta = p.delta + static_cast<std::int64_t>(bt.bh) * p.steps;
  load_rows<D, BM>(ks, p.k + in_head, p.in_stride, k0, p.steps, p.head_dim);
  load_rows<D, BM>(vs, p.v + in_head, p.in_stride, k0, p.steps, p.head_dim);

  float dk[TM][TD], dv[TM][TD];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int c = 0; c < TD; ++c) dk[i][c] = dv[i][c] = 0.f;

  // Causal: queries from the tile holding the first key on (earlier ones see none of these keys).
  const int query_begin = p.causal ? k0 / BN * BN : 0;
  for (int q0 = query_begin; q0 < p.steps; q0 += BN) {
    __syncthreads();  // the previous tile's readers are done (and ks, vs are loaded)
    load_rows<D, BN>(qs, p.q + in_head, p.in_stride, q0, p.steps, p.head_dim);
    load_rows<D, BN>(dos, p.dout + out_head, p.out_stride, q0, p.steps, p.head_dim);
    load_stat<BN>(lses, lse, q0, p.steps);
    load_stat<BN>(deltas, delta, q0, p.steps);
    __syncthreads();

    // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ for the tile.
    float st[TM][TN], dpt[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) st[i][j] = dpt[i][j] = 0.f;
#pragma unroll 4
    for (int d = 0; d < D; ++d) {
      float ka[TM], va[TM], qb[TN], ob[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        ka[i] = ks[(ty + i * kGroup) * kLd + d];
        va[i] = vs[(ty + i * kGroup) * kLd + d];
      }
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        qb[j] = qs[(tx + j * kGroup) * kLd + d];
        ob[j] = dos[(tx + j * kGroup) * kLd + d];
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          st[i][j] = fmaf(ka[i], qb[j], st[i][j]);
          dpt[i][j] = fmaf(va[i], ob[j], dpt[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int key = ty + i * kGroup, query = tx + j * kGroup;
        const float prob =
            visible(p, q0 + query, k0 + key) ? expf(st[i][j] * p.scale - lses[query]) : 0.f;
        pts[key * BN + query] = prob;
        dsts[key * BN + query] = prob * (dpt[i][j] - deltas[query]);
      }
    __syncthreads();

    // dV += Pᵀ dO, dK += dSᵀ Q (scaled at the end).
#pragma unroll 4
    for (int r = 0; r < BN; ++r) {
      float pa[TM], da[TM], ob[TD], qb[TD];
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        pa[i] = pts[(ty + i * kGroup) * BN + r];
        da[i] = dsts[(ty + i * kGroup) * BN + r];
      }
#pragma unroll
      for (int c = 0; c < TD; ++c) {
        ob[c] = dos[r * kLd + tx + c * kGroup];
        qb[c] = qs[r * kLd + tx + c * kGroup];
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int c = 0; c < TD; ++c) {
          dv[i][c] = fmaf(pa[i], ob[c], dv[i][c]);
          dk[i][c] = fmaf(da[i], qb[c], dk[i][c]);
        }
    }
  }

  const std::int64_t grad_head = head_offset(p, bt.b, bt.h, p.grad_stride);
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int t = k0 + ty + i * kGroup;
    if (t >= p.steps) continue;
    const std::int64_t at = grad_head + static_cast<std::int64_t>(t) * p.grad_stride;
#pragma unroll
    for (int c = 0; c < TD; ++c) {
      const int d = tx + c * kGroup;
      if (d < p.head_dim) {
        p.dk[at + d] = dk[i][c] * p.scale;
        p.dv[at + d] = dv[i][c];
      }
    }
  }
}

// dQ of one 64-query tile: streams the key tiles it can see.
template <int D, int BN>
static __global__ __launch_bounds__(kThreads) void attention_dq_kernel(const Params p) {
  constexpr int BM = kOwnRows, TM = BM / kGroup, TN = BN / kGroup, TD = D / kGroup, kLd = D + 1;
  extern __shared__ float smem[];
  float* qs = smem;             // [BM][kLd] owned queries
  float* dos = qs + BM * kLd;   // [BM][kLd] their output gradients
  float* ks = dos + BM * kLd;   // [BN][kLd] streamed keys
  float* vs = ks + BN * kLd;    // [BN][kLd] streamed values
  float* dss = vs + BN * kLd;   // [BM][BN] dS of the tile
  float* lses = dss + BM * BN;  // [BM]
  float* deltas = lses + BM;    // [BM]

  const Block bt = block_of(p, /*reversed=*/true);
  const int ty = threadIdx.x / kGroup, tx = threadIdx.x % kGroup;
  const int q0 = bt.tile * BM;
  const std::int64_t in_head = head_offset(p, bt.b, bt.h, p.in_stride);
  const std::int64_t out_head = head_offset(p, bt.b, bt.h, p.out_stride);
  load_rows<D, BM>(qs, p.q + in_head, p.in_stride, q0, p.steps, p.head_dim);
  load_rows<D, BM>(dos, p.dout + out_head, p.out_stride, q0, p.steps, p.head_dim);
  load_stat<BM>(lses, p.lse + static_cast<std::int64_t>(bt.bh) * p.steps, q0, p.steps);
  load_stat<BM>(deltas, p.delta + static_cast<std::int64_t>(bt.bh) * p.steps, q0, p.steps);

  float dq[TM][TD];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int c = 0; c < TD; ++c) dq[i][c] = 0.f;

  const int key_end = p.causal ? min(p.steps, q0 + BM) : p.steps;
  for (int k0 = 0; k0 < key_end; k0 += BN) {
    __syncthreads();  // the previous tile's readers are done (and the owned rows are loaded)
    load_rows<D, BN>(ks, p.k + in_head, p.in_stride, k0, p.steps, p.head_dim);
    load_rows<D, BN>(vs, p.v + in_head, p.in_stride, k0, p.steps, p.head_dim);
    __syncthreads();

    // S = Q Kᵀ and dP = dO Vᵀ for the tile.
    float s[TM][TN], dp[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) s[i][j] = dp[i][j] = 0.f;
#pragma unroll 4
    for (int d = 0; d < D; ++d) {
      float qa[TM], oa[TM], kb[TN], vb[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        qa[i] = qs[(ty + i * kGroup) * kLd + d];
        oa[i] = dos[(ty + i * kGroup) * kLd + d];
      }
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        kb[j] = ks[(tx + j * kGroup) * kLd + d];
        vb[j] = vs[(tx + j * kGroup) * kLd + d];
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          s[i][j] = fmaf(qa[i], kb[j], s[i][j]);
          dp[i][j] = fmaf(oa[i], vb[j], dp[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int query = ty + i * kGroup, key = tx + j * kGroup;
        const float prob =
            visible(p, q0 + query, k0 + key) ? expf(s[i][j] * p.scale - lses[query]) : 0.f;
        dss[query * BN + key] = prob * (dp[i][j] - deltas[query]);
      }
    __syncthreads();

    // dQ += dS K (scaled at the end).
#pragma unroll 4
    for (int c = 0; c < BN; ++c) {
      float da[TM], kb[TD];
#pragma unroll
      for (int i = 0; i < TM; ++i) da[i] = dss[(ty + i * kGroup) * BN + c];
#pragma unroll
      for (int k = 0; k < TD; ++k) kb[k] = ks[c * kLd + tx + k * kGroup];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int k = 0; k < TD; ++k) dq[i][k] = fmaf(da[i], kb[k], dq[i][k]);
    }
  }

  const std::int64_t grad_head = head_offset(p, bt.b, bt.h, p.grad_stride);
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int t = q0 + ty + i * kGroup;
    if (t >= p.steps) continue;
    const std::int64_t at = grad_head + static_cast<std::int64_t>(t) * p.grad_stride;
#pragma unroll
    for (int k = 0; k < TD; ++k) {
      const int d = tx + k * kGroup;
      if (d < p.head_dim) p.dq[at + d] = dq[i][k] * p.scale;
    }
  }
}

namespace {

template <int D>
void forward_padded(cudaStream_t stream, const Params& p, unsigned blocks) {
  attention::launch(attention_forward_kernel<D, kFwdStream>, blocks, kThreads,
                    forward_smem_bytes<D, kFwdStream>(), stream, p);
}

template <int D>
void backward_padded(cudaStream_t stream, const Params& p, unsigned blocks) {
  attention::launch(attention_dkv_kernel<D, kBwdStream>, blocks, kThreads,
                    dkv_smem_bytes<D, kBwdStream>(), stream, p);
  attention::launch(attention_dq_kernel<D, kBwdStream>, blocks, kThreads,
                    dq_smem_bytes<D, kBwdStream>(), stream, p);
}

}  // namespace

void attention_row_dots(cudaStream_t stream, const AttentionProblem& pr, const float* out,
                        const float* dout, std::int64_t out_stride, float* delta) {
  if (attention::empty(pr)) return;
  Params p = attention::problem_params(pr);
  p.out = out;
  p.dout = dout;
  p.out_stride = out_stride;
  p.delta = delta;
  const std::int64_t rows = pr.batch * pr.heads * pr.steps;
  constexpr int kDeltaThreads = 256;
  attention_delta_kernel<<<detail::grid_for(rows, kDeltaThreads / detail::kWarp), kDeltaThreads, 0,
                           stream>>>(p, rows);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void attention_forward(cudaStream_t stream, const AttentionProblem& pr, const float* q,
                       const float* k, const float* v, std::int64_t in_stride, float* out,
                       std::int64_t out_stride, float* lse) {
  if (attention::empty(pr)) return;
  const Params p = attention::forward_params(pr, q, k, v, in_stride, out, out_stride, lse);
  const unsigned blocks = attention::tile_blocks(pr);
  if (pr.bf16_operands && attention_bf16_supported()) {
    if (pr.mma)
      attention::forward_mma(stream, p, pr.head_dim, blocks, pr.rounded_probabilities);
    else
      attention::forward_wmma(stream, p, pr.head_dim, blocks);
    return;
  }
  attention::with_padded_head_dim(
      pr.head_dim, [&](auto d) { forward_padded<decltype(d)::value>(stream, p, blocks); });
}

void attention_backward(cudaStream_t stream, const AttentionProblem& pr, const float* q,
                        const float* k, const float* v, std::int64_t in_stride, const float* out,
                        const float* dout, std::int64_t out_stride, const float* lse, float* dq,
                        float* dk, float* dv, std::int64_t grad_stride, float* workspace) {
  if (attention::empty(pr)) return;
  const Params p = attention::backward_params(pr, q, k, v, in_stride, out, dout, out_stride, lse,
                                              dq, dk, dv, grad_stride, workspace);
  attention_row_dots(stream, pr, out, dout, out_stride, workspace);
  const unsigned blocks = attention::tile_blocks(pr);
  if (pr.bf16_operands && attention_bf16_supported()) {
    if (pr.mma)
      attention::backward_mma(stream, p, pr.head_dim, blocks, pr.rounded_probabilities);
    else
      attention::backward_wmma(stream, p, pr.head_dim, blocks);
    return;
  }
  attention::with_padded_head_dim(
      pr.head_dim, [&](auto d) { backward_padded<decltype(d)::value>(stream, p, blocks); });
}

bool attention_reads_bf16(const AttentionProblem& pr, const void* q, const void* k, const void* v,
                          std::int64_t in_stride) {
  const auto aligned8 = [](const void* x) { return reinterpret_cast<std::uintptr_t>(x) % 8 == 0; };
  return pr.bf16_operands && pr.mma && pr.head_dim % 4 == 0 && in_stride % 4 == 0 && aligned8(q) &&
         aligned8(k) && aligned8(v) && attention_bf16_supported();
}

void attention_forward(cudaStream_t stream, const AttentionProblem& pr, const std::uint16_t* q,
                       const std::uint16_t* k, const std::uint16_t* v, std::int64_t in_stride,
                       float* out, std::int64_t out_stride, float* lse) {
  if (attention::empty(pr)) return;
  Params p =
      attention::forward_params(pr, nullptr, nullptr, nullptr, in_stride, out, out_stride, lse);
  p.q16 = q, p.k16 = k, p.v16 = v;
  attention::forward_mma(stream, p, pr.head_dim, attention::tile_blocks(pr),
                         pr.rounded_probabilities);
}

void attention_backward(cudaStream_t stream, const AttentionProblem& pr, const std::uint16_t* q,
                        const std::uint16_t* k, const std::uint16_t* v, std::int64_t in_stride,
                        const float* out, const float* dout, std::int64_t out_stride,
                        const float* lse, float* dq, float* dk, float* dv, std::int64_t grad_stride,
                        float* workspace) {
  if (attention::empty(pr)) return;
  Params p = attention::backward_params(pr, nullptr, nullptr, nullptr, in_stride, out, dout,
                                        out_stride, lse, dq, dk, dv, grad_stride, workspace);
  p.q16 = q, p.k16 = k, p.v16 = v;
  attention_row_dots(stream, pr, out, dout, out_stride, workspace);
  attention::backward_mma(stream, p, pr.head_dim, attention::tile_blocks(pr),
                          pr.rounded_probabilities);
}

}  // namespace pipeline::kernels
