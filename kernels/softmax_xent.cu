// Fused softmax cross-entropy: forward (loss, correct count) and backward (dL/dlogits) in one
// kernel over the logits: a warp per row for short rows, a block per row for long ones.
//
// Why fused: the loss needs the row's maximum and Σ exp, and so does the gradient; computing both
// from the same read of the row halves the traffic of a separate softmax, loss and gradient. Rows
// of up to 512 classes take a warp each, in registers (float4 accesses when classes is a multiple
// of 4 and the rows are 16-byte aligned); up to 8 items per thread of a block (classes <= 8192) a
// block, in registers: the row is read once and the gradient written once. Longer rows (a
// language model's vocabulary) are split over a cluster of blocks on GPUs that have them (sm_90),
// each block's slice in registers and the slices' maxima and sums exchanged through distributed
// shared memory; elsewhere they are kept in one block's shared memory where they fit (32000
// classes: 125 KiB), else read twice with an online maximum-and-sum pass (rescaling the running
// sum when the maximum grows).
//
// Semantics follow src/ops/softmax_xent.cpp term for term: the argmax is the first maximum,
// grad = exp(z − zmax) · (scale / Σ) with scale subtracted at the label, and a row's loss is
// log(double(Σ)) − double(z[label] − zmax). Each block adds its rows' losses (double) and hits in
// a fixed order into a partial, and one block adds the partials in block order, so the totals are
// deterministic for a given device. Labels are checked first (check_range.cu); when one is bad
// the row and total kernels return without writing anything.
#include "check_range.cuh"
#include "common.cuh"
#include "softmax_xent.cuh"

#include <pipeline/cuda/check.hpp>

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

namespace pipeline::kernels {

namespace {

constexpr int kCachedLogits = 8;      // logits a thread keeps in registers on the cached path
constexpr int kMaxRowThreads = 1024;  // threads of a row block
constexpr int kTotalThreads = 1024;  // threads of the totals block
constexpr int kNoIndex = std::numeric_limits<int>::max();

struct Status {
  RangeViolation bad_label;
  double loss;
  long long correct;
};

// Workspace layout: Status, then per-row losses (double), then per-row hits (int).
constexpr std::size_t kStatusBytes = 64;
static_assert(sizeof(Status) <= kStatusBytes);
std::size_t align64(std::size_t b) {
  return (b + 63) / 64 * 64;
}

// (value, index) with the larger value winning and, among equal values, the smaller index: the
// first maximum, whatever order the candidates are combined in.
__device__ __forceinline__ void argmax_combine(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__device__ __forceinline__ void block_argmax(float& v, int& i, float* sv, int* si) {
#pragma unroll
  for (int offset = detail::kWarp / 2; offset > 0; offset >>= 1)
    argmax_combine(v, i, __shfl_xor_sync(detail::kFullMask, v, offset),
                   __shfl_xor_sync(detail::kFullMask, i, offset));
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int warps = blockDim.x / detail::kWarp;
  __syncthreads();
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  v = lane < warps ? sv[lane] : -INFINITY;
  i = lane < warps ? si[lane] : kNoIndex;
#pragma unroll
  for (int offset = detail::kWarp / 2; offset > 0; offset >>= 1)
    argmax_combine(v, i, __shfl_xor_sync(detail::kFullMask, v, offset),
                   __shfl_xor_sync(detail::kFullMask, i, offset));
}

}  // namespace

// Each row kernel adds up the loss and the hits of the rows it takes (a block strides over rows
// in a fixed order) into one partial per block; the totals kernel adds the partials in block
// order. The grids are sized to the blocks the device holds at once, so a partial covers many
// rows and the totals read a few thousand values instead of one per row.

// Items > 0: each thread holds logits c = threadIdx.x + k·blockDim.x (k < Items) in registers,
// which needs classes <= Items·blockDim.x. Items == 0: any length, two reads of the row.
template <int Items>
static __global__ __launch_bounds__(kMaxRowThreads) void softmax_xent_rows_kernel(
    const float* logits, const std::int32_t* labels, std::int64_t rows, int classes, float scale,
    float* grad, double* part_loss, int* part_hit, const Status* status) {
  if (status->bad_label.index >= 0) return;  // nothing is written when a label is bad
  __shared__ float sv[detail::kWarp];
  __shared__ int si[detail::kWarp];
  __shared__ float ss[detail::kWarp];
  const int tid = threadIdx.x, threads = blockDim.x;
  double loss = 0;
  int hits = 0;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* z = logits + r * classes;
    float* g = grad + r * classes;
    const int label = labels[r];
    float best = -INFINITY;
    int arg = kNoIndex;
    float sum;
    if constexpr (Items > 0) {
      float e[Items];
#pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int c = tid + k * threads;
        e[k] = c < classes ? z[c] : -INFINITY;
        // A thread's candidates come in increasing c: strict > keeps its first maximum.
        if (c < classes && (arg == kNoIndex || e[k] > best)) {
          best = e[k];
          arg = c;
        }
      }
      block_argmax(best, arg, sv, si);
      float part = 0.f;
#pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int c = tid + k * threads;
        e[k] = c < classes ? expf(e[k] - best) : 0.f;
        part += e[k];
      }
      sum = detail::block_sum(part, ss);
      const float inv = scale / sum;
#pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int c = tid + k * threads;
        if (c < classes) {
          float v = e[k] * inv;
          if (c == label) v -= scale;
          g[c] = v;
        }
      }
    } else {
      // Online: part = Σ exp(z − best) over this thread's logits so far.
      float part = 0.f;
      for (int c = tid; c < classes; c += threads) {
        const float x = z[c];
        if (arg == kNoIndex || x > best) {
          part = arg == kNoIndex ? 1.f : part * expf(best - x) + 1.f;
          best = x;
          arg = c;
        } else {
          part += expf(x - best);
        }
      }
      const float mine = best;
      block_argmax(best, arg, sv, si);
      // Rescale to the row maximum (threads without logits contribute 0).
      part = part > 0.f ? part * expf(mine - best) : 0.f;
      sum = detail::block_sum(part, ss);
      const float inv = scale / sum;
      for (int c = tid; c < classes; c += threads) {
        float v = expf(z[c] - best) * inv;
        if (c == label) v -= scale;
        g[c] = v;
      }
    }
    if (tid == 0) {
      loss += log(static_cast<double>(sum)) - static_cast<double>(z[label] - best);
      hits += arg == label ? 1 : 0;
    }
  }
  if (tid == 0) {
    part_loss[blockIdx.x] = loss;
    part_hit[blockIdx.x] = hits;
  }
}

