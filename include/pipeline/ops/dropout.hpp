// Inverted dropout: y = x ⊙ mask, where each mask element is 1/(1−p) with probability 1−p and 0
// otherwise, so that E[y] = x and evaluation needs no rescaling.
//
// The mask is drawn in row-major order from Rng(seed, key) alone, so the same (seed, key) gives
// the same mask on every rank and thread count; the trainer passes a per-microbatch seed and the
// layer's name as key. p must lie in [0, 1]; p = 1 drops everything (a zero mask). A mask made
// on a CUDA device is bit for bit the CPU's (kernels/dropout.cu jumps the same stream ahead), and
// dropout() and apply_mask() run on the device of their tensors.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <cstdint>
#include <string_view>

namespace pipeline::ops {

Tensor dropout_mask(const Shape& shape, float p, std::uint64_t seed, std::string_view key,
                    Device device = Device::cpu());

// y = x ⊙ mask (all three the same size; y may be x). The backward is the same op: dx = dy ⊙ mask.
void apply_mask(const Tensor& x, const Tensor& mask, Tensor& y);

// Allocating forward: returns x ⊙ mask and hands the mask back for the backward.
Tensor dropout(const Tensor& x, float p, std::uint64_t seed, std::string_view key, Tensor& mask);

}  // namespace pipeline::ops
