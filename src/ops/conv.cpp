#include <pipeline/core/threads.hpp>
#include <pipeline/ops/conv.hpp>
#include <pipeline/ops/convert.hpp>
#include <pipeline/ops/elementwise.hpp>
#include <pipeline/ops/precision.hpp>

#include "../core/parallel.hpp"
#include "conv_direct.hpp"
#include "conv_winograd.hpp"
#include "cuda_dispatch.hpp"
#include "eigen_maps.hpp"
#include "scratch.hpp"
#include "split_product.hpp"
#include "vector_lanes.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#if PIPELINE_WITH_CUDA
#include <pipeline/cuda/dnn.hpp>
#include <pipeline/cuda/dnn_graph.hpp>

#include "channel_bias.cuh"
#include "conv_direct.cuh"
#include "convert.cuh"
#endif

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// Strategy. Stride-1 3x3 and 5x5 convolutions with enough channels go to Winograd's transforms
// (conv_winograd.hpp: 1.5-3x faster than what follows, measured in bench/RESULTS.md); the forward
// and weight gradient of stride-1 ones with at most 4 input channels (first layers) are summed
// directly (conv_direct.hpp); the rest are lowered. Each sample is lowered with im2col into a
// [C·KH·KW, OH·OW] matrix and multiplied by the [M, C·KH·KW] weight with Eigen's packed gemm; the
// samples of a batch are spread over the OpenMP threads, each thread with its own im2col buffer and
// a single-threaded gemm (Eigen runs its gemm serially inside an active parallel region, so nothing
// nests). We chose this over one whole-batch im2col and one large threaded gemm because the
// per-sample buffer (627 KiB for fashion-cnn's conv2) stays in the core's L2 cache, while the
// whole-batch buffer (40 MiB) goes through memory twice, and because it needs no NCHW<->CNHW
// transposes around the gemm. When a batch has fewer samples than threads (batch 1), the samples
// run one after another and Eigen threads each gemm instead. Measured with bench/bench_conv.cpp on
// the 2-core AVX-512 build machine (in GFLOP per CPU-second, which a busy machine does not
// distort): conv2 at batch 64 runs at 50-70 in all three passes, including lowering, while the
// whole-batch gemm alone, before any lowering or transposes, reaches 35-55; a profile of a
// fashion-cnn training step shows two thirds of its time inside Eigen's gemm kernel and 7% in the
// lowering.
//
// im2col reads from a zero-bordered copy of the sample, so its rows are plain (strided) copies
// with no bounds tests, and col2im accumulates into such a copy (see Lowering below).
//
// On a CUDA device the three convolution passes run through cuDNN (cuda/dnn.hpp: the algorithm
// chosen once per shape, fp32 unless TF32 is allowed, deterministic algorithms by default) with
// the same accumulate semantics — forward and backward-data with beta = 0, backward-filter with
// beta = 1 — and the bias add and bias gradient are small custom kernels (channel_bias.cuh).

