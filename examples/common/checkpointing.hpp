// Checkpoints, resume and preemption for the example programs: the flags
//   --checkpoint-dir DIR --checkpoint-every STEPS [--checkpoint-keep K] --resume DIR
// and the training loops that honour them, one for a single process and one for a pipeline.
//
// A run's position is the global index of the next minibatch to train (minibatch j is batch
// j % B of epoch j / B); the checkpoint of position p resumes at p with the same data, masks and
// learning rate (checkpoint_manifest.hpp). Resuming from DIR with no checkpoint in it starts from
// the beginning, so a job script may always pass --resume. New checkpoints go to --checkpoint-dir,
// or to the --resume directory when only that is given.
//
// A pipelined run checkpoints while its pipeline runs: each stage copies its state right after
// the optimizer step that completes the checkpoint's step, so no schedule drains for it. Under a
// flush schedule no microbatch of the next minibatch has started on that stage then, so a resume
// is bit-identical; under 1f1b-stash the in-flight microbatches are not saved and the resumed
// pipeline starts afresh from the newest weights. A stop request (SIGTERM/SIGINT) is agreed on by
// the ranks while the pipeline runs (StopAgreement): every rank stops a few minibatches later
// (twice the schedule's lead), at the same step, and checkpoints there.
#pragma once

#include <pipeline/core/log.hpp>
#include <pipeline/data/device_prefetch.hpp>
#include <pipeline/data/loader.hpp>
#include <pipeline/io/safetensors.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/lr_schedule.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/runtime/checkpoint.hpp>
#include <pipeline/runtime/pipeline_setup.hpp>
#include <pipeline/runtime/preemption.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/speed_rebalancer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/runtime/stop_agreement.hpp>
#include <pipeline/schedule/dealing.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/fault_injection.hpp"
#include "common/pipeline_flags.hpp"
#include "common/validators.hpp"

namespace pipeline::examples {

struct CheckpointFlags {
  std::string dir;
  long every = 0;
  int keep = 2;
  std::string resume;
  bool cadence_given = false;  // --checkpoint-every or --checkpoint-keep on the command line

