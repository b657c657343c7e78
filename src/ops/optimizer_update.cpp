#include <pipeline/ops/optimizer_update.hpp>

#include <pipeline/core/threads.hpp>

#include "../core/parallel.hpp"
#include "cuda_dispatch.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <vector>

#if PIPELINE_WITH_CUDA
#include "optimizer.cuh"
#endif

namespace pipeline::ops {

namespace {

using Array = Eigen::Map<Eigen::ArrayXf, Eigen::Unaligned>;
using ConstArray = Eigen::Map<const Eigen::ArrayXf, Eigen::Unaligned>;

void check_pair(const char* op, const Tensor& param, const Tensor& other, const char* what) {
  PIPELINE_CHECK(other.defined() && other.dtype() == DType::Float32 && other.device().is_cpu(),
                 "{}: {} must be a defined float32 CPU tensor", op, what);
  PIPELINE_CHECK(other.numel() == param.numel(),
                 "{}: {} has shape {} ({} elements) but the parameter has shape {} ({} elements)",
                 op, what, other.shape(), other.numel(), param.shape(), param.numel());
}

// The gradient and, with momentum, the momentum buffer of an SGD step checked against the
// parameter by `check` (check_pair on the CPU, check_cuda_pair on a GPU); true with momentum.
template <typename CheckPair>
bool check_sgd_pairs(const Tensor& param, const Tensor& grad, const Tensor* momentum_buffer,
                     const SgdParams& p, CheckPair check) {
  check("sgd_update", param, grad, "the gradient");
  if (p.momentum == 0.f) return false;
  PIPELINE_CHECK(momentum_buffer != nullptr, "sgd_update: momentum {} needs a momentum buffer",
                 p.momentum);
  check("sgd_update", param, *momentum_buffer, "the momentum buffer");
  return true;
}

// Each thread's piece of an update or reduction holds at least this many elements (16k floats of
// an SGD-momentum step move 320 KB, several times a region's fork and join); pieces are multiples
// of 16 floats, so that every piece's vector loads are aligned alike.
constexpr std::int64_t kMinPiece = 1 << 14;
constexpr std::int64_t kPieceAlign = 16;

// Adam's bias corrections in double: beta2^step underflows gracefully and 1 - beta^step keeps its
// digits for small steps; the per-element work stays in float.
struct AdamScalars {
  float step_size, inv_sqrt_bc2;
};
AdamScalars adam_scalars(std::int64_t step, const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(step));
  return {static_cast<float>(p.lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2))};
}

#if PIPELINE_WITH_CUDA
// check_pair for tensors on a CUDA device (same device already checked).
void check_cuda_pair(const char* op, const Tensor& param, const Tensor& other, const char* what) {
  PIPELINE_CHECK(other.defined() && other.dtype() == DType::Float32,
                 "{}: {} must be a defined float32 tensor", op, what);
  PIPELINE_CHECK(other.numel() == param.numel(),
                 "{}: {} has shape {} ({} elements) but the parameter has shape {} ({} elements)",
                 op, what, other.shape(), other.numel(), param.shape(), param.numel());
}

// One tensor's operands of a CUDA SGD step on `d`, checked, as the kernel takes them.
kernels::SgdTensor sgd_operands(Tensor& param, const Tensor& grad, Tensor* momentum_buffer,
                                const SgdParams& p, Device d) {
  PIPELINE_CHECK(detail::common_device("sgd_update", {&param, &grad, momentum_buffer}) == d,
                 "sgd_update: every tensor of one step must be on {}", d.str());
  check_cuda_pair("sgd_update", param, param, "the parameter");
  const bool use_momentum = check_sgd_pairs(param, grad, momentum_buffer, p, check_cuda_pair);
  return {param.device_data<float>(), grad.device_data<float>(),
          use_momentum ? momentum_buffer->device_data<float>() : nullptr, param.numel()};
}

