// Element-wise activations and their gradients: ReLU, GELU (exact, erf-based, as PyTorch's
// default nn.GELU), tanh and sigmoid.
//
// x, y, dy and dx are float32 CPU tensors of equal element count (any shape); y and dx may alias
// x and dy respectively (in-place). Backward needs either the forward input or the forward output:
// ReLU and GELU are differentiated from the input x, tanh and sigmoid from the output y (their
// derivatives are cheap functions of y, and keeping y avoids a second transcendental).
// activation_saves_output() says which one to keep. Large tensors are split across OpenMP threads.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <string_view>

namespace pipeline::ops {

enum class Activation { ReLU, GELU, Tanh, Sigmoid };

std::string_view activation_name(Activation a);

// True when backward takes the forward output (tanh, sigmoid), false when it takes the input.
constexpr bool activation_saves_output(Activation a) {
  return a == Activation::Tanh || a == Activation::Sigmoid;
}

// y = f(x). y may be bfloat16: f(x) rounded as it is written (the bits of to_dtype of the
// float32 result), for an output that only products read (ops/precision.hpp: OutputAs).
void activation_forward(Activation a, const Tensor& x, Tensor& y);
// dx = dy ⊙ f'(·), where `saved` is x or y as activation_saves_output(a) says.
void activation_backward(Activation a, const Tensor& saved, const Tensor& dy, Tensor& dx);

// Allocating forms.
Tensor activation_forward(Activation a, const Tensor& x);
Tensor activation_backward(Activation a, const Tensor& saved, const Tensor& dy);

}  // namespace pipeline::ops
