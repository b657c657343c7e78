#include <pipeline/ops/convert.hpp>
#include <pipeline/ops/norm.hpp>

#include "../core/parallel.hpp"
#include "cuda_dispatch.hpp"
#include "eigen_maps.hpp"

#include <cmath>
#include <limits>
#include <vector>

#if PIPELINE_WITH_CUDA
#include "batch_norm.cuh"
#include "layer_norm.cuh"
#endif

namespace pipeline::ops {

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf, Eigen::Unaligned>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf, Eigen::Unaligned>;

// Elements per thread: below, waking a thread costs more than its share saves.
constexpr std::int64_t kParallelWork = 1 << 14;

// Devices are not checked here: common_device() refuses a mix, and host access to a device
// tensor is an error of its own.
void check_f32(const char* op, const char* what, const Tensor& t) {
  PIPELINE_CHECK(t.defined() && t.dtype() == DType::Float32,
                 "{}: {} must be a defined float32 tensor", op, what);
}

void check_vector(const char* op, const char* what, const Tensor& t, std::int64_t n) {
  check_f32(op, what, t);
  PIPELINE_CHECK(t.numel() == n, "{}: {} has shape {} but {} elements are needed", op, what,
                 t.shape(), n);
}

std::int64_t layer_norm_features(const Tensor& x, const Tensor& weight) {
  check_f32("layer_norm", "x", x);
  check_f32("layer_norm", "weight", weight);
  const std::int64_t f = weight.numel();
  PIPELINE_CHECK(f > 0 && x.rank() >= 1 && x.dim(-1) == f,
                 "layer_norm over {} features does not fit input {}: the last extent must be {}", f,
                 x.shape(), f);
  return f;
}

struct NchwDims {
  std::int64_t n, c, hw;
};

NchwDims batch_norm_dims(const Tensor& x, const Tensor& weight) {
  check_f32("batch_norm", "x", x);
  PIPELINE_CHECK(x.rank() == 4, "batch_norm expects [N, C, H, W] input, got {}", x.shape());
  NchwDims d{x.dim(0), x.dim(1), x.dim(2) * x.dim(3)};
  check_vector("batch_norm", "weight", weight, d.c);
  return d;
}

// Per-channel Σ over the N blocks of H·W of f(block, n, c) (an Eigen array expression's sum).
template <typename Fn>
double channel_sum(const NchwDims& d, std::int64_t c, Fn&& f) {
  double s = 0;
  for (std::int64_t n = 0; n < d.n; ++n) s += static_cast<double>(f((n * d.c + c) * d.hw));
  return s;
}

}  // namespace

// ---- layer norm ------------------------------------------------------------------------------

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                        Tensor& y, Tensor& mean, Tensor& rstd) {
  const std::int64_t f = layer_norm_features(x, weight);
  const std::int64_t rows = x.numel() / f;
  check_vector("layer_norm_forward", "bias", bias, f);
  const bool bf16 = y.dtype() == DType::BFloat16;  // rounded as it is written
  PIPELINE_CHECK(y.numel() == x.numel() && (bf16 || y.dtype() == DType::Float32),
                 "layer_norm_forward: y must be {} float32 or bfloat16 values, got {} {}",
                 x.numel(), y.numel(), dtype_name(y.dtype()));
  check_vector("layer_norm_forward", "mean", mean, rows);
  check_vector("layer_norm_forward", "rstd", rstd, rows);
  PIPELINE_CHECK(eps > 0.f, "layer_norm_forward: eps must be positive, got {}", eps);
#if PIPELINE_WITH_CUDA
  if (const Device d =
          detail::common_device("layer_norm_forward", {&x, &weight, &bias, &y, &mean, &rstd});
      d.is_cuda()) {
    const detail::CudaScope cuda(d);
    if (bf16)
      kernels::layer_norm_forward_bf16(cuda.stream(), x.device_data<float>(),
                                       weight.device_data<float>(), bias.device_data<float>(), rows,
                                       f, eps, y.device_data<std::uint16_t>(),
                                       mean.device_data<float>(), rstd.device_data<float>());
    else
      kernels::layer_norm_forward(cuda.stream(), x.device_data<float>(),
                                  weight.device_data<float>(), bias.device_data<float>(), rows, f,
                                  eps, y.device_data<float>(), mean.device_data<float>(),
                                  rstd.device_data<float>());
    return;
  }
#endif
  if (bf16)
    return compute_rounded(
        y, [&](Tensor& y32) { layer_norm_forward(x, weight, bias, eps, y32, mean, rstd); });
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
  ConstArrayMap W(weight.data<float>(), f), B(bias.data<float>(), f);
  const int threads = pipeline::detail::threads_for(rows * f, kParallelWork);
  pipeline::detail::parallel_for(rows, threads, [&](std::int64_t r) {
    ConstArrayMap X(xp + r * f, f);
    // Two passes (mean, then centred squares) keep the variance accurate when |mean| >> std.
    const float m = X.sum() / static_cast<float>(f);
    const float var = (X - m).square().sum() / static_cast<float>(f);
    const float rs = 1.f / std::sqrt(var + eps);
    mp[r] = m;
    rp[r] = rs;
    ArrayMap(yp + r * f, f) = (X - m) * rs * W + B;
  });
}

