// Embedding: token ids -> vectors, as PyTorch's nn.Embedding(vocab, dim), optionally plus a
// learned positional embedding (GPT-2 style).
//
// Input: int32 ids [B, T] (any rank >= 1; the last extent is the sequence). Output [B, T, dim].
// Parameters: `weight` [vocab, dim] ~ N(0, 1) (PyTorch's default) and, when max_positions > 0,
// `position` [max_positions, dim] ~ N(0, 0.02), whose first T rows are added to every sequence
// (T must not exceed max_positions). Ids have no gradient: backward returns an undefined tensor,
// so an Embedding is the first layer of a model.
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/ops/embedding.hpp>

namespace pipeline {

class Embedding final : public Layer {
 public:
  Embedding(std::string name, std::int64_t vocab, std::int64_t dim, std::int64_t max_positions = 0)
      : Layer(std::move(name)), m_vocab(vocab), m_dim(dim), m_max_positions(max_positions) {
    PIPELINE_CHECK_AS(ConfigError, m_vocab > 0 && m_dim > 0,
                      "Embedding '{}': vocab and dim must be positive, got {} and {}", this->name(),
                      m_vocab, m_dim);
    PIPELINE_CHECK_AS(ConfigError, m_max_positions >= 0,
                      "Embedding '{}': max_positions must be >= 0, got {}", this->name(),
                      m_max_positions);
  }

  std::string kind() const override { return "Embedding"; }
  std::int64_t vocab() const { return m_vocab; }
  std::int64_t dim() const { return m_dim; }
  std::int64_t max_positions() const { return m_max_positions; }

  Shape output_shape(const Shape& in) const override {
    PIPELINE_CHECK_AS(ConfigError, in.rank() >= 1,
                      "Embedding '{}' expects ids of shape [B, T], got {}", name(), in);
    PIPELINE_CHECK_AS(ConfigError, m_max_positions == 0 || in[-1] <= m_max_positions,
                      "Embedding '{}': sequences of {} tokens exceed max_positions = {}; use "
                      "shorter sequences or a larger position table",
                      name(), in[-1], m_max_positions);
    std::vector<std::int64_t> dims = in.dims();
    dims.push_back(m_dim);
    return Shape(std::move(dims));
  }
  // A gather is memory-bound; count one operation per output element (and one per position add).
  double flops(const Shape& in) const override {
    return (m_max_positions > 0 ? 2.0 : 1.0) * static_cast<double>(in.numel() * m_dim);
  }
  std::vector<ParamSpec> parameters() const override {
    std::vector<ParamSpec> p{{"weight", {m_vocab, m_dim}, Init::normal(1.f)}};
    if (m_max_positions > 0)
      p.push_back({"position", {m_max_positions, m_dim}, Init::normal(0.02f)});
    return p;
  }

 protected:
  Tensor forward_impl(LayerParams& p, const Tensor& ids, Saved& saved,
                      const ForwardContext&) const override {
    PIPELINE_CHECK_AS(ConfigError, ids.dtype() == DType::Int32,
                      "Embedding '{}' expects int32 token ids, got a {} tensor of shape {}", name(),
                      dtype_name(ids.dtype()), ids.shape());
    Tensor y = Tensor::empty(output_shape(ids.shape()), DType::Float32, ids.device());
    ops::embedding_forward(ids, p.params[0], y);
    if (m_max_positions > 0) ops::add_positions(y, ids.dim(-1), p.params[1]);
    saved.tensors = {ids};
    return y;
  }

  Tensor backward_impl(const LayerParams&, const Saved& saved, const Tensor& dy,
                       std::span<Tensor> grads, GradParts parts) const override {
    if (!has_part(parts, GradParts::Weight)) return {};
    const Tensor& ids = saved.tensors.at(0);
    ops::embedding_backward(ids, dy, grads[0]);
    if (m_max_positions > 0) ops::positions_grad(dy, ids.dim(-1), grads[1]);
    return {};
  }

 private:
  std::int64_t m_vocab, m_dim, m_max_positions;
};

}  // namespace pipeline
