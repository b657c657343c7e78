// train_fashion_mnist: trains a zoo model on Fashion-MNIST and prints its test accuracy.
//
//   train_fashion_mnist [--model fashion-cnn] [--epochs 2] [--batch 64] [--lr 0.01] ...
//   mpirun -np 4 train_fashion_mnist --plan plan.json --schedule 1f1b-stash --epochs 2
//
// With --plan, or under mpirun with more than one rank, the model is trained as a pipeline: one
// rank per stage replica, executing the schedule (--schedule or --schedule-csv) with the stage
// executor. Without --plan the job's rank 0 profiles the model, partitions it for the job's size
// and prints the plan first. Any error ends every rank of the job (the failing rank logs it with
// its rank and aborts the job through the communicator), never a hang.
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
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/runtime/metrics.hpp>
#include <pipeline/runtime/pipeline_parameters.hpp>
#include <pipeline/runtime/pipeline_setup.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>

#include "common/checkpointing.hpp"
#include "common/feeds.hpp"
#include "common/memory_report.hpp"
#include "common/pipeline_flags.hpp"
#include "common/progress.hpp"
#include "common/run_main.hpp"
#include "common/validators.hpp"

namespace {

using namespace pipeline;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = "fashion-cnn";
  // Defaults reach >= 0.91 test accuracy with fashion-cnn (bench/RESULTS.md).
  int epochs = 3;
  long steps = 0;  // 0: whole epochs
  int batch = 64;
  float lr = 2e-3f;
  std::string lr_schedule = "cosine";
  std::string optimizer = "adamw";
  float momentum = 0.9f;
  float weight_decay = 0.f;
  float clip_grad = 0.f;
  std::uint64_t seed = 1;
  bool no_shuffle = false;
  int threads = 0;
  std::string data = FashionMnist::kDefaultDir;
  std::string load, save, metrics;
  int eval_batch = 1000;
  examples::PipelineFlags pipeline;
  examples::CheckpointFlags checkpoints;
};

std::unique_ptr<Optimizer> make_optimizer(const Options& o) {
  if (o.optimizer == "sgd")
    return std::make_unique<Sgd>(
        SgdOptions{.momentum = o.momentum, .weight_decay = o.weight_decay});
  return std::make_unique<AdamW>(AdamWOptions{.weight_decay = o.weight_decay});
}

// What a checkpoint records of the options that set each step's learning rate, update and data
// (a resume that gives them otherwise is warned).
std::map<std::string, std::string> training_options(const Options& o, const LrSchedule& lr,
                                                    const FashionMnist& train) {
  std::map<std::string, std::string> t{
      {"learning rate", lr.str()},
      {"--weight-decay", fmt::format("{}", o.weight_decay)},
      {"--clip-grad", fmt::format("{}", o.clip_grad)},
      {"--no-shuffle", o.no_shuffle ? "given" : "not given"},
      {"training data", examples::data_fingerprint(train.files())}};
  if (o.optimizer == "sgd") t.emplace("--momentum", fmt::format("{}", o.momentum));
  return t;
}

// The --model, checked to take Fashion-MNIST's images.
ZooModel image_model(const Options& o) {
  ZooModel zoo = make_model(o.model);
  PIPELINE_CHECK_AS(ConfigError, zoo.sample_shape == Shape({1, 28, 28}),
                    "model '{}' takes inputs of shape {}, not Fashion-MNIST's [1, 28, 28]: use "
                    "mlp or fashion-cnn (a checkpoint or plan of '{}' is for the program that "
                    "trains it)",
                    o.model, zoo.sample_shape, o.model);
  return zoo;
}

DataLoader train_loader(const Options& o, const FashionMnist& train) {
  return DataLoader(
      train, {.batch_size = o.batch, .shuffle = !o.no_shuffle, .drop_last = true, .seed = o.seed});
}

