// Flatten: [N, d1, d2, ...] -> [N, d1·d2·...], a view of the input (no copy); backward reshapes
// the gradient back the same way. No parameters, no FLOPs.
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/nn/shape_record.hpp>

namespace pipeline {

class Flatten final : public Layer {
 public:
  explicit Flatten(std::string name) : Layer(std::move(name)) {}
  std::string kind() const override { return "Flatten"; }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() >= 2,
                      "Flatten '{}' expects a batched input [N, ...] of rank >= 2, got {}", name(),
                      in);
    return Shape{in[0], in.inner()};
  }
  double flops(const Shape&) const override { return 0.0; }

 protected:
  Tensor forward_impl(LayerParams&, const Tensor& x, Saved& saved,
                      const ForwardContext&) const override {
    saved.tensors = {shape_record(x.shape())};
    return x.reshape(output_shape(x.shape()));
  }
  Tensor backward_impl(const LayerParams&, const Saved& saved, const Tensor& dy, std::span<Tensor>,
                       GradParts parts) const override {
    if (!has_part(parts, GradParts::Input)) return {};
    return dy.reshape(shape_from_record(saved.tensors.at(0)));
  }
};

}  // namespace pipeline
