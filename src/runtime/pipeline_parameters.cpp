#include <pipeline/runtime/pipeline_parameters.hpp>

#include <pipeline/comm/tag.hpp>
#include <pipeline/core/error.hpp>
#include <pipeline/io/safetensors.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace pipeline {

namespace {

// Every tensor of a stage in the order of the file: each layer's parameters, then its buffers.
template <class Params, class Visit>
void for_each_tensor(Params& params, Visit&& visit) {
  for (auto& layer : params) {
    for (auto& t : layer.params) visit(t);
    for (auto& t : layer.buffers) visit(t);
  }
}

}  // namespace

void save_pipeline_parameters(const std::string& path, const Sequential& model,
                              const PipelineLayout& layout, Communicator& comm,
                              const StageParams& stage_params, Device device, int root) {
  const int rank = comm.rank();
  const std::vector<int> root_stages = layout.stages_of(root);
  const auto on_root = [&](int s) {
    return std::find(root_stages.begin(), root_stages.end(), s) != root_stages.end();
  };
  const auto sender_of = [&](int s) {
    return layout.stage_ranks[static_cast<std::size_t>(s)].front();
  };
  const auto params_of = [&](int s) -> const ModelParams& {
    const ModelParams& p = stage_params(s);
    PIPELINE_CHECK(static_cast<int>(p.size()) == layout.stages[static_cast<std::size_t>(s)].size(),
                   "save_pipeline_parameters: parameters of {} layers given for stage {} of {}",
                   p.size(), s, layout.stages[static_cast<std::size_t>(s)].size());
    return p;
  };
  if (rank != root) {
    for (int s : layout.stages_of(rank)) {
      if (on_root(s) || sender_of(s) != rank) continue;
      int k = 0;
      for_each_tensor(params_of(s),
                      [&](const Tensor& t) { comm.send(t, root, Tag::control(s, k++)); });
    }
    return;
  }
  ModelParams all(static_cast<std::size_t>(model.size()));
  for (int s = 0; s < layout.num_stages(); ++s) {
    const LayerRange r = layout.stages[static_cast<std::size_t>(s)];
    if (on_root(s)) {
      const ModelParams& own = params_of(s);
      for (int i = r.begin; i < r.end; ++i)
        all[static_cast<std::size_t>(i)] = own[static_cast<std::size_t>(i - r.begin)];
      continue;
    }
    for (int i = r.begin; i < r.end; ++i) {
      LayerParams& lp = all[static_cast<std::size_t>(i)];
      for (const auto& spec : model.layer(i).parameters())
        lp.params.push_back(Tensor::empty(spec.shape, spec.dtype, device));
      for (const auto& spec : model.layer(i).buffers())
        lp.buffers.push_back(Tensor::empty(spec.shape, spec.dtype, device));
    }
    ModelParams received(all.begin() + r.begin, all.begin() + r.end);  // shares the tensors
    int k = 0;
    for_each_tensor(received, [&](Tensor& t) { comm.recv(t, sender_of(s), Tag::control(s, k++)); });
  }
  save_parameters(path, model, all, {0, model.size()});
}

}  // namespace pipeline