// Vec consecutive floats moved as one access (Vec = 4: a float4, the row and its pointer 16-byte
// aligned and classes a multiple of 4).
template <int Vec>
struct Pack {
  float v[Vec];
};
template <int Vec>
__device__ __forceinline__ Pack<Vec> load_pack(const float* p) {
  Pack<Vec> a;
  if constexpr (Vec == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    a.v[0] = f.x;
    a.v[1] = f.y;
    a.v[2] = f.z;
    a.v[3] = f.w;
  } else {
#pragma unroll
    for (int j = 0; j < Vec; ++j) a.v[j] = p[j];
  }
  return a;
}
template <int Vec>
__device__ __forceinline__ void store_pack(float* p, const Pack<Vec>& a) {
  if constexpr (Vec == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(a.v[0], a.v[1], a.v[2], a.v[3]);
  } else {
#pragma unroll
    for (int j = 0; j < Vec; ++j) p[j] = a.v[j];
  }
}

// Short rows (classes <= 32·Packs·Vec): one warp per row, lane l holding the packs at columns
// Vec·(l + 32·k), the reductions warp shuffles only (no block barrier per row);
// kWarpRowThreads / 32 rows per block at a time. A warp loads its next row before it works on the
// current one, so a row's loads are in flight while the previous row is reduced and written.
constexpr int kWarpRowThreads = 256;