namespace pipeline::ops {

namespace {

using detail::ConstMatrixMap;
using detail::MatrixMap;
using detail::Scratch;

struct Geometry {
  std::int64_t n, c, h, w;  // input
  std::int64_t m, oh, ow;   // output channels and extents
  std::int64_t kh, kw, sh, sw, ph, pw;
  std::int64_t depth() const { return c * kh * kw; }  // gemm inner dimension
  std::int64_t pixels() const { return oh * ow; }
  std::int64_t in_plane() const { return h * w; }
  // A 1x1 kernel with stride 1 and no padding needs no lowering: the sample is the matrix.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// Contiguous row copy and accumulation. Output rows of small images are short (14 floats for
// fashion-cnn's conv2), where a memcpy call per row costs more than the copy; with AVX-512 a row
// is whole 16-float vectors plus one masked vector, without any call or scalar tail.
inline void copy_row(const float* src, float* dst, std::int64_t n) {
#if defined(__AVX512F__)
  std::int64_t t = 0;
  for (; t + 16 <= n; t += 16) _mm512_storeu_ps(dst + t, _mm512_loadu_ps(src + t));
  if (t < n) {
    const __mmask16 m = detail::first_lanes(n - t);
    _mm512_mask_storeu_ps(dst + t, m, _mm512_maskz_loadu_ps(m, src + t));
  }
#else
  std::copy_n(src, n, dst);
#endif
}

inline void add_row(const float* src, float* dst, std::int64_t n) {
#if defined(__AVX512F__)
  std::int64_t t = 0;
  for (; t + 16 <= n; t += 16)
    _mm512_storeu_ps(dst + t, _mm512_add_ps(_mm512_loadu_ps(dst + t), _mm512_loadu_ps(src + t)));
  if (t < n) {
    const __mmask16 m = detail::first_lanes(n - t);
    _mm512_mask_storeu_ps(
        dst + t, m,
        _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + t), _mm512_maskz_loadu_ps(m, src + t)));
  }
#else
  for (std::int64_t t = 0; t < n; ++t) dst[t] += src[t];
#endif
}

// Lowering of one sample. Padding is handled by first copying the sample into a zero-bordered
// [C, H + 2·PH, W + 2·PW] buffer (the border is zeroed once per thread and never written again),
// so that every im2col row is a plain strided read with no bounds tests; col2im accumulates into
// such a buffer and copies its interior out.
struct Lowering {
  Geometry g;
  std::int64_t hp, wp;  // padded extents

  explicit Lowering(const Geometry& geo) : g(geo), hp(geo.h + 2 * geo.ph), wp(geo.w + 2 * geo.pw) {}

  bool padded() const { return g.ph > 0 || g.pw > 0; }
  // Floats of per-thread padding buffer (0 when there is no padding).
  std::int64_t pad_floats() const { return padded() ? g.c * hp * wp : 0; }

  // Copies sample x into the interior of the padded buffer xp (whose border is zero).
  void pad(const float* x, float* xp) const {
    for (std::int64_t c = 0; c < g.c; ++c)
      for (std::int64_t r = 0; r < g.h; ++r)
        copy_row(x + (c * g.h + r) * g.w, xp + (c * hp + r + g.ph) * wp + g.pw, g.w);
  }

  // col[(c·KH + i)·KW + j, oh·OW + ow] = xp[c, oh·SH + i, ow·SW + j], xp padded (or x itself).
  void im2col(const float* xp, float* col) const {
    const std::int64_t P = g.pixels(), OW = g.ow;
    for (std::int64_t c = 0; c < g.c; ++c)
      for (std::int64_t i = 0; i < g.kh; ++i)
        for (std::int64_t j = 0; j < g.kw; ++j) {
          float* row = col + ((c * g.kh + i) * g.kw + j) * P;
          const float* in = xp + (c * hp + i) * wp + j;
          for (std::int64_t o = 0; o < g.oh; ++o) {
            const float* src = in + o * g.sh * wp;
            float* out = row + o * OW;
            if (g.sw == 1) {
              copy_row(src, out, OW);
            } else {
              for (std::int64_t t = 0; t < OW; ++t) out[t] = src[t * g.sw];
            }
          }
        }
  }

  // The [K, P] gemm operand of sample x: x itself when the convolution is pointwise, else its
  // im2col written to col, through the padded buffer xp (pad_floats() floats, border zero).
  const float* lower(const float* x, float* col, float* xp) const {
    if (g.pointwise()) return x;
    const float* src = x;
    if (padded()) {
      pad(x, xp);
      src = xp;
    }
    im2col(src, col);
    return col;
  }

