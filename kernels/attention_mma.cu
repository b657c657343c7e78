// Fused attention on the bf16 tensor cores with the operands and results of every tile product
// in registers (FlashAttention-2's layout), the default implementation of attention_bf16.cu's
// contract (ops::set_bf16_attention_kernel; PIPELINE_BF16_ATTENTION=wmma picks the other).
//
// Why: the WMMA kernels write each 16×64 score tile to shared memory and compute its softmax with
// 32 lanes over 1024 scores, which bounds them by those instructions (bench/RESULTS.md). Here
// each product is mma.sync.m16n8k16 (bf16 inputs, fp32 accumulators) whose fragment layout the
// PTX ISA fixes: with g = lane / 4 and t = lane % 4, an accumulator tile of 16×8 holds rows g and
// g + 8, columns 2t and 2t + 1, in c[0..1] and c[2..3]; an A tile of 16×16 holds (row g, columns
// 2t..2t+1), (row g + 8, same), (row g, columns 2t+8..2t+9), (row g + 8, same); a B tile of 16×8
// (k × n) holds (k 2t..2t+1, n g) and (k 2t+8..2t+9, n g). So a thread's scores of two adjacent
// 8-key tiles are exactly its A fragment of the P·V product over those 16 keys: the softmax runs
// on the accumulators, four threads share a row (two shuffles per reduction), and P never leaves
// the registers. Every tile sits in shared memory row-major, one row per key or query; fragments
// come out of it by ldmatrix (four 8×8 matrices an instruction), with .trans for the B operands
// whose pairs run down the tile's columns (V in P·V, Q and dO in the dK/dV products, K in dS·K).
// (Those were kept as transposed copies before, whose 2-byte stores down a column hit two banks
// out of 32.) Numerics as attention_bf16.cu: bf16 operands, fp32 softmax and accumulators, P and
// dS split in two bf16 halves — or, with AttentionProblem::rounded_probabilities, rounded to bf16
// as FlashAttention and torch.autocast do (half the tensor-core work of the products that read
// them, fewer registers, results within bf16 rounding of the split ones).
#include "attention.cuh"
#include "attention_common.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

#include <cuda_bf16.h>
#include <math_constants.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace pipeline::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * detail::kWarp;
constexpr int kTile = 64;             // rows a block owns, and rows of each streamed tile
static_assert(kTile == attention::kOwnRows, "the grid has one block per owned 64-row tile");
constexpr int kKeyTiles = kTile / 8;  // 8-wide accumulator tiles across a streamed tile

// bf16 per row of a tile [64][D + 8]: the 8 bf16 of padding put ldmatrix's eight 16-byte rows
// (and the tile loads' rows) in different banks.
template <int D>
constexpr int kRowLd = D + 8;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using attention::Block;
using attention::block_of;
using attention::head_offset;
using attention::Params;
using attention::visible;

