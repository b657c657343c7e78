// TransformerBlock: a pre-norm GPT-style decoder block on [B, T, dim] sequences.
//
//   x1 = x  + drop(proj(causal_mha(qkv(ln1(x)))))
//   y  = x1 + drop(fc2(gelu(fc1(ln2(x1)))))
//
// qkv is Linear(dim, 3·dim) whose output holds q, k and v side by side; causal_mha splits them
// into `heads` heads of dim/heads (ops/attention.hpp); proj is Linear(dim, dim); fc1 is
// Linear(dim, mlp_ratio·dim) and fc2 its inverse. Children (and parameter prefixes): ln1, qkv,
// proj, ln2, fc1, gelu, fc2. Dropout (residual dropout, p = `dropout`) is applied in training
// mode only, with masks drawn from the microbatch seed and this block's name.
#pragma once

#include <pipeline/nn/composite.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/layer_norm.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/ops/attention.hpp>
#include <pipeline/ops/dropout.hpp>

namespace pipeline {

class TransformerBlock final : public Composite {
 public:
  TransformerBlock(std::string name, std::int64_t dim, std::int64_t heads,
                   std::int64_t mlp_ratio = 4, float dropout = 0.f)
      : Composite(std::move(name)),
        m_dim(dim),
        m_heads(heads),
        m_mlp_ratio(mlp_ratio),
        m_dropout(dropout) {
    PIPELINE_CHECK_AS(ConfigError, dim > 0 && heads > 0 && dim % heads == 0,
                      "TransformerBlock '{}': dim {} must be a positive multiple of heads {}",
                      this->name(), dim, heads);
    PIPELINE_CHECK_AS(ConfigError, mlp_ratio > 0,
                      "TransformerBlock '{}': mlp_ratio must be positive, got {}", this->name(),
                      mlp_ratio);
    PIPELINE_CHECK_AS(ConfigError, dropout >= 0.f && dropout < 1.f,
                      "TransformerBlock '{}': dropout must be in [0, 1), got {}", this->name(),
                      dropout);
    // qkv, fc1 and fc2 are the only readers and keepers of their inputs (the layer norms'
    // outputs, GELU's output), and the attention of qkv's output: under bf16 those are written
    // in bf16 and kept as they are. proj's input, the attention output, is kept in float32 by the
    // block (the attention backward's row dots) and shared.
    constexpr auto kForProducts = ops::OutputAs::ProductOperand;
    m_ln1 = add_child<LayerNorm>("ln1", dim, 1e-5f, kForProducts);
    m_qkv = add_child<Linear>("qkv", dim, 3 * dim, true, SavedInput::ProductOperand, kForProducts);
    m_proj = add_child<Linear>("proj", dim, dim);
    m_ln2 = add_child<LayerNorm>("ln2", dim, 1e-5f, kForProducts);
    m_fc1 = add_child<Linear>("fc1", dim, mlp_ratio * dim, true, SavedInput::ProductOperand);
    m_gelu = add_child<GELU>("gelu", kForProducts);
    m_fc2 = add_child<Linear>("fc2", mlp_ratio * dim, dim, true, SavedInput::ProductOperand);
  }

