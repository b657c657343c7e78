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
// Every row of sample s (its c · h rows), bordered into `image`.
void border_sample(const DirectConvProblem& p, const float* x, std::int64_t s, float* image) {
  for (std::int64_t r = 0; r < p.c * p.h; ++r)
    border_row(p, x + (s * p.c * p.h + r) * p.w, image + r * row_floats(p));
}

// The sum of a vector's lanes, in a fixed order (halves added until one lane is left).
float horizontal_sum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
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

// The weight gradient's register tile: kGradChannels output channels by the kw taps of one kernel
// row (ky) of one input channel, each a vector of partial sums over 16 output columns, carried
// across the samples in `acc` (kGradChannels · KW vectors).
constexpr int kGradChannels = 4;

// A weight-gradient tile: a group of kGradChannels output channels from m0, an input channel, a
// kernel row; tiles are numbered group-major, then channel, then row.
struct GradTile {
  std::int64_t m0, c, ky;
  GradTile(const DirectConvProblem& p, std::int64_t tile)
      : m0(tile / (p.c * p.kh) * kGradChannels), c(tile / p.kh % p.c), ky(tile % p.kh) {}
};

// sums[b][k] += d[b] · (columns k.. k + 15 of the row whose first 32 are lo, hi), for k ≥ K.
template <int K, int KW>
[[gnu::always_inline]] inline void shifted_taps(__m512i lo, __m512i hi,
                                                const __m512 (&d)[kGradChannels],
                                                __m512 (&sums)[kGradChannels][KW]) {
  if constexpr (K < KW) {
    const __m512 xv = _mm512_castsi512_ps(_mm512_alignr_epi32(hi, lo, K));
    for (int b = 0; b < kGradChannels; ++b) sums[b][K] = _mm512_fmadd_ps(d[b], xv, sums[b][K]);
    shifted_taps<K + 1, KW>(lo, hi, d, sums);
  }
}

// One sample's share of a tile: acc[b][kx] += dy[m0 + b] (row oh, 16 columns at a time) times
// the bordered input row oh + ky − ph shifted by kx. Channels past the last (a group's tail)
// repeat channel m0; their sums are never read.
template <int KW>
void gradient_tile(const DirectConvProblem& p, const float* image, const float* dy, std::int64_t m0,
                   int valid, std::int64_t c, std::int64_t ky, float* acc) {
  const std::int64_t rf = row_floats(p), h = p.h, oh_count = p.oh, ow = p.ow;
  const float* planes[kGradChannels];
  for (int b = 0; b < kGradChannels; ++b)
    planes[b] = dy + (m0 + (b < valid ? b : 0)) * oh_count * ow;
  __m512 sums[kGradChannels][KW];
  for (int b = 0; b < kGradChannels; ++b)
    for (int kx = 0; kx < KW; ++kx) sums[b][kx] = _mm512_loadu_ps(acc + (b * KW + kx) * 16);
  const auto columns = [&](const float* row, std::int64_t offset, __mmask16 mask) {
    __m512 d[kGradChannels];
    for (int b = 0; b < kGradChannels; ++b) d[b] = _mm512_maskz_loadu_ps(mask, planes[b] + offset);
    // The row's 16 + KW - 1 columns from two loads and each tap's shift by valignd: loading the
    // row at each tap, the compiler folded a load into every multiply-add (24 loads for 20 of
    // them, most split across cache lines) and the gradient ran at a third of the forward's rate.
    const __m512i lo = _mm512_castps_si512(_mm512_loadu_ps(row));
    const __m512i hi = _mm512_castps_si512(_mm512_maskz_loadu_ps(first_lanes(KW - 1), row + 16));
    shifted_taps<0, KW>(lo, hi, d, sums);
  };
  for (std::int64_t oh = 0; oh < oh_count; ++oh) {
    const std::int64_t ih = oh + ky - p.ph;
    if (ih < 0 || ih >= h) continue;  // a zero row of the border
    const float* row = image + (c * h + ih) * rf;
    std::int64_t ow0 = 0;
    for (; ow0 + 16 <= ow; ow0 += 16) columns(row + ow0, oh * ow + ow0, 0xffff);
    if (ow0 < ow) columns(row + ow0, oh * ow + ow0, first_lanes(ow - ow0));
  }
  for (int b = 0; b < kGradChannels; ++b)
    for (int kx = 0; kx < KW; ++kx) _mm512_storeu_ps(acc + (b * KW + kx) * 16, sums[b][kx]);
}