// Rows [row0, row0 + 64) of one head as bf16 into dst[64][D + 8], zero past `steps` and
// head_dim. Four elements per load where the head's rows allow it (aligned to four elements,
// head_dim and stride multiples of 4: every packed qkv of a model whose head width is), else one
// at a time. In: float (rounded to bf16 here) or __nv_bfloat16 (copied as it is).
template <int D, typename In>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, const In* head, std::int64_t stride,
                                          int row0, int steps, int head_dim) {
  // bf16 heads always are (attention_reads_bf16).
  const bool by_four = std::is_same_v<In, __nv_bfloat16> ||
                       (head_dim % 4 == 0 && stride % 4 == 0 &&
                        reinterpret_cast<std::uintptr_t>(head) % (4 * sizeof(In)) == 0);
  if (by_four) {
    // Each thread's loads in batches whose loads are all issued before the first is used: a
    // loop that converts each load before the next waits out the latency once per load.
    constexpr int kQuads = D / 4;  // four-element groups per padded row
    constexpr int kPerThread = kTile * kQuads / kThreads;
    static_assert(kTile * kQuads % kThreads == 0, "whole groups per thread");
    constexpr int kBatch = kPerThread < 4 ? kPerThread : 4;  // registers
    using Group = std::conditional_t<std::is_same_v<In, float>, float4, uint2>;
#pragma unroll
    for (int b = 0; b < kPerThread; b += kBatch) {
      Group x[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = threadIdx.x + (b + j) * kThreads, r = i / kQuads, d = i % kQuads * 4;
        x[j] = Group{};
        if (row0 + r < steps && d < head_dim)  // d < head_dim: all four, as head_dim % 4 == 0
          x[j] = *reinterpret_cast<const Group*>(head +
                                                 static_cast<std::int64_t>(row0 + r) * stride + d);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = threadIdx.x + (b + j) * kThreads, r = i / kQuads, d = i % kQuads * 4;
        uint2 w;
        if constexpr (std::is_same_v<In, float>) {
          const __nv_bfloat162 lo = __floats2bfloat162_rn(x[j].x, x[j].y),
                               hi = __floats2bfloat162_rn(x[j].z, x[j].w);
          w.x = *reinterpret_cast<const std::uint32_t*>(&lo);
          w.y = *reinterpret_cast<const std::uint32_t*>(&hi);
        } else {
          w = x[j];
        }
        *reinterpret_cast<uint2*>(dst + r * kRowLd<D> + d) = w;  // 8-byte aligned: d % 4 == 0
      }
    }
    return;
  }
  if constexpr (std::is_same_v<In, float>) {  // (bf16 heads returned above)
    for (int i = threadIdx.x; i < kTile * D; i += kThreads) {
      const int r = i / D, d = i % D;
      const bool inside = row0 + r < steps && d < head_dim;
      dst[r * kRowLd<D> + d] = __float2bfloat16_rn(
          inside ? head[static_cast<std::int64_t>(row0 + r) * stride + d] : 0.f);
    }
  }
}

// Asynchronous copies into shared memory (cp.async): `bytes` of `src` land at `dst`, the rest of
// `size` bytes zero-filled (bytes 0: src is not read).
template <int size>
__device__ __forceinline__ void copy_async(void* dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto at = static_cast<std::uint32_t>(__cvta_generic_to_shared(dst));
  if constexpr (size == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src), "r"(bytes));
  else if constexpr (size == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(at), "l"(src), "r"(bytes));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(at), "l"(src), "r"(bytes));
#endif
}

__device__ __forceinline__ void copies_issued() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