kernels::SgdStep sgd_step(const SgdParams& p, bool first_step) {
  PIPELINE_CHECK_AS(ConfigError, !p.nesterov || (p.momentum != 0.f && p.dampening == 0.f),
                    "Nesterov momentum needs momentum > 0 and dampening 0 (got momentum {}, "
                    "dampening {})",
                    p.momentum, p.dampening);
  return {p.lr, p.momentum, p.dampening, p.weight_decay, p.nesterov, first_step};
}

// The same for an Adam(W) step.
kernels::AdamWTensor adamw_operands(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                                    Tensor& exp_avg_sq, Device d) {
  PIPELINE_CHECK(
      detail::common_device("adamw_update", {&param, &grad, &exp_avg, &exp_avg_sq}) == d,
      "adamw_update: every tensor of one step must be on {}", d.str());
  check_cuda_pair("adamw_update", param, param, "the parameter");
  check_cuda_pair("adamw_update", param, grad, "the gradient");
  check_cuda_pair("adamw_update", param, exp_avg, "exp_avg");
  check_cuda_pair("adamw_update", param, exp_avg_sq, "exp_avg_sq");
  return {param.device_data<float>(), grad.device_data<float>(), exp_avg.device_data<float>(),
          exp_avg_sq.device_data<float>(), param.numel()};
}

kernels::AdamWStep adamw_step(std::int64_t step, const AdamWParams& p) {
  PIPELINE_CHECK(step >= 1, "adamw_update: step counts from 1, got {}", step);
  PIPELINE_CHECK_AS(ConfigError, p.beta1 >= 0.f && p.beta1 < 1.f && p.beta2 >= 0.f && p.beta2 < 1.f,
                    "Adam betas must lie in [0, 1), got ({}, {})", p.beta1, p.beta2);
  const AdamScalars a = adam_scalars(step, p);
  return {a.step_size, a.inv_sqrt_bc2, p.beta1,     p.beta2, p.eps, p.weight_decay,
          1.f - p.lr * p.weight_decay, p.decoupled};
}

// The device pointer of a step_scalars tensor of at least `count` floats on `d` (null for none).
const float* step_scalars_on(const Tensor* scalars, std::size_t count, Device d, const char* op) {
  if (scalars == nullptr) return nullptr;
  PIPELINE_CHECK(scalars->device() == d && scalars->dtype() == DType::Float32 &&
                     scalars->numel() >= static_cast<std::int64_t>(count),
                 "{}: step scalars must be {} float32 values on {}, got {} {} on {}", op, count,
                 d.str(), scalars->shape(), dtype_name(scalars->dtype()), scalars->device().str());
  return scalars->device_data<float>();
}
#endif

// One tensor's operands of a CPU SGD step, checked.
struct SgdCpuTensor {
  float* w;
  const float* g;
  float* b;  // the momentum buffer; null without momentum
  std::int64_t n;
};
SgdCpuTensor sgd_cpu_operands(Tensor& param, const Tensor& grad, Tensor* momentum_buffer,
                              const SgdParams& p) {
  PIPELINE_CHECK(param.dtype() == DType::Float32 && param.device().is_cpu(),
                 "sgd_update: the parameter must be a float32 CPU tensor");
  const bool use_momentum = check_sgd_pairs(param, grad, momentum_buffer, p, check_pair);
  PIPELINE_CHECK_AS(ConfigError, !p.nesterov || (use_momentum && p.dampening == 0.f),
                    "Nesterov momentum needs momentum > 0 and dampening 0 (got momentum {}, "
                    "dampening {})",
                    p.momentum, p.dampening);
  return {param.data<float>(), grad.data<float>(),
          use_momentum ? momentum_buffer->data<float>() : nullptr, param.numel()};
}

// An update's passes (momentum, then weights) run over chunks this long, the chunk still in L1
// for the second pass: one trip to memory per tensor, not one per pass.
constexpr std::int64_t kCacheChunk = 1024;

