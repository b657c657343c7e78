#include "conv_direct.hpp"

#include <pipeline/core/threads.hpp>

#include "../core/parallel.hpp"
#include "scratch.hpp"
#include "vector_lanes.hpp"

#include <algorithm>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pipeline::ops::detail {

#if defined(__AVX512F__)

namespace {

constexpr std::int64_t kChunk = 32;  // output columns per step: two vectors
constexpr int kChannelBlock = 8;     // output channels kept in registers

// A zero-bordered input row: buffer[t] = row[t - pw] for 0 ≤ t - pw < w, else 0, for t up to
// the last column a chunk's vector loads reach (the output width rounded up to the chunk, plus
// the kernel's width).
std::int64_t row_floats(const DirectConvProblem& p) {
  return (p.ow + kChunk - 1) / kChunk * kChunk + p.kw - 1;
}
void border_row(const DirectConvProblem& p, const float* row, float* buffer) {
  for (std::int64_t t = 0; t < row_floats(p); ++t) {
    const std::int64_t col = t - p.pw;
    buffer[t] = col >= 0 && col < p.w ? row[col] : 0.f;
  }
}

// Output channels m0..m0+MB of one sample: `image` is the sample's bordered rows.
template <int MB>
void forward_channels(const DirectConvProblem& p, const float* image, const float* weight,
                      const float* bias, std::int64_t m0, float* y) {
  const std::int64_t rf = row_floats(p), taps = p.kh * p.kw;
  for (std::int64_t oh = 0; oh < p.oh; ++oh)
    for (std::int64_t ow0 = 0; ow0 < p.ow; ow0 += kChunk) {
      __m512 acc[MB][2];
      for (int b = 0; b < MB; ++b)
        acc[b][0] = acc[b][1] = _mm512_set1_ps(bias ? bias[m0 + b] : 0.f);
      for (std::int64_t c = 0; c < p.c; ++c)
        for (std::int64_t i = 0; i < p.kh; ++i) {
          const std::int64_t ih = oh + i - p.ph;
          if (ih < 0 || ih >= p.h) continue;  // a zero row of the border
          const float* row = image + (c * p.h + ih) * rf + ow0;
          const float* w = weight + (m0 * p.c + c) * taps + i * p.kw;
          for (std::int64_t j = 0; j < p.kw; ++j) {
            const __m512 x0 = _mm512_loadu_ps(row + j), x1 = _mm512_loadu_ps(row + j + 16);
            for (int b = 0; b < MB; ++b) {
              const __m512 s = _mm512_set1_ps(w[b * p.c * taps + j]);
              acc[b][0] = _mm512_fmadd_ps(x0, s, acc[b][0]);
              acc[b][1] = _mm512_fmadd_ps(x1, s, acc[b][1]);
            }
          }
        }
      const std::int64_t count = std::min(kChunk, p.ow - ow0);
      for (int b = 0; b < MB; ++b) {
        float* out = y + ((m0 + b) * p.oh + oh) * p.ow + ow0;
        _mm512_mask_storeu_ps(out, first_lanes(count), acc[b][0]);
        _mm512_mask_storeu_ps(out + 16, first_lanes(count - 16), acc[b][1]);
      }
    }
}

}  // namespace

bool direct_conv_suits(const DirectConvProblem& p, std::int64_t stride_h, std::int64_t stride_w) {
  return p.c >= 1 && p.c <= 4 && stride_h == 1 && stride_w == 1 && p.kh <= 7 && p.kw >= 1 &&
         p.kw <= 7;
}

void direct_conv_forward(const DirectConvProblem& p, const float* x, const float* weight,
                         const float* bias, float* y) {
  // A task: one sample, bordered into the thread's buffer, then its output channels
  // kChannelBlock at a time and the rest one by one.
  const std::int64_t image = p.c * p.h * row_floats(p);
  const int threads = pipeline::detail::threads_over(p.n, num_threads());
  // Each thread's buffer starts on its own cache line.
  const std::int64_t stride = (image + 15) / 16 * 16;
  Scratch images(threads * stride);
  pipeline::detail::parallel_for_dynamic(p.n, threads, [&](std::int64_t s, int t) {
    float* bordered = images.get() + t * stride;
    for (std::int64_t r = 0; r < p.c * p.h; ++r)
      border_row(p, x + (s * p.c * p.h + r) * p.w, bordered + r * row_floats(p));
    float* ys = y + s * p.m * p.oh * p.ow;
    std::int64_t m0 = 0;
    for (; m0 + kChannelBlock <= p.m; m0 += kChannelBlock)
      forward_channels<kChannelBlock>(p, bordered, weight, bias, m0, ys);
    for (; m0 < p.m; ++m0) forward_channels<1>(p, bordered, weight, bias, m0, ys);
  });
}

#else  // no AVX-512: convolutions are lowered

bool direct_conv_suits(const DirectConvProblem&, std::int64_t, std::int64_t) {
  return false;
}
void direct_conv_forward(const DirectConvProblem&, const float*, const float*, const float*,
                         float*) {}

#endif

}  // namespace pipeline::ops::detail
