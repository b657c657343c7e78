#include "conv_winograd.hpp"

#include <pipeline/core/error.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/ops/convert.hpp>

#include "../core/parallel.hpp"
#include "eigen_maps.hpp"
#include "register_tile.hpp"
#include "scratch.hpp"
#include "split_product.hpp"
#include "vector_lanes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// Lanes (64-byte vectors) pass by value only between this file's internal functions, so the
// calling convention GCC warns about on targets without AVX-512 never meets other code.
#pragma GCC diagnostic ignored "-Wpsabi"

// Layout. Tiles are numbered over the batch (sample, tile row, tile column) and taken a block at
// a time; a block's transformed inputs are V[in][ξ][tile] and its products
// M[out][ξ][tile] = U[ξ][out][in] · V[in][ξ][tile], one product per transform position ξ, with
// the transformed filters stored transposed, [ξ][in][out] (see position_products).
// Transforms run on kLanes tiles at once ([α][α][lane] arrays), so that every arithmetic step is
// one vector operation over the lanes and each position's values for a lane group are one
// contiguous vector store or load.
//
// Threads. Forward and backward data hand whole blocks to threads (dynamically: each output
// element belongs to one block, whatever thread computes it): the same bits for any thread
// count. The weight gradient sums over every tile: each thread sums a contiguous share of the
// tiles into an accumulator of its own, [ξ][out][in], and the accumulators are added in thread
// order at the end: the same bits for a given thread count (as the library's matrix products).

namespace pipeline::ops::detail {

namespace {

constexpr int kMaxAlpha = kWinogradMaxAlpha;
constexpr int kLanes = 16;

using Square = WinogradSquare;  // α x α used, top left

// The finite points of the transforms of each α (and infinity): a point and its negative
// reciprocal, as Barabasz et al. 2020 recommend.
std::vector<double> winograd_points(int alpha) {
  if (alpha == 6) return {0, 1, -1, 0.5, -2};
  return {0, 1, -1, 0.5, -0.5, 2, -2};
}

// Coefficients (constant term first) of the product of (x - a) over the finite points a, all but
// the one at index `skip` (-1: none).
std::array<double, kMaxAlpha> product_of_roots(const std::vector<double>& points, int skip) {
  std::array<double, kMaxAlpha> c{};
  c[0] = 1;
  int degree = 0;
  for (int l = 0; l < static_cast<int>(points.size()); ++l) {
    if (l == skip) continue;
    for (int i = degree + 1; i >= 1; --i) c[i] = c[i - 1] - points[l] * c[i];
    c[0] = -points[l] * c[0];
    ++degree;
  }
  return c;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}
std::int64_t round_up(std::int64_t a, std::int64_t b) {
  return ceil_div(a, b) * b;
}

// kLanes floats as one value (GCC/Clang vector extension): one AVX-512 register, two AVX ones.
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));
inline Lanes load(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Lanes v) {
  std::memcpy(p, &v, sizeof v);
}

// α x α values of kLanes lanes: element (i, j) at [(i·α + j)·stride], its lanes contiguous. A
// LaneTile is one with stride kLanes; the block buffers below are ones with larger strides.
template <int A>
struct alignas(64) LaneTile {
  float v[A * A * kLanes];
  float* at(int i, int j) { return v + (i * A + j) * kLanes; }
  const float* at(int i, int j) const { return v + (i * A + j) * kLanes; }
};

// Where a transform reads its input and writes its output: element (i, j)'s lanes at
// base + (i·α + j)·stride (a LaneTile, stride kLanes, or a block buffer, stride its columns).
template <int A>
struct Strided {
  const float* base;
  std::int64_t stride;
  Lanes operator()(int i, int j) const { return load(base + (i * A + j) * stride); }
};
template <int A>
struct StridedSink {
  float* base;
  std::int64_t stride;
  void operator()(int i, int j, Lanes v) const { store(base + (i * A + j) * stride, v); }
};

// Row i of a transform's input: `in.row<N>(i, r)` where the source loads whole rows, else
// element by element.
template <int N, typename Source>
[[gnu::always_inline]] inline void row_of(const Source& in, int i, Lanes (&r)[N]) {
  if constexpr (requires { in.template row<N>(i, r); })
    in.template row<N>(i, r);
  else
    for (int j = 0; j < N; ++j) r[j] = in(i, j);
}

// out = L · in · Rᵀ over the top-left Depth x Depth of `in`, for L (Rows x Depth) and R
// (Cols x Depth): Bᵀ d B, G g Gᵀ and Aᵀ M A are all of this form. Extents are compile-time, so
// every loop unrolls into vector multiply-adds over the lanes held in registers; the input is
// taken a row at a time (row_of) and `out(i, j, lanes)` takes the output's lanes.
template <int Rows, int Cols, int Depth, typename Source, typename Sink>
[[gnu::always_inline]] inline void sandwich(const Square& left, const Square& right,
                                            const Source& in, const Sink& out) {
  Lanes half[Depth][Cols];  // in · Rᵀ
  for (int k = 0; k < Depth; ++k) {
    Lanes row[Depth];
    row_of(in, k, row);
    for (int j = 0; j < Cols; ++j) {
      Lanes acc = right[j][0] * row[0];
      for (int q = 1; q < Depth; ++q) acc += right[j][q] * row[q];
      half[k][j] = acc;
    }
  }
  for (int j = 0; j < Cols; ++j)
    for (int i = 0; i < Rows; ++i) {
      Lanes acc = left[i][0] * half[0][j];
      for (int k = 1; k < Depth; ++k) acc += left[i][k] * half[k][j];
      out(i, j, acc);
    }
}

// sandwich with a runtime extent n of 2..5 (a tile or filter side) on the side that is not α:
// Rows for Aᵀ M A (n x n out of α x α), Depth for G g Gᵀ (α x α out of n x n).
enum class Side { Rows, Depth };
template <int A, Side S, int N, typename Source, typename Sink>
void sandwich_of(const Square& left, const Square& right, const Source& in, const Sink& out) {
  if constexpr (S == Side::Rows)
    sandwich<N, N, A>(left, right, in, out);
  else
    sandwich<A, A, N>(left, right, in, out);
}
template <int A, Side S, typename Source, typename Sink>
void sandwich_n(int n, const Square& left, const Square& right, const Source& in, const Sink& out) {
  switch (n) {
    case 2:
      return sandwich_of<A, S, 2>(left, right, in, out);
    case 3:
      return sandwich_of<A, S, 3>(left, right, in, out);
    case 4:
      return sandwich_of<A, S, 4>(left, right, in, out);
    case 5:
      return sandwich_of<A, S, 5>(left, right, in, out);
    default:
      PIPELINE_FAIL(Error, "no Winograd transform of extent {}", n);
  }
}

