// Finite-difference checks of a layer's backward, shared by every layer test.
//
// The scalar checked is L = Σ y ⊙ r with a fixed random r, so dL/dy = r exercises every output.
// Central differences in float32 carry rounding of about eps_machine·|L|/h, so the comparison
// uses a normalised error over sampled coordinates (as ggml's backend tests do) rather than a
// per-element bound, and prints the worst coordinates when it fails.
#pragma once

#include <pipeline/nn/layer.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace pipeline::testing {

struct GradCheckOptions {
  float step = 1e-2f;       // central-difference step h
  double tolerance = 2e-3;  // bound on Σ(a−n)² / Σ n² over the sampled coordinates
  int max_coords = 48;      // coordinates sampled per tensor (all when the tensor is smaller)
  std::uint64_t seed = 1234;
  Mode mode = Mode::Train;
  float input_lo = -1.f, input_hi = 1.f;
  // Layers whose input has no gradient (int32 token ids) set check_input = false and pass the
  // input to use in `input`; only their parameter gradients are then checked.
  bool check_input = true;
  Tensor input;  // used instead of a random input when defined
};

inline Tensor random_tensor(const Shape& s, std::uint64_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor t = Tensor::empty(s);
  Rng rng(seed);
  rng.fill_uniform(t, lo, hi);
  return t;
}

// L(x, params) = Σ forward(x) ⊙ r, in double.
inline double weighted_sum(const Layer& layer, const LayerParams& params, const Tensor& x,
                           const Tensor& r, const ForwardContext& ctx) {
  LayerParams p = params.clone();  // forward may update buffers (batch-norm statistics)
  Saved saved;
  Tensor y = layer.forward(p, x, saved, ctx);
  double s = 0;
  auto yv = y.values();
  auto rv = r.values();
  for (std::size_t i = 0; i < yv.size(); ++i) s += static_cast<double>(yv[i]) * rv[i];
  return s;
}

// Compares analytic and numeric gradients of `target` (the input or one parameter), perturbing
// it in place through `element`.
inline void compare(const std::string& what, const std::vector<float>& analytic,
                    std::span<float> target, const std::function<double()>& loss,
                    const GradCheckOptions& o) {
  Rng pick(o.seed ^ 0xabcdef);
  std::vector<std::size_t> coords;
  if (static_cast<int>(target.size()) <= o.max_coords) {
    for (std::size_t i = 0; i < target.size(); ++i) coords.push_back(i);
  } else {
    for (int k = 0; k < o.max_coords; ++k) coords.push_back(pick.below(target.size()));
  }
  double num2 = 0, err2 = 0;
  std::vector<std::tuple<double, std::size_t, double, double>> errors;
  for (auto i : coords) {
    float saved = target[i];
    target[i] = saved + o.step;
    double lp = loss();
    target[i] = saved - o.step;
    double lm = loss();
    target[i] = saved;
    double numeric = (lp - lm) / (2.0 * o.step);
    double a = analytic[i];
    num2 += numeric * numeric;
    err2 += (a - numeric) * (a - numeric);
    errors.emplace_back(std::abs(a - numeric), i, a, numeric);
  }
  double normalised = err2 / std::max(num2, 1e-12);
  if (!(normalised <= o.tolerance)) {
    std::sort(errors.rbegin(), errors.rend());
    std::string worst;
    for (std::size_t k = 0; k < std::min<std::size_t>(5, errors.size()); ++k)
      worst += fmt::format("\n  [{}] analytic {:.6g} numeric {:.6g}", std::get<1>(errors[k]),
                           std::get<2>(errors[k]), std::get<3>(errors[k]));
    FAIL_CHECK(fmt::format("gradient of {}: normalised error {:.3g} > {:.3g}; worst:{}", what,
                           normalised, o.tolerance, worst));
  } else {
    CHECK(normalised <= o.tolerance);
  }
}

// Checks that a backward split into an input-only and a weight-only pass (as the pipeline
// schedules run it) gives exactly the input and parameter gradients of one combined pass, and
// that the weight-only pass returns no input gradient (a composite's from what its input pass
// kept).
inline void check_split_backward(const Layer& layer, const LayerParams& p, const Saved& s,
                                 const Tensor& dy) {
  auto g_both = layer.zero_grads(), g_weight = layer.zero_grads();
  Tensor dx_both = layer.backward(p, s, dy, g_both, GradParts::Both);
  Tensor dx_input = layer.backward(p, s, dy, {}, GradParts::Input);
  // A composite keeps its children's output gradients for the weight pass, which uses them up.
  if (!layer.children().empty() && !p.params.empty()) CHECK_FALSE(s.child_output_grads.empty());
  Tensor dx_weight = layer.backward(p, s, dy, g_weight, GradParts::Weight);
  CHECK(s.child_output_grads.empty());
  CHECK(dx_input.to_vector() == dx_both.to_vector());
  CHECK_FALSE(dx_weight.defined());
  for (std::size_t k = 0; k < g_both.size(); ++k)
    CHECK(g_both[k].to_vector() == g_weight[k].to_vector());
}

// Checks dL/dx and dL/dparam for every parameter of `layer` at a random input of `input_shape`.
inline void check_layer_gradients(const Layer& layer, const Shape& input_shape,
                                  GradCheckOptions o = {}) {
  INFO("layer ", layer.name(), " (", layer.kind(), ") input ", input_shape.str());
  LayerParams params = layer.init(o.seed);
  // Non-zero, non-trivial parameters even where the initialiser gives zeros or ones.
  for (std::size_t k = 0; k < params.params.size(); ++k) {
    Rng rng(o.seed + 17 * (k + 1));
    for (float& v : params.params[k].values()) v += rng.uniform(-0.5f, 0.5f);
  }
  Tensor x =
      o.input.defined() ? o.input : random_tensor(input_shape, o.seed + 1, o.input_lo, o.input_hi);
  REQUIRE(x.shape() == input_shape);
  ForwardContext ctx{o.mode, o.seed + 2};

  Shape out_shape = layer.output_shape(input_shape);
  Tensor r = random_tensor(out_shape, o.seed + 3);

  LayerParams p = params.clone();
  Saved saved;
  Tensor y = layer.forward(p, x, saved, ctx);
  REQUIRE(y.shape() == out_shape);
  std::vector<Tensor> grads = layer.zero_grads();
  Tensor dx = layer.backward(p, saved, r, grads);

  auto loss = [&] { return weighted_sum(layer, params, x, r, ctx); };
  if (o.check_input) {
    REQUIRE(dx.shape() == input_shape);
    compare("input", dx.to_vector(), x.values(), loss, o);
  }
  auto specs = layer.parameters();
  for (std::size_t k = 0; k < specs.size(); ++k)
    compare(specs[k].name, grads[k].to_vector(), params.params[k].values(), loss, o);
}

}  // namespace pipeline::testing