  std::string kind() const override { return "TransformerBlock"; }
  std::int64_t dim() const { return m_dim; }
  std::int64_t heads() const { return m_heads; }
  std::int64_t mlp_ratio() const { return m_mlp_ratio; }
  float dropout() const { return m_dropout; }
  bool draws_random_numbers() const override {
    return m_dropout > 0.f || Composite::draws_random_numbers();
  }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() == 3 && in[2] == m_dim,
                      "TransformerBlock '{}' expects [B, T, {}] input, got {}", name(), m_dim, in);
    return in;
  }
  double flops(const Shape& in) const override {
    output_shape(in);
    const Shape hidden{in[0], in[1], m_mlp_ratio * m_dim};
    double f = child(m_ln1).flops(in) + child(m_qkv).flops(in) + child(m_proj).flops(in) +
               child(m_ln2).flops(in) + child(m_fc1).flops(in) + child(m_gelu).flops(hidden) +
               child(m_fc2).flops(hidden);
    // Attention: the two T×T products plus ~5 operations per score for scaling and softmax.
    f += ops::attention_flops(in[0], in[1], m_dim) +
         5.0 * static_cast<double>(in[0] * m_heads * in[1] * in[1]);
    return f + 2.0 * static_cast<double>(in.numel());  // residual adds
  }

 protected:
  // Saved::tensors: qkv output (bf16 under a bf16 compute dtype), attention output, what the
  // attention op keeps for its backward
  // (the probabilities on the CPU, per-row log-sum-exp on CUDA: ops::attention_saved_shape), then
  // the two dropout masks if used. The attention output is proj's saved input too (shared).
  Tensor forward_impl(LayerParams& p, const Tensor& x, Saved& saved,
                      const ForwardContext& ctx) const override {
    output_shape(x.shape());
    const std::int64_t B = x.dim(0), T = x.dim(1);
    const bool drop = ctx.training() && m_dropout > 0.f;
    saved.children.assign(static_cast<std::size_t>(num_children()), Saved{});

    Tensor h = forward_child(m_ln1, p, x, saved, ctx);
    Tensor qkv = forward_child(m_qkv, p, h, saved, ctx);
    Tensor attn = Tensor::empty({B, T, m_dim}, DType::Float32, x.device());
    Tensor attn_saved = Tensor::empty(ops::attention_saved_shape(x.device(), B, m_heads, T),
                                      DType::Float32, x.device());
    ops::attention_forward_packed(qkv, m_heads, attn, attn_saved);
    Tensor x1 = forward_child(m_proj, p, attn, saved, ctx);
    // The attention backward reads q, k and v only as product operands: bf16 under bf16 (qkv
    // itself, written so).
    saved.tensors = {ops::saved_product_operand(qkv), attn, attn_saved};
    if (drop) {
      Tensor mask;
      x1 = ops::dropout(x1, m_dropout, ctx.seed, qualified("attn_dropout"), mask);
      saved.tensors.push_back(mask);
    }
    add_in_place(x1, x);

    Tensor m = forward_child(m_ln2, p, x1, saved, ctx);
    m = forward_child(m_fc1, p, m, saved, ctx);
    m = forward_child(m_gelu, p, m, saved, ctx);
    m = forward_child(m_fc2, p, m, saved, ctx);
    if (drop) {
      Tensor mask;
      m = ops::dropout(m, m_dropout, ctx.seed, qualified("mlp_dropout"), mask);
      saved.tensors.push_back(mask);
    }
    add_in_place(m, x1);
    return m;
  }

  Tensor composite_backward(const LayerParams& p, const Saved& saved, const Tensor& dy,
                            std::span<Tensor> grads, GradParts parts) const override {
    const Tensor& qkv = saved.tensors.at(0);
    const Tensor& attn = saved.tensors.at(1);
    const Tensor& attn_saved = saved.tensors.at(2);
    const bool drop = saved.tensors.size() == 5;
    const GradParts inner = inner_parts(parts);

    // MLP branch; the residual passes dy through unchanged.
    Tensor g = dy;
    if (drop) {
      g = Tensor::empty(dy.shape(), DType::Float32, dy.device());
      ops::apply_mask(dy, saved.tensors.at(4), g);
    }
    g = backward_child(m_fc2, p, saved, g, grads, inner);
    g = backward_child(m_gelu, p, saved, g, grads, inner);
    g = backward_child(m_fc1, p, saved, g, grads, inner);
    Tensor dx1 = backward_child(m_ln2, p, saved, g, grads, inner);
    add_in_place(dx1, dy);

    // Attention branch.
    Tensor a = dx1;
    if (drop) {
      a = Tensor::empty(dx1.shape(), DType::Float32, dx1.device());
      ops::apply_mask(dx1, saved.tensors.at(3), a);
    }
    a = backward_child(m_proj, p, saved, a, grads, inner);
    Tensor dqkv = Tensor::empty(qkv.shape(), DType::Float32, qkv.device());
    ops::attention_backward_packed(qkv, attn, attn_saved, a, m_heads, dqkv);
    Tensor dh = backward_child(m_qkv, p, saved, dqkv, grads, inner);
    Tensor dx = backward_child(m_ln1, p, saved, dh, grads, entry_parts(parts));
    if (!has_part(parts, GradParts::Input)) return {};
    add_in_place(dx, dx1);
    return dx;
  }

 private:
  std::int64_t m_dim, m_heads, m_mlp_ratio;
  float m_dropout;
  int m_ln1 = 0, m_qkv = 0, m_proj = 0, m_ln2 = 0, m_fc1 = 0, m_gelu = 0, m_fc2 = 0;
};

}  // namespace pipeline