template <int Packs, int Vec>
static __global__ __launch_bounds__(kWarpRowThreads) void softmax_xent_warp_rows_kernel(
    const float* logits, const std::int32_t* labels, std::int64_t rows, int classes, float scale,
    float* grad, double* part_loss, int* part_hit, const Status* status) {
  if (status->bad_label.index >= 0) return;
  constexpr int kWarps = kWarpRowThreads / detail::kWarp;
  __shared__ double warp_loss[kWarps];
  __shared__ int warp_hits[kWarps];
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  double loss = 0;
  int hits = 0;
  Pack<Vec> cur[Packs], next[Packs];
  const auto load_row = [&](std::int64_t row, Pack<Vec>(&p)[Packs]) {
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int c = Vec * (lane + k * detail::kWarp);
      if (c < classes) p[k] = load_pack<Vec>(logits + row * classes + c);
    }
  };
  if (r < rows) load_row(r, cur);
  for (; r < rows; r += stride) {
    const bool more = r + stride < rows;
    if (more) load_row(r + stride, next);
    const int label = labels[r];
    float best = -INFINITY;
    int arg = kNoIndex;
    // A lane's candidates come in increasing c: strict > keeps its first maximum.
#pragma unroll
    for (int k = 0; k < Packs; ++k)
#pragma unroll
      for (int j = 0; j < Vec; ++j) {
        const int c = Vec * (lane + k * detail::kWarp) + j;
        if (c < classes && (arg == kNoIndex || cur[k].v[j] > best)) {
          best = cur[k].v[j];
          arg = c;
        }
      }
#pragma unroll
    for (int offset = detail::kWarp / 2; offset > 0; offset >>= 1)
      argmax_combine(best, arg, __shfl_xor_sync(detail::kFullMask, best, offset),
                     __shfl_xor_sync(detail::kFullMask, arg, offset));
    float part = 0.f;
#pragma unroll
    for (int k = 0; k < Packs; ++k)
#pragma unroll
      for (int j = 0; j < Vec; ++j) {
        const int c = Vec * (lane + k * detail::kWarp) + j;
        cur[k].v[j] = c < classes ? expf(cur[k].v[j] - best) : 0.f;
        part += cur[k].v[j];
      }
    const float sum = detail::warp_sum(part);
    const float inv = scale / sum;
    float* g = grad + r * classes;
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int c0 = Vec * (lane + k * detail::kWarp);
      if (c0 >= classes) continue;
      Pack<Vec> out;
#pragma unroll
      for (int j = 0; j < Vec; ++j) {
        out.v[j] = cur[k].v[j] * inv;
        if (c0 + j == label) out.v[j] -= scale;
      }
      store_pack<Vec>(g + c0, out);
    }
    if (lane == 0) {
      loss +=
          log(static_cast<double>(sum)) - static_cast<double>(logits[r * classes + label] - best);
      hits += arg == label ? 1 : 0;
    }
    if (more) {
#pragma unroll
      for (int k = 0; k < Packs; ++k) cur[k] = next[k];
    }
  }
  if (lane == 0) {
    warp_loss[warp] = loss;
    warp_hits[warp] = hits;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      loss += warp_loss[w];
      hits += warp_hits[w];
    }
    part_loss[blockIdx.x] = loss;
    part_hit[blockIdx.x] = hits;
  }
}

// Long rows that fit in shared memory (a vocabulary of 32000 is 125 KiB): the row is read once,
// kSmemUnroll packs a thread in flight (a 32000-class row in one round of 1024 threads), into
// shared memory while the maximum is found; then the exponentials replace it there (one expf an
// element) and the gradient is written from them.
constexpr int kSmemUnroll = 8;