  // The adjoint of im2col: dxp[c, oh·SH + i, ow·SW + j] += col[...]. dxp must be zeroed.
  void col2im(const float* col, float* dxp) const {
    const std::int64_t P = g.pixels(), OW = g.ow;
    for (std::int64_t c = 0; c < g.c; ++c)
      for (std::int64_t i = 0; i < g.kh; ++i)
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const float* row = col + ((c * g.kh + i) * g.kw + j) * P;
          float* in = dxp + (c * hp + i) * wp + j;
          for (std::int64_t o = 0; o < g.oh; ++o) {
            float* dst = in + o * g.sh * wp;
            const float* src = row + o * OW;
            if (g.sw == 1) {
              add_row(src, dst, OW);
            } else {
              for (std::int64_t t = 0; t < OW; ++t) dst[t * g.sw] += src[t];
            }
          }
        }
  }

  // dx (one sample) = the interior of the padded gradient dxp.
  void unpad(const float* dxp, float* dx) const {
    for (std::int64_t c = 0; c < g.c; ++c)
      for (std::int64_t r = 0; r < g.h; ++r)
        copy_row(dxp + (c * hp + r + g.ph) * wp + g.pw, dx + (c * g.h + r) * g.w, g.w);
  }
};

CpuConvAlgorithm algorithm_from_environment() {
  const char* v = std::getenv("PIPELINE_CPU_CONV");
  if (!v || std::string_view(v) == "automatic") return CpuConvAlgorithm::Automatic;
  PIPELINE_CHECK_AS(ConfigError, std::string_view(v) == "lowered",
                    "PIPELINE_CPU_CONV={} is not an algorithm: use automatic or lowered", v);
  return CpuConvAlgorithm::Lowered;
}

std::atomic<CpuConvAlgorithm>& algorithm_setting() {
  static std::atomic<CpuConvAlgorithm> setting{algorithm_from_environment()};
  return setting;
}

detail::WinogradProblem winograd_problem(const Geometry& g) {
  return {g.n, g.c, g.h, g.w, g.m, g.oh, g.ow, g.kh, g.ph, g.pw};
}
// Whether the CPU computes g with Winograd's transforms.
bool use_winograd(const Geometry& g) {
  return cpu_conv_algorithm() == CpuConvAlgorithm::Automatic &&
         detail::winograd_suits(winograd_problem(g), g.kw, g.sh, g.sw);
}
detail::DirectConvProblem direct_problem(const Geometry& g) {
  return {g.n, g.c, g.h, g.w, g.m, g.oh, g.ow, g.kh, g.kw, g.ph, g.pw};
}
// Whether the CPU computes g's forward and weight gradient directly (a first layer's few input
// channels, conv_direct.hpp).
bool use_direct(const Geometry& g) {
  return cpu_conv_algorithm() == CpuConvAlgorithm::Automatic &&
         detail::direct_conv_suits(direct_problem(g), g.sh, g.sw);
}

Geometry make_geometry(const Shape& x, const Shape& weight, const Window2d& window) {
  Shape y = conv2d_output_shape(x, weight, window);
  return {x[0],
          x[1],
          x[2],
          x[3],
          weight[0],
          y[2],
          y[3],
          window.kernel_h,
          window.kernel_w,
          window.stride_h,
          window.stride_w,
          window.pad_h,
          window.pad_w};
}

// Threads that split the samples: at most one per sample, and none at all (a serial loop whose
// gemms Eigen threads) when there is only one.
int sample_threads(std::int64_t n) {
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(num_threads(), n)));
}

// Calls fn(sample, thread) for every sample over `threads` OpenMP threads. fn must not throw
// (everything that can fail is checked before). Samples whose results do not depend on which
// thread computes them (forward, backward data) are handed out dynamically, so that a thread
// the OS preempts on a shared machine does not hold the others at the barrier; sums over
// samples (backward filter) use a static split, so that for a given thread count every thread
// adds the same samples in the same order and the result is reproducible bit for bit.
enum class Split { Dynamic, Static };

