// Composite: a layer built from named sub-layers (residual blocks, transformer blocks).
//
// A composite named "block1" owns children named "block1.<local>" (e.g. "block1.conv1"). Its
// parameters() and buffers() are the children's, concatenated in child order, with names
// qualified by the child's local name ("conv1.weight"), so Layer::init draws each tensor from
// the key "block1.conv1.weight" — exactly the key the child itself would use. Composites nest:
// a child may itself be a composite.
//
// The subclass defines the dataflow in forward_impl/backward_impl through forward_child() and
// backward_child(), which slice the composite's LayerParams and gradient buffers per child and
// keep one Saved record per child in Saved::children (indexed like children()). The subclass may
// keep its own tensors in Saved::tensors.
//
// A split backward (zero-bubble schedules) calls backward twice: input gradient only, then
// weight gradient only. The first pass keeps every child's output gradient in the record
// (Saved::child_output_grads); the second then computes each child's weight gradient from it
// directly, so the two passes together cost one whole backward.
#pragma once

#include <pipeline/nn/layer.hpp>
#include <pipeline/ops/elementwise.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pipeline {

class Composite : public Layer {
 public:
  explicit Composite(std::string name) : Layer(std::move(name)) {}

  std::vector<const Layer*> children() const override {
    std::vector<const Layer*> out;
    for (auto& c : m_children) out.push_back(c.layer.get());
    return out;
  }
  int num_children() const { return static_cast<int>(m_children.size()); }
  const Layer& child(int i) const { return *m_children.at(static_cast<std::size_t>(i)).layer; }
  const std::string& child_local_name(int i) const {
    return m_children.at(static_cast<std::size_t>(i)).local;
  }

  std::vector<ParamSpec> parameters() const override { return m_params; }
  std::vector<ParamSpec> buffers() const override { return m_buffers; }

 protected:
  // Constructs a child of type L named "<this name>.<local>" and returns its index. Call from the
  // subclass constructor only (the parameter lists are fixed afterwards).
  template <typename L, typename... Args>
  int add_child(const std::string& local, Args&&... args) {
    PIPELINE_CHECK_AS(ConfigError, !local.empty(), "composite '{}': empty child name", name());
    for (auto& c : m_children)
      PIPELINE_CHECK_AS(ConfigError, c.local != local, "composite '{}' already has a child '{}'",
                        name(), local);
    Child c;
    c.local = local;
    c.layer = std::make_unique<L>(qualified(local), std::forward<Args>(args)...);
    c.param_begin = m_params.size();
    c.buffer_begin = m_buffers.size();
    for (auto s : c.layer->parameters()) {
      s.name = local + "." + s.name;
      m_params.push_back(std::move(s));
    }
    for (auto s : c.layer->buffers()) {
      s.name = local + "." + s.name;
      m_buffers.push_back(std::move(s));
    }
    c.param_end = m_params.size();
    c.buffer_end = m_buffers.size();
    m_children.push_back(std::move(c));
    return static_cast<int>(m_children.size()) - 1;
  }

  // The child's slice of the composite's parameters (tensor handles, sharing storage).
  LayerParams child_params(const LayerParams& p, int i) const {
    const Child& c = m_children.at(static_cast<std::size_t>(i));
    LayerParams q;
    q.params.assign(p.params.begin() + static_cast<std::ptrdiff_t>(c.param_begin),
                    p.params.begin() + static_cast<std::ptrdiff_t>(c.param_end));
    q.buffers.assign(p.buffers.begin() + static_cast<std::ptrdiff_t>(c.buffer_begin),
                     p.buffers.begin() + static_cast<std::ptrdiff_t>(c.buffer_end));
    return q;
  }
  // The child's slice of the gradient buffers (empty when grads is empty: no weight gradient).
  std::span<Tensor> child_grads(std::span<Tensor> grads, int i) const {
    if (grads.empty()) return {};
    const Child& c = m_children.at(static_cast<std::size_t>(i));
    return grads.subspan(c.param_begin, c.param_end - c.param_begin);
  }

