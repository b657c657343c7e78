// Dropout: inverted dropout with drop probability p in [0, 1] (see ops/dropout.hpp).
//
// In Mode::Train the mask is drawn from Rng(ctx.seed, name), so a microbatch draws the same mask
// on whichever rank runs it and a re-run of the same microbatch (recomputation) reproduces it; the
// mask is saved for backward. In Mode::Eval the layer is the identity and saves nothing.
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/ops/dropout.hpp>

namespace pipeline {

class Dropout final : public Layer {
 public:
  Dropout(std::string name, float p) : Layer(std::move(name)), m_p(p) {
    PIPELINE_CHECK_AS(ConfigError, p >= 0.f && p <= 1.f,
                      "Dropout '{}': probability must lie in [0, 1], got {}", this->name(), p);
  }
  std::string kind() const override { return "Dropout"; }
  float p() const { return m_p; }
  bool draws_random_numbers() const override { return m_p > 0.f; }

  Shape output_shape(const Shape& in) const override { return in; }
  double flops(const Shape& in) const override { return static_cast<double>(in.numel()); }

 protected:
  Tensor forward_impl(LayerParams&, const Tensor& x, Saved& saved,
                      const ForwardContext& ctx) const override {
    saved.tensors.clear();
    if (!ctx.training() || m_p == 0.f) return x;
    Tensor mask;
    Tensor y = ops::dropout(x, m_p, ctx.seed, name(), mask);
    saved.tensors = {mask};
    return y;
  }
  Tensor backward_impl(const LayerParams&, const Saved& saved, const Tensor& dy, std::span<Tensor>,
                       GradParts parts) const override {
    if (!has_part(parts, GradParts::Input)) return {};
    if (saved.tensors.empty()) return dy;  // identity in evaluation (or with p = 0)
    Tensor dx = Tensor::empty(dy.shape(), DType::Float32, dy.device());
    ops::apply_mask(dy, saved.tensors.at(0), dx);
    return dx;
  }

 private:
  float m_p;
};

}  // namespace pipeline