__device__ __forceinline__ void copies_landed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Tiles staged ahead as float32: both streamed tiles up to 64 wide; at 128 only the first (the
// second is loaded when needed), so that two blocks still share an SM.
template <int D>
constexpr int kStagedTiles = D <= 64 ? 2 : 1;

template <int D>
constexpr std::size_t staging_bytes() {
  return static_cast<std::size_t>(kStagedTiles<D>) * kTile * D * sizeof(float);
}

// The two tiles a kernel streams (K and V, or Q and dO), 64 rows at a time: the next rows are
// copied into shared staging (cp.async) while the warps compute on the current ones, and moved
// into the bf16 tiles once they have landed: float32 rows converted, bf16 rows copied as they
// are. Each thread moves the four-element slots it copied itself, so no barrier stands between a
// copy's arrival and its move. float32 heads whose rows are not 16-byte aligned are copied a
// float at a time into the same slots (bf16 heads always are 8-byte aligned:
// attention_reads_bf16). A and B: the two sources' element types (float or __nv_bfloat16).
template <int D, typename A, typename B>
struct TileStream {
  template <typename T>
  struct Source {
    const T* head;
    std::int64_t stride;
  };
  Source<A> first;
  Source<B> second;
  __nv_bfloat16* first_tile;
  __nv_bfloat16* second_tile;
  float* staging;  // [kStagedTiles][64][D] floats (bf16 slots use the first half of their bytes)
  int steps, head_dim;

  static constexpr int kSlots = kTile * D / 4 / kThreads;  // four-element slots per thread per tile
  static_assert(kTile * D / 4 % kThreads == 0, "whole slots per thread");

  // Starts copying rows [row0, row0 + 64) of the staged tiles.
  __device__ void issue(int row0) const {
    stage(first, staging, row0);
    if constexpr (kStagedTiles<D> == 2) stage(second, staging + kTile * D, row0);
    copies_issued();
  }

  // Rows [row0, row0 + 64) into the bf16 tiles (those issued, and the unstaged one loaded now).
  __device__ void land(int row0) const {
    copies_landed();
    move(first, staging, first_tile);
    if constexpr (kStagedTiles<D> == 2)
      move(second, staging + kTile * D, second_tile);
    else
      load_tile<D>(second_tile, second.head, second.stride, row0, steps, head_dim);
  }

 private:
  template <typename T>
  __device__ void stage(const Source<T>& src, float* dst, int row0) const {
    [[maybe_unused]] const bool four = head_dim % 4 == 0 && src.stride % 4 == 0 &&
                                       reinterpret_cast<std::uintptr_t>(src.head) % 16 == 0;
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int i = threadIdx.x + j * kThreads, r = i / (D / 4), d = i % (D / 4) * 4;
      const bool row_inside = row0 + r < steps;
      const T* from = src.head + static_cast<std::int64_t>(row0 + r) * src.stride + d;
      if constexpr (std::is_same_v<T, float>) {
        if (four) {
          const bool inside = row_inside && d < head_dim;  // all four, as head_dim % 4 == 0
          copy_async<16>(dst + 4 * i, inside ? from : src.head, inside ? 16 : 0);
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const bool inside = row_inside && d + c < head_dim;
            copy_async<4>(dst + 4 * i + c, inside ? from + c : src.head, inside ? 4 : 0);
          }
        }
      } else {
        const bool inside = row_inside && d < head_dim;
        copy_async<8>(dst + 4 * i, inside ? from : src.head, inside ? 8 : 0);
      }
    }
  }

  template <typename T>
  __device__ void move(const Source<T>&, const float* staged, __nv_bfloat16* tile) const {
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int i = threadIdx.x + j * kThreads, r = i / (D / 4), d = i % (D / 4) * 4;
      uint2 w;
      if constexpr (std::is_same_v<T, float>) {
        const float4 x = *reinterpret_cast<const float4*>(staged + 4 * i);
        const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y),
                             hi = __floats2bfloat162_rn(x.z, x.w);
        w.x = *reinterpret_cast<const std::uint32_t*>(&lo);
        w.y = *reinterpret_cast<const std::uint32_t*>(&hi);
      } else {
        w = *reinterpret_cast<const uint2*>(staged + 4 * i);
      }
      *reinterpret_cast<uint2*>(tile + r * kRowLd<D> + d) = w;
    }
  }
};

// q, k or v as the kernels read it: its float32 pointer, or its bf16 one (Params::q16, k16, v16).
template <typename In>
__device__ __forceinline__ const In* operand(const float* f32, const std::uint16_t* b16) {
  if constexpr (std::is_same_v<In, float>)
    return f32;
  else
    return reinterpret_cast<const In*>(b16);
}

// The K and V rows a block of queries streams (the forward's and dQ's), into ks and vs.
template <int D, typename In>
__device__ TileStream<D, In, In> key_value_stream(const Params& p, std::int64_t in_head,
                                                  __nv_bfloat16* ks, __nv_bfloat16* vs,
                                                  float* staging) {
  return {{operand<In>(p.k, p.k16) + in_head, p.in_stride},
          {operand<In>(p.v, p.v16) + in_head, p.in_stride},
          ks,
          vs,
          staging,
          p.steps,
          p.head_dim};
}