void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, Tensor* dx, Tensor* dweight,
                         Tensor* dbias) {
  const std::int64_t f = layer_norm_features(x, weight);
  const std::int64_t rows = x.numel() / f;
  check_vector("layer_norm_backward", "mean", mean, rows);
  check_vector("layer_norm_backward", "rstd", rstd, rows);
  check_vector("layer_norm_backward", "dy", dy, x.numel());
  if (dx) check_vector("layer_norm_backward", "dx", *dx, x.numel());
  if (dweight) check_vector("layer_norm_backward", "dweight", *dweight, f);
  if (dbias) check_vector("layer_norm_backward", "dbias", *dbias, f);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("layer_norm_backward",
                                             {&x, &weight, &mean, &rstd, &dy, dx, dweight, dbias});
      d.is_cuda()) {
    const detail::CudaScope cuda(d);
    Tensor workspace = cuda.scratch_floats(
        dweight || dbias ? kernels::layer_norm_backward_workspace_floats(rows, f) : 0);
    kernels::layer_norm_backward(
        cuda.stream(), x.device_data<float>(), weight.device_data<float>(),
        mean.device_data<float>(), rstd.device_data<float>(), dy.device_data<float>(), rows, f,
        dx ? dx->device_data<float>() : nullptr, dweight ? dweight->device_data<float>() : nullptr,
        dbias ? dbias->device_data<float>() : nullptr, workspace.device_data<float>());
    return;
  }
#endif
  const float* xp = x.data<float>();
  const float* gp = dy.data<float>();
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  ConstArrayMap W(weight.data<float>(), f);
  if (dx) {
    float* dp = dx->data<float>();
    const float inv_f = 1.f / static_cast<float>(f);
    const int threads = pipeline::detail::threads_for(rows * f, kParallelWork);
    pipeline::detail::parallel_for(rows, threads, [&](std::int64_t r) {
      ConstArrayMap X(xp + r * f, f), G(gp + r * f, f);
      ArrayMap D(dp + r * f, f);
      // dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)), g = dy ⊙ weight; D holds x̂ first.
      D = (X - mp[r]) * rp[r];
      const float g_mean = (G * W).sum() * inv_f;
      const float gx_mean = (G * W * D).sum() * inv_f;
      D = rp[r] * (G * W - g_mean - D * gx_mean);
    });
  }
  if (dweight) {
    ArrayMap DW(dweight->data<float>(), f);
    for (std::int64_t r = 0; r < rows; ++r)
      DW += ConstArrayMap(gp + r * f, f) * (ConstArrayMap(xp + r * f, f) - mp[r]) * rp[r];
  }
  if (dbias) {
    detail::as_vector(*dbias) += detail::as_matrix(dy, rows, f).colwise().sum().transpose();
  }
}

// ---- batch norm ------------------------------------------------------------------------------