// Runs pass(at, count) over [i, i + n) in kCacheChunk pieces.
template <typename Pass>
void by_cache_chunks(std::int64_t i, std::int64_t n, Pass&& pass) {
  for (std::int64_t at = i; at < i + n; at += kCacheChunk)
    pass(at, std::min(kCacheChunk, i + n - at));
}

// The SGD step on elements [i, i + n) of one tensor, all within one cache chunk.
void sgd_chunk(const SgdCpuTensor& t, std::int64_t i, std::int64_t n, bool first_step,
               const SgdParams& p) {
  const float lr = p.lr, mu = p.momentum, wd = p.weight_decay, keep = 1.f - p.dampening;
  Array W(t.w + i, n);
  ConstArray G(t.g + i, n);
  if (t.b == nullptr) {
    if (wd != 0.f)
      W -= lr * (G + wd * W);
    else
      W -= lr * G;
    return;
  }
  Array B(t.b + i, n);
  // d_p = g + wd·w is formed inside each expression rather than stored, so one pass suffices.
  if (first_step)
    B = G + wd * W;
  else
    B = mu * B + keep * (G + wd * W);
  if (p.nesterov)
    W -= lr * ((G + wd * W) + mu * B);
  else
    W -= lr * B;
}

void sgd_piece(const SgdCpuTensor& t, std::int64_t i, std::int64_t n, bool first_step,
               const SgdParams& p) {
  by_cache_chunks(i, n,
                  [&](std::int64_t at, std::int64_t c) { sgd_chunk(t, at, c, first_step, p); });
}

// The same for an Adam(W) step: one tensor's operands, the step's scalars, a piece's update.
struct AdamWCpuTensor {
  float* w;
  const float* g;
  float* m;
  float* v;
  std::int64_t n;
};
AdamWCpuTensor adamw_cpu_operands(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                                  Tensor& exp_avg_sq) {
  PIPELINE_CHECK(param.dtype() == DType::Float32 && param.device().is_cpu(),
                 "adamw_update: the parameter must be a float32 CPU tensor");
  check_pair("adamw_update", param, grad, "the gradient");
  check_pair("adamw_update", param, exp_avg, "exp_avg");
  check_pair("adamw_update", param, exp_avg_sq, "exp_avg_sq");
  return {param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
          param.numel()};
}

struct AdamWCpuStep {
  AdamWParams p;
  AdamScalars bias;
  float decay;  // 1 - lr * weight_decay
};
AdamWCpuStep adamw_cpu_step(std::int64_t step, const AdamWParams& p) {
  PIPELINE_CHECK(step >= 1, "adamw_update: step counts from 1, got {}", step);
  PIPELINE_CHECK_AS(ConfigError, p.beta1 >= 0.f && p.beta1 < 1.f && p.beta2 >= 0.f && p.beta2 < 1.f,
                    "Adam betas must lie in [0, 1), got ({}, {})", p.beta1, p.beta2);
  return {p, adam_scalars(step, p), 1.f - p.lr * p.weight_decay};
}

void adamw_chunk(const AdamWCpuTensor& t, std::int64_t i, std::int64_t n, const AdamWCpuStep& s) {
  const float b1 = s.p.beta1, b2 = s.p.beta2, eps = s.p.eps, wd = s.p.weight_decay;
  Array W(t.w + i, n), M(t.m + i, n), V(t.v + i, n);
  ConstArray G(t.g + i, n);
  if (s.p.decoupled) {
    if (wd != 0.f) W *= s.decay;
    M = b1 * M + (1.f - b1) * G;
    V = b2 * V + (1.f - b2) * G.square();
  } else {
    M = b1 * M + (1.f - b1) * (G + wd * W);
    V = b2 * V + (1.f - b2) * (G + wd * W).square();
  }
  W -= s.bias.step_size * M / (V.sqrt() * s.bias.inv_sqrt_bc2 + eps);
}

void adamw_piece(const AdamWCpuTensor& t, std::int64_t i, std::int64_t n, const AdamWCpuStep& s) {
  by_cache_chunks(i, n, [&](std::int64_t at, std::int64_t c) { adamw_chunk(t, at, c, s); });
}

