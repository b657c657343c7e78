// Linear: y = x · Wᵀ + b over the last dimension (PyTorch layout: weight [out, in], bias [out]).
// Any leading dimensions are treated as rows, so it applies per token in a [B, T, C] sequence.
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/ops/bias.hpp>
#include <pipeline/ops/gemm.hpp>
#include <pipeline/ops/precision.hpp>

#include <cmath>

namespace pipeline {

// What Linear keeps of its input for the weight gradient (dW = dyᵀ x, a product).
//  Shared: x itself, no bytes of its own where something else keeps the same tensor (a stage's
//    received input, an attention output its block keeps).
//  ProductOperand: under a bf16 compute dtype x in bf16 (ops::saved_product_operand), half the
//    bytes and bit-identical gradients, since the product rounds x to bf16 anyway; for an input
//    nothing else keeps (a layer norm's output inside a transformer block), where a bf16 copy
//    beside a kept float32 tensor would add bytes instead.
enum class SavedInput { Shared, ProductOperand };

class Linear final : public Layer {
 public:
  // `output`: ops::OutputAs (the backward never reads y).
  Linear(std::string name, std::int64_t in_features, std::int64_t out_features, bool bias = true,
         SavedInput saved_input = SavedInput::Shared, ops::OutputAs output = ops::OutputAs::Float32)
      : Layer(std::move(name)),
        m_in(in_features),
        m_out(out_features),
        m_bias(bias),
        m_saved_input(saved_input),
        m_output(output) {
    PIPELINE_CHECK_AS(ConfigError, m_in > 0 && m_out > 0,
                      "Linear '{}': features must be positive, got {} -> {}", this->name(), m_in, m_out);
  }

  std::string kind() const override { return "Linear"; }
  std::int64_t in_features() const { return m_in; }
  std::int64_t out_features() const { return m_out; }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() >= 2 && in[-1] == m_in,
                      "Linear '{}' expects [..., {}] input, got {}", name(), m_in, in);
    Shape out = in;
    out[-1] = m_out;
    return out;
  }
  double flops(const Shape& in) const override {
    return 2.0 * static_cast<double>(in.numel() / m_in) * m_in * m_out;
  }
  std::vector<ParamSpec> parameters() const override {
    // PyTorch's default: kaiming_uniform(a = √5) for the weight and U(±1/√in) for the bias,
    // both of which come to a bound of 1/√in.
    float bound = 1.f / std::sqrt(static_cast<float>(m_in));
    std::vector<ParamSpec> p{
        {"weight", {m_out, m_in}, Init::uniform(bound), DType::Float32, /*product_operand=*/true}};
    if (m_bias) p.push_back({"bias", {m_out}, Init::uniform(bound)});
    return p;
  }

 protected:
  Tensor forward_impl(LayerParams& p, const Tensor& x, Saved& saved,
                      const ForwardContext&) const override {
    Shape out_shape = output_shape(x.shape());
    const std::int64_t rows = x.numel() / m_in;
    Tensor y = Tensor::empty(out_shape, ops::output_dtype(m_output), x.device());
    Tensor y2 = y.reshape({rows, m_out});
    // The kept bf16 copy is the product's operand too: x is converted once, not twice.
    const Tensor xp =
        m_saved_input == SavedInput::ProductOperand ? ops::saved_product_operand(x) : x;
    if (m_bias)
      ops::gemm_bias(xp.reshape({rows, m_in}), false, p.params[0], true, p.params[1], y2);
    else
      ops::gemm(xp.reshape({rows, m_in}), false, p.params[0], true, y2);
    saved.tensors = {xp};
    return y;
  }

  Tensor backward_impl(const LayerParams& p, const Saved& saved, const Tensor& dy,
                       std::span<Tensor> grads, GradParts parts) const override {
    const Tensor& x = saved.tensors.at(0);
    const std::int64_t rows = x.numel() / m_in;
    const Tensor dy2 = dy.reshape({rows, m_out});
    // dy as both products read it, converted once when both run.
    const Tensor dyp = parts == GradParts::Both ? ops::saved_product_operand(dy2) : dy2;
    if (has_part(parts, GradParts::Weight)) {
      ops::gemm(dyp, true, x.reshape({rows, m_in}), false, grads[0], 1.f, 1.f);  // dW += dyᵀ x
      if (m_bias) ops::bias_grad(dy2, grads[1]);
    }
    if (!has_part(parts, GradParts::Input)) return {};
    Tensor dx = Tensor::empty(x.shape(), DType::Float32, x.device());
    Tensor dx2 = dx.reshape({rows, m_in});
    ops::gemm(dyp, false, p.params[0], false, dx2);  // dx = dy W
    return dx;
  }

 private:
  std::int64_t m_in, m_out;
  bool m_bias;
  SavedInput m_saved_input;
  ops::OutputAs m_output;
};

}  // namespace pipeline