template <typename F>
void for_each_sample(std::int64_t n, int threads, Split split, F&& fn) {
  if (split == Split::Dynamic) {
    pipeline::detail::parallel_for_dynamic(n, threads, fn);
    return;
  }
  pipeline::detail::on_threads(threads, [&](int t) {
    const pipeline::detail::Range range = pipeline::detail::static_range(n, threads, t);
    for (std::int64_t s = range.begin; s < range.end; ++s) fn(s, t);
  });
}

#if PIPELINE_WITH_CUDA
// cuDNN's problem for geometry g; its legacy API takes int extents and int strides, so every
// tensor of the call must have fewer than 2^31 elements.
cuda::Conv2dProblem cuda_problem(const char* op, const Geometry& g, const Device& device) {
  const std::int64_t largest =
      std::max({g.n * g.c * g.h * g.w, g.n * g.m * g.oh * g.ow, g.m * g.depth()});
  PIPELINE_CHECK_AS(ConfigError, largest <= std::numeric_limits<std::int32_t>::max(),
                    "{} on {}: a tensor of {} elements exceeds cuDNN's limit of 2^31 - 1; use a "
                    "smaller microbatch",
                    op, device.str(), largest);
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  return {i(g.n),  i(g.c),  i(g.h),  i(g.w),  i(g.m),  i(g.kh),
          i(g.kw), i(g.sh), i(g.sw), i(g.ph), i(g.pw)};
}

// The CUDA direct kernels' problem for geometry g (offered where direct_conv_applies).
kernels::DirectConv cuda_direct_problem(const Geometry& g) {
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  return {i(g.n),  i(g.c),  i(g.h),  i(g.w),  i(g.m),  i(g.kh), i(g.kw),
          i(g.sh), i(g.sw), i(g.ph), i(g.pw), i(g.oh), i(g.ow)};
}

// A bf16 pass through cuDNN's graph API (cuda/dnn_graph.hpp): `pass` gets operands a and b as
// bf16 tensors (rounded, or as kept in bf16) and a bf16 result of `shape`, which is returned for
// the caller to widen. Undefined, with nothing queued, when that path is switched off or cuDNN
// has no engine for the problem: the caller then runs the legacy path.
template <typename Pass>
Tensor bf16_graph_pass(const Tensor& a, const Tensor& b, const Shape& shape, Pass&& pass) {
  if (cuda::graph_convolutions() == cuda::GraphConvolutions::None) return {};
  const Tensor a16 = to_dtype(a, DType::BFloat16), b16 = to_dtype(b, DType::BFloat16);
  Tensor out16 = Tensor::empty(shape, DType::BFloat16, a.device());
  if (!pass(a16.device_data<std::uint16_t>(), b16.device_data<std::uint16_t>(),
            out16.device_data<std::uint16_t>()))
    return {};
  return out16;
}

void widen_into(const detail::CudaScope& cuda, const Tensor& out16, Tensor& out) {
  kernels::bf16_to_float(cuda.stream(), out.device_data<float>(),
                         out16.device_data<std::uint16_t>(), out.numel());
}
#endif

}  // namespace

void set_cpu_conv_algorithm(CpuConvAlgorithm algorithm) {
  algorithm_setting().store(algorithm);
}
CpuConvAlgorithm cpu_conv_algorithm() {
  return algorithm_setting().load();
}

Shape conv2d_output_shape(const Shape& x, const Shape& weight, const Window2d& window) {
  PIPELINE_CHECK_AS(ConfigError, weight.rank() == 4,
                    "conv2d weight must be [out, in, kh, kw], got {}", weight);
  PIPELINE_CHECK_AS(ConfigError, x.rank() == 4 && x[1] == weight[1],
                    "conv2d expects an NCHW input with {} channels, got {}", weight[1], x);
  PIPELINE_CHECK_AS(ConfigError, weight[2] == window.kernel_h && weight[3] == window.kernel_w,
                    "conv2d weight {} does not match the {}x{} kernel of its window", weight,
                    window.kernel_h, window.kernel_w);
  return window.output_shape(x, weight[0]);
}