// Σ x² of each CPU tensor. Float sums over short blocks (vectorised), added up in double: the
// rounding error stays near float epsilon however long the tensor, at the speed of a float
// reduction. The blocks of all tensors are summed in one region, each tensor's block sums then
// added up in block order on one thread, so a tensor's result is the same bit pattern on every
// rank and thread count, alone or among others, and inside an update's pass (GradientTail).
constexpr std::int64_t kSquaresBlock = 1024;
static_assert(kSquaresBlock == kCacheChunk, "an update's chunks are the blocks of its squares");

class BlockSquares {
 public:
  explicit BlockSquares(std::span<const std::int64_t> sizes) : m_first(sizes.size() + 1, 0) {
    for (std::size_t i = 0; i < sizes.size(); ++i)
      m_first[i + 1] = m_first[i] + (sizes[i] + kSquaresBlock - 1) / kSquaresBlock;
    m_sums.resize(static_cast<std::size_t>(m_first.back()));
  }
  std::int64_t blocks(std::size_t i) const { return m_first[i + 1] - m_first[i]; }
  // Tensor i's block from element `at` (a multiple of kSquaresBlock), n elements of it.
  void add(std::size_t i, const float* x, std::int64_t at, std::int64_t n) {
    m_sums[static_cast<std::size_t>(m_first[i] + at / kSquaresBlock)] =
        ConstArray(x + at, n).square().sum();
  }
  std::vector<double> totals() const {
    std::vector<double> out(m_first.size() - 1, 0.0);
    for (std::size_t i = 0; i < out.size(); ++i)
      for (std::int64_t b = m_first[i]; b < m_first[i + 1]; ++b)
        out[i] += static_cast<double>(m_sums[static_cast<std::size_t>(b)]);
    return out;
  }

 private:
  std::vector<std::int64_t> m_first;  // of each tensor's blocks
  std::vector<float> m_sums;
};

std::vector<double> cpu_sums_of_squares(std::span<const Tensor> xs) {
  std::vector<std::int64_t> sizes;
  for (const Tensor& x : xs) {
    PIPELINE_CHECK(x.dtype() == DType::Float32 && x.device().is_cpu(),
                   "sum_of_squares: expected a float32 CPU tensor, got {} on {}",
                   dtype_name(x.dtype()), x.device().str());
    sizes.push_back(x.numel());
  }
  BlockSquares squares(sizes);
  std::vector<std::int64_t> blocks;
  for (std::size_t i = 0; i < xs.size(); ++i) blocks.push_back(squares.blocks(i));
  pipeline::detail::for_each_piece_of(blocks, kMinPiece / kSquaresBlock, 1,
                                      [&](std::size_t i, std::int64_t from, std::int64_t count) {
                                        for (std::int64_t b = from; b < from + count; ++b) {
                                          const std::int64_t at = b * kSquaresBlock;
                                          squares.add(i, xs[i].data<float>(), at,
                                                      std::min(kSquaresBlock, sizes[i] - at));
                                        }
                                      });
  return squares.totals();
}

// An update of many CPU tensors with a GradientTail: `chunk(i, at, n)` updates elements [at, at +
// n) of tensor i, one cache chunk; the gradients' squares are summed before it, from the chunk
// still in L1, and the chunk zeroed after.
template <typename Chunk>
void update_with_tail(std::span<Tensor> grads, const GradientTail& tail, Chunk&& chunk) {
  PIPELINE_CHECK(tail.sums_of_squares.empty() || tail.sums_of_squares.size() == grads.size(),
                 "an update's tail: {} sums of squares for {} gradients",
                 tail.sums_of_squares.size(), grads.size());
  std::vector<std::int64_t> sizes;
  std::vector<float*> g;
  for (Tensor& t : grads) {
    sizes.push_back(t.numel());
    g.push_back(t.data<float>());
  }
  BlockSquares squares(sizes);
  const bool sum = !tail.sums_of_squares.empty();
  // Pieces of whole chunks, so that each chunk is one block of the squares.
  pipeline::detail::for_each_piece_of(
      sizes, kMinPiece, kSquaresBlock, [&](std::size_t i, std::int64_t at, std::int64_t n) {
        by_cache_chunks(at, n, [&](std::int64_t c, std::int64_t count) {
          if (sum) squares.add(i, g[i], c, count);
          chunk(i, c, count);
          if (tail.zero) std::fill_n(g[i] + c, count, 0.f);
        });
      });
  if (sum) std::ranges::copy(squares.totals(), tail.sums_of_squares.begin());
}

