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
#include <pipeline/comm/comms/mpi.hpp>
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

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace {

using namespace pipeline;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string text = "/usr/share/games/fortunes/fortunes";
  long steps = 300;
  int batch = 16;
  float lr = 3e-3f;
  std::string lr_schedule = "warmup:20+cosine";
  float weight_decay = 0.01f;
  float clip_grad = 1.f;
  std::uint64_t seed = 1;
  int threads = 0;
  std::int64_t seq_len = 64, dim = 64, heads = 4, blocks = 2;
  std::string metrics;
  std::string plan, schedule, schedule_csv, trace;
  int microbatches = 0;
  bool vertical_sync = false;
  double comm_timeout = 0;
};

int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  return 1;
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

void report(double loss_per_byte) {
  fmt::print("validation loss: {:.4f} perplexity: {:.2f}\n", loss_per_byte, std::exp(loss_per_byte));
}

int run_single(const Options& o) {
  set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  ZooModel zoo = model_for(o);
  TextDataset train(o.text, {.seq_len = o.seq_len, .stride = o.seq_len / 2, .end = 0.9});
  TextDataset valid(o.text, {.seq_len = o.seq_len, .stride = o.seq_len, .begin = 0.9});
  SequentialTrainer trainer(zoo.model, zoo.model.init(o.seed), make_optimizer(o), o.seed, o.clip_grad);
  DataLoader loader(train, {.batch_size = o.batch, .shuffle = true, .drop_last = true, .seed = o.seed});
  const LrSchedule lr = LrSchedule::parse(o.lr_schedule, o.lr, o.steps);
  MetricsWriter metrics(o.metrics);
  long step = 0;
  const auto t0 = Clock::now();
  for (int epoch = 0; step < o.steps; ++epoch)
    for (const Batch& b : loader.epoch(epoch)) {
      if (step >= o.steps) break;
      StepResult r = trainer.step(b, lr.lr_at(step));
      ++step;
      const double per_byte = r.loss / static_cast<double>(o.seq_len);
      metrics.write({{"step", step}, {"loss", per_byte}});
      if (step % 50 == 0 || step == o.steps) fmt::print("step {}/{} loss {:.4f}\n", step, o.steps, per_byte);
    }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  log_info("{} steps in {:.1f} s ({:.0f} samples/s)", step, s, step * o.batch / s);
  EvalResult e = trainer.evaluate(valid, 64);
  metrics.write({{"validation_loss", e.loss}, {"perplexity", std::exp(e.loss)}});
  report(e.loss);
  return 0;
}