template <int Vec>
static __global__ __launch_bounds__(kMaxRowThreads) void softmax_xent_smem_rows_kernel(
    const float* logits, const std::int32_t* labels, std::int64_t rows, int classes, float scale,
    float* grad, double* part_loss, int* part_hit, const Status* status) {
  if (status->bad_label.index >= 0) return;
  extern __shared__ float4 smem[];  // float4: 16-byte aligned for the packs
  float* row = reinterpret_cast<float*>(smem);
  __shared__ float sv[detail::kWarp];
  __shared__ int si[detail::kWarp];
  __shared__ float ss[detail::kWarp];
  const int tid = threadIdx.x, threads = blockDim.x;
  const int packs = classes / Vec;
  double loss = 0;
  int hits = 0;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* z = logits + r * classes;
    float* g = grad + r * classes;
    const int label = labels[r];
    const float z_label = tid == 0 ? z[label] : 0.f;
    float best = -INFINITY;
    int arg = kNoIndex;
    __syncthreads();  // the previous row's exponentials are no longer read
    // A thread's packs come in increasing position: strict > keeps its first maximum.
    for (int base = tid; base < packs; base += kSmemUnroll * threads) {
      Pack<Vec> v[kSmemUnroll];
#pragma unroll
      for (int u = 0; u < kSmemUnroll; ++u) {
        const int i = base + u * threads;
        if (i < packs) v[u] = load_pack<Vec>(z + Vec * i);
      }
#pragma unroll
      for (int u = 0; u < kSmemUnroll; ++u) {
        const int i = base + u * threads;
        if (i >= packs) continue;
        store_pack<Vec>(row + Vec * i, v[u]);
#pragma unroll
        for (int j = 0; j < Vec; ++j)
          if (arg == kNoIndex || v[u].v[j] > best) {
            best = v[u].v[j];
            arg = Vec * i + j;
          }
      }
    }
    block_argmax(best, arg, sv, si);
    // Each thread reads back only the packs it wrote: no barrier needed before this pass.
    float part = 0.f;
    for (int i = tid; i < packs; i += threads) {
      Pack<Vec> e = load_pack<Vec>(row + Vec * i);
#pragma unroll
      for (int j = 0; j < Vec; ++j) {
        e.v[j] = expf(e.v[j] - best);
        part += e.v[j];
      }
      store_pack<Vec>(row + Vec * i, e);
    }
    const float sum = detail::block_sum(part, ss);
    const float inv = scale / sum;
    for (int i = tid; i < packs; i += threads) {
      Pack<Vec> e = load_pack<Vec>(row + Vec * i);
#pragma unroll
      for (int j = 0; j < Vec; ++j) {
        e.v[j] *= inv;
        if (Vec * i + j == label) e.v[j] -= scale;
      }
      store_pack<Vec>(g + Vec * i, e);
    }
    if (tid == 0) {
      loss += log(static_cast<double>(sum)) - static_cast<double>(z_label - best);
      hits += arg == label ? 1 : 0;
    }
  }
  if (tid == 0) {
    part_loss[blockIdx.x] = loss;
    part_hit[blockIdx.x] = hits;
  }
}

// Long rows split over a cluster of kClusterBlocks blocks (sm_90): block b of a cluster takes
// the b-th slice of each of its rows, at most kClusterPacks packs a thread, in registers. The
// blocks' maxima, then their sums, meet through distributed shared memory: each warp reads the
// kClusterBlocks values into its first lanes and combines them with shuffles, so every block
// computes the row's maximum and sum from the same values in the same order. Against the
// shared-memory kernel (one 125 KiB row an SM, its load, reduce and write phases in turn), an SM
// holds several of these small blocks, one's loads in flight while another reduces or writes.
constexpr int kClusterBlocks = 8;  // the portable cluster size
constexpr int kClusterPacks = 4;

// The largest row a cluster takes: every block's slice in kClusterPacks packs of its threads.
constexpr std::int64_t cluster_max_classes(int vec) {
  return static_cast<std::int64_t>(kClusterBlocks) * kMaxRowThreads * kClusterPacks * vec;
}

