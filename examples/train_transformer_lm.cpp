// train_transformer_lm: trains the zoo's byte-level transformer-lm on a text file and reports
// the loss per byte and the perplexity on a held-out tenth of the file.
//
//   train_transformer_lm [--text /usr/share/games/fortunes/fortunes] [--steps 300] ...
//   mpirun -np 2 train_transformer_lm --plan plan.json --schedule 1f1b-flush --microbatches 4
//
// One process: SequentialTrainer. With --plan, or under mpirun with more than one rank: a
// pipeline of the plan's stages (without --plan rank 0 profiles and partitions the model for the
// job). The flags are the same either way. Logs go to stderr; stdout ends with
// "validation loss: 2.1234 perplexity: 8.36".
#include <pipeline/core/log.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/loader.hpp>
#include <pipeline/data/text.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/optim/lr_schedule.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/runtime/metrics.hpp>
#include <pipeline/runtime/pipeline_setup.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>

#include "common/checkpointing.hpp"
#include "common/feeds.hpp"
#include "common/memory_report.hpp"
#include "common/pipeline_flags.hpp"
#include "common/run_main.hpp"

namespace {

using namespace pipeline;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string text = "/usr/share/games/fortunes/fortunes";
  long steps = 300;
  int batch = 16;
  float lr = 3e-3f;
  std::string lr_schedule = "warmup:20+cosine";
  bool lr_schedule_given = false;  // the default warms up for fewer steps on runs of 20 or fewer
  float weight_decay = 0.01f;
  float clip_grad = 1.f;
  bool clip_grad_given = false;
  std::uint64_t seed = 1;
  int threads = 0;
  std::int64_t seq_len = 64, dim = 64, heads = 4, blocks = 2;
  std::string metrics;
  examples::PipelineFlags pipeline;
  examples::CheckpointFlags checkpoints;
};

// The schedule asked for; by default 20 warm-up steps, or half the run when it is no longer than
// that (a cosine decay needs steps after the warm-up).
std::string lr_schedule(const Options& o, long steps) {
  if (o.lr_schedule_given || steps > 20) return o.lr_schedule;
  return steps >= 2 ? fmt::format("warmup:{}+cosine", steps / 2) : std::string("cosine");
}

// What a checkpoint records of the options that set each step's learning rate and update, and of
// its data (a resume that gives them otherwise is warned); `clip` is the norm the run clips to
// (0: off).
std::map<std::string, std::string> training_options(const Options& o, const LrSchedule& lr,
                                                    float clip) {
  return {{"learning rate", lr.str()},
          {"--weight-decay", fmt::format("{}", o.weight_decay)},
          {"--clip-grad", fmt::format("{}", clip)},
          {"training data", examples::data_fingerprint({o.text})}};
}

ZooModel model_for(const Options& o) {
  ZooOptions z;
  z.seq_len = o.seq_len;
  z.dim = o.dim;
  z.heads = o.heads;
  z.blocks = o.blocks;
  return make_model("transformer-lm", z);
}

std::unique_ptr<Optimizer> make_optimizer(const Options& o) {
  return std::make_unique<AdamW>(AdamWOptions{.weight_decay = o.weight_decay});
}

// The training text, and its last tenth held out for validation.
TextDataset train_text(const Options& o) {
  return TextDataset(o.text, {.seq_len = o.seq_len, .stride = o.seq_len / 2, .end = 0.9});
}
TextDataset validation_text(const Options& o) {
  return TextDataset(o.text, {.seq_len = o.seq_len, .stride = o.seq_len, .begin = 0.9});
}

DataLoader train_loader(const Options& o, const TextDataset& train) {
  return DataLoader(train,
                    {.batch_size = o.batch, .shuffle = true, .drop_last = true, .seed = o.seed});
}

void report(double loss_per_byte) {
  fmt::print("validation loss: {:.4f} perplexity: {:.2f}\n", loss_per_byte,
             std::exp(loss_per_byte));
}

