// BatchNorm2d: per-channel normalisation of [N, C, H, W] activations, as PyTorch's
// nn.BatchNorm2d(channels, eps, momentum). Parameters `weight` (ones) and `bias` (zeros);
// buffers `running_mean` (zeros) and `running_var` (ones), all [C].
//
// Train mode normalises with the batch statistics and updates the running buffers in forward
// (the LayerParams passed in), with the unbiased variance for running_var; Eval mode
// normalises with the running buffers and leaves them alone. Train mode needs N·H·W > 1.
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/ops/norm.hpp>

namespace pipeline {

class BatchNorm2d final : public Layer {
 public:
  BatchNorm2d(std::string name, std::int64_t channels, float eps = 1e-5f, float momentum = 0.1f)
      : Layer(std::move(name)), m_channels(channels), m_eps(eps), m_momentum(momentum) {
    PIPELINE_CHECK_AS(ConfigError, m_channels > 0,
                      "BatchNorm2d '{}': channels must be positive, got {}", this->name(),
                      m_channels);
    PIPELINE_CHECK_AS(ConfigError, m_eps > 0.f, "BatchNorm2d '{}': eps must be positive, got {}",
                      this->name(), m_eps);
    PIPELINE_CHECK_AS(ConfigError, m_momentum >= 0.f && m_momentum <= 1.f,
                      "BatchNorm2d '{}': momentum must be in [0, 1], got {}", this->name(),
                      m_momentum);
  }

  std::string kind() const override { return "BatchNorm2d"; }
  std::int64_t channels() const { return m_channels; }
  float eps() const { return m_eps; }
  float momentum() const { return m_momentum; }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() == 4 && in[1] == m_channels,
                      "BatchNorm2d '{}' expects [N, {}, H, W] input, got {}", name(), m_channels,
                      in);
    return in;
  }
  double flops(const Shape& in) const override { return 6.0 * static_cast<double>(in.numel()); }
  std::vector<ParamSpec> parameters() const override {
    return {{"weight", {m_channels}, Init::ones()}, {"bias", {m_channels}, Init::zeros()}};
  }
  std::vector<ParamSpec> buffers() const override {
    return {{"running_mean", {m_channels}, Init::zeros()},
            {"running_var", {m_channels}, Init::ones()}};
  }

 protected:
  // Saved: x, mean, rstd and a one-element flag (1: batch statistics were used).
  Tensor forward_impl(LayerParams& p, const Tensor& x, Saved& saved,
                      const ForwardContext& ctx) const override {
    output_shape(x.shape());
    Tensor y = Tensor::empty(x.shape(), DType::Float32, x.device());
    Tensor mean = Tensor::empty({m_channels}, DType::Float32, x.device()),
           rstd = Tensor::empty({m_channels}, DType::Float32, x.device());
    if (ctx.training())
      ops::batch_norm_forward_train(x, p.params[0], p.params[1], m_eps, m_momentum, p.buffers[0],
                                    p.buffers[1], y, mean, rstd);
    else
      ops::batch_norm_forward_eval(x, p.params[0], p.params[1], m_eps, p.buffers[0], p.buffers[1],
                                   y, mean, rstd);
    saved.tensors = {x, mean, rstd, Tensor::full({1}, ctx.training() ? 1.f : 0.f)};
    return y;
  }

  Tensor backward_impl(const LayerParams& p, const Saved& saved, const Tensor& dy,
                       std::span<Tensor> grads, GradParts parts) const override {
    const Tensor& x = saved.tensors.at(0);
    const bool training = saved.tensors.at(3).data<float>()[0] != 0.f;
    const bool input = has_part(parts, GradParts::Input);
    const bool weight = has_part(parts, GradParts::Weight);
    Tensor dx = input ? Tensor::empty(x.shape(), DType::Float32, x.device()) : Tensor();
    ops::batch_norm_backward(x, p.params[0], saved.tensors.at(1), saved.tensors.at(2), dy, training,
                             input ? &dx : nullptr, weight ? &grads[0] : nullptr,
                             weight ? &grads[1] : nullptr);
    return dx;
  }

 private:
  std::int64_t m_channels;
  float m_eps, m_momentum;
};

}  // namespace pipeline