// Whether every (query, key) of a 64 × 64 tile pair is visible: no mask to apply.
__device__ __forceinline__ bool all_visible(const Params& p, int q0, int k0) {
  return q0 + kTile <= p.steps && k0 + kTile <= p.steps && (!p.causal || k0 + kTile - 1 <= q0);
}

__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// x0 and x1 (adjacent columns) as the high halves' word and the residuals' word.
__device__ __forceinline__ void split_pack(float x0, float x1, std::uint32_t& hi,
                                           std::uint32_t& lo) {
  const float h0 = __bfloat162float(__float2bfloat16_rn(x0));
  const float h1 = __bfloat162float(__float2bfloat16_rn(x1));
  hi = pack(h0, h1);
  lo = pack(x0 - h0, x1 - h1);
}

// d += a · b for one 16×8×16 tile.
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4],
                                    const std::uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Four 8×8 bf16 matrices of shared memory, lane l giving the address of row l % 8 of matrix
// l / 8 (16 bytes, 16-byte aligned); `transposed`: each thread gets its pairs down the columns.
template <bool transposed>
__device__ __forceinline__ void load_matrices(std::uint32_t (&r)[4], const __nv_bfloat16* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto at = static_cast<std::uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (transposed)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
#endif
}

// The A fragment of rows row0.. (16) and columns col0.. (16) of a tile: matrices (rows 0-7,
// columns 0-7), (rows 8-15, 0-7), (rows 0-7, 8-15), (rows 8-15, 8-15) are a[0..3].
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const __nv_bfloat16* tile, int ld,
                                       int row0, int col0) {
  const int lane = threadIdx.x % detail::kWarp;
  load_matrices<false>(a, tile + (row0 + lane % 8 + lane / 8 % 2 * 8) * ld + col0 + lane / 16 * 8);
}

