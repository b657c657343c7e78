#include <pipeline/ops/softmax_xent.hpp>

#include "cuda_dispatch.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#if PIPELINE_WITH_CUDA
#include "softmax_xent.cuh"
#endif

namespace pipeline::ops {

namespace {

// The shape checks both forms make; returns the row count.
std::int64_t check_operands(const Tensor& logits, const Tensor& labels, const Tensor& grad) {
  PIPELINE_CHECK_AS(ConfigError, logits.rank() >= 1 && logits.dim(-1) > 0,
                    "softmax_cross_entropy needs logits [..., classes], got {}", logits.shape());
  PIPELINE_CHECK_AS(ConfigError, labels.dtype() == DType::Int32,
                    "softmax_cross_entropy labels must be int32, got {}",
                    dtype_name(labels.dtype()));
  const std::int64_t classes = logits.dim(-1);
  const std::int64_t rows = logits.numel() / classes;
  PIPELINE_CHECK_AS(ConfigError, labels.numel() == rows,
                    "softmax_cross_entropy: {} labels for logits {} ({} rows of {} classes)",
                    labels.numel(), logits.shape(), rows, classes);
  PIPELINE_CHECK(grad.shape() == logits.shape(),
                 "softmax_cross_entropy: gradient is {} but must be {}", grad.shape(),
                 logits.shape());
  PIPELINE_CHECK_AS(
      ConfigError,
      !logits.device().is_cuda() || classes <= std::numeric_limits<std::int32_t>::max(),
      "softmax_cross_entropy on {}: {} classes exceed the kernel's 2^31 - 1", logits.device().str(),
      classes);
  return rows;
}

}  // namespace

SoftmaxXentResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float scale,
                                        Tensor& grad) {
  const std::int64_t rows = check_operands(logits, labels, grad);
  const std::int64_t classes = logits.dim(-1);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("softmax_cross_entropy", {&logits, &labels, &grad});
      d.is_cuda()) {
    const detail::CudaScope cuda(d);
    Tensor workspace = cuda.scratch_bytes(kernels::softmax_xent_workspace_bytes(rows));
    const kernels::SoftmaxXentTotals t = kernels::softmax_xent(
        cuda.stream(), logits.device_data<float>(), labels.device_data<std::int32_t>(), rows,
        classes, scale, grad.device_data<float>(), workspace.raw());
    PIPELINE_CHECK_AS(ConfigError, t.bad_label.index < 0,
                      "label {} of sample {} is outside [0, {}): check the dataset's labels and "
                      "the model's class count",
                      t.bad_label.value, t.bad_label.index, classes);
    return {t.loss, t.correct, rows};
  }
#endif
  const std::int32_t* y = labels.data<std::int32_t>();
  for (std::int64_t r = 0; r < rows; ++r)
    PIPELINE_CHECK_AS(ConfigError, y[r] >= 0 && y[r] < classes,
                      "label {} of sample {} is outside [0, {}): check the dataset's labels and "
                      "the model's class count",
                      y[r], r, classes);

  const float* z = logits.data<float>();
  float* g = grad.data<float>();
  SoftmaxXentResult out;
  out.count = rows;
  double loss = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* zr = z + r * classes;
    float* gr = g + r * classes;
    std::int64_t arg = 0;
    for (std::int64_t c = 1; c < classes; ++c)
      if (zr[c] > zr[arg]) arg = c;
    const float zmax = zr[arg];
    float sum = 0.f;
    for (std::int64_t c = 0; c < classes; ++c) {
      gr[c] = std::exp(zr[c] - zmax);
      sum += gr[c];
    }
    const float inv = scale / sum;
    for (std::int64_t c = 0; c < classes; ++c) gr[c] *= inv;
    gr[y[r]] -= scale;
    // −log p[label] = log Σ exp(z − zmax) − (z[label] − zmax), accumulated in double.
    loss += std::log(static_cast<double>(sum)) - static_cast<double>(zr[y[r]] - zmax);
    out.correct += arg == y[r] ? 1 : 0;
  }
  out.loss = loss * static_cast<double>(scale);
  return out;
}

void softmax_cross_entropy_accumulate(const Tensor& logits, const Tensor& labels, float scale,
                                      Tensor& grad, Tensor& totals) {
  const std::int64_t rows = check_operands(logits, labels, grad);
  PIPELINE_CHECK(totals.defined() && totals.nbytes() >= 4 * sizeof(double),
                 "softmax_cross_entropy_accumulate: the totals need 32 bytes, got {}",
                 totals.nbytes());
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("softmax_cross_entropy_accumulate",
                                             {&logits, &labels, &grad, &totals});
      d.is_cuda()) {
    const detail::CudaScope cuda(d);
    Tensor workspace = cuda.scratch_bytes(kernels::softmax_xent_workspace_bytes(rows));
    kernels::softmax_xent_accumulate(cuda.stream(), logits.device_data<float>(),
                                     labels.device_data<std::int32_t>(), rows, logits.dim(-1),
                                     scale, grad.device_data<float>(), workspace.raw(),
                                     static_cast<double*>(totals.raw()));
    return;
  }
#endif
  PIPELINE_FAIL(Error,
                "softmax_cross_entropy_accumulate keeps its totals in device memory, for work on "
                "a GPU; on the CPU use softmax_cross_entropy ({} rows)",
                rows);
}

void set_softmax_xent_clusters(bool on) {
#if PIPELINE_WITH_CUDA
  kernels::set_softmax_xent_clusters(on);
#else
  (void)on;
#endif
}

}  // namespace pipeline::ops