// The tail's work as passes of their own around `update` (GPU tensors).
template <typename Update>
void update_then_tail(std::span<Tensor> grads, const GradientTail& tail, Update&& update) {
  if (!tail.sums_of_squares.empty()) {
    const std::vector<double> sums = sums_of_squares(grads);
    std::ranges::copy(sums, tail.sums_of_squares.begin());
  }
  update();
  if (tail.zero) zero_all(grads);
}

// Step scalars exist for CUDA graphs only: the CPU update always takes its arguments.
void check_no_step_scalars(const Tensor* scalars, const char* op) {
  PIPELINE_CHECK(scalars == nullptr,
                 "{}: step scalars in device memory are for updates on a GPU (CUDA graphs); the "
                 "CPU update takes the step's values as arguments",
                 op);
}

void check_sgd_many(std::size_t params, std::size_t grads, std::size_t momentum_buffers) {
  PIPELINE_CHECK(grads == params && momentum_buffers == params,
                 "sgd_update_many: {} parameters, {} gradients and {} momentum buffers", params,
                 grads, momentum_buffers);
}

void check_adamw_many(std::size_t params, std::size_t grads, std::size_t exp_avg,
                      std::size_t exp_avg_sq) {
  PIPELINE_CHECK(grads == params && exp_avg == params && exp_avg_sq == params,
                 "adamw_update_many: {} parameters, {} gradients, {} and {} moments", params, grads,
                 exp_avg, exp_avg_sq);
}

// Every tensor's CPU operands, checked (the counts were checked by the caller).
std::vector<SgdCpuTensor> sgd_cpu_operands_of(std::span<Tensor> params,
                                              std::span<const Tensor> grads,
                                              std::span<Tensor* const> momentum_buffers,
                                              const SgdParams& p) {
  std::vector<SgdCpuTensor> t;
  for (std::size_t i = 0; i < params.size(); ++i)
    t.push_back(sgd_cpu_operands(params[i], grads[i], momentum_buffers[i], p));
  return t;
}

std::vector<AdamWCpuTensor> adamw_cpu_operands_of(std::span<Tensor> params,
                                                  std::span<const Tensor> grads,
                                                  std::span<Tensor> exp_avg,
                                                  std::span<Tensor> exp_avg_sq) {
  std::vector<AdamWCpuTensor> t;
  for (std::size_t i = 0; i < params.size(); ++i)
    t.push_back(adamw_cpu_operands(params[i], grads[i], exp_avg[i], exp_avg_sq[i]));
  return t;
}

}  // namespace

void sgd_update(Tensor& param, const Tensor& grad, Tensor* momentum_buffer, bool first_step,
                const SgdParams& p) {
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("sgd_update", {&param, &grad, momentum_buffer});
      d.is_cuda()) {
    const kernels::SgdTensor t = sgd_operands(param, grad, momentum_buffer, p, d);
    const kernels::SgdStep step = sgd_step(p, first_step);
    const detail::CudaScope cuda(d);
    kernels::sgd_update(cuda.stream(), &t, 1, step);
    return;
  }
