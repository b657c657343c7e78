#include <pipeline/ops/embedding.hpp>

#include "../core/parallel.hpp"
#include "cuda_dispatch.hpp"
#include "eigen_maps.hpp"

#include <algorithm>
#include <limits>

#if PIPELINE_WITH_CUDA
#include <pipeline/cuda/graph.hpp>
#include "bias.cuh"

#include "check_range.cuh"
#include "embedding.cuh"
#endif

namespace pipeline::ops {

namespace {

using detail::as_matrix;

constexpr std::int64_t kParallelWork = 1 << 15;

void check_ids(const Tensor& ids, std::int64_t vocab) {
  PIPELINE_CHECK(ids.dtype() == DType::Int32 && ids.device().is_cpu(),
                 "embedding: ids must be an int32 CPU tensor, got {} on {}",
                 dtype_name(ids.dtype()), ids.device().str());
  const std::int32_t* ip = ids.data<std::int32_t>();
  const std::int64_t n = ids.numel();
  const std::int32_t* bad =
      std::find_if(ip, ip + n, [vocab](std::int32_t id) { return id < 0 || id >= vocab; });
  PIPELINE_CHECK(bad == ip + n,
                 "embedding: id {} at flat position {} of ids {} is out of range for a vocabulary "
                 "of {}: ids must lie in [0, {})",
                 bad == ip + n ? 0 : *bad, bad - ip, ids.shape(), vocab, vocab);
}

void check_table(const char* what, const Tensor& t) {
  PIPELINE_CHECK(t.rank() == 2 && t.dtype() == DType::Float32,
                 "embedding: {} must be a float32 [rows, dim] matrix, got {} {}", what,
                 dtype_name(t.dtype()), t.shape());
}

#if PIPELINE_WITH_CUDA
// check_ids for ids on a CUDA device: the same error, found by a kernel (waits for the stream).
void check_cuda_ids(const detail::CudaScope& cuda, const Tensor& ids, std::int64_t vocab) {
  PIPELINE_CHECK(ids.dtype() == DType::Int32,
                 "embedding: ids must be an int32 tensor, got {} on {}", dtype_name(ids.dtype()),
                 ids.device().str());
  PIPELINE_CHECK(ids.numel() <= std::numeric_limits<std::int32_t>::max(),
                 "embedding on {}: {} ids exceed the kernels' 2^31 - 1", ids.device().str(),
                 ids.numel());
  const std::int32_t hi = static_cast<std::int32_t>(
      std::min<std::int64_t>(vocab, std::numeric_limits<std::int32_t>::max()));
  Tensor scratch = cuda.scratch_bytes(sizeof(kernels::RangeViolation));
  auto* status = static_cast<kernels::RangeViolation*>(scratch.raw());
  const auto check = [shape = ids.shape(), vocab](const kernels::RangeViolation& bad) {
    PIPELINE_CHECK(bad.index < 0,
                   "embedding: id {} at flat position {} of ids {} is out of range for a "
                   "vocabulary of {}: ids must lie in [0, {})",
                   bad.value, bad.index, shape, vocab, vocab);
  };
  // Inside a CUDA graph capture the result cannot be waited for: the graph checks it after each
  // replay (the kernels leave out-of-range ids alone meanwhile).
  kernels::find_out_of_range(cuda.stream(), ids.device_data<std::int32_t>(), ids.numel(), 0, hi,
                             status);
  if (cuda::defer_check(cuda.stream(), {scratch, [check](const void* host) {
                                          check(*static_cast<const kernels::RangeViolation*>(host));
                                        }}))
    return;
  kernels::RangeViolation bad;
  PIPELINE_CUDA_CHECK(
      cudaMemcpyAsync(&bad, status, sizeof(bad), cudaMemcpyDeviceToHost, cuda.stream()));
  PIPELINE_CUDA_CHECK(cudaStreamSynchronize(cuda.stream()));
  check(bad);
}
#endif

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) {
  check_table("table", table);
  const std::int64_t vocab = table.dim(0), dim = table.dim(1), n = ids.numel();
  PIPELINE_CHECK(out.numel() == n * dim, "embedding_forward: output {} cannot hold {} rows of {}",
                 out.shape(), n, dim);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("embedding_forward", {&ids, &table, &out});
      d.is_cuda()) {
    PIPELINE_CHECK(out.dtype() == DType::Float32, "embedding_forward: the output must be float32");
    const detail::CudaScope cuda(d);
    check_cuda_ids(cuda, ids, vocab);
    kernels::embedding_forward(cuda.stream(), ids.device_data<std::int32_t>(), n,
                               table.device_data<float>(), dim, vocab, out.device_data<float>());
    return;
  }
#endif
  check_ids(ids, vocab);
  const std::int32_t* ip = ids.data<std::int32_t>();
  const float* tp = table.data<float>();
  float* op = out.data<float>();
  const int threads = pipeline::detail::threads_for(n * dim, kParallelWork);
  pipeline::detail::parallel_for(n, threads, [&](std::int64_t i) {
    std::copy_n(tp + static_cast<std::int64_t>(ip[i]) * dim, dim, op + i * dim);
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  check_table("table gradient", dtable);
  const std::int64_t vocab = dtable.dim(0), dim = dtable.dim(1), n = ids.numel();
  PIPELINE_CHECK(dout.numel() == n * dim,
                 "embedding_backward: output gradient {} does not hold {} rows of {}", dout.shape(),
                 n, dim);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("embedding_backward", {&ids, &dout, &dtable});
      d.is_cuda()) {
    PIPELINE_CHECK(dim <= std::int64_t{65535} * 128,
                   "embedding_backward on {}: rows of {} exceed the kernel's 65535 x 128 columns",
                   d.str(), dim);
    const detail::CudaScope cuda(d);
    check_cuda_ids(cuda, ids, vocab);
    Tensor workspace = cuda.scratch_bytes(kernels::embedding_backward_workspace_bytes(n, vocab));
    kernels::embedding_backward(cuda.stream(), ids.device_data<std::int32_t>(), n,
                                dout.device_data<float>(), dim, vocab, dtable.device_data<float>(),
                                workspace.raw());
    return;
  }
#endif
  check_ids(ids, vocab);
  const std::int32_t* ip = ids.data<std::int32_t>();
  auto G = as_matrix(dout, n, dim);
  auto T = as_matrix(dtable);
  // Repeated ids make a row-parallel scatter race; columns are independent instead, so threads
  // take disjoint column blocks and each walks all ids in order (deterministic sums).
  const std::int64_t blocks = n * dim >= kParallelWork ? std::max<std::int64_t>(dim / 64, 1) : 1;
  pipeline::detail::parallel_for(blocks, num_threads(), [&](std::int64_t blk) {
    const std::int64_t c0 = dim * blk / blocks, c1 = dim * (blk + 1) / blocks;
    for (std::int64_t i = 0; i < n; ++i)
      T.row(ip[i]).segment(c0, c1 - c0) += G.row(i).segment(c0, c1 - c0);
  });
}

void add_positions(Tensor& out, std::int64_t steps, const Tensor& pos) {
  check_table("position table", pos);
  const std::int64_t dim = pos.dim(1);
  PIPELINE_CHECK(steps > 0 && steps <= pos.dim(0),
                 "add_positions: {} steps do not fit a position table of {} rows", steps,
                 pos.dim(0));
  PIPELINE_CHECK(out.numel() % (steps * dim) == 0,
                 "add_positions: output {} is not a whole number of [{}, {}] sequences",
                 out.shape(), steps, dim);
  const std::int64_t rows = out.numel() / (steps * dim);
#if PIPELINE_WITH_CUDA
  // Per sequence, out += the first `steps` rows of pos: a bias of steps · dim features.
  if (const Device d = detail::common_device("add_positions", {&out, &pos}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::add_bias(cuda.stream(), out.device_data<float>(), pos.device_data<float>(), rows,
                      steps * dim);
    return;
  }
#endif
  auto P = as_matrix(pos).topRows(steps);
  for (std::int64_t r = 0; r < rows; ++r)
    detail::MatrixMap(out.data<float>() + r * steps * dim, steps, dim) += P;
}

void positions_grad(const Tensor& dout, std::int64_t steps, Tensor& dpos) {
  check_table("position table gradient", dpos);
  const std::int64_t dim = dpos.dim(1);
  PIPELINE_CHECK(steps > 0 && steps <= dpos.dim(0),
                 "positions_grad: {} steps do not fit a position table of {} rows", steps,
                 dpos.dim(0));
  PIPELINE_CHECK(dout.numel() % (steps * dim) == 0,
                 "positions_grad: gradient {} is not a whole number of [{}, {}] sequences",
                 dout.shape(), steps, dim);
  const std::int64_t rows = dout.numel() / (steps * dim);
#if PIPELINE_WITH_CUDA
  // The bias gradient of steps · dim features, summed over the sequences.
  if (const Device d = detail::common_device("positions_grad", {&dout, &dpos}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    Tensor workspace = cuda.scratch_floats(kernels::bias_grad_workspace_floats(rows, steps * dim));
    kernels::bias_grad(cuda.stream(), dout.device_data<float>(), rows, steps * dim,
                       dpos.device_data<float>(), workspace.device_data<float>());
    return;
  }
#endif
  auto P = as_matrix(dpos).topRows(steps);
  for (std::int64_t r = 0; r < rows; ++r)
    P += detail::ConstMatrixMap(dout.data<float>() + r * steps * dim, steps, dim);
}

}  // namespace pipeline::ops