// Under a bf16 compute dtype (ops/conv.hpp) the operands are read rounded to bf16 and a result —
// y before its bias, dx, a weight gradient before it accumulates — is rounded to bf16: what a
// bf16 convolution accumulated in fp32 writes. The CPU computes in fp32 and rounds; CUDA runs bf16
// tensors through cuDNN's graph API (bf16_graph_pass), or where that has no engine the rounded
// operands on the TF32 tensor cores (cuda/dnn.hpp: bf16_operands), and rounds.
namespace {

bool bf16_compute() {
  return compute_dtype() == DType::BFloat16;
}

}  // namespace

void conv2d_forward(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias, Tensor& y,
                    const Window2d& window) {
  const Geometry g = make_geometry(x_in.shape(), weight_in.shape(), window);
  const Shape ys{g.n, g.m, g.oh, g.ow};
  PIPELINE_CHECK(y.shape() == ys, "conv2d_forward: output is {} but must be {}", y.shape(), ys);
  PIPELINE_CHECK(!bias.defined() || (bias.rank() == 1 && bias.dim(0) == g.m),
                 "conv2d_forward: bias must be [{}], got {}", g.m, bias.shape());
  const bool bf16 = bf16_compute();
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("conv2d_forward", {&x_in, &weight_in, &bias, &y});
      d.is_cuda()) {
    if (g.n == 0) return;
    const detail::CudaScope cuda(d);
    float* yd = y.device_data<float>();
    const cuda::Conv2dProblem p = cuda_problem("conv2d_forward", g, d);
    const Tensor y16 = bf16 ? bf16_graph_pass(x_in, weight_in, ys,
                                              [&](auto x16, auto w16, auto out16) {
                                                return cuda::conv2d_forward_bf16(
                                                    cuda.stream(), d.index, p, x16, w16, out16);
                                              })
                            : Tensor();
    if (y16.defined() && bias.defined()) {  // widened and biased in one pass
      kernels::bf16_to_float_channel_bias(cuda.stream(), yd, y16.device_data<std::uint16_t>(),
                                          bias.device_data<float>(), g.n, g.m, g.pixels());
      return;
    }
    if (y16.defined()) {
      widen_into(cuda, y16, y);
      return;
    }
    const Tensor x = product_operand(x_in), weight = product_operand(weight_in);
    // A shallow window's direct kernel is offered to the float32 choice (cuda::ConvKernel).
    const kernels::DirectConv direct = cuda_direct_problem(g);
    cuda::ConvKernel direct_kernel;
    if (!bf16 && kernels::direct_conv_applies(direct))
      direct_kernel = [&](float beta, float* out) {
        PIPELINE_CHECK(beta == 0.f, "the direct convolution overwrites its output");
        kernels::direct_conv_forward(cuda.stream(), direct, x.device_data<float>(),
                                     weight.device_data<float>(), out);
      };
    cuda::conv2d_forward_f32(cuda.stream(), d.index, p, x.device_data<float>(),
                             weight.device_data<float>(), 0.f, yd, bf16, direct_kernel);
    if (bf16) round_to_bf16(y, y);  // before the bias
    if (bias.defined())
      kernels::channel_bias_add(cuda.stream(), yd, bias.device_data<float>(), g.n, g.m,
                                g.pixels());
    return;
  }
