// Fused softmax cross-entropy: forward (loss, correct count) and backward (dL/dlogits) in one
// kernel over the logits: a warp per row for short rows, a block per row for long ones.
//
// Why fused: the loss needs the row's maximum and Σ exp, and so does the gradient; computing both
// from the same read of the row halves the traffic of a separate softmax, loss and gradient. Rows
// of up to 512 classes take a warp each, 16 logits per lane in registers; up to 8 items per
// thread of a block (classes <= 8192) a block, in registers: the row is read once and the
// gradient written once. Longer rows (a language model's vocabulary) take an online
// maximum-and-sum pass (rescaling the running sum when the maximum grows) that keeps the row in
// shared memory where it fits (32000 classes: 125 KiB), else a second read of the row.
//
// Semantics follow src/ops/softmax_xent.cpp term for term: the argmax is the first maximum,
// grad = exp(z − zmax) · (scale / Σ) with scale subtracted at the label, and a row's loss is
// log(double(Σ)) − double(z[label] − zmax). Per-row losses and hits go to a workspace, and one
// block adds them up in a fixed order (double for the loss), so the totals are deterministic.
// Labels are checked first (check_range.cu); when one is bad the row and total kernels return
// without writing anything.
#include "check_range.cuh"
#include "common.cuh"
#include "softmax_xent.cuh"

#include <pipeline/cuda/check.hpp>

#include <cmath>
#include <limits>

namespace pipeline::kernels {

namespace {

constexpr int kItems = 8;            // logits a thread keeps in registers on the cached path
constexpr int kMaxThreads = 1024;    // threads of a row block
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

// Items > 0: each thread holds logits c = threadIdx.x + k·blockDim.x (k < Items) in registers,
// which needs classes <= Items·blockDim.x. Items == 0: any length, two reads of the row.
template <int Items>
static __global__ __launch_bounds__(kMaxThreads) void softmax_xent_rows_kernel(
    const float* logits, const std::int32_t* labels, std::int64_t rows, int classes, float scale,
    float* grad, double* row_loss, int* row_hit, const Status* status) {
  if (status->bad_label.index >= 0) return;  // nothing is written when a label is bad
  __shared__ float sv[detail::kWarp];
  __shared__ int si[detail::kWarp];
  __shared__ float ss[detail::kWarp];
  const int tid = threadIdx.x, threads = blockDim.x;
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
      row_loss[r] = log(static_cast<double>(sum)) - static_cast<double>(z[label] - best);
      row_hit[r] = arg == label ? 1 : 0;
    }
  }
}

// Short rows (classes <= 32·Items): one warp per row, logits c = lane + 32·k in registers, the
// reductions warp shuffles only (no block barrier per row); kWarpRowThreads / 32 rows per block.
constexpr int kWarpItems = 16;
constexpr int kWarpRowThreads = 256;

template <int Items>
static __global__ __launch_bounds__(kWarpRowThreads) void softmax_xent_warp_rows_kernel(
    const float* logits, const std::int32_t* labels, std::int64_t rows, int classes, float scale,
    float* grad, double* row_loss, int* row_hit, const Status* status) {
  if (status->bad_label.index >= 0) return;
  const int lane = threadIdx.x % detail::kWarp;
  const std::int64_t warps_per_grid =
      static_cast<std::int64_t>(gridDim.x) * (blockDim.x / detail::kWarp);
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / detail::kWarp) +
                        threadIdx.x / detail::kWarp;
       r < rows; r += warps_per_grid) {
    const float* z = logits + r * classes;
    float* g = grad + r * classes;
    const int label = labels[r];
    float e[Items];
    float best = -INFINITY;
    int arg = kNoIndex;
#pragma unroll
    for (int k = 0; k < Items; ++k) {
      const int c = lane + k * detail::kWarp;
      e[k] = c < classes ? z[c] : -INFINITY;
      if (c < classes && (arg == kNoIndex || e[k] > best)) {
        best = e[k];
        arg = c;
      }
    }
#pragma unroll
    for (int offset = detail::kWarp / 2; offset > 0; offset >>= 1)
      argmax_combine(best, arg, __shfl_xor_sync(detail::kFullMask, best, offset),
                     __shfl_xor_sync(detail::kFullMask, arg, offset));
    float part = 0.f;
#pragma unroll
    for (int k = 0; k < Items; ++k) {
      const int c = lane + k * detail::kWarp;
      e[k] = c < classes ? expf(e[k] - best) : 0.f;
      part += e[k];
    }
    const float sum = detail::warp_sum(part);
    const float inv = scale / sum;
#pragma unroll
    for (int k = 0; k < Items; ++k) {
      const int c = lane + k * detail::kWarp;
      if (c < classes) {
        float v = e[k] * inv;
        if (c == label) v -= scale;
        g[c] = v;
      }
    }
    if (lane == 0) {
      row_loss[r] = log(static_cast<double>(sum)) - static_cast<double>(z[label] - best);
      row_hit[r] = arg == label ? 1 : 0;
    }
  }
}

