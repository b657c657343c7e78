// bench_checkpoint: what a checkpoint costs a training run — its size, how long save() holds up
// training (the copy of the stage's state to memory; serialising, writing and fsync run on a
// background thread), how long the background write takes, and the training step beside them.
//
//   bench_checkpoint [--threads 1] [--steps 20] [--checkpoints 5] [--dir /tmp] [--results FILE]
//
// Each model trains with AdamW (so the optimizer state is saved too) in one process, one stage
// holding every layer: the largest shard a pipeline of that model would write. "write ms" is the
// background write alone (serialise, write, fsync, rename, manifest); "step while writing" is
// the median of the steps that ran while a write was in flight (on a machine with few cores the
// write competes with training for them). The target is a stall under one step.
#include <pipeline/core/threads.hpp>
#include <pipeline/data/loader.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/data/text.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/runtime/checkpoint.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>

#include "bench_util.hpp"

using namespace pipeline;
using Clock = std::chrono::steady_clock;

namespace {

struct Case {
  std::string label;
  ZooModel zoo;
  int batch;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Batch sample_batch(const Case& c, const std::string& text) {
  if (c.zoo.input_dtype == DType::Float32) {
    SyntheticDataset data(c.zoo.sample_shape, static_cast<int>(c.zoo.num_classes), c.batch, 3);
    std::vector<std::int64_t> idx(static_cast<std::size_t>(c.batch));
    std::iota(idx.begin(), idx.end(), 0);
    return data.get(idx);
  }
  TextDataset data(
      text, {.seq_len = c.zoo.sample_shape.dims()[0], .stride = c.zoo.sample_shape.dims()[0]});
  return DataLoader(data, {.batch_size = c.batch}).batch(0, 0);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, steps = 20, checkpoints = 5;
  std::string dir = std::filesystem::temp_directory_path().string();
  std::string text = "/usr/share/games/fortunes/fortunes";
  std::string results;
  CLI::App app{"Checkpoint size, training stall and write time per model"};
  app.add_option("--threads", threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_option("--steps", steps, "steps timed without checkpoints")->check(CLI::Range(3, 100000));
  app.add_option("--checkpoints", checkpoints, "checkpoints timed")->check(CLI::Range(1, 1000));
  app.add_option("--dir", dir, "where the checkpoints are written (and deleted)");
  app.add_option("--text", text, "text for the transformer's batch")->check(CLI::ExistingFile);
  app.add_option("--results", results, "append the table to this file (bench/RESULTS.md)");
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    std::vector<Case> cases;
    cases.push_back({"fashion-cnn b64", make_model("fashion-cnn"), 64});
    ZooOptions lm;
    lm.seq_len = 64;
    lm.dim = 64;
    lm.heads = 4;
    lm.blocks = 2;
    cases.push_back({"transformer-lm d64x2 b16", make_model("transformer-lm", lm), 16});
    lm.dim = 256;
    lm.blocks = 4;
    cases.push_back({"transformer-lm d256x4 b16", make_model("transformer-lm", lm), 16});
    lm.dim = 512;
    lm.blocks = 8;
    lm.heads = 8;
    cases.push_back({"transformer-lm d512x8 b8", make_model("transformer-lm", lm), 8});

    const std::string header = fmt::format(
        "bench_checkpoint --threads {} --steps {} --checkpoints {} ({}, {} cores, load {})\n",
        threads, steps, checkpoints, bench::cpu_name(), std::thread::hardware_concurrency(),
        bench::load_average());
    std::string table = fmt::format("{:<26} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9} {:>11} {:>10}\n",
                                    "model", "shard MB", "step ms", "stall ms", "max stall",
                                    "stall/step", "write ms", "step while", "");
    table += fmt::format("{:<26} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9} {:>11}\n", "", "",
                         "(median)", "(median)", "ms", "(max)", "(median)", "writing ms");
    fmt::print("{}{}", header, table);
    for (const Case& c : cases) {
      const Batch batch = sample_batch(c, text);
      SequentialTrainer trainer(c.zoo.model, c.zoo.model.init(1), std::make_unique<AdamW>(), 1);
      for (int i = 0; i < 3; ++i) trainer.step(batch, 1e-4f);
      std::vector<double> step_s;
      for (int i = 0; i < steps; ++i) {
        const auto t0 = Clock::now();
        trainer.step(batch, 1e-4f);
        step_s.push_back(seconds(t0));
      }
      const std::string where =
          (std::filesystem::path(dir) / fmt::format("bench_checkpoint_{}", ::getpid())).string();
      std::filesystem::remove_all(where);
      std::vector<double> stall_s, write_s, busy_step_s;
      std::uint64_t shard_bytes = 0;
      {
        CheckpointRunInfo info{
            .model = c.zoo.model.name(), .optimizer = "adamw", .seed = 1, .batch_size = c.batch};
        Checkpointer ckpt({where, 0, 2}, info, CheckpointRole::single(c.zoo.model), nullptr);
        for (int k = 1; k <= checkpoints; ++k) {
          // The write alone: save, then wait for it.
          const auto t0 = Clock::now();
          ckpt.save(2 * k, c.zoo.model, trainer.params(), trainer.optimizer());
          stall_s.push_back(ckpt.last_stall_s());
          ckpt.finish();
          write_s.push_back(seconds(t0) - stall_s.back());
          // Training while a write runs.
          ckpt.save(2 * k + 1, c.zoo.model, trainer.params(), trainer.optimizer());
          stall_s.push_back(ckpt.last_stall_s());
          for (int i = 0; i < 3; ++i) {
            const auto s0 = Clock::now();
            trainer.step(batch, 1e-4f);
            busy_step_s.push_back(seconds(s0));
          }
          ckpt.finish();
        }
        const auto latest = find_latest_checkpoint(where);
        for (auto& s : latest->manifest.shards) shard_bytes += s.bytes;
      }
      std::filesystem::remove_all(where);
      const double step = median(step_s), stall = median(stall_s);
      const double max_stall = *std::max_element(stall_s.begin(), stall_s.end());
      const std::string row = fmt::format(
          "{:<26} {:>9.2f} {:>9.2f} {:>9.3f} {:>10.3f} {:>10.3f} {:>9.1f} {:>11.2f}\n", c.label,
          static_cast<double>(shard_bytes) / 1e6, step * 1e3, stall * 1e3, max_stall * 1e3,
          max_stall / step, median(write_s) * 1e3, median(busy_step_s) * 1e3);
      fmt::print("{}", row);
      table += row;
    }
    if (!results.empty() && !bench::append_results(results, header, table)) return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