int run(const Options& o) {
  set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  ZooModel zoo = image_model(o);
  FashionMnist train(o.data, Split::Train), test(o.data, Split::Test);
  log_info("{}: {} train / {} test samples, {} threads", o.model, train.size(), test.size(),
           num_threads());

  ModelParams params = zoo.model.init(o.seed);
  if (!o.load.empty()) {
    load_parameters(o.load, zoo.model, params, zoo.model.all());
    log_info("loaded parameters from {}", o.load);
  }
  const Device device = parse_device(o.pipeline.device);
  if (!device.is_cpu()) log_info("training on {}", device.str());
  SequentialTrainer trainer(zoo.model, to_device(params, device), make_optimizer(o), o.seed,
                            o.clip_grad);
  if (o.pipeline.cuda_graphs) {
    trainer.use_cuda_graphs();
    log_info("CUDA graphs: each batch shape's second step is captured, later ones replay it");
  }
  const DataLoader loader = train_loader(o, train);
  const long per_epoch = static_cast<long>(loader.num_batches());
  const long total = o.steps > 0 ? o.steps : per_epoch * o.epochs;
  const LrSchedule schedule = LrSchedule::parse(o.lr_schedule, o.lr, total);
  const CheckpointRunInfo info =
      examples::checkpoint_run_info(zoo, trainer.optimizer(), o.seed, o.batch, 1, o.pipeline,
                                    nullptr, training_options(o, schedule, train));
  examples::Checkpointing ck = examples::start_checkpointing(o.checkpoints, info, zoo.model,
                                                             trainer.params(), trainer.optimizer());
  const std::unique_ptr<Checkpointer> checkpoints = std::move(ck.writer);
  const std::int64_t start = ck.start;
  MetricsWriter metrics(o.metrics, start);
  examples::Progress progress("train", total, start);

  double accuracy = 0;
  bool evaluated = false;
  const auto t0 = Clock::now();
  double busy_s = 0;
  auto evaluate = [&](std::int64_t epoch) {
    progress.finish();
    EvalResult e = trainer.evaluate(test, o.eval_batch);
    accuracy = e.accuracy;
    evaluated = true;
    metrics.write({{"epoch", epoch + 1}, {"test_accuracy", e.accuracy}, {"test_loss", e.loss}});
    fmt::print("epoch {}: test loss {:.4f} test accuracy {:.4f}\n", epoch + 1, e.loss, e.accuracy);
  };
  const examples::RunProgress done = examples::train_single(
      trainer, zoo.model, loader, schedule, start, total, checkpoints.get(),
      [&](std::int64_t step, const StepResult& r, double dt) {
        busy_s += dt;
        const double sps = static_cast<double>(o.batch) / dt;
        metrics.write({{"step", step}, {"loss", r.loss}, {"samples_per_s", sps}});
        progress.update(step, r.loss, sps);
      },
      evaluate);
  progress.finish();
  if (done.preempted) {
    examples::announce_preemption(done, preemption_signal());
    return examples::kPreemptedExitStatus;
  }
  if (!evaluated) accuracy = trainer.evaluate(test, o.eval_batch).accuracy;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  log_info("{} steps in {:.1f} s ({:.1f} samples/s while training)", done.position - start, wall,
           static_cast<double>((done.position - start) * o.batch) / std::max(busy_s, 1e-9));
  examples::report_checkpoints(checkpoints.get(), done);
  if (!o.save.empty()) {
    save_parameters(o.save, zoo.model, trainer.params(), zoo.model.all());
    log_info("saved parameters to {}", o.save);
  }
  fmt::print("test accuracy: {:.4f}\n", accuracy);
  return 0;
}