// Long rows that fit in shared memory (a vocabulary of 32000 is 125 KiB): the online pass keeps
// the row it reads, and the gradient is computed from that copy, so the row is read once.
static __global__ __launch_bounds__(kMaxThreads) void softmax_xent_smem_rows_kernel(
    const float* logits, const std::int32_t* labels, std::int64_t rows, int classes, float scale,
    float* grad, double* row_loss, int* row_hit, const Status* status) {
  if (status->bad_label.index >= 0) return;
  extern __shared__ float row[];
  __shared__ float sv[detail::kWarp];
  __shared__ int si[detail::kWarp];
  __shared__ float ss[detail::kWarp];
  const int tid = threadIdx.x, threads = blockDim.x;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* z = logits + r * classes;
    float* g = grad + r * classes;
    const int label = labels[r];
    float best = -INFINITY, part = 0.f;
    int arg = kNoIndex;
    __syncthreads();  // the previous row's copy is no longer read
    for (int c = tid; c < classes; c += threads) {
      const float x = z[c];
      row[c] = x;
      if (arg == kNoIndex || x > best) {
        part = arg == kNoIndex ? 1.f : part * expf(best - x) + 1.f;
        best = x;
        arg = c;
      } else {
        part += expf(x - best);
      }
    }
    const float mine = best;
    block_argmax(best, arg, sv, si);  // its barriers also publish `row`
    part = part > 0.f ? part * expf(mine - best) : 0.f;
    const float sum = detail::block_sum(part, ss);
    const float inv = scale / sum;
    for (int c = tid; c < classes; c += threads) {
      float v = expf(row[c] - best) * inv;
      if (c == label) v -= scale;
      g[c] = v;
    }
    if (tid == 0) {
      row_loss[r] = log(static_cast<double>(sum)) - static_cast<double>(row[label] - best);
      row_hit[r] = arg == label ? 1 : 0;
    }
  }
}

static __global__ __launch_bounds__(kTotalThreads) void softmax_xent_totals_kernel(
    const double* row_loss, const int* row_hit, std::int64_t rows, float scale, Status* status) {
  if (status->bad_label.index >= 0) return;
  __shared__ double sl[detail::kWarp];
  __shared__ long long sc[detail::kWarp];
  // Four rows per thread per step, in independent sums (one block reads every row: latency, not
  // bandwidth); the order is fixed by `rows` alone.
  double l0 = 0, l1 = 0, l2 = 0, l3 = 0;
  long long hits = 0;
  const std::int64_t step = blockDim.x;
  std::int64_t r = threadIdx.x;
  for (; r + 3 * step < rows; r += 4 * step) {
    l0 += row_loss[r];
    l1 += row_loss[r + step];
    l2 += row_loss[r + 2 * step];
    l3 += row_loss[r + 3 * step];
    hits += row_hit[r] + row_hit[r + step] + row_hit[r + 2 * step] + row_hit[r + 3 * step];
  }
  for (; r < rows; r += step) {
    l0 += row_loss[r];
    hits += row_hit[r];
  }
  double loss = (l0 + l1) + (l2 + l3);
  loss = detail::block_sum(loss, sl);
  hits = detail::block_sum(hits, sc);
  if (threadIdx.x == 0) {
    status->loss = loss * static_cast<double>(scale);
    status->correct = hits;
  }
}

std::size_t softmax_xent_workspace_bytes(std::int64_t rows) {
  const std::size_t n = static_cast<std::size_t>(rows < 0 ? 0 : rows);
  return kStatusBytes + align64(n * sizeof(double)) + align64(n * sizeof(int));
}

