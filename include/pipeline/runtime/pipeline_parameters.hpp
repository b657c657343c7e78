// The trained parameters of a pipelined run as one file.
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/core/device.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/runtime/stage_executor.hpp>

#include <functional>
#include <string>

namespace pipeline {

// The latest parameters of one of the calling rank's stages (StageExecutor::params(int)).
using StageParams = std::function<const ModelParams&(int stage)>;

// Writes the whole model's parameters and buffers to `path` on rank `root`: the file
// save_parameters writes for a single-process run (PyTorch names, every layer), so that
// load_parameters takes it under any plan or none. Called on every rank of the layout;
// `stage_params(s)` gives the parameters of each stage s the rank runs (one, or several on an
// interleaved plan; replicas hold the same weights, so each stage's first replica sends them).
// The root receives on `device`, where its own stages live.
void save_pipeline_parameters(const std::string& path, const Sequential& model,
                              const PipelineLayout& layout, Communicator& comm,
                              const StageParams& stage_params, Device device, int root = 0);

}  // namespace pipeline