int run_single(const Options& o) {
  set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  ZooModel zoo = model_for(o);
  const TextDataset train = train_text(o), valid = validation_text(o);
  const Device device = parse_device(o.pipeline.device);
  if (!device.is_cpu()) log_info("training on {}", device.str());
  SequentialTrainer trainer(zoo.model, to_device(zoo.model.init(o.seed), device),
                            make_optimizer(o), o.seed, o.clip_grad);
  if (o.pipeline.cuda_graphs) {
    trainer.use_cuda_graphs();
    log_info("CUDA graphs: each batch shape's second step is captured, later ones replay it");
  }
  const LrSchedule lr = LrSchedule::parse(lr_schedule(o, o.steps), o.lr, o.steps);
  const CheckpointRunInfo info =
      examples::checkpoint_run_info(zoo, trainer.optimizer(), o.seed, o.batch, 1, o.pipeline,
                                    nullptr, training_options(o, lr, o.clip_grad));
  examples::Checkpointing ck = examples::start_checkpointing(o.checkpoints, info, zoo.model,
                                                             trainer.params(), trainer.optimizer());
  const std::unique_ptr<Checkpointer> checkpoints = std::move(ck.writer);
  const std::int64_t start = ck.start;
  const DataLoader loader = train_loader(o, train);
  MetricsWriter metrics(o.metrics, start);
  const auto t0 = Clock::now();
  const examples::RunProgress done =
      examples::train_single(trainer, zoo.model, loader, lr, start, o.steps, checkpoints.get(),
                             [&](std::int64_t step, const StepResult& r, double) {
                               const double per_byte = r.loss / static_cast<double>(o.seq_len);
                               metrics.write({{"step", step}, {"loss", per_byte}});
                               if (step % 50 == 0 || step == o.steps)
                                 fmt::print("step {}/{} loss {:.4f}\n", step, o.steps, per_byte);
                             });
  if (done.preempted) {
    examples::announce_preemption(done, preemption_signal());
    return examples::kPreemptedExitStatus;
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  log_info("{} steps in {:.1f} s ({:.0f} samples/s)", done.position - start, s,
           static_cast<double>((done.position - start) * o.batch) / s);
  examples::report_checkpoints(checkpoints.get(), done);
  EvalResult e = trainer.evaluate(valid, 64);
  if (done.position > start)  // (a run resumed at its end: the records it continues stand)
    metrics.write({{"validation_loss", e.loss}, {"perplexity", std::exp(e.loss)}});
  report(e.loss);
  return 0;
}

int run_pipelined(const Options& o, Communicator& comm, Device device) {
  set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  ZooModel zoo = model_for(o);
  const TextDataset train = train_text(o), valid = validation_text(o);
  std::optional<Profile> profile;  // the plan's, for the simulated memory at the end
  const Plan plan =
      examples::plan_for_job(o.pipeline, zoo, comm, o.batch, *make_optimizer(o), &profile);
  if (comm.rank() == 0) fmt::print("{}\n", examples::describe_plan(plan));
  const PipelineLayout layout = PipelineLayout::from_plan(plan, zoo.model);
  const ScheduleRequest req = examples::schedule_request(o.pipeline, plan, layout, o.batch);
  // The stage replicas take minibatches in groups of g: the loop trains the whole groups of
  // --steps and says so when that is fewer (or refuses fewer than g); the progress line and the
  // learning-rate schedule count the steps it trains.
  const int g = minibatch_granularity(req.name, layout);
  const long steps = std::max<long>(o.steps - o.steps % g, g);

  // Under 1f1b-stash the replicas of a stage step at different rates, so no global norm exists
  // where a stage is replicated: clipping is off there (said where --clip-grad was given).
  const bool no_clip = !global_norm_exists(examples::stashes(req), layout.replica_counts());
  if (no_clip && o.clip_grad_given && o.clip_grad > 0 && comm.rank() == 0)
    log_warn(
        "--clip-grad is off: under {} with replicated stages the stages step at different "
        "rates, so no global gradient norm exists; use a flush schedule to clip",
        req.name);
  // Without replicas the norm is taken at each step, over every rank: each stage's step then waits
  // for the first stage's backward of the same minibatch, which the plan's prediction leaves out
  // and pipeline-simulate --clip-grad charges.
  if (examples::stashes(req) && !no_clip && o.clip_grad > 0 && layout.num_stages() > 1 &&
      comm.rank() == 0)
    log_info(
        "--clip-grad {} under {} sums the gradient norm over every stage at each step, so each "
        "stage's step waits for the first stage's backward of the same minibatch: the plan's "
        "predicted rate leaves that wait out, pipeline-simulate --clip-grad {} times it, and "
        "pipeline-partition --clip-grad {} compares the 1f1b-flush plan (--clip-grad 0 turns "
        "clipping off)",
        o.clip_grad, req.name, o.clip_grad, o.clip_grad);
  StageExecutor ex(
      zoo.model, zoo.sample_shape, zoo.input_dtype, layout, comm, make_optimizer(o),
      examples::with_injected_slowdown(
          examples::executor_options(o.pipeline, plan, o.seed, no_clip ? 0.f : o.clip_grad, device),
          comm));
  if (comm.rank() == 0 && !o.pipeline.plan.empty())
    examples::warn_where_plan_differs(plan, req, o.batch, ex.optimizer(), device);
  const LrSchedule lr = LrSchedule::parse(lr_schedule(o, steps), o.lr, steps);
  const CheckpointRunInfo info =
      examples::checkpoint_run_info(zoo, ex.optimizer(), o.seed, o.batch, comm.size(), o.pipeline,
                                    &plan, training_options(o, lr, no_clip ? 0.f : o.clip_grad));
  examples::Checkpointing ck = examples::start_checkpointing(o.checkpoints, info, ex, comm);
  const std::unique_ptr<Checkpointer> checkpoints = std::move(ck.writer);
  const std::int64_t start = ck.start;
  const DataLoader loader = train_loader(o, train);
  MetricsWriter metrics(ex.is_loss_rank() ? o.metrics : std::string(), start);
  const MinibatchFeed feed = examples::training_feed(loader);
  examples::PipelinedLoop loop;
  loop.request = &req;
  loop.layout = &layout;
  loop.feed = &feed;
  loop.lr = &lr;
  loop.per_epoch = loader.num_batches();
  loop.total = o.steps;
  loop.checkpoints = checkpoints.get();
  loop.rebalance_every = examples::rebalance_segment(o.pipeline, layout, comm.rank());
  loop.on_minibatch = [&](const MinibatchStats& st, double) {
    const double per_byte = st.loss / static_cast<double>(o.seq_len);
    metrics.write({{"step", st.minibatch + 1}, {"loss", per_byte}});
    if ((st.minibatch + 1) % 50 == 0 || st.minibatch + 1 == steps)
      fmt::print("step {}/{} loss {:.4f}\n", st.minibatch + 1, steps, per_byte);
  };
  std::optional<Schedule> schedule;
  double train_s = 0;
  const examples::RunProgress done =
      examples::train_pipelined(ex, comm, loop, start, schedule, train_s);
  if (done.preempted) {
    if (comm.rank() == checkpoints->coordinator())
      examples::announce_preemption(done, preemption_signal());
    return examples::kPreemptedExitStatus;
  }
  if (ex.is_loss_rank())
    log_info("{} steps in {:.1f} s ({:.0f} samples/s through the pipeline)", done.trained, train_s,
             static_cast<double>(done.trained * o.batch) / std::max(train_s, 1e-9));
  examples::report_checkpoints(checkpoints.get(), done);
  const DataLoader vloader(valid, {.batch_size = 64, .shuffle = false});
  StageExecutor::Eval e = ex.evaluate(examples::evaluation_feed(vloader), vloader.num_batches());
  // (A run resumed at its end trains nothing: the records of the run it continues stand.)
  if (done.trained > 0)
    metrics.write({{"validation_loss", e.loss}, {"perplexity", std::exp(e.loss)}});
  if (schedule) examples::write_trace_if_asked(o.pipeline, comm, ex, *schedule);
  if (done.trained > 0)  // (same on every rank)
    examples::report_peak_memory(ex, comm, plan, o.pipeline, profile, schedule, o.batch, metrics,
                                 ex.is_loss_rank());
  comm.barrier();
  if (ex.is_loss_rank()) report(e.loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train the byte-level transformer-lm on a text file; report loss and perplexity"};
  app.add_option("--text", o.text, "training text (a tenth at the end is held out)")
      ->check(CLI::ExistingFile)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")
      ->check(CLI::Range(1L, 1L << 30))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per minibatch")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate (AdamW)")
      ->check(CLI::Range(1e-8f, 10.f))
      ->capture_default_str();
  app.add_option("--lr-schedule", o.lr_schedule,
                 "constant, step:<every>:<gamma>, cosine[:<steps>[:<min>]], "
                 "warmup:<n>+<schedule> (by default runs of 20 steps or fewer warm up for half "
                 "of them)")
      ->capture_default_str()
      ->each([&](const std::string&) { o.lr_schedule_given = true; });
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")
      ->check(CLI::Range(0.f, 1.f))
      ->capture_default_str();
  app.add_option("--clip-grad", o.clip_grad,
                 "global gradient-norm clip (0: off; off under 1f1b-stash where a stage is "
                 "replicated)")
      ->check(CLI::Range(0.f, 1e9f))
      ->capture_default_str()
      ->each([&](const std::string&) { o.clip_grad_given = true; });
  app.add_option("--seed", o.seed, "seed of weights, shuffling and dropout")
      ->check(examples::non_negative_number())
      ->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per rank")->check(CLI::Range(1, 1024));
  app.add_option("--seq-len", o.seq_len, "context length in bytes")
      ->check(CLI::Range(2L, 4096L))
      ->capture_default_str();
  app.add_option("--dim", o.dim, "model width")
      ->check(CLI::Range(4L, 8192L))
      ->capture_default_str();
  app.add_option("--heads", o.heads, "attention heads")
      ->check(CLI::Range(1L, 256L))
      ->capture_default_str();
  app.add_option("--blocks", o.blocks, "transformer blocks")
      ->check(CLI::Range(1L, 256L))
      ->capture_default_str();
  app.add_option("--metrics", o.metrics, "write JSON-lines metrics here")
      ->check(examples::non_empty_path());
  examples::add_pipeline_flags(app, o.pipeline);
  examples::add_checkpoint_flags(app, o.checkpoints);
  return examples::run_main(
      argc, argv, app, o.pipeline, [&] { return run_single(o); },
      [&](Communicator& comm, Device device) { return run_pipelined(o, comm, device); });
}