void batch_norm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                              float momentum, Tensor& running_mean, Tensor& running_var, Tensor& y,
                              Tensor& mean, Tensor& rstd) {
  const NchwDims d = batch_norm_dims(x, weight);
  const std::int64_t count = d.n * d.hw;
  PIPELINE_CHECK(count > 1,
                 "batch_norm in training needs more than one value per channel, got input {}: "
                 "use a larger batch or evaluation mode",
                 x.shape());
  PIPELINE_CHECK(eps > 0.f, "batch_norm: eps must be positive, got {}", eps);
  PIPELINE_CHECK(momentum >= 0.f && momentum <= 1.f,
                 "batch_norm: momentum must be in [0, 1], got {}", momentum);
  check_vector("batch_norm_forward_train", "bias", bias, d.c);
  check_vector("batch_norm_forward_train", "running_mean", running_mean, d.c);
  check_vector("batch_norm_forward_train", "running_var", running_var, d.c);
  check_vector("batch_norm_forward_train", "y", y, x.numel());
  check_vector("batch_norm_forward_train", "mean", mean, d.c);
  check_vector("batch_norm_forward_train", "rstd", rstd, d.c);
#if PIPELINE_WITH_CUDA
  if (const Device dev = detail::common_device(
          "batch_norm_forward_train",
          {&x, &weight, &bias, &running_mean, &running_var, &y, &mean, &rstd});
      dev.is_cuda()) {
    const detail::CudaScope cuda(dev);
    kernels::batch_norm_forward_train(
        cuda.stream(), x.device_data<float>(), weight.device_data<float>(),
        bias.device_data<float>(), d.n, d.c, d.hw, eps, momentum,
        running_mean.device_data<float>(), running_var.device_data<float>(),
        y.device_data<float>(), mean.device_data<float>(), rstd.device_data<float>());
    return;
  }
#endif
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const float* wp = weight.data<float>();
  const float* bp = bias.data<float>();
  float* rmp = running_mean.data<float>();
  float* rvp = running_var.data<float>();
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
  const std::int64_t hw = d.hw;
  const int threads = pipeline::detail::threads_for(x.numel(), kParallelWork);
  pipeline::detail::parallel_for(d.c, threads, [&](std::int64_t c) {
    const double m =
        channel_sum(d, c, [&](std::int64_t o) { return ConstArrayMap(xp + o, hw).sum(); }) /
        static_cast<double>(count);
    const float mf = static_cast<float>(m);
    const double ss = channel_sum(
        d, c, [&](std::int64_t o) { return (ConstArrayMap(xp + o, hw) - mf).square().sum(); });
    const double var = ss / static_cast<double>(count);
    const float rs = static_cast<float>(1.0 / std::sqrt(var + eps));
    mp[c] = mf;
    rp[c] = rs;
    const float scale = rs * wp[c], shift = bp[c] - mf * scale;
    for (std::int64_t n = 0; n < d.n; ++n) {
      const std::int64_t o = (n * d.c + c) * hw;
      ArrayMap(yp + o, hw) = ConstArrayMap(xp + o, hw) * scale + shift;
    }
    const double unbiased = ss / static_cast<double>(count - 1);
    rmp[c] = (1.f - momentum) * rmp[c] + momentum * mf;
    rvp[c] = (1.f - momentum) * rvp[c] + momentum * static_cast<float>(unbiased);
  });
}

void batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                             const Tensor& running_mean, const Tensor& running_var, Tensor& y,
                             Tensor& mean, Tensor& rstd) {
  const NchwDims d = batch_norm_dims(x, weight);
  PIPELINE_CHECK(eps > 0.f, "batch_norm: eps must be positive, got {}", eps);
  check_vector("batch_norm_forward_eval", "bias", bias, d.c);
  check_vector("batch_norm_forward_eval", "running_mean", running_mean, d.c);
  check_vector("batch_norm_forward_eval", "running_var", running_var, d.c);
  check_vector("batch_norm_forward_eval", "y", y, x.numel());
  check_vector("batch_norm_forward_eval", "mean", mean, d.c);
  check_vector("batch_norm_forward_eval", "rstd", rstd, d.c);
#if PIPELINE_WITH_CUDA
  if (const Device dev = detail::common_device(
          "batch_norm_forward_eval",
          {&x, &weight, &bias, &running_mean, &running_var, &y, &mean, &rstd});
      dev.is_cuda()) {
    // The CPU's check of a negative running variance would need the values on the host (a
    // wait on the stream in every evaluation step); on CUDA such a channel normalises to NaN.
    const detail::CudaScope cuda(dev);
    kernels::batch_norm_forward_eval(
        cuda.stream(), x.device_data<float>(), weight.device_data<float>(),
        bias.device_data<float>(), d.n, d.c, d.hw, eps, running_mean.device_data<float>(),
        running_var.device_data<float>(), y.device_data<float>(), mean.device_data<float>(),
        rstd.device_data<float>());
    return;
  }
#endif
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const float* wp = weight.data<float>();
  const float* bp = bias.data<float>();
  const float* rvp = running_var.data<float>();
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
  mean.copy_from(running_mean);
  for (std::int64_t c = 0; c < d.c; ++c) {
    PIPELINE_CHECK(rvp[c] + eps > 0.f, "batch_norm: running_var[{}] = {} is negative", c, rvp[c]);
    rp[c] = 1.f / std::sqrt(rvp[c] + eps);
  }
  const std::int64_t hw = d.hw;
  const int threads = pipeline::detail::threads_for(x.numel(), kParallelWork);
  pipeline::detail::parallel_for(d.n * d.c, threads, [&](std::int64_t nc) {
    const std::int64_t c = nc % d.c;
    const float scale = rp[c] * wp[c], shift = bp[c] - mp[c] * scale;
    ArrayMap(yp + nc * hw, hw) = ConstArrayMap(xp + nc * hw, hw) * scale + shift;
  });
}