int run_pipelined(const Options& o, Communicator& comm) {
  if (o.comm_timeout > 0) comm.set_timeout(o.comm_timeout);
  set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  ZooModel zoo = model_for(o);
  TextDataset train(o.text, {.seq_len = o.seq_len, .stride = o.seq_len / 2, .end = 0.9});
  TextDataset valid(o.text, {.seq_len = o.seq_len, .stride = o.seq_len, .begin = 0.9});
  Plan plan;
  if (o.plan.empty()) {
    plan = auto_plan(zoo, comm, {.batch = o.batch});
    if (comm.rank() == 0) fmt::print("plan: {}\n", plan_to_json(plan).dump());
  } else {
    plan = read_plan(o.plan);
  }
  check_plan_for_job(plan, zoo.model, comm.size());
  const PipelineLayout layout = PipelineLayout::from_plan(plan, zoo.model);
  ScheduleRequest req;
  req.name = o.schedule.empty() ? plan.schedule : o.schedule;
  req.csv = o.schedule_csv;
  req.vertical_sync = o.vertical_sync;
  const bool stash = req.csv.empty() && req.name.rfind("1f1b-stash", 0) == 0;
  req.microbatches = o.microbatches > 0 ? o.microbatches : (stash ? 1 : layout.num_stages());
  const int g = minibatch_granularity(req.name, layout);
  const long steps = o.steps - o.steps % g;
  PIPELINE_CHECK_AS(ConfigError, steps > 0, "--steps {} is below the {} replicas to deal to", o.steps, g);
  Schedule schedule = make_schedule(req, layout, static_cast<int>(steps));

  StageExecutor ex(zoo.model, zoo.sample_shape, zoo.input_dtype, layout, comm, make_optimizer(o),
                   {.seed = o.seed, .clip_norm = stash ? 0.f : o.clip_grad, .record_trace = !o.trace.empty()});
  DataLoader loader(train, {.batch_size = o.batch, .shuffle = true, .drop_last = true, .seed = o.seed});
  const long per_epoch = static_cast<long>(loader.num_batches());
  std::optional<DataLoader::Epoch> order;
  long order_epoch = -1;
  MinibatchFeed feed{[&](std::int64_t j) {
                       const long e = static_cast<long>(j / per_epoch);
                       if (e != order_epoch) {
                         order.emplace(loader.epoch(e));
                         order_epoch = e;
                       }
                       return *DataLoader::Epoch::Iterator(&*order, j % per_epoch);
                     },
                     [&](std::int64_t) { return std::int64_t{o.batch}; }};
  const LrSchedule lr = LrSchedule::parse(o.lr_schedule, o.lr, steps);
  MetricsWriter metrics(ex.is_loss_rank() ? o.metrics : std::string());
  TrainResult r = ex.train(schedule, feed, 0, [&](std::int64_t s) { return lr.lr_at(s); },
                           [&](const MinibatchStats& st) {
                             const double per_byte = st.loss / static_cast<double>(o.seq_len);
                             metrics.write({{"step", st.minibatch + 1}, {"loss", per_byte}});
                             if ((st.minibatch + 1) % 50 == 0 || st.minibatch + 1 == steps)
                               fmt::print("step {}/{} loss {:.4f}\n", st.minibatch + 1, steps, per_byte);
                           });
  if (ex.is_loss_rank())
    log_info("{} steps in {:.1f} s ({:.0f} samples/s through the pipeline)", steps, r.seconds,
             static_cast<double>(steps * o.batch) / r.seconds);
  const std::int64_t vb = 64, batches = (valid.size() + vb - 1) / vb;
  DataLoader vloader(valid, {.batch_size = vb, .shuffle = false});
  StageExecutor::Eval e = ex.evaluate(
      {[&](std::int64_t u) { return vloader.batch(0, u); },
       [&](std::int64_t u) { return std::min<std::int64_t>(vb, valid.size() - u * vb); }},
      batches);
  metrics.write({{"validation_loss", e.loss}, {"perplexity", std::exp(e.loss)}});
  if (!o.trace.empty())
    write_rank_trace(per_rank_path(o.trace, comm.rank(), comm.size()), ex.trace_events(), schedule,
                     fmt::format("{} rank {}", schedule.name, comm.rank()));
  comm.barrier();
  if (ex.is_loss_rank()) report(e.loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train the byte-level transformer-lm on a text file; report loss and perplexity"};
  app.add_option("--text", o.text, "training text (a tenth at the end is held out)")
      ->check(CLI::ExistingFile)->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::Range(1L, 1L << 30))->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per minibatch")->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate (AdamW)")->check(CLI::Range(1e-8f, 10.f))->capture_default_str();
  app.add_option("--lr-schedule", o.lr_schedule, "learning-rate schedule (lr_schedule.hpp)")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->check(CLI::Range(0.f, 1.f));
  app.add_option("--clip-grad", o.clip_grad, "global gradient-norm clip (0: off; ignored by 1f1b-stash)")
      ->check(CLI::Range(0.f, 1e9f));
  app.add_option("--seed", o.seed, "seed of weights, shuffling and dropout")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per rank")->check(CLI::Range(1, 1024));
  app.add_option("--seq-len", o.seq_len, "context length in bytes")->check(CLI::Range(2L, 4096L))->capture_default_str();
  app.add_option("--dim", o.dim, "model width")->check(CLI::Range(4L, 8192L))->capture_default_str();
  app.add_option("--heads", o.heads, "attention heads")->check(CLI::Range(1L, 256L))->capture_default_str();
  app.add_option("--blocks", o.blocks, "transformer blocks")->check(CLI::Range(1L, 256L))->capture_default_str();
  app.add_option("--metrics", o.metrics, "write JSON-lines metrics here");
  app.add_option("--plan", o.plan, "train as a pipeline with this plan.json");
  app.add_option("--schedule", o.schedule, "gpipe, 1f1b-flush or 1f1b-stash (default: the plan's)")
      ->check(CLI::IsMember({"gpipe", "1f1b-flush", "1f1b-stash", "1f1b-stash-vsync"}));
  app.add_option("--schedule-csv", o.schedule_csv, "a hand-written schedule (CSV)")->check(CLI::ExistingFile);
  app.add_option("--microbatches", o.microbatches, "microbatches per minibatch (flush schedules)")
      ->check(CLI::Range(1, 65536));
  app.add_flag("--vertical-sync", o.vertical_sync, "1f1b-stash with vertical sync");
  app.add_option("--comm-timeout", o.comm_timeout, "seconds a wait for a peer may take")
      ->check(CLI::Range(1e-3, 1e9));
  app.add_option("--trace", o.trace, "write this rank's executed schedule as a Chrome trace");
  CLI11_PARSE(app, argc, argv);
  if (!o.plan.empty() || launcher_world_size() > 1) {
    MpiSession mpi(&argc, &argv);
    MpiCommunicator comm;
    try {
      return run_pipelined(o, comm);
    } catch (const std::exception& e) {
      std::fflush(stdout);
      fmt::print(stderr, "error: {}\n", e.what());
      std::fflush(stderr);
      comm.abort(e.what());
    }
  }
  try {
    return run_single(o);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
