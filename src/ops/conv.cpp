#include <pipeline/core/threads.hpp>
#include <pipeline/ops/conv.hpp>

#include "eigen_maps.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

// Strategy. Each sample is lowered with im2col into a [C·KH·KW, OH·OW] matrix and multiplied by
// the [M, C·KH·KW] weight with Eigen's packed gemm; the samples of a batch are spread over the
// OpenMP threads, each thread with its own im2col buffer and a single-threaded gemm (Eigen runs
// its gemm serially inside an active parallel region, so nothing nests). We chose this over one
// whole-batch im2col and one large threaded gemm because the per-sample buffer (627 KiB for
// fashion-cnn's conv2) stays in the core's L2 cache, while the whole-batch buffer (40 MiB) goes
// through memory twice, and because it needs no NCHW<->CNHW transposes around the gemm. When a
// batch has fewer samples than threads (batch 1), the samples run one after another and Eigen
// threads each gemm instead. bench/bench_conv.cpp measures the result.
//
// im2col and col2im work a whole output row at a time: the range of output columns whose input
// lies inside the image is computed once per kernel offset, the padding is written with fill and
// the interior is a memcpy (stride 1) or a strided gather, so no inner loop tests bounds.

namespace pipeline::ops {

namespace {

using detail::ConstMatrixMap;
using detail::MatrixMap;

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

// Output positions [lo, hi) whose input coordinate o·stride − pad + k falls inside [0, in).
struct Range {
  std::int64_t lo, hi;
};

Range valid_outputs(std::int64_t in, std::int64_t out, std::int64_t stride, std::int64_t pad,
                    std::int64_t k) {
  const std::int64_t a = pad - k;  // o·stride >= a
  std::int64_t lo = a <= 0 ? 0 : (a + stride - 1) / stride;
  const std::int64_t b = in - 1 + pad - k;  // o·stride <= b
  std::int64_t hi = b < 0 ? 0 : b / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi};
}

struct Lowering {
  Geometry g;
  std::vector<Range> rows;  // per kernel row offset
  std::vector<Range> cols;  // per kernel column offset

  explicit Lowering(const Geometry& geo) : g(geo) {
    for (std::int64_t i = 0; i < g.kh; ++i) rows.push_back(valid_outputs(g.h, g.oh, g.sh, g.ph, i));
    for (std::int64_t j = 0; j < g.kw; ++j) cols.push_back(valid_outputs(g.w, g.ow, g.sw, g.pw, j));
  }

  // col[(c·KH + i)·KW + j, oh·OW + ow] = x[c, oh·SH − PH + i, ow·SW − PW + j] (0 outside).
  void im2col(const float* x, float* col) const {
    const std::int64_t P = g.pixels(), OW = g.ow;
    for (std::int64_t c = 0; c < g.c; ++c) {
      const float* plane = x + c * g.in_plane();
      for (std::int64_t i = 0; i < g.kh; ++i) {
        const Range r = rows[static_cast<std::size_t>(i)];
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const Range q = cols[static_cast<std::size_t>(j)];
          float* row = col + ((c * g.kh + i) * g.kw + j) * P;
          std::fill(row, row + r.lo * OW, 0.f);
          std::fill(row + r.hi * OW, row + P, 0.f);
          const std::int64_t off = j - g.pw;  // input column = ow·SW + off
          for (std::int64_t o = r.lo; o < r.hi; ++o) {
            float* out = row + o * OW;
            const float* in = plane + (o * g.sh - g.ph + i) * g.w;
            std::fill(out, out + q.lo, 0.f);
            std::fill(out + q.hi, out + OW, 0.f);
            if (g.sw == 1) {
              std::memcpy(out + q.lo, in + q.lo + off,
                          static_cast<std::size_t>(q.hi - q.lo) * sizeof(float));
            } else {
              for (std::int64_t t = q.lo; t < q.hi; ++t) out[t] = in[t * g.sw + off];
            }
          }
        }
      }
    }
  }

