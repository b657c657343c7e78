// Internal: stride-1 3x3 and 5x5 convolutions on the CPU by Winograd's minimal filtering
// (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
//
// A 2-D correlation of an r x r filter over an α x α input tile gives an m x m output tile
// (α = m + r − 1) as Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A. Summed over input channels, the products
// at each of the α² transform positions become one gemm per position, [out, in] x [in, tiles]:
// α² · out · in multiply-adds per tile instead of m² · r² · out · in. Every transform here has
// α = 6 with the points 0, ±1, 1/2, −2 and infinity (3x more accurate here than 0, ±1, ±2; a
// point and its negative reciprocal, as Barabasz et al. 2020 recommend): F(2, 5) for 5x5 filters
// (2.78x fewer products than direct), F(4, 3) for 3x3 (4x); the weight gradient correlates the
// input with the output gradient as the filter, F(5, 2) and F(3, 4), which share Bᵀ. Its sums over
// tiles stay in the transform domain and are taken back to r x r once per call.
//
// The results differ from the direct convolution by rounding only: on random data the largest
// difference from the lowered convolution is 1.3-4.5e-6 of the largest output for 5x5 filters
// and 1.6-3.8e-6 for 3x3 ones (32-256 channels; tests/unit/test_conv.cpp bounds it by 1e-5).
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

constexpr int kWinogradAlpha = 6;

// F(m, r) for α = 6: Aᵀ (m x α; rows past m are zero) and G (α x r; columns past r are zero),
// rounded to float from exact double arithmetic. Bᵀ (α x α) is common to all of them.
struct WinogradMatrices {
  int m = 0, r = 0;
  std::array<std::array<float, kWinogradAlpha>, kWinogradAlpha> at{}, g{};
};
WinogradMatrices winograd_matrices(int m, int r);
const std::array<std::array<float, kWinogradAlpha>, kWinogradAlpha>& winograd_input_matrix();

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