#endif
  if (g.n == 0) return;
  const Tensor x = product_operand(x_in), weight = product_operand(weight_in);
  const float* xd = x.data<float>();
  float* yd = y.data<float>();
  const float* bd = bias.defined() ? bias.data<float>() : nullptr;
  if (use_winograd(g)) {
    detail::winograd_forward(winograd_problem(g), xd, weight.data<float>(), bd, yd, bf16);
    return;
  }
  if (use_direct(g) && !bf16) {  // (under bf16 the output is rounded before the bias: lowered)
    detail::direct_conv_forward(direct_problem(g), xd, weight.data<float>(), bd, yd);
    return;
  }
  const Lowering low(g);
  const std::int64_t K = g.depth(), P = g.pixels();
  const ConstMatrixMap W(weight.data<float>(), g.m, K);
  const int threads = sample_threads(g.n);
  const std::int64_t col_floats = g.pointwise() ? 0 : K * P, pad_floats = low.pad_floats();
  const std::int64_t per_thread = col_floats + pad_floats;
  Scratch work(threads * per_thread);
  for (int t = 0; t < threads; ++t)  // the padding border, never written afterwards
    std::fill_n(work.get() + t * per_thread + col_floats, pad_floats, 0.f);
  for_each_sample(g.n, threads, Split::Dynamic, [&](std::int64_t s, int t) {
    float* col = work.get() + t * per_thread;
    const float* lowered = low.lower(xd + s * g.c * g.in_plane(), col, col + col_floats);
    MatrixMap Y(yd + s * g.m * P, g.m, P);
    detail::assign_product(Y, W, ConstMatrixMap(lowered, K, P));
    if (bf16)  // rounded before the bias
      for (float& v : Y.reshaped()) v = bf16_to_float(float_to_bf16(v));
    if (bd) Y.colwise() += Eigen::Map<const Eigen::VectorXf>(bd, g.m);
  });
}

void conv2d_backward_data(const Tensor& dy_in, const Tensor& weight_in, Tensor& dx,
                          const Window2d& window) {
  const Geometry g = make_geometry(dx.shape(), weight_in.shape(), window);
  const Shape ys{g.n, g.m, g.oh, g.ow};
  PIPELINE_CHECK(dy_in.shape() == ys, "conv2d_backward_data: output gradient is {} but must be {}",
                 dy_in.shape(), ys);
  const bool bf16 = bf16_compute();
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("conv2d_backward_data", {&dy_in, &weight_in, &dx});
      d.is_cuda()) {
    if (g.n == 0) return;
    const detail::CudaScope cuda(d);
    const cuda::Conv2dProblem p = cuda_problem("conv2d_backward_data", g, d);
    if (bf16) {
      const Tensor dx16 =
          bf16_graph_pass(dy_in, weight_in, dx.shape(), [&](auto dy16, auto w16, auto out16) {
            return cuda::conv2d_backward_data_bf16(cuda.stream(), d.index, p, dy16, w16, out16);
          });
      if (dx16.defined()) return widen_into(cuda, dx16, dx);
    }
    const Tensor dy = product_operand(dy_in), weight = product_operand(weight_in);
    cuda::conv2d_backward_data_f32(cuda.stream(), d.index, p, dy.device_data<float>(),
                                   weight.device_data<float>(), 0.f, dx.device_data<float>(), bf16);
    if (bf16) round_to_bf16(dx, dx);
    return;
  }
#endif
  if (g.n == 0) return;
  const Tensor dy = product_operand(dy_in), weight = product_operand(weight_in);
  const float* dyd = dy.data<float>();
  float* dxd = dx.data<float>();
  if (use_winograd(g)) {
    detail::winograd_backward_data(winograd_problem(g), dyd, weight.data<float>(), dxd);
    if (bf16) round_to_bf16(dx, dx);
    return;
  }
  const Lowering low(g);
  const std::int64_t K = g.depth(), P = g.pixels();
  const ConstMatrixMap W(weight.data<float>(), g.m, K);
  const int threads = sample_threads(g.n);
  const std::int64_t col_floats = g.pointwise() ? 0 : K * P, pad_floats = low.pad_floats();
  const std::int64_t per_thread = col_floats + pad_floats;
  Scratch work(threads * per_thread);
  for_each_sample(g.n, threads, Split::Dynamic, [&](std::int64_t s, int t) {
    const ConstMatrixMap DY(dyd + s * g.m * P, g.m, P);
    float* dxs = dxd + s * g.c * g.in_plane();
    if (g.pointwise()) {
      detail::assign_product(MatrixMap(dxs, K, P), W.transpose(), DY);
      return;
    }
    float* col = work.get() + t * per_thread;
    detail::assign_product(MatrixMap(col, K, P), W.transpose(), DY);
    float* dst = low.padded() ? col + col_floats : dxs;
    std::fill_n(dst, low.padded() ? pad_floats : g.c * g.in_plane(), 0.f);
    low.col2im(col, dst);
    if (low.padded()) low.unpad(dst, dxs);
  });
  if (bf16) round_to_bf16(dx, dx);
}