// The B fragments (k × n = 16 × 8) of two adjacent n tiles, n0.. and n0 + 8.., whose element
// (k, n) is tile[n][k0 + k]: a tile with n along its rows (K in Q·Kᵀ). b0's words come from
// (rows n0.., columns k0..) and (rows n0.., k0 + 8..), b1's from the same 8 rows further down.
__device__ __forceinline__ void load_b_pair(std::uint32_t (&b0)[2], std::uint32_t (&b1)[2],
                                            const __nv_bfloat16* tile, int ld, int n0, int k0) {
  const int lane = threadIdx.x % detail::kWarp;
  std::uint32_t r[4];
  load_matrices<false>(r, tile + (n0 + lane % 8 + lane / 16 * 8) * ld + k0 + lane / 8 % 2 * 8);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// The B fragments of two adjacent n tiles whose element (k, n) is tile[k0 + k][n]: a tile with k
// along its rows (V in P·V), read transposed. b0 from (rows k0.., columns n0..) and (rows
// k0 + 8.., n0..), b1 from the same rows 8 columns on.
__device__ __forceinline__ void load_b_pair_down(std::uint32_t (&b0)[2], std::uint32_t (&b1)[2],
                                                 const __nv_bfloat16* tile, int ld, int k0,
                                                 int n0) {
  const int lane = threadIdx.x % detail::kWarp;
  std::uint32_t r[4];
  load_matrices<true>(r, tile + (k0 + lane % 8 + lane / 8 % 2 * 8) * ld + n0 + lane / 16 * 8);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// acc[n] (16 rows × 64 columns as 8 accumulator tiles) = A[16 rows][D] · B[64][D]ᵀ, A the rows
// row0.. of a row-major tile, B a row-major tile.
template <int D>
__device__ __forceinline__ void scores(float (&acc)[kKeyTiles][4], const __nv_bfloat16* a_tile,
                                       int row0, const __nv_bfloat16* b_tile) {
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[4];
    load_a(a, a_tile, kRowLd<D>, row0, kk * 16);
#pragma unroll
    for (int n = 0; n < kKeyTiles; n += 2) {
      std::uint32_t b0[2], b1[2];
      load_b_pair(b0, b1, b_tile, kRowLd<D>, n * 8, kk * 16);
      mma(acc[n], a, b0);
      mma(acc[n + 1], a, b1);
    }
  }
}

// out[dn] (16 × D as D/8 accumulator tiles) += X · B, X the 16 × 64 fp32 values of `x` (the
// accumulator layout of `scores`) split in bf16 halves — or, `kRounded`, rounded to bf16 — and
// B[64][D] a tile.
template <int D, bool kRounded>
__device__ __forceinline__ void accumulate(float (&out)[D / 8][4], const float (&x)[kKeyTiles][4],
                                           const __nv_bfloat16* b_tile) {
#pragma unroll
  for (int j = 0; j < kTile / 16; ++j) {
    std::uint32_t hi[4];
    [[maybe_unused]] std::uint32_t lo[4];
    if constexpr (kRounded) {
      hi[0] = pack(x[2 * j][0], x[2 * j][1]);
      hi[1] = pack(x[2 * j][2], x[2 * j][3]);
      hi[2] = pack(x[2 * j + 1][0], x[2 * j + 1][1]);
      hi[3] = pack(x[2 * j + 1][2], x[2 * j + 1][3]);
    } else {
      split_pack(x[2 * j][0], x[2 * j][1], hi[0], lo[0]);
      split_pack(x[2 * j][2], x[2 * j][3], hi[1], lo[1]);
      split_pack(x[2 * j + 1][0], x[2 * j + 1][1], hi[2], lo[2]);
      split_pack(x[2 * j + 1][2], x[2 * j + 1][3], hi[3], lo[3]);
    }
#pragma unroll
    for (int dn = 0; dn < D / 8; dn += 2) {
      std::uint32_t b0[2], b1[2];
      load_b_pair_down(b0, b1, b_tile, kRowLd<D>, j * 16, dn * 8);
      mma(out[dn], hi, b0);
      if constexpr (!kRounded) mma(out[dn], lo, b0);
      mma(out[dn + 1], hi, b1);
      if constexpr (!kRounded) mma(out[dn + 1], lo, b1);
    }
  }
}

// Writes a warp's 16 × D accumulator (times `scale`) to rows row0.. of a [B·T, *] head; rows
// past steps and columns past head_dim are left alone.
template <int D>
__device__ __forceinline__ void store_rows(const Params& p, const float (&acc)[D / 8][4],
                                           float* head, std::int64_t stride, int row0,
                                           float scale) {
  const int g = threadIdx.x % detail::kWarp / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + g + (i >= 2 ? 8 : 0), col = dn * 8 + 2 * t + (i & 1);
      if (row < p.steps && col < p.head_dim)
        head[static_cast<std::int64_t>(row) * stride + col] = acc[dn][i] * scale;
    }
}

template <int D>
constexpr std::size_t forward_smem() {
  return 3 * kTile * kRowLd<D> * sizeof(__nv_bfloat16) + staging_bytes<D>();
}