static __global__ void softmax_xent_accumulate_kernel(const Status* status, double* totals) {
  if (status->bad_label.index >= 0) {
    if (totals[2] == 0.0) {
      totals[2] = static_cast<double>(status->bad_label.index) + 1.0;
      totals[3] = status->bad_label.value;
    }
    return;
  }
  totals[0] += status->loss;
  totals[1] += static_cast<double>(status->correct);
}

namespace {

// Queues the label check, the rows and the totals; the Status at the workspace's start holds the
// outcome once the stream reaches it.
Status* launch_softmax_xent(cudaStream_t stream, const float* logits, const std::int32_t* labels,
                            std::int64_t rows, std::int64_t classes, float scale, float* grad,
                            void* workspace) {
  auto* base = static_cast<unsigned char*>(workspace);
  auto* status = reinterpret_cast<Status*>(base);
  auto* row_loss = reinterpret_cast<double*>(base + kStatusBytes);
  auto* row_hit = reinterpret_cast<int*>(base + kStatusBytes +
                                         align64(static_cast<std::size_t>(rows) * sizeof(double)));

  find_out_of_range(stream, labels, rows, 0, static_cast<std::int32_t>(classes),
                    &status->bad_label);

  const int c = static_cast<int>(classes);
  // About 4 logits per thread, a whole number of warps, at most kMaxThreads.
  const int threads = std::clamp((c / 4 + detail::kWarp - 1) / detail::kWarp * detail::kWarp,
                                 detail::kWarp, kMaxThreads);
  const unsigned blocks =
      static_cast<unsigned>(std::min<std::int64_t>(rows, detail::kMaxGridBlocks));
  int device = 0, smem_optin = 0;
  PIPELINE_CUDA_CHECK(cudaGetDevice(&device));
  PIPELINE_CUDA_CHECK(
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  // What the smem kernel's reductions take besides the row (3 arrays of 32).
  const std::size_t row_bytes = static_cast<std::size_t>(classes) * sizeof(float);
  const bool row_fits =
      row_bytes + 3 * detail::kWarp * sizeof(float) <= static_cast<std::size_t>(smem_optin);
  if (classes <= static_cast<std::int64_t>(detail::kWarp) * kWarpItems) {
    const int rows_per_block = kWarpRowThreads / detail::kWarp;
    const unsigned warp_blocks = static_cast<unsigned>(std::min<std::int64_t>(
        (rows + rows_per_block - 1) / rows_per_block, detail::kMaxGridBlocks));
    softmax_xent_warp_rows_kernel<kWarpItems><<<warp_blocks, kWarpRowThreads, 0, stream>>>(
        logits, labels, rows, c, scale, grad, row_loss, row_hit, status);
  } else if (classes <= static_cast<std::int64_t>(threads) * kItems) {
    softmax_xent_rows_kernel<kItems><<<blocks, threads, 0, stream>>>(
        logits, labels, rows, c, scale, grad, row_loss, row_hit, status);
  } else if (row_fits) {
    PIPELINE_CUDA_CHECK(cudaFuncSetAttribute(softmax_xent_smem_rows_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(row_bytes)));
    softmax_xent_smem_rows_kernel<<<blocks, threads, row_bytes, stream>>>(
        logits, labels, rows, c, scale, grad, row_loss, row_hit, status);
  } else {
    softmax_xent_rows_kernel<0><<<blocks, threads, 0, stream>>>(logits, labels, rows, c, scale,
                                                                grad, row_loss, row_hit, status);
  }
  PIPELINE_CUDA_LAUNCH_CHECK();
  softmax_xent_totals_kernel<<<1, kTotalThreads, 0, stream>>>(row_loss, row_hit, rows, scale,
                                                              status);
  PIPELINE_CUDA_LAUNCH_CHECK();
  return status;
}

}  // namespace

SoftmaxXentTotals softmax_xent(cudaStream_t stream, const float* logits, const std::int32_t* labels,
                               std::int64_t rows, std::int64_t classes, float scale, float* grad,
                               void* workspace) {
  SoftmaxXentTotals totals;
  if (rows <= 0) return totals;
  const Status* status =
      launch_softmax_xent(stream, logits, labels, rows, classes, scale, grad, workspace);
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
  const Status* status =
      launch_softmax_xent(stream, logits, labels, rows, classes, scale, grad, workspace);
  softmax_xent_accumulate_kernel<<<1, 1, 0, stream>>>(status, totals);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