void batch_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dy, bool training, Tensor* dx,
                         Tensor* dweight, Tensor* dbias) {
  const NchwDims d = batch_norm_dims(x, weight);
  check_vector("batch_norm_backward", "mean", mean, d.c);
  check_vector("batch_norm_backward", "rstd", rstd, d.c);
  check_vector("batch_norm_backward", "dy", dy, x.numel());
  if (dx) check_vector("batch_norm_backward", "dx", *dx, x.numel());
  if (dweight) check_vector("batch_norm_backward", "dweight", *dweight, d.c);
  if (dbias) check_vector("batch_norm_backward", "dbias", *dbias, d.c);
#if PIPELINE_WITH_CUDA
  if (const Device dev = detail::common_device(
          "batch_norm_backward", {&x, &weight, &mean, &rstd, &dy, dx, dweight, dbias});
      dev.is_cuda()) {
    const detail::CudaScope cuda(dev);
    kernels::batch_norm_backward(
        cuda.stream(), x.device_data<float>(), weight.device_data<float>(),
        mean.device_data<float>(), rstd.device_data<float>(), dy.device_data<float>(), d.n, d.c,
        d.hw, training, dx ? dx->device_data<float>() : nullptr,
        dweight ? dweight->device_data<float>() : nullptr,
        dbias ? dbias->device_data<float>() : nullptr);
    return;
  }
#endif
  const float* xp = x.data<float>();
  const float* gp = dy.data<float>();
  const float* wp = weight.data<float>();
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  float* dxp = dx ? dx->data<float>() : nullptr;
  float* dwp = dweight ? dweight->data<float>() : nullptr;
  float* dbp = dbias ? dbias->data<float>() : nullptr;
  const std::int64_t hw = d.hw;
  const double count = static_cast<double>(d.n * d.hw);
  const int threads = pipeline::detail::threads_for(x.numel(), kParallelWork);
  pipeline::detail::parallel_for(d.c, threads, [&](std::int64_t c) {
    const float m = mp[c], rs = rp[c];
    // Σ dy and Σ dy ⊙ x̂ over the channel: the bias and weight gradients, and the two
    // projections the training-mode input gradient removes.
    const double sum_g =
        channel_sum(d, c, [&](std::int64_t o) { return ConstArrayMap(gp + o, hw).sum(); });
    const double sum_gx =
        channel_sum(d, c,
                    [&](std::int64_t o) {
                      return (ConstArrayMap(gp + o, hw) * (ConstArrayMap(xp + o, hw) - m)).sum();
                    }) *
        rs;
    if (dbp) dbp[c] += static_cast<float>(sum_g);
    if (dwp) dwp[c] += static_cast<float>(sum_gx);
    if (!dxp) return;
    const float k = rs * wp[c];
    // Training: dx = w·rstd · (dy − mean(dy) − x̂ · mean(dy ⊙ x̂)); evaluation: dx = w·rstd · dy.
    const float g_mean = training ? static_cast<float>(sum_g / count) : 0.f;
    const float gx_mean = training ? static_cast<float>(sum_gx / count) : 0.f;
    for (std::int64_t n = 0; n < d.n; ++n) {
      const std::int64_t o = (n * d.c + c) * hw;
      ConstArrayMap X(xp + o, hw), G(gp + o, hw);
      ArrayMap(dxp + o, hw) = k * (G - g_mean - (X - m) * (rs * gx_mean));
    }
  });
}

}  // namespace pipeline::ops