template <int D, bool kRounded, typename In>
__global__ __launch_bounds__(kThreads) void attention_forward_mma_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* ks = qs + kTile * kRowLd<D>;
  __nv_bfloat16* vs = ks + kTile * kRowLd<D>;
  auto* staging = reinterpret_cast<float*>(vs + kTile * kRowLd<D>);

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int g = lane / 4, t = lane % 4;
  const Block blk = block_of(p, /*reversed=*/true);
  const int q0 = blk.tile * kTile;
  const std::int64_t in_head = head_offset(p, blk.b, blk.h, p.in_stride);
  const auto kv = key_value_stream<D, In>(p, in_head, ks, vs, staging);
  kv.issue(0);
  load_tile<D>(qs, operand<In>(p.q, p.q16) + in_head, p.in_stride, q0, p.steps, p.head_dim);
  const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

  // The softmax in base 2 (scores times scale · log2 e; exp2 is one instruction): the same
  // probabilities, and m + log2(l) times ln 2 is the natural log-sum-exp the backward reads.
  const float scale2 = p.scale * kLog2e;
  float o[D / 8][4] = {};
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.f, 0.f};
  const int key_tiles = p.causal ? min(blk.tile + 1, p.tiles) : p.tiles;
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K and V
    kv.land(k0);
    __syncthreads();
    if (kt + 1 < key_tiles) kv.issue(k0 + kTile);  // copied while these are used

    float s[kKeyTiles][4];
    scores<D>(s, qs, warp * 16, ks);
    float tile_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
    const bool unmasked = all_visible(p, q0, k0);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + n * 8 + 2 * t + (i & 1);
        s[n][i] = unmasked || visible(p, rows[i / 2], key) ? s[n][i] * scale2 : -CUDART_INF_F;
        tile_max[i / 2] = fmaxf(tile_max[i / 2], s[n][i]);
      }
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(detail::kFullMask, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(detail::kFullMask, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      base[r] = m_new == -CUDART_INF_F ? 0.f : m_new;  // a row with nothing visible yet
      alpha[r] = exp2f(m[r] - base[r]);
      m[r] = m_new;
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[n][i] = exp2f(s[n][i] - base[i / 2]);
        sum[i / 2] += s[n][i];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(detail::kFullMask, sum[r], 1);
      sum[r] += __shfl_xor_sync(detail::kFullMask, sum[r], 2);
      l[r] = l[r] * alpha[r] + sum[r];
    }
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      o[dn][0] *= alpha[0];
      o[dn][1] *= alpha[0];
      o[dn][2] *= alpha[1];
      o[dn][3] *= alpha[1];
    }
    accumulate<D, kRounded>(o, s, vs);  // O += P V
  }

  const std::int64_t out_head = head_offset(p, blk.b, blk.h, p.out_stride);
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = rows[i / 2], col = dn * 8 + 2 * t + (i & 1);
      if (row < p.steps && col < p.head_dim)
        p.o[out_head + static_cast<std::int64_t>(row) * p.out_stride + col] = o[dn][i] / l[i / 2];
    }
  if (t == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (rows[r] < p.steps)
        p.lse_out[static_cast<std::int64_t>(blk.bh) * p.steps + rows[r]] =
            (m[r] + log2f(l[r])) * kLn2;
}

template <int D>
constexpr std::size_t dkv_smem() {
  return 4 * kTile * kRowLd<D> * sizeof(__nv_bfloat16) + staging_bytes<D>() +
         2 * kTile * sizeof(float);
}