int run_pipelined(const Options& o, Communicator& comm, Device device) {
  set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  ZooModel zoo = image_model(o);

  std::optional<Profile> profile;  // the plan's, for the simulated memory at the end
  const Plan plan =
      examples::plan_for_job(o.pipeline, zoo, comm, o.batch, *make_optimizer(o), &profile);
  if (comm.rank() == 0) fmt::print("{}\n", examples::describe_plan(plan));
  const PipelineLayout layout = PipelineLayout::from_plan(plan, zoo.model);
  // Only ranks of the first stage feed images; the others read the labels (the last stage's
  // loss, and every rank's sample count).
  const std::vector<int> mine = layout.stages_of(comm.rank());
  const auto contents = !mine.empty() && mine.front() != 0 ? FashionMnist::Contents::Labels
                                                           : FashionMnist::Contents::Everything;
  FashionMnist train(o.data, Split::Train, contents), test(o.data, Split::Test, contents);
  const ScheduleRequest req = examples::schedule_request(o.pipeline, plan, layout, o.batch);

  const DataLoader loader = train_loader(o, train);
  const long per_epoch = static_cast<long>(loader.num_batches());
  const long total = o.steps > 0 ? o.steps : per_epoch * o.epochs;

  StageExecutor ex(
      zoo.model, zoo.sample_shape, zoo.input_dtype, layout, comm, make_optimizer(o),
      examples::with_injected_slowdown(
          examples::executor_options(o.pipeline, plan, o.seed, o.clip_grad, device), comm));
  if (!o.load.empty())
    ex.for_each_stage([&](int) { load_parameters(o.load, zoo.model, ex.params(), ex.layers()); });
  const LrSchedule lr = LrSchedule::parse(o.lr_schedule, o.lr, total);
  const CheckpointRunInfo info =
      examples::checkpoint_run_info(zoo, ex.optimizer(), o.seed, o.batch, comm.size(), o.pipeline,
                                    &plan, training_options(o, lr, train));
  examples::Checkpointing ck = examples::start_checkpointing(o.checkpoints, info, ex, comm);
  const std::unique_ptr<Checkpointer> checkpoints = std::move(ck.writer);
  const std::int64_t start = ck.start;
  if (comm.rank() == 0) {
    log_info(
        "{}: {} stages on {} ranks, schedule {} ({} microbatch(es) per minibatch of {}), {} "
        "threads per rank",
        o.model, layout.num_stages(), comm.size(), info.schedule, req.microbatches, o.batch,
        num_threads());
    if (!o.pipeline.plan.empty())
      examples::warn_where_plan_differs(plan, req, o.batch, ex.optimizer(), device);
  }

  const MinibatchFeed feed = examples::training_feed(loader);
  const DataLoader test_loader(test, {.batch_size = o.eval_batch, .shuffle = false});
  const MinibatchFeed test_feed = examples::evaluation_feed(test_loader);

  MetricsWriter metrics(ex.is_loss_rank() ? o.metrics : std::string(), start);
  examples::Progress progress("train", total, start);
  const bool reporter = ex.is_loss_rank();

  double accuracy = 0, train_s = 0;
  examples::PipelinedLoop loop;
  loop.request = &req;
  loop.layout = &layout;
  loop.feed = &feed;
  loop.lr = &lr;
  loop.per_epoch = per_epoch;
  loop.total = total;
  loop.checkpoints = checkpoints.get();
  loop.rebalance_every = examples::rebalance_segment(o.pipeline, layout, comm.rank());
  loop.on_minibatch = [&](const MinibatchStats& st, double sps) {
    metrics.write({{"step", st.minibatch + 1}, {"loss", st.loss}, {"samples_per_s", sps}});
    progress.update(static_cast<long>(st.minibatch + 1), st.loss, sps);
  };
  loop.on_epoch_end = [&](std::int64_t epoch, const TrainResult& r) {
    if (reporter) progress.finish();
    StageExecutor::Eval e = ex.evaluate(test_feed, test_loader.num_batches());
    accuracy = e.accuracy;
    // (A run resumed at its end trains nothing: the records of the run it continues stand.)
    if (r.count > 0)
      metrics.write({{"epoch", epoch + 1},
                     {"test_accuracy", e.accuracy},
                     {"test_loss", e.loss},
                     {"samples_per_s", static_cast<double>(r.count) / std::max(r.seconds, 1e-9)}});
    if (reporter)
      fmt::print("epoch {}: test loss {:.4f} test accuracy {:.4f}\n", epoch + 1, e.loss,
                 e.accuracy);
  };
  std::optional<Schedule> schedule;
  const examples::RunProgress done =
      examples::train_pipelined(ex, comm, loop, start, schedule, train_s);
  if (reporter) progress.finish();
  if (done.preempted) {
    if (comm.rank() == checkpoints->coordinator())
      examples::announce_preemption(done, preemption_signal());
    return examples::kPreemptedExitStatus;
  }
  const std::int64_t samples = done.trained * o.batch;
  if (reporter)
    log_info("{} steps in {:.1f} s of training: {:.1f} samples/s through the pipeline",
             done.trained, train_s, static_cast<double>(samples) / std::max(train_s, 1e-9));
  examples::report_checkpoints(checkpoints.get(), done);
  if (!o.save.empty()) {
    save_pipeline_parameters(
        o.save, zoo.model, layout, comm, [&](int s) -> const ModelParams& { return ex.params(s); },
        device);
    if (comm.rank() == 0)
      log_info("saved the parameters of all {} stages to {}", layout.num_stages(), o.save);
  }
  if (schedule) examples::write_trace_if_asked(o.pipeline, comm, ex, *schedule);
  if (done.trained > 0)  // (same on every rank)
    examples::report_peak_memory(ex, comm, plan, o.pipeline, profile, schedule, o.batch, metrics,
                                 reporter);
  comm.barrier();
  if (reporter) fmt::print("test accuracy: {:.4f}\n", accuracy);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train a model on Fashion-MNIST and report its test accuracy"};
  const CLI::Validator positive = examples::positive_number();
  app.add_option("--model", o.model, "zoo model: fashion-cnn or mlp")->capture_default_str();
  app.add_option("--epochs", o.epochs, "passes over the training set")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "stop after this many optimizer steps (0: whole epochs)")
      ->check(CLI::Range(0L, 1L << 40));
  app.add_option("--batch", o.batch, "minibatch size")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate")->check(positive)->capture_default_str();
  app.add_option("--lr-schedule", o.lr_schedule,
                 "constant, step:<every>:<gamma>, cosine[:<steps>[:<min>]], warmup:<n>+<schedule>")
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")
      ->check(CLI::Range(0.f, 0.999f))
      ->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "weight decay")->check(CLI::Range(0.f, 1.f));
  app.add_option("--clip-grad", o.clip_grad, "clip the global gradient norm to this (0: off)")
      ->check(CLI::Range(0.f, 1e9f));
  app.add_option("--seed", o.seed, "seed of initial weights, shuffling and dropout")
      ->check(examples::non_negative_number())
      ->capture_default_str();
  app.add_flag("--no-shuffle", o.no_shuffle, "visit the training set in file order");
  app.add_option("--threads", o.threads, "CPU threads (default: cores / ranks on this host)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--data", o.data, "directory with the Fashion-MNIST IDX files")
      ->capture_default_str();
  app.add_option("--load", o.load, "initial parameters (safetensors)")
      ->check(examples::non_empty_path());
  app.add_option("--save", o.save, "write the trained parameters here (safetensors)")
      ->check(examples::file_to_write());
  app.add_option("--metrics", o.metrics, "write JSON-lines metrics here")
      ->check(examples::non_empty_path());
  app.add_option("--eval-batch", o.eval_batch, "batch size for evaluation")
      ->check(CLI::Range(1, 65536));
  examples::add_pipeline_flags(app, o.pipeline);
  examples::add_checkpoint_flags(app, o.checkpoints);
  return examples::run_main(
      argc, argv, app, o.pipeline, [&] { return run(o); },
      [&](Communicator& comm, Device device) { return run_pipelined(o, comm, device); });
}