template <int KW>
void backward_filter(const DirectConvProblem& p, const float* x, const float* dy, float* dweight) {
  // Tiles (a group of output channels, an input channel, a kernel row), split among the threads
  // by tile: each thread runs every sample through its own tiles, so each weight's sum runs in
  // the same order for any thread count. A sample's output gradient for a group (4 planes) stays
  // in L1 over its kernel rows.
  const std::int64_t groups = (p.m + kGradChannels - 1) / kGradChannels;
  const std::int64_t tiles = groups * p.c * p.kh;
  const int threads = pipeline::detail::threads_over(tiles, num_threads());
  const std::int64_t image = p.c * p.h * row_floats(p);
  pipeline::detail::on_threads(threads, [&](int t) {
    const auto range = pipeline::detail::static_range(tiles, threads, t);
    const std::int64_t mine = range.end - range.begin;
    if (mine <= 0) return;
    Scratch bordered(image);
    // Each tile's kGradChannels x KW vectors of partial sums.
    constexpr std::int64_t kTileFloats = kGradChannels * KW * 16;
    Scratch sums(mine * kTileFloats);
    float* acc = sums.get();
    std::fill_n(acc, mine * kTileFloats, 0.f);
    for (std::int64_t s = 0; s < p.n; ++s) {
      border_sample(p, x, s, bordered.get());
      const float* dys = dy + s * p.m * p.oh * p.ow;
      for (std::int64_t tile = range.begin; tile < range.end; ++tile) {
        const GradTile at(p, tile);
        const int valid = static_cast<int>(std::min<std::int64_t>(kGradChannels, p.m - at.m0));
        gradient_tile<KW>(p, bordered.get(), dys, at.m0, valid, at.c, at.ky,
                          acc + (tile - range.begin) * kTileFloats);
      }
    }
    for (std::int64_t tile = range.begin; tile < range.end; ++tile) {
      const GradTile at(p, tile);
      const float* a = acc + (tile - range.begin) * kTileFloats;
      for (int b = 0; b < kGradChannels && at.m0 + b < p.m; ++b) {
        float* w = dweight + ((at.m0 + b) * p.c + at.c) * p.kh * p.kw + at.ky * p.kw;
        for (int kx = 0; kx < KW; ++kx)
          w[kx] += horizontal_sum(_mm512_loadu_ps(a + (b * KW + kx) * 16));
      }
    }
  });
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
    border_sample(p, x, s, bordered);
    float* ys = y + s * p.m * p.oh * p.ow;
    std::int64_t m0 = 0;
    for (; m0 + kChannelBlock <= p.m; m0 += kChannelBlock)
      forward_channels<kChannelBlock>(p, bordered, weight, bias, m0, ys);
    for (; m0 < p.m; ++m0) forward_channels<1>(p, bordered, weight, bias, m0, ys);
  });
}

void direct_conv_backward_filter(const DirectConvProblem& p, const float* x, const float* dy,
                                 float* dweight) {
  // The kernel's width is a template argument (its taps' partial sums live in registers).
  using Kernel = void (*)(const DirectConvProblem&, const float*, const float*, float*);
  static constexpr Kernel kByWidth[] = {backward_filter<1>, backward_filter<2>, backward_filter<3>,
                                        backward_filter<4>, backward_filter<5>, backward_filter<6>,
                                        backward_filter<7>};
  kByWidth[std::clamp<std::int64_t>(p.kw, 1, 7) - 1](p, x, dy, dweight);
}

#else  // no AVX-512: convolutions are lowered

bool direct_conv_suits(const DirectConvProblem&, std::int64_t, std::int64_t) {
  return false;
}
void direct_conv_forward(const DirectConvProblem&, const float*, const float*, const float*,
                         float*) {}
void direct_conv_backward_filter(const DirectConvProblem&, const float*, const float*, float*) {}

#endif

}  // namespace pipeline::ops::detail