// A block owns 64 keys (a warp 16) and streams the query tiles that see them: with Sᵀ = K Qᵀ and
// dPᵀ = V dOᵀ in the accumulators, dV += Pᵀ dO and dK += dSᵀ Q · scale.
template <int D, bool kRounded, typename In>
__global__ __launch_bounds__(kThreads) void attention_dkv_mma_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  auto* ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* vs = ks + kTile * kRowLd<D>;
  __nv_bfloat16* qs = vs + kTile * kRowLd<D>;
  __nv_bfloat16* dos = qs + kTile * kRowLd<D>;
  auto* staging = reinterpret_cast<float*>(dos + kTile * kRowLd<D>);
  float* lses = staging + staging_bytes<D>() / sizeof(float);
  float* deltas = lses + kTile;

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int g = lane / 4, t = lane % 4;
  const Block blk = block_of(p, /*reversed=*/false);
  const int k0 = blk.tile * kTile;
  const std::int64_t in_head = head_offset(p, blk.b, blk.h, p.in_stride);
  const std::int64_t out_head = head_offset(p, blk.b, blk.h, p.out_stride);
  const TileStream<D, In, float> qdo{{operand<In>(p.q, p.q16) + in_head, p.in_stride},
                                     {p.dout + out_head, p.out_stride},
                                     qs,
                                     dos,
                                     staging,
                                     p.steps,
                                     p.head_dim};
  const int first_q_tile = p.causal ? blk.tile : 0;
  qdo.issue(first_q_tile * kTile);
  load_tile<D>(ks, operand<In>(p.k, p.k16) + in_head, p.in_stride, k0, p.steps, p.head_dim);
  load_tile<D>(vs, operand<In>(p.v, p.v16) + in_head, p.in_stride, k0, p.steps, p.head_dim);
  const int keys[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};

  const float scale2 = p.scale * kLog2e;
  float dv[D / 8][4] = {}, dk[D / 8][4] = {};
  const float* lse_head = p.lse + static_cast<std::int64_t>(blk.bh) * p.steps;
  const float* delta_head = p.delta + static_cast<std::int64_t>(blk.bh) * p.steps;
  for (int qt_index = first_q_tile; qt_index < p.tiles; ++qt_index) {
    const int q0 = qt_index * kTile;
    __syncthreads();  // every warp is done with the previous Q and dO
    qdo.land(q0);
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      const bool inside = q0 + i < p.steps;
      lses[i] = inside ? lse_head[q0 + i] * kLog2e : 0.f;  // base 2, as the forward
      deltas[i] = inside ? delta_head[q0 + i] : 0.f;
    }
    __syncthreads();
    if (qt_index + 1 < p.tiles) qdo.issue(q0 + kTile);  // copied while these are used
    float st[kKeyTiles][4], dpt[kKeyTiles][4];
    scores<D>(st, ks, warp * 16, qs);    // Sᵀ: this warp's keys × 64 queries
    scores<D>(dpt, vs, warp * 16, dos);  // dPᵀ = V dOᵀ
    const bool unmasked = all_visible(p, q0, k0);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = n * 8 + 2 * t + (i & 1);  // the query, within the tile
        const float pr =
            unmasked || visible(p, q0 + c, keys[i / 2]) ? exp2f(st[n][i] * scale2 - lses[c]) : 0.f;
        st[n][i] = pr;                             // Pᵀ
        dpt[n][i] = pr * (dpt[n][i] - deltas[c]);  // dSᵀ
      }
    accumulate<D, kRounded>(dv, st, dos);  // dV += Pᵀ dO
    accumulate<D, kRounded>(dk, dpt, qs);  // dK += dSᵀ Q
  }
  const std::int64_t grad_head = head_offset(p, blk.b, blk.h, p.grad_stride);
  store_rows<D>(p, dv, p.dv + grad_head, p.grad_stride, k0 + warp * 16, 1.f);
  store_rows<D>(p, dk, p.dk + grad_head, p.grad_stride, k0 + warp * 16, p.scale);
}

template <int D>
constexpr std::size_t dq_smem() {
  return 4 * kTile * kRowLd<D> * sizeof(__nv_bfloat16) + staging_bytes<D>();
}

