// The trained parameters of a pipelined run as one file.
#pragma once

#include <pipeline/comm/communicator.hpp>
#include <pipeline/core/device.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/runtime/stage_executor.hpp>

#include <string>

namespace pipeline {

// Writes the whole model's parameters and buffers to `path` on rank `root`: the file
// save_parameters writes for a single-process run (PyTorch names, every layer), so that
// load_parameters takes it under any plan or none. Called on every rank of the layout with the
// parameters of the rank's stage (one stage per rank; replicas hold the same weights, so each
// stage's first replica sends them). The root receives on `device`, where its own stage lives.
void save_pipeline_parameters(const std::string& path, const Sequential& model,
                              const PipelineLayout& layout, Communicator& comm,
                              const ModelParams& stage_params, Device device, int root = 0);

}  // namespace pipeline