#endif
  const SgdCpuTensor t = sgd_cpu_operands(param, grad, momentum_buffer, p);
  pipeline::detail::for_each_piece(
      t.n, kMinPiece, kPieceAlign,
      [&](std::int64_t i, std::int64_t n) { sgd_piece(t, i, n, first_step, p); });
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                  std::int64_t step, const AdamWParams& p) {
#if PIPELINE_WITH_CUDA
  if (const Device d =
          detail::common_device("adamw_update", {&param, &grad, &exp_avg, &exp_avg_sq});
      d.is_cuda()) {
    const kernels::AdamWTensor t = adamw_operands(param, grad, exp_avg, exp_avg_sq, d);
    const kernels::AdamWStep s = adamw_step(step, p);
    const detail::CudaScope cuda(d);
    kernels::adamw_update(cuda.stream(), &t, 1, s);
    return;
  }
#endif
  const AdamWCpuTensor t = adamw_cpu_operands(param, grad, exp_avg, exp_avg_sq);
  const AdamWCpuStep s = adamw_cpu_step(step, p);
  pipeline::detail::for_each_piece(
      t.n, kMinPiece, kPieceAlign,
      [&](std::int64_t i, std::int64_t n) { adamw_piece(t, i, n, s); });
}

void sgd_update_many(std::span<Tensor> params, std::span<const Tensor> grads,
                     std::span<Tensor* const> momentum_buffers, bool first_step, const SgdParams& p,
                     const Tensor* step_scalars) {
  check_sgd_many(params.size(), grads.size(), momentum_buffers.size());
#if PIPELINE_WITH_CUDA
  if (!params.empty() && params[0].device().is_cuda()) {
    const Device d = params[0].device();
    std::vector<kernels::SgdTensor> t;
    for (std::size_t i = 0; i < params.size(); ++i)
      t.push_back(sgd_operands(params[i], grads[i], momentum_buffers[i], p, d));
    kernels::SgdStep step = sgd_step(p, first_step);
    step.scalars = step_scalars_on(step_scalars, 1, d, "sgd_update_many");
    const detail::CudaScope cuda(d);
    kernels::sgd_update(cuda.stream(), t.data(), static_cast<int>(t.size()), step);
    return;
  }
#endif
  check_no_step_scalars(step_scalars, "sgd_update_many");
  const std::vector<SgdCpuTensor> t = sgd_cpu_operands_of(params, grads, momentum_buffers, p);
  std::vector<std::int64_t> sizes;
  for (const SgdCpuTensor& x : t) sizes.push_back(x.n);
  pipeline::detail::for_each_piece_of(sizes, kMinPiece, kPieceAlign,
                                      [&](std::size_t i, std::int64_t at, std::int64_t n) {
                                        sgd_piece(t[i], at, n, first_step, p);
                                      });
}

void sgd_update_many(std::span<Tensor> params, std::span<Tensor> grads,
                     std::span<Tensor* const> momentum_buffers, bool first_step, const SgdParams& p,
                     const GradientTail& tail) {
  if (!params.empty() && params[0].device().is_cuda())
    return update_then_tail(grads, tail, [&] {
      sgd_update_many(params, std::span<const Tensor>(grads), momentum_buffers, first_step, p);
    });
  check_sgd_many(params.size(), grads.size(), momentum_buffers.size());
  const std::vector<SgdCpuTensor> t = sgd_cpu_operands_of(params, grads, momentum_buffers, p);
  update_with_tail(grads, tail, [&](std::size_t i, std::int64_t at, std::int64_t n) {
    sgd_chunk(t[i], at, n, first_step, p);
  });
}