template <int Vec>
static __global__ __launch_bounds__(kMaxRowThreads) void softmax_xent_cluster_rows_kernel(
    const float* logits, const std::int32_t* labels, std::int64_t rows, int classes, float scale,
    float* grad, double* part_loss, int* part_hit, const Status* status) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (status->bad_label.index >= 0) return;  // every block of every cluster returns here
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  __shared__ float sv[detail::kWarp];
  __shared__ int si[detail::kWarp];
  __shared__ float ss[detail::kWarp];
  // This block's part of the current row, read by every block of the cluster. A block rewrites
  // slice_max only after the row's second cluster barrier (all blocks have read it by then) and
  // slice_sum only after the next row's first (all blocks have read the previous one).
  __shared__ float slice_max, slice_sum;
  __shared__ int slice_arg;
  const int tid = threadIdx.x, lane = tid % detail::kWarp;
  const int rank = static_cast<int>(cluster.block_rank());
  const std::int64_t clusters = gridDim.x / kClusterBlocks;
  const int packs = classes / Vec;
  const int per_block = (packs + kClusterBlocks - 1) / kClusterBlocks;
  const int first = rank * per_block, last = min(packs, first + per_block);
  double loss = 0;
  int hits = 0;
  for (std::int64_t r = blockIdx.x / kClusterBlocks; r < rows; r += clusters) {
    const float* z = logits + r * classes;
    Pack<Vec> v[kClusterPacks];
#pragma unroll
    for (int k = 0; k < kClusterPacks; ++k) {
      const int i = first + tid + k * static_cast<int>(blockDim.x);
      if (i < last) v[k] = load_pack<Vec>(z + Vec * i);
    }
    float best = -INFINITY;
    int arg = kNoIndex;
    // A thread's candidates come in increasing position: strict > keeps its first maximum.
#pragma unroll
    for (int k = 0; k < kClusterPacks; ++k) {
      const int i = first + tid + k * static_cast<int>(blockDim.x);
#pragma unroll
      for (int j = 0; j < Vec; ++j)
        if (i < last && (arg == kNoIndex || v[k].v[j] > best)) {
          best = v[k].v[j];
          arg = Vec * i + j;
        }
    }
    block_argmax(best, arg, sv, si);
    if (tid == 0) {
      slice_max = best;
      slice_arg = arg;
    }
    cluster.sync();
    best = -INFINITY;
    arg = kNoIndex;
    if (lane < kClusterBlocks) {
      best = *cluster.map_shared_rank(&slice_max, lane);
      arg = *cluster.map_shared_rank(&slice_arg, lane);
    }
#pragma unroll
    for (int offset = kClusterBlocks / 2; offset > 0; offset >>= 1)
      argmax_combine(best, arg, __shfl_xor_sync(detail::kFullMask, best, offset),
                     __shfl_xor_sync(detail::kFullMask, arg, offset));
    best = __shfl_sync(detail::kFullMask, best, 0);
    arg = __shfl_sync(detail::kFullMask, arg, 0);
    float part = 0.f;
#pragma unroll
    for (int k = 0; k < kClusterPacks; ++k) {
      const int i = first + tid + k * static_cast<int>(blockDim.x);
#pragma unroll
      for (int j = 0; j < Vec; ++j) {
        v[k].v[j] = i < last ? expf(v[k].v[j] - best) : 0.f;
        part += v[k].v[j];
      }
    }
    part = detail::block_sum(part, ss);
    if (tid == 0) slice_sum = part;
    cluster.sync();
    float sum = lane < kClusterBlocks ? *cluster.map_shared_rank(&slice_sum, lane) : 0.f;
    // The same butterfly in every warp of every block: the same sum, bit for bit.
#pragma unroll
    for (int offset = kClusterBlocks / 2; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(detail::kFullMask, sum, offset);
    sum = __shfl_sync(detail::kFullMask, sum, 0);
    const float inv = scale / sum;
    const int label = labels[r];
    float* g = grad + r * classes;
#pragma unroll
    for (int k = 0; k < kClusterPacks; ++k) {
      const int i = first + tid + k * static_cast<int>(blockDim.x);
      if (i >= last) continue;
      Pack<Vec> out;
#pragma unroll
      for (int j = 0; j < Vec; ++j) {
        out.v[j] = v[k].v[j] * inv;
        if (Vec * i + j == label) out.v[j] -= scale;
      }
      store_pack<Vec>(g + Vec * i, out);
    }
    if (rank == 0 && tid == 0) {
      loss += log(static_cast<double>(sum)) - static_cast<double>(z[label] - best);
      hits += arg == label ? 1 : 0;
    }
  }
  cluster.sync();  // no block leaves while another may still read its slice_sum
  // One partial a cluster (a grid has no more clusters than rows: the workspace's per-row layout
  // holds them).
  if (rank == 0 && tid == 0) {
    part_loss[blockIdx.x / kClusterBlocks] = loss;
    part_hit[blockIdx.x / kClusterBlocks] = hits;
  }
#endif
}

// Adds the partials into the Status; with `totals` (softmax_xent_accumulate) also adds them there,
// or records the bad label there, so a graphed step needs no further kernel.
static __global__ __launch_bounds__(kTotalThreads) void softmax_xent_totals_kernel(
    const double* part_loss, const int* part_hit, std::int64_t parts, float scale, Status* status,
    double* totals) {
  if (status->bad_label.index >= 0) {
    if (totals != nullptr && threadIdx.x == 0 && totals[2] == 0.0) {
      totals[2] = static_cast<double>(status->bad_label.index) + 1.0;
      totals[3] = status->bad_label.value;
    }
    return;
  }
  __shared__ double sl[detail::kWarp];
  __shared__ long long sc[detail::kWarp];
  double loss = 0;
  long long hits = 0;
  for (std::int64_t p = threadIdx.x; p < parts; p += blockDim.x) {
    loss += part_loss[p];
    hits += part_hit[p];
  }
  loss = detail::block_sum(loss, sl);
  hits = detail::block_sum(hits, sc);
  if (threadIdx.x == 0) {
    status->loss = loss * static_cast<double>(scale);
    status->correct = hits;
    if (totals != nullptr) {
      totals[0] += status->loss;
      totals[1] += static_cast<double>(hits);
    }
  }
}

