// Flattening a stage's parameters and gradients into the flat lists the optimizers and the
// gradient clipping take. The lists hold Tensor handles that share storage with the model's
// tensors, so updating them updates the model. The order is layer by layer, then the layer's
// parameters() order; parameter_names() gives the matching `<layer>.<param>` names.
#pragma once

#include <pipeline/nn/sequential.hpp>

#include <string>
#include <vector>

namespace pipeline {

// Trainable tensors of every layer (buffers such as running statistics are not included).
inline std::vector<Tensor> flatten_params(const ModelParams& params) {
  std::vector<Tensor> out;
  for (auto& layer : params)
    for (auto& t : layer.params) out.push_back(t);
  return out;
}

inline std::vector<Tensor> flatten_grads(const ModelGrads& grads) {
  std::vector<Tensor> out;
  for (auto& layer : grads)
    for (auto& t : layer) out.push_back(t);
  return out;
}

// `<layer>.<param>` for every trainable tensor of layers [r.begin, r.end), in flattened order.
inline std::vector<std::string> parameter_names(const Sequential& model, LayerRange r) {
  std::vector<std::string> out;
  for (int i = r.begin; i < r.end; ++i)
    for (auto& s : model.layer(i).parameters()) out.push_back(model.layer(i).name() + "." + s.name);
  return out;
}

inline std::vector<Shape> parameter_shapes(const Sequential& model, LayerRange r) {
  std::vector<Shape> out;
  for (int i = r.begin; i < r.end; ++i)
    for (auto& s : model.layer(i).parameters()) out.push_back(s.shape);
  return out;
}

}  // namespace pipeline