void adamw_update_many(std::span<Tensor> params, std::span<const Tensor> grads,
                       std::span<Tensor> exp_avg, std::span<Tensor> exp_avg_sq, std::int64_t step,
                       const AdamWParams& p, const Tensor* step_scalars) {
  check_adamw_many(params.size(), grads.size(), exp_avg.size(), exp_avg_sq.size());
#if PIPELINE_WITH_CUDA
  if (!params.empty() && params[0].device().is_cuda()) {
    const Device d = params[0].device();
    std::vector<kernels::AdamWTensor> t;
    for (std::size_t i = 0; i < params.size(); ++i)
      t.push_back(adamw_operands(params[i], grads[i], exp_avg[i], exp_avg_sq[i], d));
    kernels::AdamWStep s = adamw_step(step, p);
    s.scalars = step_scalars_on(step_scalars, 3, d, "adamw_update_many");
    const detail::CudaScope cuda(d);
    kernels::adamw_update(cuda.stream(), t.data(), static_cast<int>(t.size()), s);
    return;
  }
#endif
  check_no_step_scalars(step_scalars, "adamw_update_many");
  const AdamWCpuStep s = adamw_cpu_step(step, p);
  const std::vector<AdamWCpuTensor> t = adamw_cpu_operands_of(params, grads, exp_avg, exp_avg_sq);
  std::vector<std::int64_t> sizes;
  for (const AdamWCpuTensor& x : t) sizes.push_back(x.n);
  pipeline::detail::for_each_piece_of(
      sizes, kMinPiece, kPieceAlign,
      [&](std::size_t i, std::int64_t at, std::int64_t n) { adamw_piece(t[i], at, n, s); });
}

void adamw_update_many(std::span<Tensor> params, std::span<Tensor> grads, std::span<Tensor> exp_avg,
                       std::span<Tensor> exp_avg_sq, std::int64_t step, const AdamWParams& p,
                       const GradientTail& tail) {
  if (!params.empty() && params[0].device().is_cuda())
    return update_then_tail(grads, tail, [&] {
      adamw_update_many(params, std::span<const Tensor>(grads), exp_avg, exp_avg_sq, step, p);
    });
  check_adamw_many(params.size(), grads.size(), exp_avg.size(), exp_avg_sq.size());
  const AdamWCpuStep s = adamw_cpu_step(step, p);
  const std::vector<AdamWCpuTensor> t = adamw_cpu_operands_of(params, grads, exp_avg, exp_avg_sq);
  update_with_tail(grads, tail, [&](std::size_t i, std::int64_t at, std::int64_t n) {
    adamw_chunk(t[i], at, n, s);
  });
}

std::vector<float> sgd_step_scalars(const SgdParams& p) {
  return {p.lr};
}

std::vector<float> adamw_step_scalars(std::int64_t step, const AdamWParams& p) {
  PIPELINE_CHECK(step >= 1, "adamw_step_scalars: step counts from 1, got {}", step);
  const AdamScalars a = adam_scalars(step, p);
  return {a.step_size, a.inv_sqrt_bc2, 1.f - p.lr * p.weight_decay};
}

double sum_of_squares(const Tensor& x) {
#if PIPELINE_WITH_CUDA
  if (x.device().is_cuda()) {
    PIPELINE_CHECK(x.dtype() == DType::Float32, "sum_of_squares: expected a float32 tensor");
    const detail::CudaScope cuda(x.device());
    Tensor workspace = cuda.scratch_bytes(kernels::kSumOfSquaresWorkspace * sizeof(double));
    return kernels::sum_of_squares(cuda.stream(), x.device_data<float>(), x.numel(),
                                   static_cast<double*>(workspace.raw()));
  }
#endif
  return cpu_sums_of_squares(std::span<const Tensor>(&x, 1)).front();
}