std::size_t softmax_xent_workspace_bytes(std::int64_t rows) {
  const std::size_t n = static_cast<std::size_t>(rows < 0 ? 0 : rows);
  return kStatusBytes + align64(n * sizeof(double)) + align64(n * sizeof(int));
}

namespace {

// What the launcher asks the driver, asked once per device and kernel shape (a training step
// launches this once per microbatch; each query is a call into the driver). Stage threads of an
// in-process pipeline launch concurrently, hence the lock.
class LaunchLimits {
 public:
  // Blocks of `kernel` with `threads` threads and `smem` dynamic shared bytes that `device` holds
  // at once (at least one a multiprocessor).
  std::int64_t resident_blocks(int device, const void* kernel, int threads, std::size_t smem) {
    const std::lock_guard<std::mutex> lock(m_mutex);
    const auto key = std::make_tuple(device, kernel, threads, smem);
    if (const auto it = m_resident.find(key); it != m_resident.end()) return it->second;
    int per_sm = 0;
    PIPELINE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    const std::int64_t resident = static_cast<std::int64_t>(std::max(per_sm, 1)) *
                                  attribute(device, cudaDevAttrMultiProcessorCount);
    m_resident.emplace(key, resident);
    return resident;
  }

  // Clusters of `kernel` with `threads` threads a block that `device` holds at once (at least
  // one), launched as `config` says.
  std::int64_t resident_clusters(int device, const void* kernel, int threads,
                                 const cudaLaunchConfig_t& config) {
    const std::lock_guard<std::mutex> lock(m_mutex);
    const auto key = std::make_tuple(device, kernel, threads);
    if (const auto it = m_clusters.find(key); it != m_clusters.end()) return it->second;
    int clusters = 0;
    PIPELINE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    const std::int64_t resident = std::max(clusters, 1);
    m_clusters.emplace(key, resident);
    return resident;
  }

  // Whether `kernel` runs its cluster code on `device`: the device has clusters (sm_90 on) and
  // the code loaded for it was compiled for them (a PTX of an older architecture, compiled by the
  // driver, has none).
  bool has_clusters(int device, const void* kernel) {
    const std::lock_guard<std::mutex> lock(m_mutex);
    if (attribute(device, cudaDevAttrComputeCapabilityMajor) < 9) return false;
    const auto key = std::make_pair(device, kernel);
    if (const auto it = m_cluster_code.find(key); it != m_cluster_code.end()) return it->second;
    cudaFuncAttributes a{};
    PIPELINE_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
    const bool ok = a.binaryVersion >= 90 && a.ptxVersion >= 90;
    m_cluster_code.emplace(key, ok);
    return ok;
  }

  // The most dynamic shared memory a block of `device` may opt in to.
  std::size_t shared_optin(int device) {
    const std::lock_guard<std::mutex> lock(m_mutex);
    return static_cast<std::size_t>(attribute(device, cudaDevAttrMaxSharedMemoryPerBlockOptin));
  }

  // Lets `kernel` take `bytes` of dynamic shared memory on `device`, the current device (raised
  // only past the largest amount allowed before: the attribute is a ceiling).
  void allow_shared(int device, const void* kernel, std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(m_mutex);
    std::size_t& allowed = m_shared_allowed[std::make_pair(device, kernel)];
    if (bytes <= allowed) return;
    PIPELINE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(bytes)));
    allowed = bytes;
  }

 private:
  // Called with m_mutex held.
  int attribute(int device, cudaDeviceAttr which) {
    const auto key = std::make_pair(device, which);
    if (const auto it = m_attributes.find(key); it != m_attributes.end()) return it->second;
    int value = 0;
    PIPELINE_CUDA_CHECK(cudaDeviceGetAttribute(&value, which, device));
    m_attributes.emplace(key, value);
    return value;
  }

  std::mutex m_mutex;
  std::map<std::pair<int, cudaDeviceAttr>, int> m_attributes;
  std::map<std::tuple<int, const void*, int, std::size_t>, std::int64_t> m_resident;
  std::map<std::pair<int, const void*>, std::size_t> m_shared_allowed;
  std::map<std::tuple<int, const void*, int>, std::int64_t> m_clusters;
  std::map<std::pair<int, const void*>, bool> m_cluster_code;
};