void conv2d_backward_filter(const Tensor& x_in, const Tensor& dy_in, Tensor& dweight,
                            const Window2d& window) {
  const Geometry g = make_geometry(x_in.shape(), dweight.shape(), window);
  const Shape ys{g.n, g.m, g.oh, g.ow};
  PIPELINE_CHECK(dy_in.shape() == ys,
                 "conv2d_backward_filter: output gradient is {} but must be {}", dy_in.shape(), ys);
  const bool bf16 = bf16_compute();
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("conv2d_backward_filter", {&x_in, &dy_in, &dweight});
      d.is_cuda()) {
    if (g.n == 0) return;
    const detail::CudaScope cuda(d);
    const cuda::Conv2dProblem p = cuda_problem("conv2d_backward_filter", g, d);
    if (bf16) {  // this call's gradient apart, rounded, then accumulated (as on the CPU)
      Tensor part = Tensor::empty(dweight.shape(), DType::Float32, d);
      const Tensor part16 =
          bf16_graph_pass(x_in, dy_in, part.shape(), [&](auto x16, auto dy16, auto out16) {
            return cuda::conv2d_backward_filter_bf16(cuda.stream(), d.index, p, x16, dy16, out16);
          });
      if (part16.defined()) {
        widen_into(cuda, part16, part);
      } else {
        const Tensor x = product_operand(x_in), dy = product_operand(dy_in);
        cuda::conv2d_backward_filter_f32(cuda.stream(), d.index, p, x.device_data<float>(),
                                         dy.device_data<float>(), 0.f, part.device_data<float>(),
                                         true);
        round_to_bf16(part, part);
      }
      add_in_place(dweight, part);
      return;
    }
    const Tensor x = product_operand(x_in), dy = product_operand(dy_in);
    const kernels::DirectConv direct = cuda_direct_problem(g);
    cuda::ConvKernel direct_kernel;
    if (kernels::direct_conv_applies(direct))
      direct_kernel = [&](float beta, float* out) {
        Tensor workspace =
            cuda.scratch_bytes(kernels::direct_conv_backward_filter_workspace(direct));
        kernels::direct_conv_backward_filter(cuda.stream(), direct, x.device_data<float>(),
                                             dy.device_data<float>(), beta, out, workspace.raw());
      };
    // Weight gradients accumulate (beta = 1), as on the CPU.
    cuda::conv2d_backward_filter_f32(cuda.stream(), d.index, p, x.device_data<float>(),
                                     dy.device_data<float>(), 1.f, dweight.device_data<float>(),
                                     false, direct_kernel);
    return;
  }