std::vector<double> sums_of_squares(std::span<const Tensor> xs) {
#if PIPELINE_WITH_CUDA
  if (!xs.empty() && xs[0].device().is_cuda()) {
    std::vector<double> out(xs.size(), 0.0);
    const Device d = xs[0].device();
    const detail::CudaScope cuda(d);
    Tensor workspace = cuda.scratch_bytes(kernels::kSumOfSquaresWorkspace * sizeof(double));
    Tensor results = cuda.scratch_bytes(xs.size() * sizeof(double));
    auto* r = static_cast<double*>(results.raw());
    for (std::size_t i = 0; i < xs.size(); ++i) {
      PIPELINE_CHECK(xs[i].device() == d && xs[i].dtype() == DType::Float32,
                     "sums_of_squares: expected float32 tensors on {}, got {} on {}", d.str(),
                     dtype_name(xs[i].dtype()), xs[i].device().str());
      kernels::sum_of_squares_async(cuda.stream(), xs[i].device_data<float>(), xs[i].numel(),
                                    static_cast<double*>(workspace.raw()), r + i);
    }
    // The copy to the host waits for every sum at once.
    device_functions(d).copy(out.data(), Device::cpu(), r, d, out.size() * sizeof(double));
    return out;
  }
#endif
  return cpu_sums_of_squares(xs);
}

void scale_inplace(Tensor& x, float factor) {
#if PIPELINE_WITH_CUDA
  if (x.device().is_cuda()) {
    const detail::CudaScope cuda(x.device());
    kernels::scale(cuda.stream(), x.device_data<float>(), x.numel(), factor);
    return;
  }
#endif
  PIPELINE_CHECK(x.dtype() == DType::Float32 && x.device().is_cpu(),
                 "scale_inplace: expected a float32 CPU tensor");
  float* p = x.data<float>();
  pipeline::detail::for_each_piece(
      x.numel(), kMinPiece, kPieceAlign,
      [&](std::int64_t i, std::int64_t n) { Array(p + i, n) *= factor; });
}

namespace {

// The device and double slot of a sum_of_squares_total / scale_by_clip_factor call.
Device device_total(std::span<const Tensor> xs, const Tensor& total, const char* op) {
  PIPELINE_CHECK(total.defined() && total.nbytes() >= sizeof(double),
                 "{}: the total needs 8 bytes of device memory, got {} bytes", op, total.nbytes());
  for (const Tensor& x : xs)
    PIPELINE_CHECK(x.device() == total.device() && x.dtype() == DType::Float32,
                   "{}: expected float32 tensors on {}, got {} on {}", op, total.device().str(),
                   dtype_name(x.dtype()), x.device().str());
  PIPELINE_CHECK(total.device().is_cuda(),
                 "{}: the total stays in device memory, for work on a GPU; on the CPU use "
                 "sums_of_squares and scale_inplace",
                 op);
  return total.device();
}

}  // namespace

void sum_of_squares_total(std::span<const Tensor> xs, Tensor& total) {
  [[maybe_unused]] const Device d = device_total(xs, total, "sum_of_squares_total");
#if PIPELINE_WITH_CUDA
  const detail::CudaScope cuda(d);
  Tensor workspace = cuda.scratch_bytes(kernels::kSumOfSquaresWorkspace * sizeof(double));
  Tensor parts = cuda.scratch_bytes(std::max<std::size_t>(xs.size(), 1) * sizeof(double));
  auto* r = static_cast<double*>(parts.raw());
  for (std::size_t i = 0; i < xs.size(); ++i)
    kernels::sum_of_squares_async(cuda.stream(), xs[i].device_data<float>(), xs[i].numel(),
                                  static_cast<double*>(workspace.raw()), r + i);
  kernels::add_in_order(cuda.stream(), r, static_cast<int>(xs.size()),
                        static_cast<double*>(total.raw()));
#endif
}

void scale_by_clip_factor(std::span<Tensor> xs, const Tensor& total, float max_norm) {
  PIPELINE_CHECK_AS(ConfigError, max_norm > 0.f, "gradient clipping needs max_norm > 0, got {}",
                    max_norm);
  [[maybe_unused]] const Device d = device_total(xs, total, "scale_by_clip_factor");
#if PIPELINE_WITH_CUDA
  const detail::CudaScope cuda(d);
  for (Tensor& x : xs)
    kernels::scale_by_clip_factor(cuda.stream(), x.device_data<float>(), x.numel(),
                                  static_cast<const double*>(total.raw()),
                                  static_cast<double>(max_norm));
#endif
}

}  // namespace pipeline::ops
