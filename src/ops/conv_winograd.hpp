// Internal: stride-1 3x3 and 5x5 convolutions on the CPU by Winograd's minimal filtering
// (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
//
// A 2-D correlation of an r x r filter over an α x α input tile gives an m x m output tile
// (α = m + r − 1) as Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A. Summed over input channels, the products
// at each of the α² transform positions become one gemm per position, [out, in] x [in, tiles]:
// α² · out · in multiply-adds per tile instead of m² · r² · out · in. 3x3 filters take F(4, 3)
// with α = 6 and the points 0, ±1, 1/2, −2 and infinity (4x fewer products than direct); 5x5 ones
// F(4, 5) with α = 8 and the points 0, ±1, ±1/2, ±2 and infinity (6.25x; F(2, 5) with α = 6 saved
// 2.78x, and still serves outputs too small for 4x4 tiles). Each set pairs a point with its
// negative reciprocal, as Barabasz et al. 2020 recommend (0, ±1, ±2 for α = 6 was 3x less accurate
// here). The weight gradient correlates the input with the output gradient as the filter, F(3, 4)
// and F(5, 4) (F(5, 2) where the forward takes F(2, 5)), which share Bᵀ with the forward; its sums
// over tiles stay in the transform domain and are taken back to r x r once per call.
//
// For α = 8 the transforms are not dense products: its points pair up as ±p, so Bᵀ's, Aᵀ's and
// G's rows for p and −p are e ± o of an even and an odd part (28, 19 and at most 20 operations a
// row instead of 64, 32 and 40).
//
// The results differ from the direct convolution by rounding only: on random data the largest
// difference from the lowered convolution is 1.6-3.8e-6 of the largest output for 3x3 filters
// (α = 6) and 4.6-9.5e-6 for 5x5 ones (α = 8; α = 6 gave 1.3-4.5e-6), over 32-256 channels;
// tests/unit/test_conv.cpp bounds it.
#pragma once

#include <array>
#include <cstdint>

namespace pipeline::ops::detail {

// One stride-1 convolution: x [n, c, h, w], weight [m, c, r, r], y [n, m, oh, ow].
struct WinogradProblem {
  std::int64_t n, c, h, w;
  std::int64_t m, oh, ow;
  std::int64_t r, pad_h, pad_w;
};

constexpr int kWinogradMaxAlpha = 8;
using WinogradSquare = std::array<std::array<float, kWinogradMaxAlpha>, kWinogradMaxAlpha>;

// The α of the transforms for p: 6 for 3x3 filters (F(4, 3)); 8 for 5x5 ones (F(4, 5)), or 6
// (F(2, 5)) where the output is so small that 4x4 tiles would save less than 2x2 ones.
int winograd_alpha(const WinogradProblem& p);

// F(m, r) for α = m + r − 1 of 6 or 8: Aᵀ (m x α; rows past m are zero) and G (α x r; columns
// past r are zero), rounded to float from exact double arithmetic, in the top left of 8 x 8
// arrays. Bᵀ (α x α) is common to all of one α.
struct WinogradMatrices {
  int alpha = 0, m = 0, r = 0;
  WinogradSquare at{}, g{};
};
WinogradMatrices winograd_matrices(int m, int r);
const WinogradSquare& winograd_input_matrix(int alpha);

// Whether the winograd_* functions compute this convolution, by shape alone: a square 3x3 or 5x5
// kernel, stride 1 (dilation 1), padding at most r − 1, at least 16 input and output channels
// (below that the transforms cost more than they save), and an output large enough that the
// tiles cut off at its edges leave at least 2x fewer products than the direct convolution.
bool winograd_suits(const WinogradProblem& p, std::int64_t kernel_w, std::int64_t stride_h,
                    std::int64_t stride_w);

// y = conv(x, weight) (+ bias when not null; under round_bf16 each value is rounded to bf16 before
// its bias, as ops/conv.hpp specifies), dx = conv_transpose(dy, weight), dweight += Σ_n dy ⋆ x.
void winograd_forward(const WinogradProblem& p, const float* x, const float* weight,
                      const float* bias, float* y, bool round_bf16);
void winograd_backward_data(const WinogradProblem& p, const float* dy, const float* weight,
                            float* dx);
void winograd_backward_filter(const WinogradProblem& p, const float* x, const float* dy,
                              float* dweight);

}  // namespace pipeline::ops::detail