// Whether long rows take the cluster kernel where it can run (set_softmax_xent_clusters).
std::atomic<bool> g_clusters{[] {
  const char* v = std::getenv("PIPELINE_SOFTMAX_XENT_CLUSTERS");
  return v == nullptr || std::string_view(v) != "0";
}()};

LaunchLimits& launch_limits() {
  static LaunchLimits limits;
  return limits;
}

// Queues the label check, the rows and the totals; the Status at the workspace's start holds the
// outcome once the stream reaches it (and `totals`, when given, has it added).
Status* launch_softmax_xent(cudaStream_t stream, const float* logits, const std::int32_t* labels,
                            std::int64_t rows, std::int64_t classes, float scale, float* grad,
                            void* workspace, double* totals) {
  auto* base = static_cast<unsigned char*>(workspace);
  auto* status = reinterpret_cast<Status*>(base);
  // Per-block partials: a grid never has more blocks than rows, so the per-row layout holds them.
  auto* part_loss = reinterpret_cast<double*>(base + kStatusBytes);
  auto* part_hit = reinterpret_cast<int*>(base + kStatusBytes +
                                          align64(static_cast<std::size_t>(rows) * sizeof(double)));

  find_out_of_range(stream, labels, rows, 0, static_cast<std::int32_t>(classes),
                    &status->bad_label);

  const int c = static_cast<int>(classes);
  LaunchLimits& limits = launch_limits();
  int device = 0;
  PIPELINE_CUDA_CHECK(cudaGetDevice(&device));
  // Blocks for `work_blocks` blocks' worth of rows: no more than the device holds at once (the
  // kernels stride), so that each partial covers many rows.
  const auto grid = [&](const void* kernel, int threads, std::size_t smem,
                        std::int64_t work_blocks) {
    return static_cast<unsigned>(std::clamp<std::int64_t>(
        work_blocks, 1, limits.resident_blocks(device, kernel, threads, smem)));
  };
  const bool vec4 = classes % 4 == 0 && detail::aligned16(logits) && detail::aligned16(grad);
  // About 4 logits per thread, a whole number of warps, at most kMaxRowThreads.
  const int threads = std::clamp((c / 4 + detail::kWarp - 1) / detail::kWarp * detail::kWarp,
                                 detail::kWarp, kMaxRowThreads);
  const std::size_t row_bytes = static_cast<std::size_t>(classes) * sizeof(float);
  // What the smem kernel's reductions take besides the row (3 arrays of 32).
  const bool row_fits =
      row_bytes + 3 * detail::kWarp * sizeof(float) <= limits.shared_optin(device);
  unsigned parts = 0;
  const auto warp_rows = [&](auto kernel) {
    constexpr int kRowsPerBlock = kWarpRowThreads / detail::kWarp;
    parts = grid(reinterpret_cast<const void*>(kernel), kWarpRowThreads, 0,
                 (rows + kRowsPerBlock - 1) / kRowsPerBlock);
    kernel<<<parts, kWarpRowThreads, 0, stream>>>(logits, labels, rows, c, scale, grad, part_loss,
                                                  part_hit, status);
  };
  const auto smem_rows = [&](auto kernel) {
    limits.allow_shared(device, reinterpret_cast<const void*>(kernel), row_bytes);
    parts = grid(reinterpret_cast<const void*>(kernel), threads, row_bytes, rows);
    kernel<<<parts, threads, row_bytes, stream>>>(logits, labels, rows, c, scale, grad, part_loss,
                                                  part_hit, status);
  };
  // Launches `kernel` over clusters and returns true where it can: rows a cluster holds, a device
  // and loaded code with clusters, and clusters not switched off.
  const auto cluster_rows = [&](auto kernel, int vec) {
    const auto* k = reinterpret_cast<const void*>(kernel);
    if (classes > cluster_max_classes(vec) || !g_clusters.load(std::memory_order_relaxed) ||
        !limits.has_clusters(device, k))
      return false;
    const std::int64_t per_block = (classes / vec + kClusterBlocks - 1) / kClusterBlocks;
    const int block = static_cast<int>(
        std::clamp<std::int64_t>((per_block + kClusterPacks * detail::kWarp - 1) /
                                     (kClusterPacks * detail::kWarp) * detail::kWarp,
                                 detail::kWarp, kMaxRowThreads));
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = kClusterBlocks;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kClusterBlocks);  // a valid grid for the occupancy query: one cluster
    config.blockDim = dim3(static_cast<unsigned>(block));
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    // One partial a cluster, so no more clusters than rows.
    parts = static_cast<unsigned>(
        std::clamp<std::int64_t>(rows, 1, limits.resident_clusters(device, k, block, config)));
    config.gridDim = dim3(parts * kClusterBlocks);
    PIPELINE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, logits, labels, rows, c, scale, grad,
                                           part_loss, part_hit,
                                           static_cast<const Status*>(status)));
    return true;
  };
  const auto block_rows = [&](auto kernel) {
    parts = grid(reinterpret_cast<const void*>(kernel), threads, 0, rows);
    kernel<<<parts, threads, 0, stream>>>(logits, labels, rows, c, scale, grad, part_loss, part_hit,
                                          status);
  };
  if (vec4 && classes <= 4 * detail::kWarp)
    warp_rows(softmax_xent_warp_rows_kernel<1, 4>);
  else if (vec4 && classes <= 8 * detail::kWarp)
    warp_rows(softmax_xent_warp_rows_kernel<2, 4>);
  else if (vec4 && classes <= 16 * detail::kWarp)
    warp_rows(softmax_xent_warp_rows_kernel<4, 4>);
  else if (classes <= detail::kWarp)
    warp_rows(softmax_xent_warp_rows_kernel<1, 1>);
  else if (classes <= 4 * detail::kWarp)
    warp_rows(softmax_xent_warp_rows_kernel<4, 1>);
  else if (classes <= 16 * detail::kWarp)
    warp_rows(softmax_xent_warp_rows_kernel<16, 1>);
  else if (classes <= static_cast<std::int64_t>(threads) * kCachedLogits)
    block_rows(softmax_xent_rows_kernel<kCachedLogits>);
  else if (vec4 ? cluster_rows(softmax_xent_cluster_rows_kernel<4>, 4)
                : cluster_rows(softmax_xent_cluster_rows_kernel<1>, 1))
    ;  // launched
  else if (row_fits && vec4)
    smem_rows(softmax_xent_smem_rows_kernel<4>);
  else if (row_fits)
    smem_rows(softmax_xent_smem_rows_kernel<1>);
  else
    block_rows(softmax_xent_rows_kernel<0>);
  PIPELINE_CUDA_LAUNCH_CHECK();
  softmax_xent_totals_kernel<<<1, kTotalThreads, 0, stream>>>(part_loss, part_hit, parts, scale,
                                                              status, totals);
  PIPELINE_CUDA_LAUNCH_CHECK();
  return status;
}

}  // namespace

