#include <pipeline/core/threads.hpp>
#include <pipeline/ops/pool.hpp>

#include "../core/parallel.hpp"
#include "cuda_dispatch.hpp"
#include "vector_lanes.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if PIPELINE_WITH_CUDA
#include "check_range.cuh"
#include "pool.cuh"
#endif

// Every op works plane by plane (one (n, c) pair), planes spread over the OpenMP threads; a plane
// is contiguous, so each thread streams through its own part of memory. The window bounds of
// every output column are computed once per call, so the inner loops only index.
//
// On a CUDA device every pool runs as a custom kernel (kernels/pool.cuh), not through cuDNN:
// the max pool must produce the int32 argmax indices the layer saves (cuDNN's max pool keeps no
// indices and its backward needs x and y instead), and with the indices in hand its backward is
// a gather that reproduces the CPU's sums bit for bit. The average pools are as simple written
// the same way, and stay exactly in the CPU's summation order.

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

// Parallel over planes, each thread with enough work to pay for waking it.
template <typename F>
void for_each_plane(std::int64_t planes, std::int64_t work_per_plane, F&& fn) {
  pipeline::detail::parallel_for(
      planes, pipeline::detail::threads_for(planes * work_per_plane, 1 << 14), fn);
}

// One output row of 2x2, stride-2 max pooling (every CNN's pooling): reads input rows r0 and
// r0 + w, writes `ow` maxima and their plane positions (base = position of r0[0]). Later elements
// win only when strictly greater or NaN, so the first maximum is kept, as in PyTorch. With
// AVX-512 sixteen outputs (AVX2: eight) are computed at once with compares and blends, the row's
// tail under masks: scalar code pays a branch misprediction per output on real data.
void max_pool_2x2_row(const float* r0, std::int64_t w, std::int32_t base, std::int64_t ow,
                      float* out, std::int32_t* idx) {
  const float* r1 = r0 + w;
  const auto wi = static_cast<std::int32_t>(w);
  std::int64_t q = 0;
#if defined(__AVX512F__)
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (; q < ow; q += 16) {
    const auto n = static_cast<unsigned>(std::min<std::int64_t>(16, ow - q));
    const auto m_out = static_cast<__mmask16>((1u << n) - 1);
    const auto m_lo = static_cast<__mmask16>(n >= 8 ? 0xFFFFu : (1u << (2 * n)) - 1);
    const auto m_hi = static_cast<__mmask16>(n > 8 ? (1u << (2 * n - 16)) - 1 : 0u);
    const float* p0 = r0 + 2 * q;
    const float* p1 = r1 + 2 * q;
    const __m512 lo0 = _mm512_maskz_loadu_ps(m_lo, p0), hi0 = _mm512_maskz_loadu_ps(m_hi, p0 + 16);
    const __m512 lo1 = _mm512_maskz_loadu_ps(m_lo, p1), hi1 = _mm512_maskz_loadu_ps(m_hi, p1 + 16);
    const __m512 a = _mm512_permutex2var_ps(lo0, even, hi0);
    const __m512 b = _mm512_permutex2var_ps(lo0, odd, hi0);
    const __m512 c = _mm512_permutex2var_ps(lo1, even, hi1);
    const __m512 d = _mm512_permutex2var_ps(lo1, odd, hi1);
    const __m512i ia =
        _mm512_add_epi32(_mm512_set1_epi32(base + 2 * static_cast<std::int32_t>(q)), even);
    const __m512i ic = _mm512_add_epi32(ia, _mm512_set1_epi32(wi));
    const __m512i one = _mm512_set1_epi32(1);
    __mmask16 t = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    __m512 m = _mm512_mask_blend_ps(t, a, b);
    __m512i at = _mm512_mask_blend_epi32(t, ia, _mm512_add_epi32(ia, one));
    t = _mm512_cmp_ps_mask(c, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
    m = _mm512_mask_blend_ps(t, m, c);
    at = _mm512_mask_blend_epi32(t, at, ic);
    t = _mm512_cmp_ps_mask(d, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
    m = _mm512_mask_blend_ps(t, m, d);
    at = _mm512_mask_blend_epi32(t, at, _mm512_add_epi32(ic, one));
    _mm512_mask_storeu_ps(out + q, m_out, m);
    _mm512_mask_storeu_epi32(idx + q, m_out, at);
  }
#elif defined(__AVX2__)
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i even = _mm256_slli_epi32(lane, 1);
  const __m256i one = _mm256_set1_epi32(1);
  // The even (odd) elements of 16 floats: shuffle within 128-bit lanes, then order the halves.
  const auto pick = [](__m256 lo, __m256 hi, auto odd) {
    const __m256 s = odd ? _mm256_shuffle_ps(lo, hi, 0xDD) : _mm256_shuffle_ps(lo, hi, 0x88);
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), 0xD8));
  };
  // b wins over the current maximum m where it is greater or NaN.
  const auto wins = [](__m256 b, __m256 m) {
    return _mm256_or_ps(_mm256_cmp_ps(b, m, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  };
  const auto blend_index = [](__m256i at, __m256i candidate, __m256 t) {
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(candidate), t));
  };
  for (; q < ow; q += 8) {
    const auto n = static_cast<int>(std::min<std::int64_t>(8, ow - q));
    const __m256i m_out = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
    const __m256i m_lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n), lane);
    const __m256i m_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n - 8), lane);
    const float* p0 = r0 + 2 * q;
    const float* p1 = r1 + 2 * q;
    const __m256 lo0 = _mm256_maskload_ps(p0, m_lo), hi0 = _mm256_maskload_ps(p0 + 8, m_hi);
    const __m256 lo1 = _mm256_maskload_ps(p1, m_lo), hi1 = _mm256_maskload_ps(p1 + 8, m_hi);
    const __m256 a = pick(lo0, hi0, false), b = pick(lo0, hi0, true);
    const __m256 c = pick(lo1, hi1, false), d = pick(lo1, hi1, true);
    const __m256i ia =
        _mm256_add_epi32(_mm256_set1_epi32(base + 2 * static_cast<std::int32_t>(q)), even);
    const __m256i ic = _mm256_add_epi32(ia, _mm256_set1_epi32(wi));
    __m256 t = wins(b, a);
    __m256 m = _mm256_blendv_ps(a, b, t);
    __m256i at = blend_index(ia, _mm256_add_epi32(ia, one), t);
    t = wins(c, m);
    m = _mm256_blendv_ps(m, c, t);
    at = blend_index(at, ic, t);
    t = wins(d, m);
    m = _mm256_blendv_ps(m, d, t);
    at = blend_index(at, _mm256_add_epi32(ic, one), t);
    _mm256_maskstore_ps(out + q, m_out, m);
    _mm256_maskstore_epi32(idx + q, m_out, at);
  }
