// Optimizer steps and gradient-norm reduction on the device.
//
// SGD-momentum and Adam(W) are element-wise over four or five streams of memory (param, grad and
// the state buffers), so they are bound by bandwidth and, for the many small tensors of a model,
// by launch count. multi_tensor_launch() packs up to kMaxTensors tensors and kMaxBlocks chunks of
// kChunk elements into one kernel argument (apex's multi_tensor_apply scheme); each block finds
// its tensor and chunk there and strides over the chunk. The per-element arithmetic is the CPU
// op's Eigen expression written out (src/ops/optimizer_update.cpp), in float, with the step's
// scalars (bias corrections) computed on the host exactly as the CPU computes them.
//
// sum_of_squares is the norm half of clipping and must give the same bits on every run (ranks
// compare and add these partial sums): a fixed number of blocks (a function of n only) each
// reduce a strided share in double, and one block adds the block sums in order.
#include "common.cuh"
#include "optimizer.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

namespace {

constexpr std::int64_t kChunk = 65536;  // elements per block of a multi-tensor launch
constexpr int kChunkThreads = 512;
constexpr int kMaxTensors = 48;
constexpr int kMaxBlocks = 320;
constexpr int kSumOfSquaresThreads = 256;
constexpr int kMaxReduceBlocks = static_cast<int>(kSumOfSquaresWorkspace) - 1;

template <typename T>
struct TensorList {
  T tensors[kMaxTensors];
  unsigned char block_tensor[kMaxBlocks];  // index into tensors
  int block_chunk[kMaxBlocks];             // chunk of that tensor
};
static_assert(kMaxTensors <= 256, "block_tensor is one byte");
// Kernel arguments are limited to 4 KiB on every architecture and toolkit we target.
static_assert(sizeof(TensorList<AdamWTensor>) + sizeof(AdamWStep) <= 4000);
static_assert(sizeof(TensorList<SgdTensor>) + sizeof(SgdStep) <= 4000);

struct SgdOp {
  SgdStep s;
  bool use_momentum;
  __device__ __forceinline__ void operator()(const SgdTensor& t, std::int64_t i) const {
    const float lr = s.scalars != nullptr ? s.scalars[0] : s.lr;
    float w = t.param[i];
    const float g = t.grad[i];
    if (!use_momentum) {
      if (s.weight_decay != 0.f)
        w -= lr * (g + s.weight_decay * w);
      else
        w -= lr * g;
      t.param[i] = w;
      return;
    }
    const float d = g + s.weight_decay * w;  // d_p, from the parameter before this step
    const float b = s.first_step ? d : s.momentum * t.momentum_buffer[i] + (1.f - s.dampening) * d;
    t.momentum_buffer[i] = b;
    if (s.nesterov)
      w -= lr * (d + s.momentum * b);
    else
      w -= lr * b;
    t.param[i] = w;
  }
};

struct AdamWOp {
  AdamWStep s;
  __device__ __forceinline__ void operator()(const AdamWTensor& t, std::int64_t i) const {
    const bool read = s.scalars != nullptr;
    const float step_size = read ? s.scalars[0] : s.step_size;
    const float inv_sqrt_bc2 = read ? s.scalars[1] : s.inv_sqrt_bc2;
    const float decay = read ? s.scalars[2] : s.decay;
    float w = t.param[i];
    const float g = t.grad[i];
    float m = t.exp_avg[i], v = t.exp_avg_sq[i];
    if (s.decoupled) {
      if (s.weight_decay != 0.f) w *= decay;
      m = s.beta1 * m + (1.f - s.beta1) * g;
      v = s.beta2 * v + (1.f - s.beta2) * (g * g);
    } else {
      const float gd = g + s.weight_decay * w;
      m = s.beta1 * m + (1.f - s.beta1) * gd;
      v = s.beta2 * v + (1.f - s.beta2) * (gd * gd);
    }
    w -= step_size * m / (sqrtf(v) * inv_sqrt_bc2 + s.eps);
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    t.param[i] = w;
  }
};

}  // namespace

template <typename T, typename Op>
static __global__ __launch_bounds__(kChunkThreads) void multi_tensor_kernel(TensorList<T> list,
                                                                            Op op) {
  const T& t = list.tensors[list.block_tensor[blockIdx.x]];
  const std::int64_t begin = static_cast<std::int64_t>(list.block_chunk[blockIdx.x]) * kChunk;
  const std::int64_t end = min(t.n, begin + kChunk);
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) op(t, i);
}

static __global__ __launch_bounds__(kSumOfSquaresThreads) void sum_of_squares_partial_kernel(
    const float* x, std::int64_t n, double* partials) {
  __shared__ double scratch[detail::kWarp];
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = x[i];
    acc += static_cast<double>(v * v);
  }
  acc = detail::block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