void set_softmax_xent_clusters(bool on) {
  g_clusters.store(on, std::memory_order_relaxed);
}

SoftmaxXentTotals softmax_xent(cudaStream_t stream, const float* logits, const std::int32_t* labels,
                               std::int64_t rows, std::int64_t classes, float scale, float* grad,
                               void* workspace) {
  SoftmaxXentTotals totals;
  if (rows <= 0) return totals;
  const Status* status =
      launch_softmax_xent(stream, logits, labels, rows, classes, scale, grad, workspace, nullptr);
  Status host{};
  PIPELINE_CUDA_CHECK(cudaMemcpyAsync(&host, status, sizeof(host), cudaMemcpyDeviceToHost, stream));
  PIPELINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  totals.bad_label = host.bad_label;
  if (host.bad_label.index < 0) {
    totals.loss = host.loss;
    totals.correct = host.correct;
  }
  return totals;
}

void softmax_xent_accumulate(cudaStream_t stream, const float* logits, const std::int32_t* labels,
                             std::int64_t rows, std::int64_t classes, float scale, float* grad,
                             void* workspace, double* totals) {
  if (rows <= 0) return;
  launch_softmax_xent(stream, logits, labels, rows, classes, scale, grad, workspace, totals);
}

}  // namespace pipeline::kernels