#endif
  for (; q < ow; ++q) {
    const std::int32_t a_at = base + 2 * static_cast<std::int32_t>(q);
    const std::int32_t at[4] = {a_at, a_at + 1, a_at + wi, a_at + wi + 1};
    const float v[4] = {r0[2 * q], r0[2 * q + 1], r1[2 * q], r1[2 * q + 1]};
    int best = 0;
    for (int k = 1; k < 4; ++k)
      if (v[k] > v[best] || std::isnan(v[k])) best = k;
    out[q] = v[best];
    idx[q] = at[best];
  }
}

#if defined(__AVX512F__)
// The gradient of one output row of 2x2, stride-2 max pooling into input rows r0 and r0 + w (the
// first 2·ow columns): each input element takes its window's gradient where the window's index
// names it and zero elsewhere. The windows do not overlap, so the rows are written whole, sixteen
// at a time, with no zero fill first and no scattered adds (which cost about a cycle an output).
void max_pool_2x2_backward_row(const float* dy, const std::int32_t* idx, std::int64_t ow,
                               std::int32_t base, std::int64_t w, float* r0) {
  float* r1 = r0 + w;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i first_half = _mm512_srli_epi32(lane, 1);  // 0, 0, 1, 1, ..., 7, 7
  const __m512i halves[2] = {first_half, _mm512_add_epi32(first_half, _mm512_set1_epi32(8))};
  const __m512i next_row = _mm512_set1_epi32(static_cast<std::int32_t>(w));
  for (std::int64_t q = 0; q < ow; q += 16) {
    const std::int64_t n = std::min<std::int64_t>(16, ow - q);
    const __m512 g = _mm512_maskz_loadu_ps(detail::first_lanes(n), dy + q);
    const __m512i at = _mm512_maskz_loadu_epi32(detail::first_lanes(n), idx + q);
    for (int half = 0; half < 2; ++half) {
      const std::int64_t col = 2 * q + 16 * half;
      const __mmask16 store = detail::first_lanes(2 * n - 16 * half);
      const __m512 gh = _mm512_permutexvar_ps(halves[half], g);
      const __m512i ath = _mm512_permutexvar_epi32(halves[half], at);
      const __m512i pos0 =
          _mm512_add_epi32(_mm512_set1_epi32(base + static_cast<std::int32_t>(col)), lane);
      const __m512i pos1 = _mm512_add_epi32(pos0, next_row);
      _mm512_mask_storeu_ps(r0 + col, store,
                            _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(ath, pos0), gh));
      _mm512_mask_storeu_ps(r1 + col, store,
                            _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(ath, pos1), gh));
    }
  }
}
#endif

