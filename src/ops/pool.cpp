#include <pipeline/core/threads.hpp>
#include <pipeline/ops/pool.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// Every op works plane by plane (one (n, c) pair), planes spread over the OpenMP threads; a plane
// is contiguous, so each thread streams through its own part of memory. The window bounds of
// every output column are computed once per call, so the inner loops only index.

namespace pipeline::ops {

namespace {

struct Bounds {
  std::int64_t lo, hi;  // input positions [lo, hi) covered by one window, clipped to the image
};

std::vector<Bounds> window_bounds(std::int64_t in, std::int64_t out, std::int64_t kernel,
                                  std::int64_t stride, std::int64_t pad) {
  std::vector<Bounds> b(static_cast<std::size_t>(out));
  for (std::int64_t o = 0; o < out; ++o) {
    const std::int64_t start = o * stride - pad;
    b[static_cast<std::size_t>(o)] = {std::max<std::int64_t>(start, 0),
                                      std::min<std::int64_t>(start + kernel, in)};
  }
  return b;
}

struct PoolGeometry {
  std::int64_t planes, h, w, oh, ow;
  std::vector<Bounds> rows, cols;
};

PoolGeometry make_geometry(const Shape& x, const Window2d& window) {
  Shape y = pool2d_output_shape(x, window);
  PoolGeometry g{x[0] * x[1], x[2], x[3], y[2], y[3], {}, {}};
  g.rows = window_bounds(g.h, g.oh, window.kernel_h, window.stride_h, window.pad_h);
  g.cols = window_bounds(g.w, g.ow, window.kernel_w, window.stride_w, window.pad_w);
  return g;
}

// Parallel over planes when there is enough work to pay for waking the threads.
template <typename F>
void for_each_plane(std::int64_t planes, std::int64_t work_per_plane, F&& fn) {
  const int threads = num_threads();
  const bool parallel = threads > 1 && planes > 1 && planes * work_per_plane >= (1 << 15);
#pragma omp parallel for schedule(static) num_threads(threads) if (parallel)
  for (std::int64_t p = 0; p < planes; ++p) fn(p);
}

void check_same_shape(const Tensor& a, const Shape& s, const char* what) {
  PIPELINE_CHECK(a.shape() == s, "{} is {} but must be {}", what, a.shape(), s);
}

}  // namespace

Shape pool2d_output_shape(const Shape& x, const Window2d& window) {
  Shape y = window.output_shape(x, x.rank() == 4 ? x[1] : 0);
  PIPELINE_CHECK_AS(ConfigError,
                    2 * window.pad_h <= window.kernel_h && 2 * window.pad_w <= window.kernel_w,
                    "pooling padding {}x{} exceeds half the {}x{} kernel", window.pad_h,
                    window.pad_w, window.kernel_h, window.kernel_w);
  return y;
}

void max_pool2d_forward(const Tensor& x, Tensor& y, Tensor& indices, const Window2d& window) {
  const PoolGeometry g = make_geometry(x.shape(), window);
  const Shape ys = pool2d_output_shape(x.shape(), window);
  check_same_shape(y, ys, "max_pool2d_forward: output");
  check_same_shape(indices, ys, "max_pool2d_forward: indices");
  PIPELINE_CHECK(g.h * g.w <= std::numeric_limits<std::int32_t>::max(),
                 "max_pool2d_forward: a {}x{} plane is too large for int32 indices", g.h, g.w);
  const float* xd = x.data<float>();
  float* yd = y.data<float>();
  std::int32_t* id = indices.data<std::int32_t>();
  const bool two_by_two = window.kernel_h == 2 && window.kernel_w == 2 && window.stride_h == 2 &&
                          window.stride_w == 2 && window.pad_h == 0 && window.pad_w == 0;
  for_each_plane(g.planes, g.h * g.w, [&](std::int64_t p) {
    const float* in = xd + p * g.h * g.w;
    float* out = yd + p * g.oh * g.ow;
    std::int32_t* idx = id + p * g.oh * g.ow;
    if (two_by_two) {
      // The common case (every CNN's 2x2 pooling): four loads and a fixed comparison order.
      for (std::int64_t o = 0; o < g.oh; ++o) {
        const std::int64_t r0 = 2 * o * g.w, r1 = r0 + g.w;
        for (std::int64_t q = 0; q < g.ow; ++q) {
          std::int64_t best_at = r0 + 2 * q;
          float best = in[best_at];
          for (std::int64_t at : {r0 + 2 * q + 1, r1 + 2 * q, r1 + 2 * q + 1}) {
            const float v = in[at];
            if (v > best || std::isnan(v)) {
              best = v;
              best_at = at;
            }
          }
          out[o * g.ow + q] = best;
          idx[o * g.ow + q] = static_cast<std::int32_t>(best_at);
        }
      }
      return;
    }
    for (std::int64_t o = 0; o < g.oh; ++o) {
      const Bounds r = g.rows[static_cast<std::size_t>(o)];
      for (std::int64_t q = 0; q < g.ow; ++q) {
        const Bounds c = g.cols[static_cast<std::size_t>(q)];
        std::int64_t best_at = r.lo * g.w + c.lo;
        float best = -std::numeric_limits<float>::infinity();
        for (std::int64_t i = r.lo; i < r.hi; ++i) {
          for (std::int64_t j = c.lo; j < c.hi; ++j) {
            const float v = in[i * g.w + j];
            if (v > best || std::isnan(v)) {
              best = v;
              best_at = i * g.w + j;
            }
          }
        }
        out[o * g.ow + q] = best;
        idx[o * g.ow + q] = static_cast<std::int32_t>(best_at);
      }
    }
  });
}

void max_pool2d_backward(const Tensor& dy, const Tensor& indices, Tensor& dx) {
  PIPELINE_CHECK(dy.rank() == 4 && dx.rank() == 4 && dy.dim(0) == dx.dim(0) &&
                     dy.dim(1) == dx.dim(1),
                 "max_pool2d_backward: output gradient {} does not match input gradient {}",
                 dy.shape(), dx.shape());
  check_same_shape(indices, dy.shape(), "max_pool2d_backward: indices");
  const std::int64_t planes = dx.dim(0) * dx.dim(1), in_plane = dx.dim(2) * dx.dim(3),
                     out_plane = dy.dim(2) * dy.dim(3);
  const float* dyd = dy.data<float>();
  const std::int32_t* id = indices.data<std::int32_t>();
  float* dxd = dx.data<float>();
  // Indices come from max_pool2d_forward, but a bad one would write out of bounds: check once.
  const std::int64_t n_idx = indices.numel();
  bool ok = true;
  for (std::int64_t k = 0; k < n_idx; ++k) ok &= id[k] >= 0 && id[k] < in_plane;
  PIPELINE_CHECK(ok, "max_pool2d_backward: indices outside a {}x{} plane; pass the indices that "
                 "max_pool2d_forward wrote for this input", dx.dim(2), dx.dim(3));
  for_each_plane(planes, in_plane, [&](std::int64_t p) {
    float* g = dxd + p * in_plane;
    std::fill(g, g + in_plane, 0.f);
    const float* d = dyd + p * out_plane;
    const std::int32_t* idx = id + p * out_plane;
    for (std::int64_t k = 0; k < out_plane; ++k) g[idx[k]] += d[k];
  });
}

void avg_pool2d_forward(const Tensor& x, Tensor& y, const Window2d& window) {
  const PoolGeometry g = make_geometry(x.shape(), window);
  check_same_shape(y, pool2d_output_shape(x.shape(), window), "avg_pool2d_forward: output");
  const float scale = 1.f / static_cast<float>(window.kernel_h * window.kernel_w);
  const float* xd = x.data<float>();
  float* yd = y.data<float>();
  for_each_plane(g.planes, g.h * g.w, [&](std::int64_t p) {
    const float* in = xd + p * g.h * g.w;
    float* out = yd + p * g.oh * g.ow;
    for (std::int64_t o = 0; o < g.oh; ++o) {
      const Bounds r = g.rows[static_cast<std::size_t>(o)];
      for (std::int64_t q = 0; q < g.ow; ++q) {
        const Bounds c = g.cols[static_cast<std::size_t>(q)];
        float s = 0.f;
        for (std::int64_t i = r.lo; i < r.hi; ++i)
          for (std::int64_t j = c.lo; j < c.hi; ++j) s += in[i * g.w + j];
        out[o * g.ow + q] = s * scale;
      }
    }
  });
}

void avg_pool2d_backward(const Tensor& dy, Tensor& dx, const Window2d& window) {
  const PoolGeometry g = make_geometry(dx.shape(), window);
  check_same_shape(dy, pool2d_output_shape(dx.shape(), window), "avg_pool2d_backward: output gradient");
  const float scale = 1.f / static_cast<float>(window.kernel_h * window.kernel_w);
  const float* dyd = dy.data<float>();
  float* dxd = dx.data<float>();
  for_each_plane(g.planes, g.h * g.w, [&](std::int64_t p) {
    float* in = dxd + p * g.h * g.w;
    std::fill(in, in + g.h * g.w, 0.f);
    const float* out = dyd + p * g.oh * g.ow;
    for (std::int64_t o = 0; o < g.oh; ++o) {
      const Bounds r = g.rows[static_cast<std::size_t>(o)];
      for (std::int64_t q = 0; q < g.ow; ++q) {
        const Bounds c = g.cols[static_cast<std::size_t>(q)];
        const float v = out[o * g.ow + q] * scale;
        for (std::int64_t i = r.lo; i < r.hi; ++i)
          for (std::int64_t j = c.lo; j < c.hi; ++j) in[i * g.w + j] += v;
      }
    }
  });
}

void global_avg_pool_forward(const Tensor& x, Tensor& y) {
  PIPELINE_CHECK_AS(ConfigError, x.rank() == 4 && x.dim(2) * x.dim(3) > 0,
                    "global_avg_pool expects a non-empty NCHW input, got {}", x.shape());
  check_same_shape(y, Shape{x.dim(0), x.dim(1)}, "global_avg_pool_forward: output");
  const std::int64_t plane = x.dim(2) * x.dim(3);
  const float* xd = x.data<float>();
  float* yd = y.data<float>();
  for_each_plane(x.dim(0) * x.dim(1), plane, [&](std::int64_t p) {
    const float* in = xd + p * plane;
    double s = 0;  // a plane can be large; double keeps the mean exact to float precision
    for (std::int64_t k = 0; k < plane; ++k) s += in[k];
    yd[p] = static_cast<float>(s / static_cast<double>(plane));
  });
}

void global_avg_pool_backward(const Tensor& dy, Tensor& dx) {
  PIPELINE_CHECK(dx.rank() == 4 && dx.dim(2) * dx.dim(3) > 0,
                 "global_avg_pool_backward: input gradient must be non-empty NCHW, got {}",
                 dx.shape());
  check_same_shape(dy, Shape{dx.dim(0), dx.dim(1)}, "global_avg_pool_backward: output gradient");
  const std::int64_t plane = dx.dim(2) * dx.dim(3);
  const float scale = 1.f / static_cast<float>(plane);
  const float* dyd = dy.data<float>();
  float* dxd = dx.data<float>();
  for_each_plane(dx.dim(0) * dx.dim(1), plane, [&](std::int64_t p) {
    std::fill(dxd + p * plane, dxd + (p + 1) * plane, dyd[p] * scale);
  });
}

}  // namespace pipeline::ops