  // Where new checkpoints go (empty: none are written).
  std::string output_dir() const { return dir.empty() ? resume : dir; }
  bool writes() const { return !output_dir().empty(); }
  // Whether the run writes its checkpoints where it resumes from (--resume alone, or the same
  // directory given twice).
  bool resumes_where_it_writes() const {
    std::error_code ec;
    return !resume.empty() && std::filesystem::weakly_canonical(resume, ec) ==
                                  std::filesystem::weakly_canonical(output_dir(), ec);
  }
};

inline void add_checkpoint_flags(CLI::App& app, CheckpointFlags& flags) {
  app.add_option("--checkpoint-dir", flags.dir,
                 "write checkpoints (parameters, optimizer state, step) under this directory")
      ->check(non_empty_path());
  app.add_option("--checkpoint-every", flags.every,
                 "steps between checkpoints (0: only at the end and when stopped by a signal)")
      ->check(CLI::Range(0L, 1L << 40))
      ->each([&flags](const std::string&) { flags.cadence_given = true; });
  app.add_option("--checkpoint-keep", flags.keep, "complete checkpoints to keep")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str()
      ->each([&flags](const std::string&) { flags.cadence_given = true; });
  app.add_option("--resume", flags.resume,
                 "continue from the newest complete checkpoint in this directory (from the start "
                 "when it has none)")
      ->check(non_empty_path());
}

// A run that resumes continues the one that wrote the checkpoint: the model and its options, the
// seed, batch, optimizer and --dtype of the newest checkpoint under `app`'s --resume directory are
// taken where the command line leaves them out (take_recorded_options). Nothing is taken without
// one.
inline std::string take_checkpoint_options(CLI::App& app) {
  const CLI::Option* resume = app.get_option_no_throw("--resume");
  if (resume == nullptr || resume->count() == 0) return {};
  // Resuming looks again and warns about what it skips: once, not twice.
  const LogThresholdScope quiet(LogLevel::Error);
  try {
    const std::optional<Checkpoint> c = find_latest_checkpoint(resume->as<std::string>());
    if (!c) return {};
    const CheckpointManifest& m = c->manifest;
    std::vector<std::pair<std::string, std::string>> options =
        model_options(m.model, m.architecture);
    options.emplace_back("seed", std::to_string(m.seed));
    options.emplace_back("batch", std::to_string(m.batch_size));
    options.emplace_back("optimizer", m.optimizer);
    // (Only mixed precision is taken: float32 is the default, and where a bf16 plan would
    // otherwise choose bf16 the difference is warned.)
    if (const auto dtype = m.training.find("--dtype");
        dtype != m.training.end() && dtype->second == "bf16")
      options.emplace_back("dtype", dtype->second);
    return take_recorded_options(app, options);
  } catch (const std::exception&) {
    return {};  // resuming reads it again and says what is wrong
  }
}

// What a checkpoint records of the data a run trains on (among its training options, so that a
// resume on other data is warned): each file's name, size and CRC-32, which stay the same where
// the files move.
inline std::string data_fingerprint(const std::vector<std::string>& files) {
  std::vector<std::string> parts;
  for (const std::string& file : files) {
    const FileDigest d = digest_file(file);
    parts.push_back(fmt::format("{} ({} bytes, CRC-32 {:08x})",
                                std::filesystem::path(file).filename().string(), d.bytes, d.crc32));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

// What a run records in its checkpoints and checks on resume; `plan` is null for one process.
inline CheckpointRunInfo checkpoint_run_info(const ZooModel& zoo, const Optimizer& optimizer,
                                             std::uint64_t seed, std::int64_t batch_size,
                                             int world_size, const PipelineFlags& flags,
                                             const Plan* plan,
                                             std::map<std::string, std::string> training) {
  // The precision changes every step's numbers: a resume that leaves --dtype out takes the
  // checkpoint's (take_checkpoint_options), one that gives another is warned, as is another
  // --transfer-dtype between stages.
  const auto flag_value = [](DType t) { return t == DType::BFloat16 ? "bf16" : "float32"; };
  training["--dtype"] = flag_value(flags.compute_dtype(plan));
  if (plan) training["--transfer-dtype"] = flag_value(flags.wire_dtype(plan));
  return {.model = zoo.model.name(),
          .architecture = zoo.architecture,
          .schedule = plan ? schedule_name(flags, *plan) : "sequential",
          .optimizer = optimizer.kind(),
          .seed = seed,
          .batch_size = batch_size,
          .world_size = world_size,
          .plan = plan ? plan_to_json(*plan) : nlohmann::json(),
          .training = std::move(training)};
}

// The checkpoint to resume from, checked against the run; logs what it does.
inline std::optional<Checkpoint> checkpoint_to_resume(const CheckpointFlags& flags,
                                                      const CheckpointRunInfo& run, bool log) {
  if (flags.resume.empty()) return std::nullopt;
  std::error_code ec;
  PIPELINE_CHECK_AS(
      ConfigError,
      !std::filesystem::exists(flags.resume, ec) || std::filesystem::is_directory(flags.resume, ec),
      "--resume '{}' is not a directory: give the directory that --checkpoint-dir "
      "wrote (it holds step-<n> directories)",
      flags.resume);
  std::optional<Checkpoint> c = find_latest_checkpoint(flags.resume);
  if (!c) {
    if (log)
      log_warn("no checkpoint in '{}'{}: starting from step 0", flags.resume,
               std::filesystem::exists(flags.resume, ec) ? " yet" : " (it does not exist)");
    return std::nullopt;
  }
  check_resume_compatible(c->manifest, run);
  if (log) {
    log_info("resuming from '{}' at step {} (written by {} rank(s) under {})", c->path,
             c->manifest.step, c->manifest.world_size, c->manifest.schedule);
    if (const std::vector<std::string> d = training_differences(c->manifest, run); !d.empty())
      log_warn(
          "this run's training options differ from those of the run that wrote the checkpoint: "
          "{}; the learning rate and data order from step {} on are this run's, not a "
          "continuation of that run's (resume with the checkpoint's values to continue it)",
          fmt::join(d, ", "), c->manifest.step);
    if (c->manifest.world_size != run.world_size || c->manifest.plan != run.plan)
      log_info(
          "the checkpoint was written under another plan: every rank loads its own layers "
          "from the shards that hold them");
    else if (c->manifest.schedule != run.schedule)
      log_info("the checkpoint was written under schedule {}; this run continues under {}",
               c->manifest.schedule, run.schedule);
    if (stashes_weights(run.schedule))
      log_info(
          "1f1b-stash: in-flight microbatches and their stashed weight versions are not "
          "part of a checkpoint; the pipeline starts afresh from the newest weights");
  }
  return c;
}

// Whether `flag` is true on any rank of the job (collective; `comm` null: this process alone).
inline bool on_any_rank(Communicator* comm, bool flag) {
  if (comm == nullptr) return flag;
  Tensor count = Tensor::from_vector(Shape{1}, {flag ? 1.f : 0.f});
  comm->allreduce_sum(count, comm->world());
  return count.data<float>()[0] > 0;
}

// Restores this rank's layers (`restore(c)`) from `c`, checkpoint_to_resume's, and while a shard
// of it is damaged on any rank (CheckpointDamaged), from the next older checkpoint instead: a
// job restarted by its scheduler goes on rather than failing at every restart. Every rank takes
// the same one. The damaged one is set aside (renamed *.damaged) by `checkpoints`' coordinator
// when the run writes where it resumes from. Returns the step the run starts from. Collective;
// called once the run's Checkpointer holds its directory's lock.
inline std::int64_t restore_checkpoint(std::optional<Checkpoint> c, const CheckpointFlags& flags,
                                       const CheckpointRunInfo& run, Communicator* comm,
                                       const Checkpointer* checkpoints,
                                       const std::function<void(const Checkpoint&)>& restore) {
  const int rank = comm ? comm->rank() : 0;
  while (c) {
    bool damaged = false;
    try {
      restore(*c);
    } catch (const CheckpointDamaged& e) {
      log_warn("{}", pipeline::detail::unprefixed_message(e));
      damaged = true;
    }
    if (!on_any_rank(comm, damaged)) return c->manifest.step;
    const Checkpoint bad = *c;
    {
      const LogThresholdScope quiet(rank == 0 ? log_threshold() : LogLevel::Error);
      c = find_latest_checkpoint(flags.resume, bad.manifest.step);
    }
    // (Kept where no older one remains: set aside, the next restart would start from step 0.)
    PIPELINE_CHECK_AS(CheckpointDamaged, c.has_value(),
                      "checkpoint '{}' is damaged (the warnings say what) and '{}' holds no "
                      "older complete checkpoint: start afresh (an empty --checkpoint-dir, no "
                      "--resume) or restore the directory from a copy",
                      bad.path, flags.resume);
    if (checkpoints && rank == checkpoints->coordinator() && flags.resumes_where_it_writes()) {
      const std::string aside = set_aside_damaged_checkpoint(bad.path);
      log_warn("moved the damaged checkpoint '{}' aside to '{}'", bad.path, aside);
    }
    check_resume_compatible(c->manifest, run);
    if (rank == 0)
      log_warn("checkpoint '{}' is damaged: resuming from the older '{}' at step {} instead",
               bad.path, c->path, c->manifest.step);
  }
  return 0;
}

// The run's checkpoint writer (null without --checkpoint-dir or --resume), with SIGTERM/SIGINT
// turned into stop requests. Collective.
inline std::unique_ptr<Checkpointer> make_checkpointer(const CheckpointFlags& flags,
                                                       const CheckpointRunInfo& run,
                                                       CheckpointRole role, Communicator* comm,
                                                       std::int64_t checkpoint_bytes) {
  PIPELINE_CHECK_AS(ConfigError, flags.writes() || !flags.cadence_given,
                    "--checkpoint-every and --checkpoint-keep need a directory to write "
                    "checkpoints in: add --checkpoint-dir DIR (or --resume DIR)");
  if (!flags.writes()) return nullptr;
  // Another run's checkpoints where this one writes would count as this run's older ones: kept
  // in their place (its own pruned as older), and the newest that a --resume takes.
  if (!flags.resumes_where_it_writes()) {
    const LogThresholdScope quiet(LogLevel::Error);  // (interrupted writes: the writer says so)
    const std::optional<Checkpoint> other = find_latest_checkpoint(flags.output_dir());
    PIPELINE_CHECK_AS(ConfigError, !other,
                      "--checkpoint-dir '{}' holds another run's checkpoints (the newest of step "
                      "{}): continue that run with --resume {}, or give this run an empty "
                      "directory",
                      flags.output_dir(), other ? other->manifest.step : 0, flags.output_dir());
  }
  auto c = std::make_unique<Checkpointer>(
      CheckpointOptions{flags.output_dir(), flags.every, flags.keep, checkpoint_bytes}, run,
      std::move(role), comm);
  catch_preemption_signals();
  return c;
}

// The run's checkpointing, set up in its order: the checkpoint --resume names, checked against the
// run; the writer, which takes its directory's lock (so no other job prunes that checkpoint while
// it is read); then this rank's layers restored (`restore`, with restore_checkpoint's fallback).
// `writer` is null without --checkpoint-dir or --resume; `start` is the step the run starts from.
// Collective.
struct Checkpointing {
  std::unique_ptr<Checkpointer> writer;
  std::int64_t start = 0;
};

inline Checkpointing start_checkpointing(const CheckpointFlags& flags, const CheckpointRunInfo& run,
                                         CheckpointRole role, Communicator* comm,
                                         std::int64_t checkpoint_bytes,
                                         const std::function<void(const Checkpoint&)>& restore) {
  const int rank = comm ? comm->rank() : 0;
  std::optional<Checkpoint> resumed = checkpoint_to_resume(flags, run, rank == 0);
  Checkpointing out;
  out.writer = make_checkpointer(flags, run, std::move(role), comm, checkpoint_bytes);
  out.start = restore_checkpoint(std::move(resumed), flags, run, comm, out.writer.get(), restore);
  return out;
}

// A single process holding the whole model.
inline Checkpointing start_checkpointing(const CheckpointFlags& flags, const CheckpointRunInfo& run,
                                         const Sequential& model, ModelParams& params,
                                         Optimizer& optimizer) {
  return start_checkpointing(
      flags, run, CheckpointRole::single(model), nullptr,
      pipeline::checkpoint_bytes(model, optimizer),
      [&](const Checkpoint& c) { restore_stage(c, model, model.all(), params, optimizer); });
}

// A rank of a pipeline, with every stage it runs.
inline Checkpointing start_checkpointing(const CheckpointFlags& flags, const CheckpointRunInfo& run,
                                         StageExecutor& ex, Communicator& comm) {
  return start_checkpointing(
      flags, run, CheckpointRole::for_layout(ex.layout(), comm.rank()), &comm,
      pipeline::checkpoint_bytes(ex.model(), ex.optimizer()), [&](const Checkpoint& c) {
        ex.for_each_stage(
            [&](int) { restore_stage(c, ex.model(), ex.layers(), ex.params(), ex.optimizer()); });
      });
}

// Where a run stands between steps: `position` is the next minibatch's global index.
struct RunProgress {
  std::int64_t position = 0;
  // Minibatches this run trained: the positions it advanced, less an epoch's tail that the
  // replicas could not be dealt (skipped, not trained).
  std::int64_t trained = 0;
  bool preempted = false;
  std::string checkpoint;  // the last checkpoint completed (coordinator only)
};

// One log line per rank that writes checkpoints: the longest time a checkpoint held up its
// training, and (on the coordinator) the newest checkpoint.
inline void report_checkpoints(const Checkpointer* checkpoints, const RunProgress& p) {
  if (!checkpoints || checkpoints->last_saved_step() < 0) return;
  if (p.checkpoint.empty())
    log_info("checkpoints held up this rank for {:.2f} ms at most",
             checkpoints->max_stall_s() * 1e3);
  else
    log_info("checkpoint of step {} in '{}'; checkpoints held up this rank for {:.2f} ms at most",
             p.position, p.checkpoint, checkpoints->max_stall_s() * 1e3);
}

// The exit status of a run stopped by a signal after its checkpoint: EX_TEMPFAIL of sysexits.h,
// "try again later". Neither 0, which a scheduler takes for a finished job and does not restart
// (a signal to a rank, not to mpirun, left mpirun's status 0), nor a failure's 1.
inline constexpr int kPreemptedExitStatus = 75;

// `signal`: the one this process received; 0 when the stop came from a signal to another rank.
inline void announce_preemption(const RunProgress& p, int signal) {
  fmt::print(
      "stopped by {} after step {}: checkpoint '{}' written; continue with --resume\n",
      signal > 0 ? fmt::format("signal {}", signal) : std::string("a signal to another rank"),
      p.position, p.checkpoint);
  std::fflush(stdout);
}

// A run resumed at or past its last step trains nothing (a finished job started again by its
// scheduler, or --steps lowered): say so, rather than print a run of 0 steps.
inline void warn_if_nothing_to_train(std::int64_t start, std::int64_t total) {
  if (start > 0 && start >= total)
    log_warn(
        "resumed at step {}, {} the {} steps this run asks for (--steps/--epochs): nothing "
        "to train; the model is evaluated as the checkpoint holds it",
        start, start == total ? "the last of" : "past", total);
}

// The single-process loop: steps `trainer` from `start` to `total`; `on_step(step, result, dt)`
// after each step (step counts from 1) and `on_epoch_end(epoch)` when an epoch's last batch is
// done, or the run's last within an epoch. Checkpoints when due and when a stop is requested (then
// returns with preempted set).
inline RunProgress train_single(
    SequentialTrainer& trainer, const Sequential& model, const DataLoader& loader,
    const LrSchedule& lr, std::int64_t start, std::int64_t total, Checkpointer* checkpoints,
    const std::function<void(std::int64_t, const StepResult&, double)>& on_step,
    const std::function<void(std::int64_t)>& on_epoch_end = {}) {
  using Clock = std::chrono::steady_clock;
  const std::int64_t per_epoch = loader.num_batches();
  warn_if_nothing_to_train(start, total);
  trainer.continue_from(start);  // the resumed run's dropout masks
  RunProgress p{start};
  auto checkpoint = [&] {
    checkpoints->save(p.position, model, trainer.params(), trainer.optimizer());
    p.checkpoint = checkpoints->finish();
  };
  // On a GPU the next batch is copied over while the current step computes.
  DevicePrefetcher prefetch(trainer.device());
  while (p.position < total) {
    const std::int64_t epoch = p.position / per_epoch;
    const DataLoader::Epoch order = loader.epoch(epoch);
    DataLoader::Epoch::Iterator it(&order, p.position % per_epoch);
    if (it != order.end()) prefetch.stage(*it);
    for (; it != order.end();) {
      if (p.position >= total) break;
      const Batch batch = prefetch.take();
      if (++it != order.end() && p.position + 1 < total) prefetch.stage(*it);
      const auto t0 = Clock::now();
      StepResult r = trainer.step(batch, lr.lr_at(p.position));
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      ++p.position;
      if (on_step) on_step(p.position, r, dt);
      if (checkpoints) {
        if (checkpoints->due(p.position))
          checkpoints->save(p.position, model, trainer.params(), trainer.optimizer());
        checkpoints->poll();
        if (preemption_requested()) {
          if (checkpoints->last_saved_step() != p.position) checkpoint();
          p.checkpoint = checkpoints->finish();
          p.preempted = true;
          return p;
        }
      }
    }
    // (An epoch the run leaves part of is done too, as in the pipelined loop: its model is
    // evaluated.)
    if ((p.position % per_epoch == 0 || p.position >= total) && on_epoch_end)
      on_epoch_end((p.position - 1) / per_epoch);
  }
  if (checkpoints) {  // the final state, unless it is the checkpoint resumed from
    if (p.position > start && checkpoints->last_saved_step() != p.position) checkpoint();
    p.checkpoint = checkpoints->finish();
  }
  return p;
}

// What the pipelined loop needs besides the executor.
struct PipelinedLoop {
  const ScheduleRequest* request = nullptr;
  const PipelineLayout* layout = nullptr;
  const MinibatchFeed* feed = nullptr;
  const LrSchedule* lr = nullptr;
  std::int64_t per_epoch = 0;  // minibatches in an epoch of the loader
  std::int64_t total = 0;      // the run ends before minibatch `total`
  Checkpointer* checkpoints = nullptr;
  // > 0: run in segments of this many minibatches and deal each segment's microbatches by the
  // speed the ranks measured (SpeedRebalancer); 0: one schedule per epoch, round-robin.
  int rebalance_every = 0;
  std::function<void(const MinibatchStats&, double samples_per_s)> on_minibatch;
  std::function<void(std::int64_t epoch, const TrainResult&)> on_epoch_end;
};

// Adds a run segment's result to `total` (the segments of one epoch).
inline void add_segment(TrainResult& total, const TrainResult& segment) {
  const std::int64_t n = total.minibatches + segment.minibatches;
  if (n > 0)
    total.loss = (total.loss * static_cast<double>(total.minibatches) +
                  segment.loss * static_cast<double>(segment.minibatches)) /
                 static_cast<double>(n);
  total.minibatches = n;
  total.steps += segment.steps;
  total.correct += segment.correct;
  total.count += segment.count;
  total.seconds += segment.seconds;
  total.forwards += segment.forwards;
  total.compute_seconds += segment.compute_seconds;
  total.peak_in_flight = std::max(total.peak_in_flight, segment.peak_in_flight);
  total.peak_weight_versions = std::max(total.peak_weight_versions, segment.peak_weight_versions);
  total.peak_memory.include(segment.peak_memory);
}

// Says how each replicated stage deals its microbatches when that changes (rank 0, --rebalance):
// "rebalance at minibatch 20: stage 0 deals 6:2 of 8 microbatches to ranks 0,1 (1.02, 3.05 ms
// per microbatch)". `last` holds what was reported before, per stage.
inline void report_dealing(const Schedule& schedule, const ScheduleRequest& req,
                           std::int64_t position, std::vector<std::vector<int>>& last) {
  for (int s = 0; s < schedule.num_stages(); ++s) {
    if (schedule.replicas(s) < 2) continue;
    std::vector<int> counts = dealt_counts(schedule, s);
    if (last.size() <= static_cast<std::size_t>(s)) last.resize(static_cast<std::size_t>(s) + 1);
    if (counts == last[static_cast<std::size_t>(s)]) continue;
    last[static_cast<std::size_t>(s)] = counts;
    std::string speeds = "speeds not measured yet";
    if (!req.seconds_per_rank.empty()) {
      std::vector<std::string> ms;
      for (int rank : schedule.stage_ranks[s])
        ms.push_back(fmt::format("{:.2f}", 1e3 * req.seconds_per_rank[rank]));
      speeds = fmt::format("{} ms per microbatch", fmt::join(ms, ", "));
    }
    log_info("rebalance at minibatch {}: stage {} deals {} of {} microbatches to ranks {} ({})",
             position, s, fmt::join(counts, ":"), schedule.microbatches,
             fmt::join(schedule.stage_ranks[s], ","), speeds);
  }
}

// The pipelined loop from `start`; returns where it stopped. The last schedule run is kept in
// `last_schedule` (for traces). Every rank calls it with the same arguments. Schedules run an
// epoch at a time (the pipeline drains at each epoch's end, where it is evaluated).
inline RunProgress train_pipelined(StageExecutor& ex, Communicator& comm, const PipelinedLoop& loop,
                                   std::int64_t start, std::optional<Schedule>& last_schedule,
                                   double& train_seconds) {
  using Clock = std::chrono::steady_clock;
  ScheduleRequest req = *loop.request;
  std::optional<SpeedRebalancer> rebalancer;
  std::vector<std::vector<int>> reported_dealing;
  if (loop.rebalance_every > 0) rebalancer.emplace(comm);
  if (comm.rank() == 0) warn_if_nothing_to_train(start, loop.total);
  // Under 1F1B-stash the replicas of a replicated stage take g consecutive minibatches and step
  // together once they are done. The run trains whole groups that start at multiples of g, within
  // an epoch: every stage then steps at multiples of g whatever the run's start, so checkpoints,
  // stops and resumes (which fall between steps) meet at the same minibatch on every stage. Up
  // to g - 1 minibatches at an epoch's start and end that make no whole group are skipped, and
  // so are those before the first group of a run resumed in the middle of one.
  // A hand-written schedule has its own length: the run proceeds in whole copies of it, which
  // is its granularity whatever the plan's schedule would take.
  if (!req.csv.empty()) last_schedule = make_schedule(req, *loop.layout, 0);
  const int g = req.csv.empty() ? minibatch_granularity(req.name, *loop.layout)
                                : static_cast<int>(last_schedule->minibatches);
  PIPELINE_CHECK_AS(ConfigError, !req.csv.empty() || loop.per_epoch >= g,
                    "an epoch of {} minibatches cannot be dealt to the stage replicas of this plan "
                    "(they take minibatches in groups of {}): use a smaller --batch",
                    loop.per_epoch, g);
  const auto down = [g](std::int64_t x) { return x / g * g; };
  const auto epoch_begin_of = [&](std::int64_t x) { return x / loop.per_epoch * loop.per_epoch; };
  // Where training in the epoch of `x` ends: after its last whole group.
  const auto epoch_stop = [&](std::int64_t x) { return down(epoch_begin_of(x) + loop.per_epoch); };
  const std::int64_t last = down(loop.total);  // the run's end, after its last whole group
  // The first position from `x` on where a whole group starts (`last` or more when none does).
  const auto next_trainable = [&](std::int64_t x) {
    for (;;) {
      const std::int64_t q = down(x + g - 1);
      if (q >= last || q < epoch_stop(q)) return q;
      x = epoch_begin_of(q) + loop.per_epoch;
    }
  };
  if (req.csv.empty() && loop.per_epoch % g != 0 && last > epoch_stop(start) && comm.rank() == 0)
    log_warn(
        "this plan's stage replicas take minibatches in groups of {} from multiples of {}, and "
        "an epoch of {} is not a multiple of {}: the minibatches at an epoch's start or end that "
        "make no whole group are skipped (at most {} an epoch; a --batch that makes the epoch a "
        "multiple of {} trains them all)",
        g, g, loop.per_epoch, g, g - 1, g);
  Checkpointer* ckpt = loop.checkpoints;
  PIPELINE_CHECK_AS(
      ConfigError, !ckpt || ckpt->options().every % g == 0,
      "--checkpoint-every {} must be a multiple of {} for {}", ckpt ? ckpt->options().every : 0, g,
      req.csv.empty() ? fmt::format("this plan (its stage replicas take minibatches in groups "
                                    "of {})",
                                    g)
                      : fmt::format("the schedule '{}' (the run trains whole copies of its {} "
                                    "minibatch(es))",
                                    req.csv, g));
  if (!req.csv.empty() && comm.rank() == 0 && loop.total > start) {
    if (start % g != 0)
      log_warn(
          "resumed at step {}, which is not a multiple of the {} minibatch(es) of the schedule "
          "'{}': its copies, and so its checkpoints, fall at other steps than the run's that "
          "wrote the checkpoint",
          start, g, req.csv);
    if ((loop.total - start) % g != 0)
      log_warn(
          "training {} of the {} steps asked for: the schedule '{}' trains whole copies of its "
          "{} minibatch(es)",
          (loop.total - start) / g * g, loop.total - start, req.csv, g);
  }

  RunProgress p{start};
  TrainResult epoch_result;  // the segments of the epoch in progress, summed
  std::unique_ptr<StopAgreement> stop;
  // Between runs: every stage of this rank. During a run, each stage as its step completes.
  auto checkpoint = [&](std::int64_t position) {
    ex.for_each_stage(
        [&](int s) { ckpt->save(position, s, ex.model(), ex.params(), ex.optimizer()); });
  };
  // Whether the run trains nothing past `position`: what is left of it cannot be dealt to the
  // replicas (or holds no whole copy of a hand-written schedule).
  const auto run_ends_at = [&](std::int64_t position) {
    return req.csv.empty() ? next_trainable(position) >= last
                           : !last_schedule || loop.total - position < last_schedule->minibatches;
  };
  if (req.csv.empty() && loop.total > start) {  // generated schedules deal in groups of g
    PIPELINE_CHECK_AS(ConfigError, start > 0 || last > 0,
                      "{} step(s) to train, but this plan's stage replicas take minibatches in "
                      "groups of {}: train at least {} steps (--steps)",
                      loop.total, g, g);
    const std::int64_t from = next_trainable(start);
    if (comm.rank() == 0) {
      if (from >= last)
        log_warn(
            "resumed at step {} of {}: this plan's stage replicas take minibatches in groups of "
            "{} from multiples of {}, and no whole group is left to train; the model is evaluated "
            "as the checkpoint holds it",
            start, loop.total, g, g);
      else if (from > start && epoch_begin_of(from) == epoch_begin_of(start))
        log_warn(
            "resumed at step {}: this plan's stage replicas take minibatches in groups of {} "
            "from multiples of {}, so training continues at step {} ({} minibatch(es) skipped)",
            start, g, g, from, from - start);
      if (from < last && last < loop.total) {
        std::int64_t trained = 0;  // the whole groups from `from` on, epoch by epoch
        for (std::int64_t x = from; x < last;) {
          const std::int64_t stop_at = std::min(last, epoch_stop(x));
          trained += stop_at - x;
          x = next_trainable(stop_at);
        }
        log_warn(
            "training {} of the {} steps asked for: this plan's stage replicas take minibatches "
            "in groups of {}",
            trained, loop.total - start, g);
      }
    }
    p.position = std::min(from, loop.total);
  }
  // Every rank starts its clock together: a rank that is ready first (one that reads no input
  // samples) would otherwise count its wait for the first activation, 0.4-0.7 s, as training.
  comm.barrier();
  while (p.position < loop.total) {
    const std::int64_t epoch_begin = epoch_begin_of(p.position);
    std::int64_t n = std::min(last, epoch_stop(p.position)) - p.position;
    if (!req.csv.empty()) {
      n = last_schedule->minibatches;
      if (p.position + n > loop.total) break;
    } else {
      if (n <= 0) break;  // the run's last minibatches cannot be dealt to the replicas
      if (rebalancer) {
        n = std::min<std::int64_t>(n, loop.rebalance_every);
        req.seconds_per_rank = rebalancer->seconds_per_microbatch();
        last_schedule.reset();  // the dealing may have changed
      }
      if (!last_schedule || last_schedule->minibatches != n) {
        last_schedule = make_schedule(req, *loop.layout, static_cast<int>(n));
        if (rebalancer && comm.rank() == 0)
          report_dealing(*last_schedule, req, p.position, reported_dealing);
      }
    }
    PIPELINE_CHECK_AS(ConfigError, loop.feed->size(p.position) >= last_schedule->microbatches,
                      "a minibatch of {} samples cannot be cut into {} microbatches: use a --batch "
                      "of at least {}{}",
                      loop.feed->size(p.position), last_schedule->microbatches,
                      last_schedule->microbatches,
                      req.csv.empty() ? " or fewer --microbatches" : " or a schedule of fewer");
    if (ckpt && !stop)
      stop = std::make_unique<StopAgreement>(comm, ckpt->coordinator(), stop_margin(*last_schedule),
                                             g);
    const auto t0 = Clock::now();
    std::int64_t seen = 0;
    TrainResult r = ex.train(
        *last_schedule, *loop.feed, p.position,
        [&](std::int64_t step) {
          fault_injection_point(comm.rank(), step);  // testing only; see the header
          return loop.lr->lr_at(step);
        },
        [&](const MinibatchStats& st) {
          seen += st.count;
          const double s = std::chrono::duration<double>(Clock::now() - t0).count();
          if (loop.on_minibatch)
            loop.on_minibatch(st, static_cast<double>(seen) / std::max(s, 1e-9));
        },
        [&](std::int64_t position) {
          if (!ckpt) return;
          if (ckpt->due(position))
            ckpt->save(position, ex.stage(), ex.model(), ex.params(), ex.optimizer());
          ckpt->poll();
          if (ex.stop_position() < 0)
            if (auto k = stop->poll(position)) ex.stop_before(*k);
        });
    train_seconds += r.seconds;
    if (rebalancer) rebalancer->observe(r);
    add_segment(epoch_result, r);
    const std::int64_t end = p.position + n;
    if (ex.stop_position() >= 0 && ex.stop_position() < end) {
      p.trained += ex.stop_position() - p.position;
      p.position = ex.stop_position();
      p.preempted = true;
    } else {
      p.trained += n;
      p.position = end;
      // (An epoch the run leaves part of is done too: its model is evaluated.)
      // (Copies of a hand-written schedule may end past an epoch's end.)
      const bool epoch_done = p.position == epoch_stop(epoch_begin) ||
                              (!req.csv.empty() && p.position >= epoch_begin + loop.per_epoch) ||
                              run_ends_at(p.position);
      if (epoch_done) {
        if (loop.on_epoch_end) loop.on_epoch_end(epoch_begin / loop.per_epoch, epoch_result);
        epoch_result = TrainResult{};
      }
      if (req.csv.empty()) p.position = std::min(next_trainable(p.position), loop.total);
      // A request that came too late to be agreed within the run stops the job here, unless
      // the job is done: it then ends as any finished job (evaluated, saved).
      p.preempted = stop && stop->any_requested() && !run_ends_at(p.position);
    }
    if (p.preempted) {
      if (ckpt->last_saved_step() != p.position) checkpoint(p.position);
      p.checkpoint = ckpt->finish();
      return p;
    }
  }
  // A run that trained nothing (resumed at its end) still evaluates the model it holds.
  if (p.trained == 0 && loop.on_epoch_end)
    loop.on_epoch_end(std::max<std::int64_t>(p.position - 1, 0) / loop.per_epoch, TrainResult{});
  if (ckpt) {  // the final state, unless it is the checkpoint resumed from
    if (p.trained > 0 && ckpt->last_saved_step() != p.position) checkpoint(p.position);
    p.checkpoint = ckpt->finish();
  }
  return p;
}

}  // namespace pipeline::examples