static __global__ __launch_bounds__(kSumOfSquaresThreads) void sum_of_squares_final_kernel(
    const double* partials, int count, double* out) {
  __shared__ double scratch[detail::kWarp];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = detail::block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
}

static __global__ void add_in_order_kernel(const double* parts, int count, double* total) {
  double acc = 0.0;
  for (int i = 0; i < count; ++i) acc += parts[i];
  *total = acc;
}

// clip_factor() of optim/grad_clip.hpp, in the same double arithmetic.
static __device__ __forceinline__ float clip_factor_of(double sum_of_squares, double max_norm) {
  const double norm = sqrt(sum_of_squares);
  if (!isfinite(norm)) return 1.f;
  return static_cast<float>(fmin(1.0, max_norm / (norm + 1e-6)));
}

static __global__ void scale_by_clip_factor_kernel(float* x, std::int64_t n,
                                                   const double* sum_of_squares, double max_norm) {
  const float factor = clip_factor_of(*sum_of_squares, max_norm);
  if (factor == 1.f) return;  // as the host, which does not scale then
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    x[i] *= factor;
}

static __global__ void scale_kernel(float* x, std::int64_t n, float factor) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    x[i] *= factor;
}

namespace {

// Launches `op` over every element of every tensor, as few launches as the argument limits
// allow. A tensor whose chunks do not fit the current launch continues in the next one.
template <typename T, typename Op>
void multi_tensor_launch(cudaStream_t stream, const T* tensors, int count, const Op& op) {
  TensorList<T> list{};
  int slots = 0, blocks = 0;
  const auto flush = [&] {
    if (blocks == 0) return;
    multi_tensor_kernel<T, Op><<<blocks, kChunkThreads, 0, stream>>>(list, op);
    PIPELINE_CUDA_LAUNCH_CHECK();
    blocks = 0;
  };
  for (int k = 0; k < count; ++k) {
    const T& t = tensors[k];
    if (t.n <= 0) continue;
    if (slots == kMaxTensors) {
      flush();
      slots = 0;
    }
    list.tensors[slots] = t;
    const std::int64_t chunks = (t.n + kChunk - 1) / kChunk;
    for (std::int64_t c = 0; c < chunks; ++c) {
      if (blocks == kMaxBlocks) {
        flush();
        // The tensor being cut up carries over as the first of the next launch.
        list.tensors[0] = t;
        slots = 0;
      }
      list.block_tensor[blocks] = static_cast<unsigned char>(slots);
      list.block_chunk[blocks] = static_cast<int>(c);
      ++blocks;
    }
    ++slots;
  }
  flush();
}

}  // namespace

void sgd_update(cudaStream_t stream, const SgdTensor* tensors, int count, const SgdStep& step) {
  if (count <= 0) return;
  multi_tensor_launch(stream, tensors, count, SgdOp{step, step.momentum != 0.f});
}

void adamw_update(cudaStream_t stream, const AdamWTensor* tensors, int count,
                  const AdamWStep& step) {
  if (count <= 0) return;
  multi_tensor_launch(stream, tensors, count, AdamWOp{step});
}

void sum_of_squares_async(cudaStream_t stream, const float* x, std::int64_t n, double* workspace,
                          double* out) {
  if (n <= 0) {
    PIPELINE_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  // At least 16 elements per thread before another block is worth its partial sum.
  const std::int64_t per_block = std::int64_t{kSumOfSquaresThreads} * 16;
  const int blocks = static_cast<int>(
      std::clamp<std::int64_t>((n + per_block - 1) / per_block, 1, kMaxReduceBlocks));
  sum_of_squares_partial_kernel<<<blocks, kSumOfSquaresThreads, 0, stream>>>(x, n, workspace);
  PIPELINE_CUDA_LAUNCH_CHECK();
  sum_of_squares_final_kernel<<<1, kSumOfSquaresThreads, 0, stream>>>(workspace, blocks, out);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

double sum_of_squares(cudaStream_t stream, const float* x, std::int64_t n, double* workspace) {
  if (n <= 0) return 0.0;
  double* out = workspace + kMaxReduceBlocks;
  sum_of_squares_async(stream, x, n, workspace, out);
  double result = 0.0;
  PIPELINE_CUDA_CHECK(
      cudaMemcpyAsync(&result, out, sizeof(double), cudaMemcpyDeviceToHost, stream));
  PIPELINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

void scale(cudaStream_t stream, float* x, std::int64_t n, float factor) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  scale_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, factor);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void add_in_order(cudaStream_t stream, const double* parts, int count, double* total) {
  add_in_order_kernel<<<1, 1, 0, stream>>>(parts, count, total);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void scale_by_clip_factor(cudaStream_t stream, float* x, std::int64_t n,
                          const double* sum_of_squares, double max_norm) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  scale_by_clip_factor_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(
      x, n, sum_of_squares, max_norm);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