bool two_by_two(const Window2d& window) {
  return window.kernel_h == 2 && window.kernel_w == 2 && window.stride_h == 2 &&
         window.stride_w == 2 && window.pad_h == 0 && window.pad_w == 0;
}

void check_indices(bool ok, const Tensor& dx) {
  PIPELINE_CHECK(ok,
                 "max_pool2d_backward: indices outside a {}x{} plane; pass the indices that "
                 "max_pool2d_forward wrote for this input",
                 dx.dim(2), dx.dim(3));
}

// fn(p, idx) for every plane p of dx whose indices (idx, out_plane of them) all lie in its plane.
// Indices come from max_pool2d_forward, but a bad one would make a backward write out of bounds:
// each plane's are checked on the plane's thread (a serial pass over them cost 0.1 ms of
// fashion-cnn's 0.8 ms pool1 backward); a plane with a bad one is left unwritten and the call
// fails once all are done.
template <typename Fn>
void for_each_checked_plane(const Tensor& indices, Tensor& dx, std::int64_t out_plane, Fn&& fn) {
  const std::int64_t planes = dx.dim(0) * dx.dim(1), in_plane = dx.dim(2) * dx.dim(3);
  const std::int32_t* id = indices.data<std::int32_t>();
  std::atomic<bool> ok{true};
  for_each_plane(planes, in_plane, [&](std::int64_t p) {
    const std::int32_t* idx = id + p * out_plane;
    // The plane's smallest and largest index: min and max reductions vectorise, where a test of
    // each index behind a short-circuit ran element by element (pool1's backward 3-5% faster).
    std::int32_t low = std::numeric_limits<std::int32_t>::max(),
                 high = std::numeric_limits<std::int32_t>::min();  // no index: in range
    for (std::int64_t k = 0; k < out_plane; ++k) {
      low = std::min(low, idx[k]);
      high = std::max(high, idx[k]);
    }
    if (low >= 0 && high < in_plane)
      fn(p, idx);
    else
      ok.store(false, std::memory_order_relaxed);
  });
  check_indices(ok.load(), dx);
}

void check_same_shape(const Tensor& a, const Shape& s, const char* what) {
  PIPELINE_CHECK(a.shape() == s, "{} is {} but must be {}", what, a.shape(), s);
}

#if PIPELINE_WITH_CUDA
kernels::PoolShape cuda_shape(const PoolGeometry& g, const Window2d& window) {
  return {g.planes,        g.h,             g.w,             g.oh,
          g.ow,            window.kernel_h, window.kernel_w, window.stride_h,
          window.stride_w, window.pad_h,    window.pad_w};
}
#endif

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
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("max_pool2d_forward", {&x, &y, &indices});
      d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::max_pool2d_forward(cuda.stream(), cuda_shape(g, window), x.device_data<float>(),
                                y.device_data<float>(), indices.device_data<std::int32_t>());
    return;
  }
