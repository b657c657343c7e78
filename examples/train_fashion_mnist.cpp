// train_fashion_mnist: trains a zoo model on Fashion-MNIST and prints its test accuracy.
//
//   train_fashion_mnist [--model fashion-cnn] [--epochs 2] [--batch 64] [--lr 0.01] ...
//
// Logs go to stderr; stdout has the progress (a bar on a terminal, plain lines otherwise), one
// line per evaluation and, last, "test accuracy: 0.9123".
#include <pipeline/core/log.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/fashion_mnist.hpp>
#include <pipeline/io/safetensors.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/optim/lr_schedule.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/metrics.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "common/progress.hpp"

namespace {

using namespace pipeline;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = "fashion-cnn";
  int epochs = 2;
  long steps = 0;  // 0: whole epochs
  int batch = 64;
  float lr = 0.01f;
  std::string lr_schedule = "constant";
  std::string optimizer = "sgd";
  float momentum = 0.9f;
  float weight_decay = 0.f;
  float clip_grad = 0.f;
  std::uint64_t seed = 1;
  bool no_shuffle = false;
  int threads = 0;
  std::string data = FashionMnist::kDefaultDir;
  std::string load, save, metrics;
  int eval_batch = 1000;
};

std::unique_ptr<Optimizer> make_optimizer(const Options& o) {
  if (o.optimizer == "sgd")
    return std::make_unique<Sgd>(SgdOptions{.momentum = o.momentum, .weight_decay = o.weight_decay});
  return std::make_unique<AdamW>(AdamWOptions{.weight_decay = o.weight_decay});
}

int run(const Options& o) {
  set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  ZooModel zoo = make_model(o.model);
  PIPELINE_CHECK_AS(ConfigError, zoo.sample_shape == Shape({1, 28, 28}),
                    "model '{}' takes inputs of shape {}, not Fashion-MNIST's [1, 28, 28]: use "
                    "mlp or fashion-cnn",
                    o.model, zoo.sample_shape);
  FashionMnist train(o.data, Split::Train), test(o.data, Split::Test);
  log_info("{}: {} train / {} test samples, {} threads", o.model, train.size(), test.size(),
           num_threads());

  ModelParams params = zoo.model.init(o.seed);
  if (!o.load.empty()) {
    load_parameters(o.load, zoo.model, params, zoo.model.all());
    log_info("loaded parameters from {}", o.load);
  }
  SequentialTrainer trainer(zoo.model, std::move(params), make_optimizer(o), o.seed, o.clip_grad);
  DataLoader loader(train, {.batch_size = o.batch, .shuffle = !o.no_shuffle, .drop_last = true,
                            .seed = o.seed});
  const long per_epoch = static_cast<long>(loader.num_batches());
  const long total = o.steps > 0 ? o.steps : per_epoch * o.epochs;
  const LrSchedule schedule = LrSchedule::parse(o.lr_schedule, o.lr, total);
  MetricsWriter metrics(o.metrics);
  examples::Progress progress("train", total);

  long step = 0;
  double accuracy = 0;
  bool evaluated = false;
  const auto start = Clock::now();
  double busy_s = 0;
  for (int epoch = 0; step < total; ++epoch) {
    for (const Batch& batch : loader.epoch(epoch)) {
      if (step >= total) break;
      auto t0 = Clock::now();
      StepResult r = trainer.step(batch, schedule.lr_at(step));
      double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      busy_s += dt;
      ++step;
      double sps = static_cast<double>(batch.size()) / dt;
      metrics.write({{"step", step}, {"loss", r.loss}, {"samples_per_s", sps}});
      progress.update(step, r.loss, sps);
    }
    progress.finish();
    bool epoch_done = step % per_epoch == 0 || step >= total;
    if (epoch_done) {
      EvalResult e = trainer.evaluate(test, o.eval_batch);
      accuracy = e.accuracy;
      evaluated = true;
      metrics.write({{"epoch", epoch + 1}, {"test_accuracy", e.accuracy}, {"test_loss", e.loss}});
      fmt::print("epoch {}: test loss {:.4f} test accuracy {:.4f}\n", epoch + 1, e.loss, e.accuracy);
    }
  }
  if (!evaluated) accuracy = trainer.evaluate(test, o.eval_batch).accuracy;
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  log_info("{} steps in {:.1f} s ({:.1f} samples/s while training)", step, wall,
           step * o.batch / std::max(busy_s, 1e-9));
  if (!o.save.empty()) {
    save_parameters(o.save, zoo.model, trainer.params(), zoo.model.all());
    log_info("saved parameters to {}", o.save);
  }
  fmt::print("test accuracy: {:.4f}\n", accuracy);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train a model on Fashion-MNIST and report its test accuracy"};
  const CLI::Validator positive(
      [](std::string& s) {
        double v = 0;
        try {
          v = std::stod(s);
        } catch (...) {
        }
        return v > 0 && std::isfinite(v) ? std::string() : "must be a positive number, got " + s;
      },
      "POSITIVE");
  app.add_option("--model", o.model, "zoo model: fashion-cnn or mlp")->capture_default_str();
  app.add_option("--epochs", o.epochs, "passes over the training set")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--steps", o.steps, "stop after this many optimizer steps (0: whole epochs)")
      ->check(CLI::Range(0L, 1L << 40));
  app.add_option("--batch", o.batch, "minibatch size")->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate")->check(positive)->capture_default_str();
  app.add_option("--lr-schedule", o.lr_schedule,
                 "constant, step:<every>:<gamma>, cosine[:<steps>[:<min>]], warmup:<n>+<schedule>")
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(CLI::Range(0.f, 0.999f))->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "weight decay")->check(CLI::Range(0.f, 1.f));
  app.add_option("--clip-grad", o.clip_grad, "clip the global gradient norm to this (0: off)")
      ->check(CLI::Range(0.f, 1e9f));
  app.add_option("--seed", o.seed, "seed of initial weights, shuffling and dropout")->capture_default_str();
  app.add_flag("--no-shuffle", o.no_shuffle, "visit the training set in file order");
  app.add_option("--threads", o.threads, "CPU threads (default: cores / ranks on this host)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--data", o.data, "directory with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--load", o.load, "initial parameters (safetensors)");
  app.add_option("--save", o.save, "write the trained parameters here (safetensors)");
  app.add_option("--metrics", o.metrics, "write JSON-lines metrics here");
  app.add_option("--eval-batch", o.eval_batch, "batch size for evaluation")->check(CLI::Range(1, 65536));
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
