// bench_train: single-process training throughput of a zoo model on random Fashion-MNIST-shaped
// data, the same steps bench/torch_train.py times in PyTorch (SGD with momentum 0.9, batch 64).
//
//   bench_train [--model fashion-cnn] [--batch 64] [--threads 2] [--steps 50] [--warmup 5] [--json]
//
// Prints samples/s and the fraction of the machine's fp32 peak this reaches, counting training
// FLOPs as 3 × forward FLOPs (forward, input gradient, weight gradient).
#include <pipeline/core/rng.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <numeric>

using namespace pipeline;

int main(int argc, char** argv) {
  std::string model = "fashion-cnn";
  int batch = 64, threads = 2, steps = 50, warmup = 5;
  double peak_gflops = 0;
  bool json = false;
  CLI::App app{"Training throughput of a zoo model in one process"};
  app.add_option("--model", model);
  app.add_option("--batch", batch)->check(CLI::Range(1, 65536));
  app.add_option("--threads", threads)->check(CLI::Range(1, 1024));
  app.add_option("--steps", steps)->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup)->check(CLI::Range(0, 1000000));
  app.add_option("--peak-gflops", peak_gflops,
                 "fp32 peak of the machine (for the fraction column)");
  app.add_flag("--json", json, "print one JSON line instead of the table");
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    ZooModel z = make_model(model);
    Batch b;
    if (z.input_dtype == DType::Int32) {
      // A language model: random token ids in, the next tokens (any ids) as labels.
      Rng rng(3, "bench_train.tokens");
      auto tokens = [&] {
        Tensor t = Tensor::empty(z.input_shape(batch), DType::Int32);
        for (std::int64_t i = 0; i < t.numel(); ++i)
          t.data<std::int32_t>()[i] =
              static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(z.num_classes)));
        return t;
      };
      b = {tokens(), tokens()};
    } else {
      SyntheticDataset data(z.sample_shape, static_cast<int>(z.num_classes), batch, 3);
      std::vector<std::int64_t> idx(static_cast<std::size_t>(batch));
      std::iota(idx.begin(), idx.end(), 0);
      b = data.get(idx);
    }
    SequentialTrainer trainer(z.model, z.model.init(1),
                              std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f}), 1);
    for (int i = 0; i < warmup; ++i) trainer.step(b, 0.01f);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) trainer.step(b, 0.01f);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double sps = steps * static_cast<double>(batch) / dt;
    double fwd_flops = 0;
    std::vector<Shape> shapes = z.model.shapes(z.input_shape(1), z.model.all());
    for (int i = 0; i < z.model.size(); ++i) fwd_flops += z.model.layer(i).flops(shapes[i]);
    double gflops = 3.0 * fwd_flops * sps / 1e9;
    if (json) {
      fmt::print(
          "{{\"model\": \"{}\", \"batch\": {}, \"threads\": {}, \"samples_per_s\": {:.2f}, "
          "\"gflops\": {:.2f}}}\n",
          model, batch, threads, sps, gflops);
    } else {
      fmt::print("| model | batch | threads | samples/s | training GFLOP/s | of peak |\n");
      fmt::print("|---|---|---|---|---|---|\n");
      fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {} |\n", model, batch, threads, sps, gflops,
                 peak_gflops > 0 ? fmt::format("{:.1f}%", 100 * gflops / peak_gflops) : "-");
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