// The tiles of one correlation: `tile` x `tile` outputs each, tiles_h x tiles_w per sample.
struct TileGrid {
  std::int64_t samples, tiles_h, tiles_w, tile;
  std::int64_t count() const { return samples * tiles_h * tiles_w; }
};

// An image [samples, channels, h, w].
struct Image {
  std::int64_t channels, h, w;
  std::int64_t plane() const { return h * w; }
};

// The windows of one lane group in an image: each lane's sample and the top-left corner of its
// window, at its tile's origin shifted by (-shift_h, -shift_w) (the padding); lanes past the last
// tile are not valid. With AVX2, also each lane's offset of its window's first row in channel 0
// and which of that row's 8 columns lie inside the image (none in lanes with no tile), for
// gather_rows; with AVX-512 the same columns as a mask and, per window row, the lanes for which
// it lies inside the image, for RowLoaded and RowStored.
struct LaneWindows {
  std::int64_t sample[kLanes], y[kLanes], x[kLanes];
  bool valid[kLanes];
#if defined(__AVX2__)
  std::int64_t corner[kLanes];
  __m256i columns_inside[kLanes];
#endif
#if defined(__AVX512F__)
  __mmask16 row_inside[kMaxAlpha];  // per window row, the lanes for which it lies inside
  __mmask8 columns[kLanes];         // per lane, which of its first 8 columns lie inside
#endif

  LaneWindows(const TileGrid& grid, std::int64_t first, [[maybe_unused]] const Image& image,
              std::int64_t shift_h, std::int64_t shift_w) {
    const std::int64_t per_sample = grid.tiles_h * grid.tiles_w;
    for (int l = 0; l < kLanes; ++l) {
      const std::int64_t t = first + l;
      valid[l] = t < grid.count();
      const std::int64_t within = valid[l] ? t % per_sample : 0;
      sample[l] = valid[l] ? t / per_sample : 0;
      y[l] = within / grid.tiles_w * grid.tile - shift_h;
      x[l] = within % grid.tiles_w * grid.tile - shift_w;
    }
#if defined(__AVX2__)
    const __m256i column = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i last_x = _mm256_set1_epi32(static_cast<int>(image.w) - 1);
    for (int l = 0; l < kLanes; ++l) {
      corner[l] = sample[l] * image.channels * image.plane() + y[l] * image.w + x[l];
      const __m256i xs = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(x[l])), column);
      const __m256i outside = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), xs),
                                              _mm256_cmpgt_epi32(xs, last_x));
      columns_inside[l] =
          valid[l] ? _mm256_xor_si256(outside, _mm256_set1_epi32(-1)) : _mm256_setzero_si256();
    }
#endif
#if defined(__AVX512F__)
    for (int i = 0; i < kMaxAlpha; ++i) {
      row_inside[i] = 0;
      for (int l = 0; l < kLanes; ++l)
        if (valid[l] && y[l] + i >= 0 && y[l] + i < image.h)
          row_inside[i] |= static_cast<__mmask16>(1u << l);
    }
    for (int l = 0; l < kLanes; ++l)
      columns[l] = static_cast<__mmask8>(_mm256_movemask_ps(_mm256_castsi256_ps(columns_inside[l])));
#endif
  }
};

// d(i, j)[l] = image[sample_l, channel, y_l + i, x_l + j] for i, j < extent; zero outside the
// image and in lanes with no tile.
template <int A>
void gather(const float* data, const Image& image, std::int64_t channel, const LaneWindows& o,
            int extent, LaneTile<A>& d) {
  for (int l = 0; l < kLanes; ++l) {
    const float* plane = data + (o.sample[l] * image.channels + channel) * image.plane();
    for (int i = 0; i < extent; ++i)
      for (int j = 0; j < extent; ++j) {
        const std::int64_t y = o.y[l] + i, x = o.x[l] + j;
        const bool inside = o.valid[l] && y >= 0 && y < image.h && x >= 0 && x < image.w;
        d.at(i, j)[l] = inside ? plane[y * image.w + x] : 0.f;
      }
  }
}

#if defined(__AVX2__)
// With AVX2, windows are gathered a row at a time: each lane's window row is one masked load of 8
// floats (the columns outside the image or past the window's extent masked, so nothing outside is
// read), and each 8 x 8 block of (lanes, columns) is transposed in registers into the tile's
// per-column lane vectors. The scalar gather tests every element: about 6 instructions an element.
// (The same by rows for the outputs, with masked stores, ran no faster on an AMD EPYC, whose
// masked stores are slow; the outputs are written element by element.)

// data + offset formed as an integer: a window row that starts in the padding lies outside the
// array, and only its inside columns are accessed.
inline const float* row_address(const float* data, std::int64_t offset) {
  return reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(data) +
                                        static_cast<std::uintptr_t>(offset) * sizeof(float));
}