#endif
  const float* xd = x.data<float>();
  float* yd = y.data<float>();
  std::int32_t* id = indices.data<std::int32_t>();
  const bool pairs = two_by_two(window);
  for_each_plane(g.planes, g.h * g.w, [&](std::int64_t p) {
    const float* in = xd + p * g.h * g.w;
    float* out = yd + p * g.oh * g.ow;
    std::int32_t* idx = id + p * g.oh * g.ow;
    if (pairs) {
      for (std::int64_t o = 0; o < g.oh; ++o)
        max_pool_2x2_row(in + 2 * o * g.w, g.w, static_cast<std::int32_t>(2 * o * g.w), g.ow,
                         out + o * g.ow, idx + o * g.ow);
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
  PIPELINE_CHECK(
      dy.rank() == 4 && dx.rank() == 4 && dy.dim(0) == dx.dim(0) && dy.dim(1) == dx.dim(1),
      "max_pool2d_backward: output gradient {} does not match input gradient {}", dy.shape(),
      dx.shape());
  check_same_shape(indices, dy.shape(), "max_pool2d_backward: indices");
  const std::int64_t in_plane = dx.dim(2) * dx.dim(3), out_plane = dy.dim(2) * dy.dim(3);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("max_pool2d_backward", {&dy, &indices, &dx});
      d.is_cuda()) {
    const detail::CudaScope cuda(d);
    // The same check as below, on the device (it waits for the stream).
    Tensor scratch = cuda.scratch_bytes(sizeof(kernels::RangeViolation));
    const kernels::RangeViolation bad = kernels::find_out_of_range_sync(
        cuda.stream(), indices.device_data<std::int32_t>(), indices.numel(), 0,
        static_cast<std::int32_t>(std::min<std::int64_t>(
            in_plane, std::numeric_limits<std::int32_t>::max())),
        static_cast<kernels::RangeViolation*>(scratch.raw()));
    check_indices(bad.index < 0, dx);
    kernels::max_pool2d_backward_scatter(
        cuda.stream(), dx.dim(0) * dx.dim(1), in_plane, out_plane, dy.device_data<float>(),
        indices.device_data<std::int32_t>(), dx.device_data<float>());
    return;
  }
#endif
  const float* dyd = dy.data<float>();
  float* dxd = dx.data<float>();
  for_each_checked_plane(indices, dx, out_plane, [&](std::int64_t p, const std::int32_t* idx) {
    float* g = dxd + p * in_plane;
    std::fill(g, g + in_plane, 0.f);
    const float* d = dyd + p * out_plane;
    for (std::int64_t k = 0; k < out_plane; ++k) g[idx[k]] += d[k];
  });
}

void max_pool2d_backward(const Tensor& dy, const Tensor& indices, Tensor& dx,
                         const Window2d& window) {
  [[maybe_unused]] const PoolGeometry g = make_geometry(dx.shape(), window);
  check_same_shape(dy, pool2d_output_shape(dx.shape(), window),
                   "max_pool2d_backward: output gradient");
  check_same_shape(indices, dy.shape(), "max_pool2d_backward: indices");
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("max_pool2d_backward", {&dy, &indices, &dx});
      d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::max_pool2d_backward(cuda.stream(), cuda_shape(g, window), dy.device_data<float>(),
                                 indices.device_data<std::int32_t>(), dx.device_data<float>());
    return;
  }
#endif
#if defined(__AVX512F__)
  if (two_by_two(window)) {
    const float* dyd = dy.data<float>();
    float* dxd = dx.data<float>();
    const std::int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
    for_each_checked_plane(indices, dx, out_plane, [&](std::int64_t p, const std::int32_t* idx) {
      float* plane = dxd + p * in_plane;
      for (std::int64_t o = 0; o < g.oh; ++o) {
        float* r0 = plane + 2 * o * g.w;
        max_pool_2x2_backward_row(dyd + p * out_plane + o * g.ow, idx + o * g.ow, g.ow,
                                  static_cast<std::int32_t>(2 * o * g.w), g.w, r0);
        // An odd width's last column lies in no window.
        for (std::int64_t j = 2 * g.ow; j < g.w; ++j) r0[j] = r0[g.w + j] = 0.f;
      }
      std::fill(plane + 2 * g.oh * g.w, plane + in_plane, 0.f);  // an odd height's last row
    });
    return;
  }
#endif
  max_pool2d_backward(dy, indices, dx);
}

void avg_pool2d_forward(const Tensor& x, Tensor& y, const Window2d& window) {
  const PoolGeometry g = make_geometry(x.shape(), window);
  check_same_shape(y, pool2d_output_shape(x.shape(), window), "avg_pool2d_forward: output");
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("avg_pool2d_forward", {&x, &y}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::avg_pool2d_forward(cuda.stream(), cuda_shape(g, window), x.device_data<float>(),
                                y.device_data<float>());
    return;
  }
#endif
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
  check_same_shape(dy, pool2d_output_shape(dx.shape(), window),
                   "avg_pool2d_backward: output gradient");
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("avg_pool2d_backward", {&dy, &dx}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::avg_pool2d_backward(cuda.stream(), cuda_shape(g, window), dy.device_data<float>(),
                                 dx.device_data<float>());
    return;
  }
#endif
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
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("global_avg_pool_forward", {&x, &y}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::global_avg_pool_forward(cuda.stream(), x.dim(0) * x.dim(1), plane,
                                     x.device_data<float>(), y.device_data<float>());
    return;
  }
#endif
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
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("global_avg_pool_backward", {&dy, &dx});
      d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::global_avg_pool_backward(cuda.stream(), dx.dim(0) * dx.dim(1), plane,
                                      dy.device_data<float>(), dx.device_data<float>());
    return;
  }
#endif
  const float scale = 1.f / static_cast<float>(plane);
  const float* dyd = dy.data<float>();
  float* dxd = dx.data<float>();
  for_each_plane(dx.dim(0) * dx.dim(1), plane, [&](std::int64_t p) {
    std::fill(dxd + p * plane, dxd + (p + 1) * plane, dyd[p] * scale);
  });
}

}  // namespace pipeline::ops
