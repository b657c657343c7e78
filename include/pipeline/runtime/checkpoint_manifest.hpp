// The manifest of a training checkpoint: what the checkpoint holds and how to verify it.
//
// A checkpoint is a directory `<dir>/step-<step, 9 digits>/` with one safetensors shard per
// pipeline stage (`stage-<s>.safetensors`, written by the stage's first replica) and this
// manifest, `manifest.json`, written last: a checkpoint exists only once its manifest does, so a
// job that dies while writing leaves a directory without one, which resume skips. `<dir>/.lock`
// is the lock a job holds while it writes there (CheckpointDirLock).
//
//   {"format": "pipeline.checkpoint/1", "step": 200, "model": "fashion-cnn",
//    "architecture": {"channels": 1, "image_size": 28, "num_classes": 10, "width": 1},
//    "world_size": 4, "schedule": "1f1b-flush", "optimizer": "adamw", "seed": 1,
//    "batch_size": 64, "weight_versions": 1, "plan": {...plan.json...} or null,
//    "training": {"learning rate": "cosine:2000:0 (lr 0.1)", "--weight-decay": "0", ...},
//    "shards": [{"file": "stage-0.safetensors", "stage": 0, "layers": [0, 4],
//                "bytes": 13712, "crc32": 3735928559,
//                "tensors": [{"name": "conv1.weight", "dtype": "F32", "shape": [32, 1, 3, 3]},
//                            ...]}]}
//
// `step` counts the optimizer steps (minibatches) done; training resumes with minibatch `step`,
// whose data, dropout masks and learning rate follow from the step, the seed and the options in
// `training` (the data order of epoch e is drawn from (seed, e); masks from (seed, step,
// microbatch)), so nothing else of the random state needs saving. Shards hold tensors under
// layer-qualified names (PyTorch's `conv1.weight`, `bn1.running_mean`; optimizer state as
// `optimizer.conv1.weight.exp_avg`), so a run may resume under another plan: every rank loads the
// tensors of its own layers from whichever shards hold them.
#pragma once

#include <pipeline/core/shape.hpp>
#include <pipeline/nn/architecture.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pipeline {

struct CheckpointTensor {
  std::string name;
  std::string dtype;  // the safetensors spelling: F32, I32, I64, ...
  Shape shape;
};

struct CheckpointShard {
  std::string file;  // relative to the checkpoint directory
  int stage = 0;
  int layer_begin = 0, layer_end = 0;  // [begin, end) of the model's layers
  std::uint64_t bytes = 0;
  std::uint32_t crc32 = 0;  // zlib's CRC-32 of the whole file
  std::vector<CheckpointTensor> tensors;

  bool holds_layer(int layer) const { return layer_begin <= layer && layer < layer_end; }
};

struct CheckpointManifest {
  static constexpr const char* kFormat = "pipeline.checkpoint/1";

  std::int64_t step = 0;
  std::string model;
  // ZooModel::architecture (empty in manifests written before it was recorded).
  Architecture architecture;
  int world_size = 1;
  std::string schedule;   // "sequential" for a single-process run
  std::string optimizer;  // Optimizer::kind()
  std::uint64_t seed = 0;
  std::int64_t batch_size = 0;
  int weight_versions = 1;  // weight versions each stage held (always 1: checkpoints are drained)
  nlohmann::json plan;      // the run's plan.json; null for a single-process run
  // The options that set each step's learning rate, update and data order, by flag (or what
  // they set: {"learning rate": "cosine:2000:0 (lr 0.1)", "--weight-decay": "0", ...}, the
  // schedule as resolved for the run's length); a resume that differs is warned. Empty in
  // manifests written before it was recorded.
  std::map<std::string, std::string> training;
  std::vector<CheckpointShard> shards;
};

nlohmann::ordered_json manifest_to_json(const CheckpointManifest& manifest);

// Parses and validates a manifest (format, field types, shard layer ranges that cover the model's
// layers once each). `origin` names the file in errors. ConfigError on anything malformed.
CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& origin);

}  // namespace pipeline