#endif
  if (g.n == 0) return;
  const Tensor x = product_operand(x_in), dy = product_operand(dy_in);
  // Under bf16 this call's gradient is summed apart, rounded, then accumulated.
  Tensor part = bf16 ? Tensor::zeros(dweight.shape()) : dweight;
  const float* xd = x.data<float>();
  const float* dyd = dy.data<float>();
  const auto accumulate_part = [&] {
    if (!bf16) return;
    round_to_bf16(part, part);
    add_in_place(dweight, part);
  };
  if (use_winograd(g)) {
    detail::winograd_backward_filter(winograd_problem(g), xd, dyd, part.data<float>());
    return accumulate_part();
  }
  if (use_direct(g)) {
    detail::direct_conv_backward_filter(direct_problem(g), xd, dyd, part.data<float>());
    return accumulate_part();
  }
  const Lowering low(g);
  const std::int64_t K = g.depth(), P = g.pixels();
  MatrixMap DW(part.data<float>(), g.m, K);
  const int threads = sample_threads(g.n);
  // With several threads each sums its samples into a private [M, K] buffer (a few hundred KiB
  // at most) and the buffers are added at the end; a single thread accumulates in place.
  const std::int64_t col_floats = g.pointwise() ? 0 : K * P, pad_floats = low.pad_floats();
  const std::int64_t acc_floats = threads > 1 ? g.m * K : 0;
  const std::int64_t per_thread = col_floats + pad_floats + acc_floats;
  Scratch work(threads * per_thread);
  for (int t = 0; t < threads; ++t)  // padding border and private sums start at zero
    std::fill_n(work.get() + t * per_thread + col_floats, pad_floats + acc_floats, 0.f);
  for_each_sample(g.n, threads, Split::Static, [&](std::int64_t s, int t) {
    float* col = work.get() + t * per_thread;
    const float* lowered = low.lower(xd + s * g.c * g.in_plane(), col, col + col_floats);
    const ConstMatrixMap DY(dyd + s * g.m * P, g.m, P);
    const ConstMatrixMap X(lowered, K, P);
    if (acc_floats > 0)
      detail::split_product(MatrixMap(col + col_floats + pad_floats, g.m, K), DY, X.transpose(),
                            1.f);
    else
      detail::split_product(DW, DY, X.transpose(), 1.f);
  });
  for (int t = 0; acc_floats > 0 && t < threads; ++t)
    DW += ConstMatrixMap(work.get() + t * per_thread + col_floats + pad_floats, g.m, K);
  accumulate_part();
}

void conv2d_backward_bias(const Tensor& dy, Tensor& dbias) {
  PIPELINE_CHECK(dy.rank() == 4 && dbias.rank() == 1 && dbias.dim(0) == dy.dim(1),
                 "conv2d_backward_bias: bias gradient {} does not match output gradient {}",
                 dbias.shape(), dy.shape());
  const std::int64_t n = dy.dim(0), m = dy.dim(1), p = dy.dim(2) * dy.dim(3);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("conv2d_backward_bias", {&dy, &dbias}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    Tensor workspace = cuda.scratch_floats(kernels::channel_split(n, m, p).workspace_floats(m));
    kernels::channel_bias_grad(cuda.stream(), dy.device_data<float>(), n, m, p,
                               dbias.device_data<float>(),
                               workspace.numel() > 0 ? workspace.device_data<float>() : nullptr);
    return;
  }
#endif
  // Channels spread over the threads, each summed over the samples in order by one thread: the
  // same bits for any thread count (one thread read fashion-cnn's 6 MiB conv1 gradient in 0.4 ms).
  float* db = dbias.data<float>();
  const float* d = dy.data<float>();
  pipeline::detail::parallel_for(
      m, pipeline::detail::threads_for(n * m * p, std::int64_t{1} << 16), [&](std::int64_t c) {
        float sum = db[c];
        for (std::int64_t s = 0; s < n; ++s)
          sum += Eigen::Map<const Eigen::VectorXf>(d + (s * m + c) * p, p).sum();
        db[c] = sum;
      });
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& window) {
  Tensor y =
      Tensor::empty(conv2d_output_shape(x.shape(), weight.shape(), window), DType::Float32,
                    x.device());
  conv2d_forward(x, weight, bias, y, window);
  return y;
}

}  // namespace pipeline::ops
