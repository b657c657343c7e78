#include <pipeline/runtime/pipeline_parameters.hpp>

#include <pipeline/comm/tag.hpp>
#include <pipeline/core/error.hpp>
#include <pipeline/io/safetensors.hpp>

#include <cstddef>

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
                              const ModelParams& stage_params, Device device, int root) {
  const int rank = comm.rank();
  const int stage = layout.stage_of(rank);
  PIPELINE_CHECK_AS(ConfigError, layout.stages_of(rank).size() == 1,
                    "saving the parameters of a rank that runs {} stages (an interleaved plan) is "
                    "not supported",
                    layout.stages_of(rank).size());
  PIPELINE_CHECK(static_cast<int>(stage_params.size()) ==
                     layout.stages[static_cast<std::size_t>(stage)].size(),
                 "save_pipeline_parameters: parameters of {} layers given for stage {} of {}",
                 stage_params.size(), stage, layout.stages[static_cast<std::size_t>(stage)].size());
  const int root_stage = layout.stage_of(root);
  auto sender_of = [&](int s) { return layout.stage_ranks[static_cast<std::size_t>(s)].front(); };
  if (rank != root) {
    if (stage == root_stage || sender_of(stage) != rank) return;
    int k = 0;
    for_each_tensor(stage_params,
                    [&](const Tensor& t) { comm.send(t, root, Tag::control(stage, k++)); });
    return;
  }
  ModelParams all(static_cast<std::size_t>(model.size()));
  for (int s = 0; s < layout.num_stages(); ++s) {
    const LayerRange r = layout.stages[static_cast<std::size_t>(s)];
    if (s == root_stage) {
      for (int i = r.begin; i < r.end; ++i)
        all[static_cast<std::size_t>(i)] = stage_params[static_cast<std::size_t>(i - r.begin)];
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
