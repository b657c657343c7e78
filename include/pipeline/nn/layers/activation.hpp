// Element-wise activation layers: ReLU, GELU (exact erf form, PyTorch's nn.GELU default), Tanh,
// Sigmoid. No parameters; any input shape, output of the same shape. ReLU and GELU keep their
// input for backward, Tanh and Sigmoid their output (see ops/activation.hpp).
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/ops/activation.hpp>
#include <pipeline/ops/precision.hpp>

#include <string>

namespace pipeline {

class ActivationLayer : public Layer {
 public:
  // `output`: ops::OutputAs (ProductOperand only for the functions differentiated from their
  // input, whose kept tensor is then not the rounded output).
  ActivationLayer(std::string name, ops::Activation fn,
                  ops::OutputAs output = ops::OutputAs::Float32)
      : Layer(std::move(name)), m_fn(fn), m_output(output) {
    PIPELINE_CHECK_AS(
        ConfigError, output == ops::OutputAs::Float32 || !ops::activation_saves_output(fn),
        "{} '{}': its backward reads its output, which must stay float32", kind(), this->name());
  }

  ops::Activation function() const { return m_fn; }
  std::string kind() const override { return std::string(ops::activation_name(m_fn)); }
  Shape output_shape(const Shape& in) const override { return in; }
  // max(relu(a), relu(b)) = relu(max(a, b)), and the gradients agree: where the window's maximum
  // is positive both orders route it to the same element (the first of equal maxima), and where
  // it is not the ReLU's gradient is zero either way.
  bool commutes_with_next(const Layer& next) const override {
    return m_fn == ops::Activation::ReLU && next.kind() == "MaxPool2d";
  }
  double flops(const Shape& in) const override {
    // Rough per-element costs, counting a transcendental as a handful of multiply-adds.
    double per = m_fn == ops::Activation::ReLU ? 1.0 : m_fn == ops::Activation::GELU ? 8.0 : 4.0;
    return per * static_cast<double>(in.numel());
  }

 protected:
  Tensor forward_impl(LayerParams&, const Tensor& x, Saved& saved,
                      const ForwardContext&) const override {
    Tensor y = Tensor::empty(x.shape(), ops::output_dtype(m_output), x.device());
    ops::activation_forward(m_fn, x, y);
    saved.tensors = {ops::activation_saves_output(m_fn) ? y : x};
    return y;
  }
  Tensor backward_impl(const LayerParams&, const Saved& saved, const Tensor& dy, std::span<Tensor>,
                       GradParts parts) const override {
    if (!has_part(parts, GradParts::Input)) return {};
    const Tensor& s = saved.tensors.at(0);
    PIPELINE_CHECK(dy.numel() == s.numel(), "{} '{}': output gradient {} does not match output {}",
                   kind(), name(), dy.shape(), s.shape());
    Tensor dx = ops::activation_backward(m_fn, s, dy);
    return dx.reshape(s.shape());
  }

 private:
  ops::Activation m_fn;
  ops::OutputAs m_output;
};

class ReLU final : public ActivationLayer {
 public:
  explicit ReLU(std::string name) : ActivationLayer(std::move(name), ops::Activation::ReLU) {}
};

class GELU final : public ActivationLayer {
 public:
  explicit GELU(std::string name, ops::OutputAs output = ops::OutputAs::Float32)
      : ActivationLayer(std::move(name), ops::Activation::GELU, output) {}
};

class Tanh final : public ActivationLayer {
 public:
  explicit Tanh(std::string name) : ActivationLayer(std::move(name), ops::Activation::Tanh) {}
};

class Sigmoid final : public ActivationLayer {
 public:
  explicit Sigmoid(std::string name) : ActivationLayer(std::move(name), ops::Activation::Sigmoid) {}
};

}  // namespace pipeline