  // The adjoint of im2col: dx[c, ih, iw] += col[...] over every (i, j, oh, ow) reading it.
  // dx must be zeroed by the caller.
  void col2im(const float* col, float* dx) const {
    const std::int64_t P = g.pixels(), OW = g.ow;
    for (std::int64_t c = 0; c < g.c; ++c) {
      float* plane = dx + c * g.in_plane();
      for (std::int64_t i = 0; i < g.kh; ++i) {
        const Range r = rows[static_cast<std::size_t>(i)];
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const Range q = cols[static_cast<std::size_t>(j)];
          const float* row = col + ((c * g.kh + i) * g.kw + j) * P;
          const std::int64_t off = j - g.pw;
          for (std::int64_t o = r.lo; o < r.hi; ++o) {
            const float* src = row + o * OW;
            float* in = plane + (o * g.sh - g.ph + i) * g.w;
            if (g.sw == 1) {
              float* dst = in + off;
              for (std::int64_t t = q.lo; t < q.hi; ++t) dst[t] += src[t];
            } else {
              for (std::int64_t t = q.lo; t < q.hi; ++t) in[t * g.sw + off] += src[t];
            }
          }
        }
      }
    }
  }
};

Geometry make_geometry(const Shape& x, const Shape& weight, const Window2d& window) {
  Shape y = conv2d_output_shape(x, weight, window);
  return {x[0],        x[1],          x[2],          x[3],          weight[0],
          y[2],        y[3],          window.kernel_h, window.kernel_w, window.stride_h,
          window.stride_w, window.pad_h, window.pad_w};
}

// Threads that split the samples: at most one per sample, and none at all (a serial loop whose
// gemms Eigen threads) when there is only one.
int sample_threads(std::int64_t n) {
  return static_cast<int>(std::clamp<std::int64_t>(std::min<std::int64_t>(num_threads(), n), 1, 1 << 16));
}

int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Uninitialised scratch: it is always written before it is read, so zeroing it would be waste.
std::unique_ptr<float[]> scratch(std::int64_t floats) {
  return std::unique_ptr<float[]>(new float[static_cast<std::size_t>(std::max<std::int64_t>(floats, 1))]);
}

// Calls fn(sample, thread) for every sample, samples split statically over `threads` OpenMP
// threads. fn must not throw (everything that can fail is checked before).
template <typename F>
void for_each_sample(std::int64_t n, int threads, F&& fn) {
  if (threads <= 1) {
    for (std::int64_t s = 0; s < n; ++s) fn(s, 0);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int t = thread_id();
#pragma omp for schedule(static)
    for (std::int64_t s = 0; s < n; ++s) fn(s, t);
  }
}

}  // namespace

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

void conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                    const Window2d& window) {
  const Geometry g = make_geometry(x.shape(), weight.shape(), window);
  const Shape ys{g.n, g.m, g.oh, g.ow};
  PIPELINE_CHECK(y.shape() == ys, "conv2d_forward: output is {} but must be {}", y.shape(), ys);
  PIPELINE_CHECK(!bias.defined() || (bias.rank() == 1 && bias.dim(0) == g.m),
                 "conv2d_forward: bias must be [{}], got {}", g.m, bias.shape());
  if (g.n == 0) return;
  const Lowering low(g);
  const std::int64_t K = g.depth(), P = g.pixels();
  const float* xd = x.data<float>();
  float* yd = y.data<float>();
  const float* bd = bias.defined() ? bias.data<float>() : nullptr;
  const ConstMatrixMap W(weight.data<float>(), g.m, K);
  const int threads = sample_threads(g.n);
  auto cols = scratch(g.pointwise() ? 0 : threads * K * P);
  for_each_sample(g.n, threads, [&](std::int64_t s, int t) {
    const float* xs = xd + s * g.c * g.in_plane();
    const float* lowered = xs;
    if (!g.pointwise()) {
      float* col = cols.get() + t * K * P;
      low.im2col(xs, col);
      lowered = col;
    }
    MatrixMap Y(yd + s * g.m * P, g.m, P);
    Y.noalias() = W * ConstMatrixMap(lowered, K, P);
    if (bd) Y.colwise() += Eigen::Map<const Eigen::VectorXf>(bd, g.m);
  });
}

