// LayerNorm: normalises over the last dimension, y = (x − mean) / √(var + eps) · weight + bias,
// as PyTorch's nn.LayerNorm(features). Input [..., features], output of the same shape.
// Parameters `weight` (ones) and `bias` (zeros), both [features].
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/ops/norm.hpp>
#include <pipeline/ops/precision.hpp>

namespace pipeline {

class LayerNorm final : public Layer {
 public:
  // `output`: ops::OutputAs (the backward reads x, mean and rstd, never y).
  LayerNorm(std::string name, std::int64_t features, float eps = 1e-5f,
            ops::OutputAs output = ops::OutputAs::Float32)
      : Layer(std::move(name)), m_features(features), m_eps(eps), m_output(output) {
    PIPELINE_CHECK_AS(ConfigError, m_features > 0,
                      "LayerNorm '{}': features must be positive, got {}", this->name(),
                      m_features);
    PIPELINE_CHECK_AS(ConfigError, m_eps > 0.f, "LayerNorm '{}': eps must be positive, got {}",
                      this->name(), m_eps);
  }

  std::string kind() const override { return "LayerNorm"; }
  std::int64_t features() const { return m_features; }
  float eps() const { return m_eps; }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() >= 1 && in[-1] == m_features,
                      "LayerNorm '{}' expects [..., {}] input, got {}", name(), m_features, in);
    return in;
  }
  double flops(const Shape& in) const override { return 8.0 * static_cast<double>(in.numel()); }
  std::vector<ParamSpec> parameters() const override {
    return {{"weight", {m_features}, Init::ones()}, {"bias", {m_features}, Init::zeros()}};
  }

 protected:
  Tensor forward_impl(LayerParams& p, const Tensor& x, Saved& saved,
                      const ForwardContext&) const override {
    output_shape(x.shape());
    const std::int64_t rows = x.numel() / m_features;
    Tensor y = Tensor::empty(x.shape(), ops::output_dtype(m_output), x.device());
    Tensor mean = Tensor::empty({rows}, DType::Float32, x.device()),
           rstd = Tensor::empty({rows}, DType::Float32, x.device());
    ops::layer_norm_forward(x, p.params[0], p.params[1], m_eps, y, mean, rstd);
    saved.tensors = {x, mean, rstd};
    return y;
  }

  Tensor backward_impl(const LayerParams& p, const Saved& saved, const Tensor& dy,
                       std::span<Tensor> grads, GradParts parts) const override {
    const Tensor& x = saved.tensors.at(0);
    const bool input = has_part(parts, GradParts::Input);
    const bool weight = has_part(parts, GradParts::Weight);
    Tensor dx = input ? Tensor::empty(x.shape(), DType::Float32, x.device()) : Tensor();
    ops::layer_norm_backward(x, p.params[0], saved.tensors.at(1), saved.tensors.at(2), dy,
                             input ? &dx : nullptr, weight ? &grads[0] : nullptr,
                             weight ? &grads[1] : nullptr);
    return dx;
  }

 private:
  std::int64_t m_features;
  float m_eps;
  ops::OutputAs m_output;
};

}  // namespace pipeline