// A block owns 64 queries (a warp 16) and streams the key tiles they see: with S = Q Kᵀ and
// dP = dO Vᵀ in the accumulators, dQ += dS K · scale.
template <int D, bool kRounded, typename In>
__global__ __launch_bounds__(kThreads, D <= 64 ? 3 : 1) void attention_dq_mma_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* dos = qs + kTile * kRowLd<D>;
  __nv_bfloat16* ks = dos + kTile * kRowLd<D>;
  __nv_bfloat16* vs = ks + kTile * kRowLd<D>;
  auto* staging = reinterpret_cast<float*>(vs + kTile * kRowLd<D>);

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int g = lane / 4, t = lane % 4;
  const Block blk = block_of(p, /*reversed=*/true);
  const int q0 = blk.tile * kTile;
  const std::int64_t in_head = head_offset(p, blk.b, blk.h, p.in_stride);
  const auto kv = key_value_stream<D, In>(p, in_head, ks, vs, staging);
  kv.issue(0);
  load_tile<D>(qs, operand<In>(p.q, p.q16) + in_head, p.in_stride, q0, p.steps, p.head_dim);
  load_tile<D>(dos, p.dout + head_offset(p, blk.b, blk.h, p.out_stride), p.out_stride, q0, p.steps,
               p.head_dim);
  const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float lse[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t at = static_cast<std::int64_t>(blk.bh) * p.steps + rows[r];
    lse[r] = rows[r] < p.steps ? p.lse[at] * kLog2e : 0.f;  // base 2, as the forward
    delta[r] = rows[r] < p.steps ? p.delta[at] : 0.f;
  }

  const float scale2 = p.scale * kLog2e;
  float dq[D / 8][4] = {};
  const int key_tiles = p.causal ? min(blk.tile + 1, p.tiles) : p.tiles;
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K and V
    kv.land(k0);
    __syncthreads();
    if (kt + 1 < key_tiles) kv.issue(k0 + kTile);  // copied while these are used
    float s[kKeyTiles][4], dp[kKeyTiles][4];
    scores<D>(s, qs, warp * 16, ks);    // S
    scores<D>(dp, dos, warp * 16, vs);  // dP = dO Vᵀ
    const bool unmasked = all_visible(p, q0, k0);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + n * 8 + 2 * t + (i & 1);
        const float pr =
            unmasked || visible(p, rows[i / 2], key) ? exp2f(s[n][i] * scale2 - lse[i / 2]) : 0.f;
        dp[n][i] = pr * (dp[n][i] - delta[i / 2]);  // dS
      }
    accumulate<D, kRounded>(dq, dp, ks);  // dQ += dS K
  }
  store_rows<D>(p, dq, p.dq + head_offset(p, blk.b, blk.h, p.grad_stride), p.grad_stride,
                q0 + warp * 16, p.scale);
}

}  // namespace

namespace attention {

// Runs fn with std::bool_constant<rounded>.
template <typename F>
void with_rounding(bool rounded, F&& fn) {
  if (rounded)
    fn(std::true_type{});
  else
    fn(std::false_type{});
}

// Runs fn with the kernels' input type: __nv_bfloat16 when q, k and v are held in bf16.
template <typename F>
void with_inputs(const Params& p, F&& fn) {
  if (p.q16 != nullptr)
    fn(__nv_bfloat16{});
  else
    fn(float{});
}

void forward_mma(cudaStream_t stream, const Params& p, std::int64_t head_dim, unsigned blocks,
                 bool rounded) {
  with_padded_head_dim(head_dim, [&](auto d) {
    with_rounding(rounded, [&](auto r) {
      with_inputs(p, [&](auto in) {
        constexpr int D = decltype(d)::value;
        constexpr bool R = decltype(r)::value;
        using In = decltype(in);
        launch(attention_forward_mma_kernel<D, R, In>, blocks, kThreads, forward_smem<D>(), stream,
               p);
      });
    });
  });
}

void backward_mma(cudaStream_t stream, const Params& p, std::int64_t head_dim, unsigned blocks,
                  bool rounded) {
  with_padded_head_dim(head_dim, [&](auto d) {
    with_rounding(rounded, [&](auto r) {
      with_inputs(p, [&](auto in) {
        constexpr int D = decltype(d)::value;
        constexpr bool R = decltype(r)::value;
        using In = decltype(in);
        launch(attention_dkv_mma_kernel<D, R, In>, blocks, kThreads, dkv_smem<D>(), stream, p);
        launch(attention_dq_mma_kernel<D, R, In>, blocks, kThreads, dq_smem<D>(), stream, p);
      });
    });
  });
}

}  // namespace attention

}  // namespace pipeline::kernels