void conv2d_backward_data(const Tensor& dy, const Tensor& weight, Tensor& dx,
                          const Window2d& window) {
  const Geometry g = make_geometry(dx.shape(), weight.shape(), window);
  const Shape ys{g.n, g.m, g.oh, g.ow};
  PIPELINE_CHECK(dy.shape() == ys, "conv2d_backward_data: output gradient is {} but must be {}",
                 dy.shape(), ys);
  if (g.n == 0) return;
  const Lowering low(g);
  const std::int64_t K = g.depth(), P = g.pixels();
  const float* dyd = dy.data<float>();
  float* dxd = dx.data<float>();
  const ConstMatrixMap W(weight.data<float>(), g.m, K);
  const int threads = sample_threads(g.n);
  auto cols = scratch(g.pointwise() ? 0 : threads * K * P);
  for_each_sample(g.n, threads, [&](std::int64_t s, int t) {
    const ConstMatrixMap DY(dyd + s * g.m * P, g.m, P);
    float* dxs = dxd + s * g.c * g.in_plane();
    if (g.pointwise()) {
      MatrixMap(dxs, K, P).noalias() = W.transpose() * DY;
      return;
    }
    float* col = cols.get() + t * K * P;
    MatrixMap(col, K, P).noalias() = W.transpose() * DY;
    std::fill(dxs, dxs + g.c * g.in_plane(), 0.f);
    low.col2im(col, dxs);
  });
}

void conv2d_backward_filter(const Tensor& x, const Tensor& dy, Tensor& dweight,
                            const Window2d& window) {
  const Geometry g = make_geometry(x.shape(), dweight.shape(), window);
  const Shape ys{g.n, g.m, g.oh, g.ow};
  PIPELINE_CHECK(dy.shape() == ys, "conv2d_backward_filter: output gradient is {} but must be {}",
                 dy.shape(), ys);
  if (g.n == 0) return;
  const Lowering low(g);
  const std::int64_t K = g.depth(), P = g.pixels();
  const float* xd = x.data<float>();
  const float* dyd = dy.data<float>();
  MatrixMap DW(dweight.data<float>(), g.m, K);
  const int threads = sample_threads(g.n);
  // With several threads each sums its samples into a private [M, K] buffer (a few hundred KiB
  // at most) and the buffers are added at the end; a single thread accumulates in place.
  const std::int64_t col_floats = g.pointwise() ? 0 : K * P;
  const std::int64_t acc_floats = threads > 1 ? g.m * K : 0;
  auto buffers = scratch(threads * (col_floats + acc_floats));
  if (acc_floats > 0) std::fill(buffers.get(), buffers.get() + threads * (col_floats + acc_floats), 0.f);
  for_each_sample(g.n, threads, [&](std::int64_t s, int t) {
    float* mine = buffers.get() + t * (col_floats + acc_floats);
    const float* xs = xd + s * g.c * g.in_plane();
    const float* lowered = xs;
    if (!g.pointwise()) {
      low.im2col(xs, mine);
      lowered = mine;
    }
    const ConstMatrixMap DY(dyd + s * g.m * P, g.m, P);
    const ConstMatrixMap X(lowered, K, P);
    if (acc_floats > 0)
      MatrixMap(mine + col_floats, g.m, K).noalias() += DY * X.transpose();
    else
      DW.noalias() += DY * X.transpose();
  });
  for (int t = 0; acc_floats > 0 && t < threads; ++t)
    DW += ConstMatrixMap(buffers.get() + t * (col_floats + acc_floats) + col_floats, g.m, K);
}

void conv2d_backward_bias(const Tensor& dy, Tensor& dbias) {
  PIPELINE_CHECK(dy.rank() == 4 && dbias.rank() == 1 && dbias.dim(0) == dy.dim(1),
                 "conv2d_backward_bias: bias gradient {} does not match output gradient {}",
                 dbias.shape(), dy.shape());
  const std::int64_t n = dy.dim(0), m = dy.dim(1), p = dy.dim(2) * dy.dim(3);
  Eigen::Map<Eigen::VectorXf> db(dbias.data<float>(), m);
  const float* d = dy.data<float>();
  for (std::int64_t s = 0; s < n; ++s) db += ConstMatrixMap(d + s * m * p, m, p).rowwise().sum();
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& window) {
  Tensor y = Tensor::empty(conv2d_output_shape(x.shape(), weight.shape(), window));
  conv2d_forward(x, weight, bias, y, window);
  return y;
}

}  // namespace pipeline::ops