  // Runs child i forward on x, keeping its record in saved.children[i]. Buffers the child
  // replaces (rather than updates in place) are written back into p.
  Tensor forward_child(int i, LayerParams& p, const Tensor& x, Saved& saved,
                       const ForwardContext& ctx) const {
    const Child& c = m_children.at(static_cast<std::size_t>(i));
    if (saved.children.size() != m_children.size()) saved.children.resize(m_children.size());
    LayerParams q = child_params(p, i);
    Tensor y = c.layer->forward(q, x, saved.children[static_cast<std::size_t>(i)], ctx);
    for (std::size_t k = 0; k < q.buffers.size(); ++k) p.buffers[c.buffer_begin + k] = q.buffers[k];
    return y;
  }

  // Runs child i backward. `parts` is what this call needs from the child; the weight part is
  // dropped when the caller passed no gradient buffers.
  Tensor backward_child(int i, const LayerParams& p, const Saved& saved, const Tensor& dy,
                        std::span<Tensor> grads, GradParts parts) const {
    PIPELINE_CHECK(saved.children.size() == m_children.size(),
                   "composite '{}': saved record has {} child records for {} children; was it "
                   "produced by this layer's forward?",
                   name(), saved.children.size(), m_children.size());
    std::span<Tensor> g = child_grads(grads, i);
    if (grads.empty())
      parts = static_cast<GradParts>(static_cast<unsigned>(parts) &
                                     static_cast<unsigned>(GradParts::Input));
    const Child& c = m_children.at(static_cast<std::size_t>(i));
    if (!has_part(parts, GradParts::Weight) && c.param_end > c.param_begin) {
      // An input-gradient pass: keep what the weight pass will need.
      saved.child_output_grads.resize(m_children.size());
      saved.child_output_grads[static_cast<std::size_t>(i)] = dy;
    }
    if (static_cast<unsigned>(parts) == 0) return {};
    return m_children.at(static_cast<std::size_t>(i))
        .layer->backward(child_params(p, i), saved.children[static_cast<std::size_t>(i)], dy, g,
                         parts);
  }

  // The dataflow of the backward (called for every pass but a weight pass after an input pass).
  virtual Tensor composite_backward(const LayerParams& p, const Saved& saved, const Tensor& dy,
                                    std::span<Tensor> grads, GradParts parts) const = 0;

  Tensor backward_impl(const LayerParams& p, const Saved& saved, const Tensor& dy,
                       std::span<Tensor> grads, GradParts parts) const final {
    if (parts != GradParts::Weight || saved.child_output_grads.size() != m_children.size())
      return composite_backward(p, saved, dy, grads, parts);
    for (int i = 0; i < num_children(); ++i) {
      const Tensor& child_dy = saved.child_output_grads[static_cast<std::size_t>(i)];
      if (!child_dy.defined()) continue;  // no weights
      m_children[static_cast<std::size_t>(i)].layer->backward(
          child_params(p, i), saved.children[static_cast<std::size_t>(i)], child_dy,
          child_grads(grads, i), GradParts::Weight);
    }
    saved.child_output_grads.clear();
    return {};
  }

  // Parts for an inner child: its input gradient always (later children need it to reach the
  // earlier ones), its weight gradient when the composite's caller asked for weights.
  static GradParts inner_parts(GradParts outer) {
    return has_part(outer, GradParts::Weight) ? GradParts::Both : GradParts::Input;
  }
  // Parts for a child whose input is the composite's input: input gradient only if requested.
  static GradParts entry_parts(GradParts outer) { return outer; }

  // acc += x element-wise (the residual adds), on their device; both float32 of equal size.
  static void add_in_place(Tensor& acc, const Tensor& x) { ops::add_in_place(acc, x); }

 private:
  struct Child {
    std::string local;
    LayerPtr layer;
    std::size_t param_begin = 0, param_end = 0, buffer_begin = 0, buffer_end = 0;
  };
  std::vector<Child> m_children;
  std::vector<ParamSpec> m_params, m_buffers;
};

}  // namespace pipeline