// out[j] holds column j of the 8 x 8 block whose rows are in[0..7].
inline void transpose_8x8(const __m256 (&in)[8], __m256 (&out)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(in[0], in[1]), t1 = _mm256_unpackhi_ps(in[0], in[1]);
  const __m256 t2 = _mm256_unpacklo_ps(in[2], in[3]), t3 = _mm256_unpackhi_ps(in[2], in[3]);
  const __m256 t4 = _mm256_unpacklo_ps(in[4], in[5]), t5 = _mm256_unpackhi_ps(in[4], in[5]);
  const __m256 t6 = _mm256_unpacklo_ps(in[6], in[7]), t7 = _mm256_unpackhi_ps(in[6], in[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  out[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  out[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  out[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  out[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  out[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  out[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  out[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  out[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// gather's d for extent <= 8.
template <int A>
void gather_rows(const float* data, const Image& image, std::int64_t channel,
                 const LaneWindows& o, int extent, LaneTile<A>& d) {
  static_assert(kLanes % 8 == 0 && A <= 8, "8 x 8 blocks of lanes and columns");
  const __m256i within =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(extent), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const std::int64_t plane = channel * image.plane();
  __m256i inside[kLanes];  // the columns inside the image and the window's extent
  for (int l = 0; l < kLanes; ++l) inside[l] = _mm256_and_si256(o.columns_inside[l], within);
  for (int i = 0; i < extent; ++i)
    for (int block = 0; block < kLanes; block += 8) {
      __m256 r[8], columns[8];
      for (int k = 0; k < 8; ++k) {
        const int l = block + k;
        const std::int64_t y = o.y[l] + i;
        r[k] = y >= 0 && y < image.h
                   ? _mm256_maskload_ps(row_address(data, o.corner[l] + plane + i * image.w),
                                        inside[l])
                   : _mm256_setzero_ps();
      }
      transpose_8x8(r, columns);
      for (int j = 0; j < extent; ++j) _mm256_storeu_ps(d.at(i, j) + block, columns[j]);
    }
}

#endif

#if defined(__AVX512F__)
// Shuffles within each 128-bit part of two vectors (as vunpcklps, vunpckhps and vshufps do):
// the steps of in-register transposes. In part q: interleave_low gives a0 b0 a1 b1,
// interleave_high a2 b2 a3 b3, pairs_low a0 a1 b0 b1 and pairs_high a2 a3 b2 b3.
inline Lanes interleave_low(Lanes a, Lanes b) {
  return __builtin_shufflevector(a, b, 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
}
inline Lanes interleave_high(Lanes a, Lanes b) {
  return __builtin_shufflevector(a, b, 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
}
inline Lanes pairs_low(Lanes a, Lanes b) {
  return __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
}
inline Lanes pairs_high(Lanes a, Lanes b) {
  return __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
}

inline float* row_address(float* data, std::int64_t offset) {
  return const_cast<float*>(row_address(static_cast<const float*>(data), offset));
}

// The same values straight into registers, a window row at a time: each lane's row is one masked
// load of 8 floats, and the 16 lanes' rows are transposed in registers into the row's per-column
// lane vectors, so a transform's input never goes through memory. (Through a stack tile, loads
// of it that alias in-flight stores to the block buffers modulo 4 KiB stalled behind them: the
// same step ran 2x slower depending on where the main thread's stack happened to lie. One masked
// gather per element instead kept the gathers' loads busy: two thirds of conv2's input
// transforms in `perf` on an AMD Zen 5.)
struct RowLoaded {
  const float* data;     // the image
  std::int64_t channel;  // offset of the channel's plane in a sample
  std::int64_t w;
  __mmask8 within;  // the window's extent
  const LaneWindows& o;

  __mmask8 mask(int l, int i) const {
    return (o.row_inside[i] >> l) & 1 ? o.columns[l] & within : 0;
  }
  const float* address(int l, int i) const {
    return row_address(data, o.corner[l] + channel + i * w);
  }

  // Lane k's window row i in the low half, lane k + 8's in the high half (zeros outside).
  Lanes lane_pair(int k, int i) const {
    using Half = float __attribute__((vector_size(8 * sizeof(float))));
    const auto row = reinterpret_cast<Half>(_mm256_maskz_loadu_ps(mask(k, i), address(k, i)));
    const Lanes low = __builtin_shufflevector(row, Half{}, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                              12, 13, 14, 15);  // zero-extended: no instruction
    return reinterpret_cast<Lanes>(
        _mm512_mask_loadu_ps(reinterpret_cast<__m512>(low),
                             static_cast<__mmask16>(mask(k + 8, i) << 8), address(k + 8, i) - 8));
  }

  template <int N>
  [[gnu::always_inline]] void row(int i, Lanes (&r)[N]) const {
    static_assert(N <= 8 && kLanes == 16, "8-column rows of 16 lanes");
    // Lane k's row in the low half of v[k], lane k + 8's in its high half; then an 8 x 8
    // transpose of each half, whose last step pairs 128-bit parts across the halves.
    Lanes v[8], t[8], u[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) v[k] = lane_pair(k, i);
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
      t[k] = interleave_low(v[k], v[k + 1]);
      t[k + 1] = interleave_high(v[k], v[k + 1]);
    }
#pragma GCC unroll 2
    for (int k = 0; k < 8; k += 4) {
      u[k] = pairs_low(t[k], t[k + 2]);
      u[k + 1] = pairs_high(t[k], t[k + 2]);
      u[k + 2] = pairs_low(t[k + 1], t[k + 3]);
      u[k + 3] = pairs_high(t[k + 1], t[k + 3]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) {
      const Lanes a = u[j % 4], b = u[j % 4 + 4];
      r[j] = j < 4 ? __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24,
                                             25, 26, 27)
                   : __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28,
                                             29, 30, 31);
    }
  }
};

// The outputs of m x m tiles (m <= 4), plus a bias, stored a tile row at a time: the sink keeps
// the tile in registers and `store` transposes each row's column vectors into each lane's m
// values, one masked store per lane and row (the pixels inside the image). One masked scatter per
// element (the form before) spent a quarter of conv2's forward in its scatters in `perf`, on
// an AMD Zen 5.
struct RowStored {
  float* data;           // the image
  std::int64_t channel;  // offset of the channel's plane in a sample
  std::int64_t w;
  int m;
  const LaneWindows& o;
  Lanes (*tile)[4];  // [i][j], the sink's registers

  // (Extents past 4 are instantiated by sandwich_n but never called: m is 2 or 4.)
  void operator()(int i, int j, Lanes v) const {
    if (i < 4 && j < 4) tile[i][j] = v;
  }

  void store(float bias) const {
    const auto columns = static_cast<__mmask8>((1u << m) - 1);
    for (int i = 0; i < m; ++i) {
      const Lanes a = tile[i][0] + bias, b = tile[i][1] + bias, c = tile[i][2] + bias,
                  d = tile[i][3] + bias;
      // A 4 x 4 transpose in each 128-bit part: r[k]'s part q holds lane 4q + k's row.
      const Lanes ab_low = interleave_low(a, b), ab_high = interleave_high(a, b),
                  cd_low = interleave_low(c, d), cd_high = interleave_high(c, d);
      const Lanes r[4] = {pairs_low(ab_low, cd_low), pairs_high(ab_low, cd_low),
                          pairs_low(ab_high, cd_high), pairs_high(ab_high, cd_high)};
      const auto store_part = [&]<int Q>() {  // lanes 4Q .. 4Q + 3
        for (int k = 0; k < 4; ++k) {
          const int l = 4 * Q + k;
          const __mmask8 mask = (o.row_inside[i] >> l) & 1 ? o.columns[l] & columns : 0;
          _mm_mask_storeu_ps(row_address(data, o.corner[l] + channel + i * w), mask,
                             _mm512_extractf32x4_ps(reinterpret_cast<__m512>(r[k]), Q));
        }
      };
      store_part.template operator()<0>();
      store_part.template operator()<1>();
      store_part.template operator()<2>();
      store_part.template operator()<3>();
    }
  }
};
#endif

// Applies sandwich_n-style transform `apply(source)` to the extent x extent windows of one lane
// group of one channel: from registers with AVX-512, else through a tile.
template <int A, typename Apply>
void transform_windows(const float* data, const Image& image, std::int64_t channel,
                       const LaneWindows& windows, int extent, const Apply& apply) {
#if defined(__AVX512F__)
  static_assert(A <= 8, "RowLoaded reads rows of up to 8 columns");
  const auto within = static_cast<__mmask8>((1u << extent) - 1);
  apply(RowLoaded{data, channel * image.plane(), image.w, within, windows});
#else
  LaneTile<A> d;
#if defined(__AVX2__)
  gather_rows(data, image, channel, windows, extent, d);
#else
  gather(data, image, channel, windows, extent, d);
#endif
  apply(Strided<A>{d.v, kLanes});
#endif
}

// A block's buffer laid out [row][ξ][cols]: row r's lane group `column / kLanes` starts at
// lanes(r, column) with stride cols between positions, and position pos is a rows x cols matrix.
// Keeping a row's α² positions together (rather than [ξ][row][cols]) makes the 36 vectors a
// transform stores or loads lie within a few KiB, where a whole-matrix stride of a multiple of
// 4 KiB mapped all of them to one L1 cache set (transforms 2x slower, measured). The products
// walk a position down the rows, so rows are one cache line more than their α² · cols floats
// apart: at α = 8 and 32 tiles a row is 8 KiB, and every row of a product's depth fell into
// one L1 set too.
template <int A>
struct BlockBuffer {
  static constexpr int kPositions = A * A;
  static constexpr std::int64_t kRowPadding = 16;  // floats: one cache line
  float* data;
  std::int64_t cols;
  static std::int64_t row_stride(std::int64_t cols) { return kPositions * cols + kRowPadding; }
  static std::int64_t floats(std::int64_t rows, std::int64_t cols) {
    return rows * row_stride(cols);
  }
  std::int64_t row_stride() const { return row_stride(cols); }
  float* lanes(std::int64_t row, std::int64_t column) const {
    return data + row * row_stride() + column;
  }
  Eigen::Map<RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>> at_position(
      int pos, std::int64_t first_row, std::int64_t rows) const {
    return {lanes(first_row, 0) + pos * cols, rows, cols, Eigen::OuterStride<>(row_stride())};
  }
};

// t = Bᵀ d for α = 8 (winograd_input_matrix(8), points 0, ±1, ±1/2, ±2): rows 1-2, 3-4 and
// 5-6 are e ± o of an even part (d2, d4, d6) and an odd one (d1, d3, d5), and rows 0 and 7 take
// four values each: 28 operations where the dense product takes 64 (20 of its coefficients are
// zero). unit.test_conv checks the transforms against direct convolutions.
template <typename Value>
[[gnu::always_inline]] inline void input_rows_8(const Value (&d)[8], Value (&t)[8]) {
  t[0] = (d[6] - d[0]) + 5.25f * (d[2] - d[4]);
  t[7] = (d[7] - d[1]) + 5.25f * (d[3] - d[5]);
  Value e = d[2] + d[6] - 4.25f * d[4], o = d[1] + d[5] - 4.25f * d[3];
  t[1] = e + o;
  t[2] = e - o;
  e = 4.f * d[2] - 5.f * d[4] + d[6];
  o = 2.f * d[1] - 2.5f * d[3] + 0.5f * d[5];
  t[3] = e + o;
  t[4] = e - o;
  e = 0.25f * d[2] - 1.25f * d[4] + d[6];
  o = 0.5f * d[1] - 2.5f * d[3] + 2.f * d[5];
  t[5] = e + o;
  t[6] = e - o;
}

// out = T in Tᵀ for a 1-D transform T of N values to M, `rows(d, t)` (t = T d): along the
// input's rows (as row_of gives them), then down the columns.
template <int N, int M, typename Rows, typename Source, typename Sink>
[[gnu::always_inline]] inline void separable(const Rows& rows, const Source& in, const Sink& out) {
  Lanes half[N][M];
  for (int i = 0; i < N; ++i) {
    Lanes row[N];
    row_of(in, i, row);
    rows(row, half[i]);
  }
  for (int j = 0; j < M; ++j) {
    Lanes column[N], t[M];
    for (int k = 0; k < N; ++k) column[k] = half[k][j];
    rows(column, t);
    for (int i = 0; i < M; ++i) out(i, j, t[i]);
  }
}

// Bᵀ d B for α = 8.
template <typename Source, typename Sink>
void input_transform_8(const Source& in, const Sink& out) {
  separable<8, 8>([](const Lanes(&d)[8], Lanes(&t)[8]) { input_rows_8(d, t); }, in, out);
}

// o = Aᵀ m for F(4, 5) (winograd_matrices(4, 5): Aᵀ[i][j] = p_j^i over the points 0, 1, −1, 1/2,
// −1/2, 2, −2, and infinity in the last row): sums and differences of the ±p pairs, 19 operations
// where the dense product takes 32.
template <typename Value>
[[gnu::always_inline]] inline void output_rows_8x4(const Value (&m)[8], Value (&o)[4]) {
  const Value s1 = m[1] + m[2], d1 = m[1] - m[2];
  const Value s2 = m[3] + m[4], d2 = m[3] - m[4];
  const Value s3 = m[5] + m[6], d3 = m[5] - m[6];
  o[0] = m[0] + s1 + s2 + s3;
  o[1] = d1 + 0.5f * d2 + 2.f * d3;
  o[2] = s1 + 0.25f * s2 + 4.f * s3;
  o[3] = d1 + 0.125f * d2 + 8.f * d3 + m[7];
}

// Aᵀ M A for F(4, 5): the 4 x 4 outputs of an 8 x 8 product tile.
template <typename Source, typename Sink>
void output_transform_8x4(const Source& in, const Sink& out) {
  separable<8, 4>([](const Lanes(&m)[8], Lanes(&o)[4]) { output_rows_8x4(m, o); }, in, out);
}

// t = G d for α = 8 and n = 4 or 5 values (G of winograd_matrices: G[j][k] = p_j^k / s_j over the
// points 0, 1, −1, 1/2, −1/2, 2, −2, then infinity): the rows of p and −p share s_j and differ in
// the sign of their odd columns, so each pair is e ± o of the even and the odd terms.
template <int N, typename Value>
[[gnu::always_inline]] inline void filter_rows_8(const Square& g, const Value (&d)[N],
                                                 Value (&t)[8]) {
  static_assert(N == 4 || N == 5, "F(5, 4) and F(4, 5) filters");
  t[0] = g[0][0] * d[0];
  for (int j = 1; j < 7; j += 2) {
    Value e = g[j][0] * d[0] + g[j][2] * d[2], o = g[j][1] * d[1] + g[j][3] * d[3];
    if constexpr (N == 5) e += g[j][4] * d[4];
    t[j] = e + o;
    t[j + 1] = e - o;
  }
  t[7] = g[7][N - 1] * d[N - 1];
}

// G d Gᵀ for α = 8: an n x n filter (or output-gradient tile) to 8 x 8.
template <int N, typename Source, typename Sink>
void filter_transform_8(const Square& g, const Source& in, const Sink& out) {
  separable<N, 8>([&g](const Lanes(&d)[N], Lanes(&t)[8]) { filter_rows_8<N>(g, d, t); }, in, out);
}

// G d Gᵀ of n x n values: the structured form for α = 8, else the dense one.
template <int A, typename Source, typename Sink>
void transform_filter(int n, const Square& g, const Source& in, const Sink& out) {
  if constexpr (A == 8) {
    if (n == 4) return filter_transform_8<4>(g, in, out);
    if (n == 5) return filter_transform_8<5>(g, in, out);
  }
  sandwich_n<A, Side::Depth>(n, g, g, in, out);
}

// Aᵀ M A of one lane group's product tiles: the structured form for F(4, 5), else the dense one.
template <int A, typename Source, typename Sink>
void transform_outputs(const WinogradMatrices& f, const Source& in, const Sink& out) {
  if constexpr (A == 8) {
    if (f.m == 4) return output_transform_8x4(in, out);  // F(4, 5)
  }
  sandwich_n<A, Side::Rows>(f.m, f.at, f.at, in, out);
}

// Bᵀ d B of α x α windows: the structured form for α = 8, else the dense one.
template <int A, typename Source, typename Sink>
void transform_input(const Source& in, const Sink& out) {
  if constexpr (A == 8) {
    input_transform_8(in, out);
  } else {
    const Square& bt = winograd_input_matrix(A);
    sandwich<A, A, A>(bt, bt, in, out);
  }
}

// Bᵀ d B of the α x α windows of one lane group of one channel, into v.
template <int A>
void transform_inputs(const float* data, const Image& image, std::int64_t channel,
                      const LaneWindows& windows, const BlockBuffer<A>& v, std::int64_t column) {
  const StridedSink<A> to{v.lanes(channel, column), v.cols};
  transform_windows<A>(data, image, channel, windows, A,
                       [&](const auto& from) { transform_input<A>(from, to); });
}

// Asks for the rows of one channel that a lane group's extent x extent windows read, ahead of
// transform_windows: consecutive groups read planes tens of KiB apart, which the hardware
// prefetchers do not follow, and a transform's first gather waited for memory (a fifth of
// conv2's input transforms and weight gradient in `perf`). Groups spanning more than two samples
// (images under 16 tiles) are left to the hardware.
inline void prefetch_windows(const float* data, const Image& image, std::int64_t channel,
                             const LaneWindows& windows, int extent) {
  if (!windows.valid[0]) return;
  int last = kLanes - 1;
  while (!windows.valid[last]) --last;
  const auto rows = [&](std::int64_t sample, std::int64_t from, std::int64_t to) {
    from = std::max<std::int64_t>(from, 0);
    to = std::min(to, image.h);
    if (from >= to) return;
    const float* plane = data + (sample * image.channels + channel) * image.plane();
    const auto* begin = reinterpret_cast<const char*>(plane + from * image.w);
    const auto* end = reinterpret_cast<const char*>(plane + to * image.w);
    for (const char* line = begin; line < end; line += 64) __builtin_prefetch(line, 0, 3);
  };
  const std::int64_t first = windows.sample[0], final = windows.sample[last];
  if (first == final) {
    rows(first, windows.y[0], windows.y[last] + extent);
  } else if (final == first + 1) {
    rows(first, windows.y[0], image.h);
    rows(final, 0, windows.y[last] + extent);
  }
}

// Transformed filters: u[ξ][row][col] = G g Gᵀ of every filter g, read as filter(row, col) (r x
// r, row-major; nullptr: a zero filter); positions `stride` floats apart (rows · cols rounded up
// to whole lane groups).
template <int A, typename Filter>
void transform_filters(const WinogradMatrices& f, std::int64_t rows, std::int64_t cols,
                       const Filter& filter, float* u, std::int64_t stride) {
  const std::int64_t count = rows * cols;
  const std::int64_t groups = ceil_div(count, kLanes);
  const int threads = count * 1024 > kMinProductWork ? num_threads() : 1;
  pipeline::detail::parallel_for(groups, threads, [&](std::int64_t group) {
    LaneTile<A> g{};
    for (int l = 0; l < kLanes; ++l) {
      const std::int64_t index = group * kLanes + l;
      if (index >= count) continue;
      const float* src = filter(index / cols, index % cols);
      if (src == nullptr) continue;
      for (int i = 0; i < f.r; ++i)
        for (int j = 0; j < f.r; ++j) g.at(i, j)[l] = src[i * f.r + j];
    }
    transform_filter<A>(f.r, f.g, Strided<A>{g.v, kLanes},
                        StridedSink<A>{u + group * kLanes, stride});
  });
}

// Tiles per block: the block's transformed inputs and products fill about 1 MiB, a core's share
// of L2, in whole lane groups (from 16 to 256 tiles; speed varied by under 10% over that range
// for fashion-cnn's conv2).
std::int64_t block_tiles(int alpha, std::int64_t ins, std::int64_t outs) {
  const std::int64_t bytes_per_tile = alpha * alpha * (ins + outs) * std::int64_t{sizeof(float)};
  const std::int64_t tiles = (std::int64_t{1} << 20) / bytes_per_tile / kLanes * kLanes;
  return std::clamp<std::int64_t>(tiles, kLanes, 16 * kLanes);
}

// y[n, out] = Σ_in x[n, in] ⋆ filter[out, in] (+ bias) for filters already transformed into u
// (transform_filters, [ξ][in][padded out], positions u_stride apart); x [samples, ins, h, w] read
// with zero padding, y [samples, outs, oh, ow].
struct Correlation {
  std::int64_t samples, ins, h, w, outs, oh, ow, pad_h, pad_w;
};

// Output channels per register tile of the products. The transformed filters and a block's
// products have their output channels padded to whole tiles: zero filters whose products are
// never transformed back.
constexpr int kProductRows = 8;
std::int64_t padded_outs(std::int64_t outs) {
  return round_up(outs, kProductRows);
}

// M[ξ] = U[ξ] · V[ξ] at every transform position of a block, for U stored transposed, [ξ][in][out]
// (`outs` padded, positions u_stride apart). The products are small (fashion-cnn's conv2: 64 x 32
// by 32 x 32 tiles): Eigen's gemm packed both operands for each and reached about half of a
// core's rate; register tiles read U's columns as broadcasts and V's rows as vectors in place,
// all of one position's operands within L1.
template <int A>
void position_products(const float* u, std::int64_t u_stride, std::int64_t ins, std::int64_t outs,
                       const BlockBuffer<A>& v, const BlockBuffer<A>& m) {
  constexpr int kPositions = A * A;
  for (int pos = 0; pos < kPositions; ++pos) {
    const float* up = u + pos * u_stride;
#if defined(__AVX512F__)
    const std::int64_t ldv = v.row_stride(), ldm = m.row_stride();
    const std::int64_t vectors = v.cols / kLanes;
    const float* vp = v.lanes(0, 0) + pos * v.cols;
    float* mp = m.lanes(0, 0) + pos * m.cols;
    for (std::int64_t o = 0; o < outs; o += kProductRows) {
      // kProductRows output channels by KV vectors of tiles from vector j on.
      const auto tile = [&]<int KV>(std::int64_t j) {
        depth_tile<kProductRows, KV>(ins, up + o, outs, vp + j * kLanes, ldv, 1.f, 0.f,
                                     mp + o * ldm + j * kLanes, ldm, 0xffff);
      };
      std::int64_t j = 0;
      for (; j + 3 <= vectors; j += 3) tile.template operator()<3>(j);
      if (vectors - j == 2) tile.template operator()<2>(j);
      if (vectors - j == 1) tile.template operator()<1>(j);
    }
#else
    m.at_position(pos, 0, outs).noalias() =
        ConstMatrixMap(up, ins, outs).transpose() * v.at_position(pos, 0, ins);
#endif
  }
}

template <int A>
void correlate(const Correlation& p, const WinogradMatrices& f, const float* x, const float* u,
               std::int64_t u_stride, const float* bias, bool round_bf16, float* y) {
  const TileGrid grid{p.samples, ceil_div(p.oh, f.m), ceil_div(p.ow, f.m), f.m};
  const Image in{p.ins, p.h, p.w}, out{p.outs, p.oh, p.ow};
  const std::int64_t outs = padded_outs(p.outs);
  const std::int64_t tiles = grid.count(), block = block_tiles(A, p.ins, outs);
  const std::int64_t blocks = ceil_div(tiles, block);
  const int threads = static_cast<int>(std::clamp<std::int64_t>(blocks, 1, num_threads()));
  const std::int64_t v_floats = BlockBuffer<A>::floats(p.ins, block),
                     m_floats = BlockBuffer<A>::floats(outs, block);
  Scratch work(threads * (v_floats + m_floats));
  pipeline::detail::parallel_for_dynamic(blocks, threads, [&](std::int64_t index, int thread) {
    const EigenOnThisThread one;
    float* const mine = work.get() + thread * (v_floats + m_floats);
    const std::int64_t first = index * block,
                       groups = ceil_div(std::min(block, tiles - first), kLanes);
    const BlockBuffer<A> v{mine, groups * kLanes}, m{mine + v_floats, groups * kLanes};
    std::vector<LaneWindows> windows, outputs;
    for (std::int64_t group = 0; group < groups; ++group) {
      windows.emplace_back(grid, first + group * kLanes, in, p.pad_h, p.pad_w);
      outputs.emplace_back(grid, first + group * kLanes, out, 0, 0);
    }
    for (std::int64_t q = 0; q < p.ins * groups; ++q) {
      if (q + 1 < p.ins * groups)
        prefetch_windows(x, in, (q + 1) / groups, windows[(q + 1) % groups], A);
      transform_inputs(x, in, q / groups, windows[q % groups], v, q % groups * kLanes);
    }
    position_products(u, u_stride, p.ins, outs, v, m);
    for (std::int64_t o = 0; o < p.outs; ++o) {
      const float b = bias ? bias[o] : 0.f;
      for (std::int64_t group = 0; group < groups; ++group) {
        const Strided<A> from{m.lanes(o, group * kLanes), m.cols};
        const LaneWindows& at = outputs[group];
#if defined(__AVX512F__)
        if (!round_bf16 && f.m <= 4) {
          Lanes tile[4][4] = {};
          const RowStored to{y, o * out.plane(), p.ow, f.m, at, tile};
          transform_outputs<A>(f, from, to);
          to.store(b);
          continue;
        }
#endif
        LaneTile<A> tile;
        transform_outputs<A>(f, from, StridedSink<A>{tile.v, kLanes});
        for (int l = 0; l < kLanes; ++l) {
          if (!at.valid[l]) continue;
          float* plane = y + (at.sample[l] * p.outs + o) * out.plane();
          for (int i = 0; i < f.m && at.y[l] + i < p.oh; ++i)
            for (int j = 0; j < f.m && at.x[l] + j < p.ow; ++j) {
              float value = tile.at(i, j)[l];
              if (round_bf16) value = bf16_to_float(float_to_bf16(value));
              plane[(at.y[l] + i) * p.ow + at.x[l] + j] = value + b;
            }
        }
      }
    }
  });
}

template <int A>
void forward(const WinogradProblem& p, const float* x, const float* weight, const float* bias,
             float* y, bool round_bf16) {
  const WinogradMatrices f =
      winograd_matrices(A + 1 - static_cast<int>(p.r), static_cast<int>(p.r));
  const std::int64_t filter_floats = p.r * p.r, outs = padded_outs(p.m),
                     u_stride = round_up(p.c * outs, kLanes);
  Scratch u(A * A * u_stride);
  transform_filters<A>(
      f, p.c, outs,
      [&](std::int64_t in, std::int64_t out) {
        return out < p.m ? weight + (out * p.c + in) * filter_floats : nullptr;
      },
      u.get(), u_stride);
  correlate<A>({p.n, p.c, p.h, p.w, p.m, p.oh, p.ow, p.pad_h, p.pad_w}, f, x, u.get(), u_stride,
               bias, round_bf16, y);
}

template <int A>
void backward_data(const WinogradProblem& p, const float* dy, const float* weight, float* dx) {
  // dx is the correlation of dy, padded by r - 1 - pad, with each filter turned by 180 degrees
  // and its in and out channels exchanged.
  const WinogradMatrices f =
      winograd_matrices(A + 1 - static_cast<int>(p.r), static_cast<int>(p.r));
  const std::int64_t filter_floats = p.r * p.r;
  Scratch turned(p.m * p.c * filter_floats);
  for (std::int64_t o = 0; o < p.m; ++o)
    for (std::int64_t i = 0; i < p.c; ++i) {
      const float* src = weight + (o * p.c + i) * filter_floats;
      float* dst = turned.get() + (i * p.m + o) * filter_floats;
      for (std::int64_t e = 0; e < filter_floats; ++e) dst[e] = src[filter_floats - 1 - e];
    }
  const std::int64_t outs = padded_outs(p.c), u_stride = round_up(p.m * outs, kLanes);
  Scratch u(A * A * u_stride);
  transform_filters<A>(
      f, p.m, outs,
      [&](std::int64_t in, std::int64_t out) {
        return out < p.c ? turned.get() + (out * p.m + in) * filter_floats : nullptr;
      },
      u.get(), u_stride);
  correlate<A>({p.n, p.m, p.oh, p.ow, p.c, p.h, p.w, p.r - 1 - p.pad_h, p.r - 1 - p.pad_w}, f, dy,
               u.get(), u_stride, nullptr, false, dx);
}

#if defined(__AVX512F__)
// dst[t · ldd + i] = src[i · lds + t] for i < rows and t < cols (a multiple of 16): 16 x 16
// blocks transposed in registers, the last rows (past a multiple of 16) element by element.
void transpose_rows(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols,
                    float* dst, std::int64_t ldd) {
  std::int64_t i = 0;
  for (; i + 16 <= rows; i += 16)
    for (std::int64_t t = 0; t < cols; t += 16) {
      __m512 r[16], u[16];
      for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(src + (i + k) * lds + t);
      // Pairs of rows interleaved, then quads: within each 128-bit lane q of u[4k + j], column
      // 4q + j of rows 4k..4k+3.
      for (int k = 0; k < 16; k += 2) {
        u[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
        u[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
      }
      for (int k = 0; k < 16; k += 4) {
        r[k] = _mm512_shuffle_ps(u[k], u[k + 2], 0x44);
        r[k + 1] = _mm512_shuffle_ps(u[k], u[k + 2], 0xee);
        r[k + 2] = _mm512_shuffle_ps(u[k + 1], u[k + 3], 0x44);
        r[k + 3] = _mm512_shuffle_ps(u[k + 1], u[k + 3], 0xee);
      }
      // Then the 128-bit lanes: column 4q + j gathers lane q of r[j], r[4 + j], r[8 + j], r[12 +
      // j].
      for (int j = 0; j < 4; ++j) {
        const __m512 even01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
        const __m512 odd01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
        const __m512 even23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        const __m512 odd23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
        _mm512_storeu_ps(dst + (t + j) * ldd + i, _mm512_shuffle_f32x4(even01, even23, 0x88));
        _mm512_storeu_ps(dst + (t + 4 + j) * ldd + i, _mm512_shuffle_f32x4(odd01, odd23, 0x88));
        _mm512_storeu_ps(dst + (t + 8 + j) * ldd + i, _mm512_shuffle_f32x4(even01, even23, 0xdd));
        _mm512_storeu_ps(dst + (t + 12 + j) * ldd + i, _mm512_shuffle_f32x4(odd01, odd23, 0xdd));
      }
    }
  for (; i < rows; ++i)
    for (std::int64_t t = 0; t < cols; ++t) dst[t * ldd + i] = src[i * lds + t];
}
#endif

// acc[o][i] (+)= Σ_tile D[ξ][o][tile] · V[ξ][i][tile] for one transform position ξ of a block
// (acc [outs][ins] row-major; overwritten unless `accumulate`), each element summed over the
// block's tiles in order. V's rows are first transposed into `vt` (tiles x ins floats), so that
// register tiles read them as vectors over i and D's elements as broadcasts: Eigen's gemm packed
// both operands per position.
template <int A>
void gradient_products(int pos, const BlockBuffer<A>& d, std::int64_t outs, const BlockBuffer<A>& v,
                       std::int64_t ins, bool accumulate, float* acc, float* vt) {
#if defined(__AVX512F__)
  const std::int64_t tiles = v.cols, ld = v.row_stride();
  const float beta = accumulate ? 1.f : 0.f;
  transpose_rows(v.lanes(0, 0) + pos * v.cols, ld, ins, tiles, vt, ins);
  const float* dp = d.lanes(0, 0) + pos * d.cols;
  const auto rows = [&]<int R>(std::int64_t o) {
    std::int64_t i = 0;
    for (; i + 32 <= ins; i += 32)
      depth_tile<R, 2>(tiles, dp + o * ld, 1, vt + i, ins, 1.f, beta, acc + o * ins + i, ins,
                       0xffff, ld);
    for (; i < ins; i += 16)
      depth_tile<R, 1>(tiles, dp + o * ld, 1, vt + i, ins, 1.f, beta, acc + o * ins + i, ins,
                       first_lanes(ins - i), ld);
  };
  std::int64_t o = 0;
  for (; o + 8 <= outs; o += 8) rows.template operator()<8>(o);
  for (; o < outs; ++o) rows.template operator()<1>(o);
#else
  (void)vt;
  const auto product = d.at_position(pos, 0, outs) * v.at_position(pos, 0, ins).transpose();
  if (accumulate)
    MatrixMap(acc, outs, ins).noalias() += product;
  else
    MatrixMap(acc, outs, ins).noalias() = product;
#endif
}

template <int A>
void backward_filter(const WinogradProblem& p, const float* x, const float* dy, float* dweight) {
  constexpr int kPositions = A * A;
  // dweight[o, i] = Σ_tiles x-window ⋆ dy-tile: F(r, m) with the output gradient's m x m tiles as
  // the filters, summed over tiles in the transform domain.
  const int r = static_cast<int>(p.r), m = A + 1 - r;
  const WinogradMatrices f = winograd_matrices(r, m);
  const TileGrid grid{p.n, ceil_div(p.oh, m), ceil_div(p.ow, m), m};
  const Image in{p.c, p.h, p.w}, grad{p.m, p.oh, p.ow};
  const std::int64_t groups = ceil_div(grid.count(), kLanes);
  // Blocks of twice the forward's (about 2 MiB of transforms): the products' depth is the
  // block's tiles, and each block reads and writes the whole accumulator.
  const std::int64_t block_groups = 2 * block_tiles(A, p.c, p.m) / kLanes,
                     block = block_groups * kLanes;
  // Each thread's accumulator, acc[ξ][o][i] (positions acc_stride apart, whole lane groups), and
  // its block buffers. Nothing a thread writes is read by another before the end: with a
  // block's transforms split over the threads and shared (the form before), each core's writes
  // to buffers the other had just read waited for the other's copies to be invalidated, and two
  // threads ran conv2's weight gradient little faster than one.
  const std::int64_t count = p.m * p.c, acc_stride = round_up(count, kLanes),
                     acc_floats = kPositions * acc_stride;
  const std::int64_t buffer_floats = BlockBuffer<A>::floats(p.c + p.m, block) + block * p.c;
  const int threads = pipeline::detail::threads_over(groups, num_threads());
  Scratch sums(threads * acc_floats), work(threads * buffer_floats);
  pipeline::detail::on_threads(threads, [&](int thread) {
    const EigenOnThisThread one;
    float* const acc = sums.get() + thread * acc_floats;
    // (threads_over gives every thread at least one lane group.)
    const pipeline::detail::Range mine = pipeline::detail::static_range(groups, threads, thread);
    float* const buffers = work.get() + thread * buffer_floats;
    float* const transposed = buffers + BlockBuffer<A>::floats(p.c + p.m, block);  // tiles x ins
    std::vector<LaneWindows> windows, tiles_of_grad;
    for (std::int64_t first = mine.begin; first < mine.end; first += block_groups) {
      const std::int64_t n = std::min(block_groups, mine.end - first);
      const BlockBuffer<A> v{buffers, n * kLanes};
      const BlockBuffer<A> d{v.lanes(p.c, 0), v.cols};
      windows.clear();
      tiles_of_grad.clear();
      for (std::int64_t group = 0; group < n; ++group) {
        windows.emplace_back(grid, (first + group) * kLanes, in, p.pad_h, p.pad_w);
        tiles_of_grad.emplace_back(grid, (first + group) * kLanes, grad, 0, 0);
      }
      // The input's α x α windows (Bᵀ x B), then the output gradient's tiles (G dy Gᵀ), a
      // channel's groups in a row: neighbouring tile rows of one plane share window rows (VGG-16's
      // 32x32 images: 1.15x faster than a group's channels in a row).
      for (std::int64_t q = 0; q < p.c * n; ++q) {
        if (q + 1 < p.c * n) prefetch_windows(x, in, (q + 1) / n, windows[(q + 1) % n], A);
        transform_inputs(x, in, q / n, windows[q % n], v, q % n * kLanes);
      }
      for (std::int64_t q = 0; q < p.m * n; ++q) {
        const std::int64_t o = q / n, group = q % n;
        if (q + 1 < p.m * n) prefetch_windows(dy, grad, (q + 1) / n, tiles_of_grad[(q + 1) % n], m);
        const StridedSink<A> to{d.lanes(o, group * kLanes), d.cols};
        transform_windows<A>(dy, grad, o, tiles_of_grad[group], m,
                             [&](const auto& from) { transform_filter<A>(m, f.g, from, to); });
      }
      for (int pos = 0; pos < kPositions; ++pos)
        gradient_products(pos, d, p.m, v, p.c, first > mine.begin, acc + pos * acc_stride,
                          transposed);
    }
  });
  // The threads' sums added in thread order, then back from the transform domain:
  // dweight[o, i] += Aᵀ acc[·][o][i] A.
  pipeline::detail::parallel_for(ceil_div(count, kLanes), threads, [&](std::int64_t group) {
    LaneTile<A> sum, w;
    for (int pos = 0; pos < kPositions; ++pos) {
      const float* from = sums.get() + pos * acc_stride + group * kLanes;
      Lanes s = load(from);
      for (int t = 1; t < threads; ++t) s += load(from + t * acc_floats);
      store(sum.v + pos * kLanes, s);
    }
    sandwich_n<A, Side::Rows>(r, f.at, f.at, Strided<A>{sum.v, kLanes},
                              StridedSink<A>{w.v, kLanes});
    for (int l = 0; l < kLanes && group * kLanes + l < count; ++l) {
      float* dst = dweight + (group * kLanes + l) * r * r;
      for (int i = 0; i < r; ++i)
        for (int j = 0; j < r; ++j) dst[i * r + j] += w.at(i, j)[l];
    }
  });
}

// The direct convolution's products over those of F(α + 1 − r, r), counting the tiles' cut-off
// parts: 4 for a 3x3 filter with α = 6 and 6.25 for a 5x5 one with α = 8 on large images; 1 for
// a 3x3 one on a 2x2 image (where it measured slower than the direct convolution).
double products_saved(const WinogradProblem& p, int alpha) {
  const std::int64_t m = alpha + 1 - p.r;
  return static_cast<double>(p.r * p.r * p.oh * p.ow) /
         static_cast<double>(alpha * alpha * ceil_div(p.oh, m) * ceil_div(p.ow, m));
}

}  // namespace

int winograd_alpha(const WinogradProblem& p) {
  if (p.r != 5) return 6;
  // F(4, 5) unless its 4x4 tiles cut off more than F(2, 5)'s 2x2 ones save (small outputs).
  return products_saved(p, 8) >= products_saved(p, 6) ? 8 : 6;
}

WinogradMatrices winograd_matrices(int m, int r) {
  const int alpha = m + r - 1;
  PIPELINE_CHECK(m >= 1 && r >= 1 && (alpha == 6 || alpha == 8),
                 "Winograd F({}, {}) needs m + r - 1 = 6 or 8", m, r);
  const std::vector<double> points = winograd_points(alpha);
  WinogradMatrices f;
  f.alpha = alpha;
  f.m = m;
  f.r = r;
  for (int j = 0; j < alpha - 1; ++j) {
    double scale = 1;
    for (int l = 0; l < alpha - 1; ++l)
      if (l != j) scale *= points[j] - points[l];
    for (int i = 0; i < m; ++i) f.at[i][j] = static_cast<float>(std::pow(points[j], i));
    for (int k = 0; k < r; ++k) f.g[j][k] = static_cast<float>(std::pow(points[j], k) / scale);
  }
  f.at[m - 1][alpha - 1] = 1;
  f.g[alpha - 1][r - 1] = 1;
  return f;
}

const WinogradSquare& winograd_input_matrix(int alpha) {
  PIPELINE_CHECK(alpha == 6 || alpha == 8, "no Winograd input transform for alpha = {}", alpha);
  static const auto make = [](int a) {
    const std::vector<double> points = winograd_points(a);
    WinogradSquare b{};
    for (int j = 0; j <= a - 1; ++j) {
      const std::array<double, kMaxAlpha> c = product_of_roots(points, j == a - 1 ? -1 : j);
      for (int i = 0; i < a; ++i) b[j][i] = static_cast<float>(c[i]);
    }
    return b;
  };
  static const WinogradSquare six = make(6), eight = make(8);
  return alpha == 6 ? six : eight;
}

bool winograd_suits(const WinogradProblem& p, std::int64_t kernel_w, std::int64_t stride_h,
                    std::int64_t stride_w) {
  const std::int64_t r = p.r;
  if (kernel_w != r || (r != 3 && r != 5) || stride_h != 1 || stride_w != 1 || p.pad_h >= r ||
      p.pad_w >= r || p.c < 16 || p.m < 16)
    return false;
  return products_saved(p, winograd_alpha(p)) >= 2;
}

void winograd_forward(const WinogradProblem& p, const float* x, const float* weight,
                      const float* bias, float* y, bool round_bf16) {
  if (winograd_alpha(p) == 8) return forward<8>(p, x, weight, bias, y, round_bf16);
  forward<6>(p, x, weight, bias, y, round_bf16);
}

void winograd_backward_data(const WinogradProblem& p, const float* dy, const float* weight,
                            float* dx) {
  if (winograd_alpha(p) == 8) return backward_data<8>(p, dy, weight, dx);
  backward_data<6>(p, dy, weight, dx);
}

void winograd_backward_filter(const WinogradProblem& p, const float* x, const float* dy,
                              float* dweight) {
  if (winograd_alpha(p) == 8) return backward_filter<8>(p, x, dy, dweight);
  backward_filter<6>(p, x, dy, dweight);
}

}  // namespace pipeline::ops::detail
