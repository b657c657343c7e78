// The pipeline flags of the example programs (--plan, --schedule, --schedule-csv, --microbatches,
// --vertical-sync, --recompute, --comm-timeout, --trace) and what they turn into: the plan of
// the job, the schedule request, the executor's options and the per-rank trace. Every example
// takes the same flags with the same meaning, so a script can drive any of them the same way.
//
// All of it is called on every rank of the job with the same flags, so every rank derives the
// same plan and schedule (see runtime/pipeline_setup.hpp).
#pragma once

#include <pipeline/comm/transport.hpp>
#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/ops/precision.hpp>
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/interleaved_layout.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/profile/profile_json.hpp>
#include <pipeline/runtime/pipeline_setup.hpp>
#include <pipeline/schedule/csv.hpp>
#include <pipeline/schedule/dealing.hpp>
#include <pipeline/schedule/generator.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/validators.hpp"

namespace pipeline::examples {

struct PipelineFlags {
  std::string plan;          // empty: rank 0 profiles and partitions the model for the job
  // The profile --plan was made from: the end-of-run memory report adds each rank's peak as the
  // simulator predicts it for the schedule run (a run without --plan has its own profile).
  std::string profile;
  std::string schedule;      // empty: the plan's
  std::string schedule_csv;  // a hand-written schedule instead of a generated one
  std::string trace;         // empty: no trace
  int microbatches = 0;      // 0: flush schedules use one per stage; stash schedules 1
  bool vertical_sync = false;
  double comm_timeout = 0;  // 0: PIPELINE_COMM_TIMEOUT or the default
  // Activation recomputation: "auto" runs the plan's per-stage choice, "all" every stage,
  // "none" no stage.
  std::string recompute = "auto";
  // Straggler mitigation: deal replicated stages' microbatches by the replicas' measured speed,
  // re-measured every `rebalance_every` minibatches (runtime/speed_rebalancer.hpp).
  bool rebalance = false;
  int rebalance_every = 10;
  bool rebalance_every_given = false;

  // The dtype of the products (ops/precision.hpp): float32, or bf16 (mixed precision); empty:
  // the plan's (Plan::dtype), else float32.
  std::string dtype;
  // The element type of the activations and gradients sent between stages: float32 or bf16;
  // empty: the plan's (Plan::transfer_dtype) when it names one, else bf16 when the products
  // compute in bf16, else float32.
  std::string transfer_dtype;

  DType compute_dtype(const Plan* plan = nullptr) const {
    if (!dtype.empty()) return ops::parse_compute_dtype(dtype);
    return plan != nullptr && plan->dtype == "bfloat16" ? DType::BFloat16 : DType::Float32;
  }
  DType wire_dtype(const Plan* plan = nullptr) const {
    if (!transfer_dtype.empty()) return transfer_dtype == "bf16" ? DType::BFloat16 : DType::Float32;
    if (plan != nullptr && !plan->transfer_dtype.empty())
      return plan->transfer_bf16() ? DType::BFloat16 : DType::Float32;
    return compute_dtype(plan);
  }

  // Where the run trains (parse_device: cpu, cuda, cuda:N).
  std::string device = "cpu";
  // Every stage of --plan as a thread of this one process (comms/local.hpp).
  bool in_process = false;
  // How the ranks of an MPI job talk (comm/transport.hpp): auto, nccl, mpi, or local (the same
  // as --in-process).
  std::string comm = "auto";

  // Capture a single-process GPU step into a CUDA graph and replay it (SequentialTrainer).
  bool cuda_graphs = false;

  bool runs_in_process() const { return in_process || comm == "local"; }

  // ConfigError for flags that contradict each other. A single-process run ignores these flags,
  // so only a pipelined run checks them.
  void check() const {
    PIPELINE_CHECK_AS(ConfigError, schedule_csv.empty() || schedule.empty(),
                      "give either --schedule or --schedule-csv, not both");
    PIPELINE_CHECK_AS(ConfigError, profile.empty() || !plan.empty(),
                      "--profile names the profile --plan was made from; without --plan the run "
                      "profiles the model itself: drop --profile, or give --plan");
    PIPELINE_CHECK_AS(ConfigError, !runs_in_process() || !plan.empty(),
                      "--in-process runs the stages of a plan as threads of this process: give "
                      "--plan plan.json (pipeline-partition writes one)");
    PIPELINE_CHECK_AS(ConfigError, !runs_in_process() || launcher_world_size() == 1,
                      "--in-process runs the whole plan in one process, but the launcher started "
                      "{}: run it with mpirun -np 1 (or without mpirun), or drop --in-process",
                      launcher_world_size());
    PIPELINE_CHECK_AS(ConfigError, !cuda_graphs,
                      "--cuda-graphs captures the whole step of a single-process run on one GPU; "
                      "a pipeline's stages run without graphs: drop --cuda-graphs, or --plan / "
                      "--in-process / mpirun -np N");
    parse_device(device);
    parse_transport_request(comm);
  }

  // With a plan, or when started by an MPI launcher with more than one process, the program
  // trains as a pipeline; otherwise in this one process.
  bool pipelined() const { return !plan.empty() || launcher_world_size() > 1 || runs_in_process(); }
};

// Says so at start-up when the run computes in bf16 (float32 is the quiet default), and warns when
// --dtype contradicts the plan's, whose memory estimate assumes its own.
inline void log_precision(const PipelineFlags& flags, const Plan* plan = nullptr) {
  const DType dtype = flags.compute_dtype(plan);
  if (plan != nullptr && (dtype == DType::BFloat16) != (plan->dtype == "bfloat16"))
    log_warn(
        "the plan was made from a {} profile but the run computes in {}: its memory "
        "estimate assumes weight versions stashed in {} (drop --dtype to follow the plan)",
        plan->dtype.empty() ? "float32" : plan->dtype, dtype_name(dtype),
        plan->dtype == "bfloat16" ? "bf16" : "float32");
  if (dtype != DType::BFloat16) {
    if (flags.wire_dtype(plan) == DType::BFloat16)
      log_info("float32 compute; activations and gradients move between stages as bf16{}",
               flags.transfer_dtype.empty() ? " (the plan's transfer_dtype)" : "");
    return;
  }
  log_info(
      "mixed precision: bf16 products with float32 accumulation, float32 master weights and "
      "optimizer state; stashed weight matrices in bf16, transfers in {}",
      flags.wire_dtype(plan) == DType::BFloat16 ? "bf16" : "float32");
}

// The help section of the flags that only a pipelined run reads. A single-process run names
// those it was given and ignores (pipeline_only_flags_given): a job script may pass the same
// flags to both.
inline constexpr const char* kPipelineOnlyFlags =
    "Pipeline options (read with --plan, --in-process or under mpirun -np N)";

// The flags of the kPipelineOnlyFlags section given on the command line, by name.
inline std::vector<std::string> pipeline_only_flags_given(const CLI::App& app) {
  std::vector<std::string> given;
  for (const CLI::Option* o : app.get_options([](const CLI::Option* o) {
         return o->get_group() == kPipelineOnlyFlags && o->count() > 0;
       }))
    given.push_back(o->get_name());
  return given;
}

// Options a file records for the run it belongs to (flag name without "--", value), taken for
// those the command line leaves out and `app` has a flag for, so that the run is the one the file
// was made for (options given otherwise are still refused by the file's own check, naming them).
// Returns what was taken ("--dim 128 --blocks 4"); a value a flag does not take is left out.
inline std::string take_recorded_options(
    CLI::App& app, const std::vector<std::pair<std::string, std::string>>& options) {
  std::string taken;
  for (auto [option, value] : options) {
    std::replace(option.begin(), option.end(), '_', '-');
    CLI::Option* o = app.get_option_no_throw("--" + option);
    if (o == nullptr || o->count() > 0) continue;
    try {
      o->add_result(value);
      o->run_callback();
    } catch (const CLI::Error&) {
      o->clear();  // not a value this program takes: the file's check names the difference
      continue;
    }
    taken += fmt::format("{}--{} {}", taken.empty() ? "" : " ", option, value);
  }
  return taken;
}

// A model and its options (Architecture) as take_recorded_options() takes them.
inline std::vector<std::pair<std::string, std::string>> model_options(
    const std::string& model, const Architecture& architecture) {
  std::vector<std::pair<std::string, std::string>> options;
  if (!model.empty()) options.emplace_back("model", model);
  for (const auto& [option, value] : architecture)
    options.emplace_back(option, fmt::format("{}", value));
  return options;
}

// A plan is made for one model ("model" and "architecture" in plan.json): the run builds that
// one where the command line leaves its options out. Nothing is taken from a plan that cannot be
// read (reading it again says why).
inline std::string take_plan_model_options(CLI::App& app, const std::string& plan_path) {
  if (plan_path.empty()) return {};
  try {
    const Plan plan = read_plan(plan_path);
    return take_recorded_options(app, model_options(plan.model, plan.architecture));
  } catch (const std::exception&) {
    return {};
  }
}

// Adds the pipeline flags to `app`, bound to `flags`.
inline void add_pipeline_flags(CLI::App& app, PipelineFlags& flags) {
  app.add_option("--device", flags.device,
                 "where the run trains: cpu, cuda or cuda:N (CUDA builds). Under mpirun each rank "
                 "takes the GPU the transport gives it (its node-local rank); an --in-process "
                 "pipeline puts rank r on cuda:(N + r) modulo the visible GPUs")
      ->capture_default_str();
  app.add_option("--comm", flags.comm,
                 "how the ranks talk: auto (NCCL when every rank of a host has a GPU of its own, "
                 "else MPI, staging device tensors through the host), nccl, mpi, or local (all "
                 "ranks in this process, as --in-process)")
      ->check(CLI::IsMember({"auto", "nccl", "mpi", "local"}))
      ->capture_default_str()
      ->group(kPipelineOnlyFlags);
  app.add_flag("--cuda-graphs", flags.cuda_graphs,
               "single-process GPU training: capture a step into a CUDA graph once its batch "
               "shape has run, and replay it (the same results, far fewer launches)");
  app.add_flag("--in-process", flags.in_process,
               "run every stage of --plan as a thread of this one process (one GPU, or the CPU), "
               "instead of one process per stage under mpirun")
      ->group(kPipelineOnlyFlags);
  app.add_option("--plan", flags.plan,
                 "train as a pipeline with this plan.json (pipeline-partition)")
      ->check(non_empty_path())
      ->group(kPipelineOnlyFlags);
  app.add_option("--profile", flags.profile,
                 "the profile.json --plan was made from: the memory report at the end then shows "
                 "each rank's peak as pipeline-simulate predicts it for the schedule and "
                 "microbatches this run used")
      ->check(CLI::ExistingFile)
      ->group(kPipelineOnlyFlags);
  std::vector<std::string> schedules = GeneratorRegistry::builtin().names();
  schedules.push_back("interleaved");  // the interleaved plan's own: interleaved_schedule_for()
  app.add_option("--schedule", flags.schedule,
                 "pipeline schedule: gpipe, 1f1b-flush, zb-h1, 1f1b-stash, ... (default: the "
                 "plan's; interleaved = the interleaved plan's interleaved-1f1b or zb-v)")
      ->check(CLI::IsMember(schedules))
      ->group(kPipelineOnlyFlags);
  auto* csv = app.add_option("--schedule-csv", flags.schedule_csv,
                             "a hand-written schedule (CSV), validated first; it fixes its own "
                             "microbatches and weight-version policy")
                  ->check(CLI::ExistingFile)
                  ->group(kPipelineOnlyFlags);
  app.add_option("--microbatches", flags.microbatches,
                 "microbatches per minibatch for flush schedules (default: the plan's, or 4 "
                 "per rank, or the most below that which divide --batch)")
      ->check(CLI::Range(1, 65536))
      ->excludes(csv)
      ->group(kPipelineOnlyFlags);
  app.add_flag("--vertical-sync", flags.vertical_sync,
               "1f1b-stash: every stage uses the weight version the input stage used")
      ->excludes(csv)
      ->group(kPipelineOnlyFlags);
  app.add_option("--recompute", flags.recompute,
                 "activation recomputation: auto (the plan's choice per stage), all or none")
      ->check(CLI::IsMember({"none", "auto", "all"}))
      ->capture_default_str()
      ->group(kPipelineOnlyFlags);
  app.add_flag("--rebalance", flags.rebalance,
               "deal each replicated stage's microbatches by its replicas' measured speed, so a "
               "slow replica hands work to its peers (flush schedules: gpipe, 1f1b-flush, zb-h1)")
      ->group(kPipelineOnlyFlags);
  app.add_option("--rebalance-every", flags.rebalance_every,
                 "with --rebalance: minibatches between re-measurements of the replicas' speed")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str()
      ->each([&flags](const std::string&) { flags.rebalance_every_given = true; })
      ->group(kPipelineOnlyFlags);
  app.add_option("--dtype", flags.dtype,
                 "dtype of the matrix products, convolutions and attention: float32, or bf16 "
                 "(mixed precision: bf16 operands with float32 accumulation, float32 master "
                 "weights, optimizer state, norms and losses; stashed weight versions and "
                 "transfers in bf16). On a CPU bf16 computes the same numbers but is not faster. "
                 "Default: the plan's dtype (a plan made from a bf16 profile), else float32")
      ->check(CLI::IsMember({"float32", "bf16"}));
  app.add_option("--transfer-dtype", flags.transfer_dtype,
                 "element type of the activations and gradients sent between stages: float32, or "
                 "bf16 for half the bytes on the wire (default: the plan's transfer_dtype, else "
                 "bf16 under --dtype bf16, else float32)")
      ->check(CLI::IsMember({"float32", "bf16"}))
      ->group(kPipelineOnlyFlags);
  app.add_option("--comm-timeout", flags.comm_timeout,
                 "seconds any wait for a peer may take before the job ends with an error")
      ->check(positive_number())
      ->group(kPipelineOnlyFlags);
  app.add_option("--trace", flags.trace, "write this rank's executed schedule as a Chrome trace")
      ->check(file_to_write())
      ->group(kPipelineOnlyFlags);
}

// The name the planner knows `optimizer`'s update rule by: sgd, momentum or adamw (Adam with
// L2 decay costs what AdamW does).
inline std::string update_rule(const Optimizer& optimizer) {
  if (optimizer.kind() == "sgd") return optimizer.buffer_names().empty() ? "sgd" : "momentum";
  return "adamw";
}

// The plan of the job: --plan, or (without it) rank 0 profiles `zoo` at minibatch size `batch`
// and partitions it for the job's ranks, charging `optimizer`'s state in the memory model (for a
// flush --schedule the partitioner plans for, at its microbatch size: --microbatches of them, or
// 4 per rank where that divides the minibatch).
// Checked against the job and the model either way. `profile`, where given, gets the profile the
// plan was made from: --profile's, or the one just measured; none (nullopt) with a --plan alone.
// Collective.
inline Plan plan_for_job(const PipelineFlags& flags, const ZooModel& zoo, Communicator& comm,
                         int batch, const Optimizer& optimizer,
                         std::optional<Profile>* profile = nullptr) {
  Plan plan;
  if (flags.plan.empty()) {
    // A flush schedule's microbatches: --microbatches, or as pipeline-partition's default, 4 per
    // rank, or the most below that which divide the minibatch. An interleaved schedule's: a
    // multiple of the ranks (4 per rank where that divides the minibatch, else fewer).
    const bool flush = plans_flush(flags.schedule);
    const bool interleaved = plans_interleaved(flags.schedule);
    int microbatches = flush || interleaved ? flags.microbatches : 1;
    if (microbatches <= 0)
      microbatches = default_flush_microbatches(comm.size(), interleaved, batch);
    if (comm.rank() == 0)
      log_info("no --plan: profiling {} at batch {} and partitioning it for {} workers{}",
               zoo.model.name(), batch / std::max(1, microbatches), comm.size(),
               flush || interleaved
                   ? fmt::format(" under {} with {} microbatches", flags.schedule, microbatches)
                   : "");
    Profile measured;
    plan =
        auto_plan(zoo, comm,
                  {.batch = batch,
                   .optimizer_state_factor = static_cast<double>(optimizer.buffer_names().size()),
                   .optimizer = update_rule(optimizer),
                   .compute_dtype = flags.compute_dtype(),
                   .transfer_dtype = flags.wire_dtype(),
                   .schedule = flush || interleaved ? flags.schedule : "1f1b-stash",
                   .microbatches = microbatches},
                  profile != nullptr ? &measured : nullptr);
    if (profile != nullptr) *profile = std::move(measured);
  } else {
    plan = read_plan(flags.plan);
    const std::vector<int> used = plan.ranks_used();
    if (!used.empty() && static_cast<int>(used.size()) < plan.workers && comm.rank() == 0)
      log_info(
          "the plan uses {} of its {} workers (the others idle), so it runs as a job of {} "
          "ranks (mpirun -np {}): its ranks {} run as ranks 0-{} of the job",
          used.size(), plan.workers, used.size(), used.size(), fmt::join(used, ","),
          used.size() - 1);
    plan = compact_ranks(std::move(plan));
    if (profile != nullptr && !flags.profile.empty()) {
      *profile = read_profile(flags.profile);
      const Profile& p = **profile;
      PIPELINE_CHECK_AS(ConfigError, p.size() == zoo.model.size() && p.model == plan.model,
                        "--profile {} is of {} ({} layers) but --plan is for {} ({} layers): give "
                        "the profile the plan was made from",
                        flags.profile, p.model, p.size(), plan.model, zoo.model.size());
      if (const auto d = first_difference(plan.architecture, p.architecture))
        PIPELINE_FAIL(ConfigError,
                      "--profile {} is of {} with {} but --plan was made for it with {}: give the "
                      "profile the plan was made from",
                      flags.profile, p.model, d->our_flags, d->recorded_flags);
    }
  }
  check_plan_for_job(plan, zoo, comm.size());
  if (comm.rank() == 0) log_precision(flags, &plan);
  return plan;
}

// One line for the log: the plan's model, workers, config, stages and predicted rate.
inline std::string describe_plan(const Plan& plan) {
  std::string stages;
  for (auto& s : plan.stages)
    stages += fmt::format("{}[{}, {}){}", stages.empty() ? "" : " ", s.begin, s.end,
                          s.replicas > 1 ? fmt::format("x{}", s.replicas) : "");
  return fmt::format("plan for {} on {} workers: config {}, stages {}{}", plan.model, plan.workers,
                     plan.config, stages,
                     plan.predicted.samples_per_s > 0
                         ? fmt::format(", predicted {:.0f} samples/s under {}{}",
                                       plan.predicted.samples_per_s, plan.schedule,
                                       plan.microbatches > 0
                                           ? fmt::format(" with {} microbatches", plan.microbatches)
                                           : std::string())
                         : std::string());
}

// Whether the request is for a generated weight-stashing schedule (1f1b-stash, with or without
// vertical sync): one microbatch per minibatch by default, and a step after every backward.
inline bool stashes(const ScheduleRequest& request) {
  return request.csv.empty() && stashes_weights(request.name);
}

// The name of the schedule the run uses: --schedule, the CSV file's, or the plan's.
inline std::string schedule_name(const PipelineFlags& flags, const Plan& plan) {
  if (!flags.schedule_csv.empty()) return "csv:" + flags.schedule_csv;
  return flags.schedule.empty() ? plan.schedule : flags.schedule;
}

// The schedule the flags ask for on the plan's layout; the plan gives the schedule's name unless
// --schedule overrides it, and its warm-up depth. `batch`: samples per minibatch, which the
// default microbatch count divides where it can.
inline ScheduleRequest schedule_request(const PipelineFlags& flags, const Plan& plan,
                                        const PipelineLayout& layout, int batch) {
  ScheduleRequest req;
  req.name = flags.schedule.empty() ? plan.schedule : flags.schedule;
  req.csv = flags.schedule_csv;
  // An interleaved plan's ranks hold several stages, which only the interleaved schedules order:
  // interleaved-1f1b and interleaved-zb-h1 a looped placement, zb-v a V (their default microbatch
  // count below is a multiple of the ranks where one divides the batch, as the first two need).
  if (req.csv.empty()) {
    if (req.name == "interleaved") req.name = interleaved_schedule_for(plan);
    check_schedule_for_plan(plan, req.name);
  }
  PIPELINE_CHECK_AS(ConfigError, !flags.vertical_sync || stashes(req) || !req.csv.empty(),
                    "--vertical-sync chooses the weight version of each microbatch under "
                    "1f1b-stash; {} keeps one version: drop it, or add --schedule 1f1b-stash",
                    req.name);
  req.vertical_sync = flags.vertical_sync;
  // Stash schedules pipeline whole minibatches; a plan made for a flush schedule says how many
  // microbatches it was made for; otherwise 4 per rank, as pipeline-partition plans a flush
  // schedule and pipeline-simulate times one (default_microbatches: enough for every stage and
  // replica to be busy, with one microbatch a data-parallel minibatch ran on one replica while
  // the other waited at the allreduce).
  req.microbatches = flags.microbatches > 0
                         ? flags.microbatches
                         : default_microbatches(plan, req.name, std::max(batch, 0));
  if (!req.csv.empty()) req.microbatches = read_schedule_csv(req.csv).microbatches;  // for the logs
  take_plan_hints(req, plan);
  PIPELINE_CHECK_AS(ConfigError, flags.rebalance || !flags.rebalance_every_given,
                    "--rebalance-every sets how often --rebalance re-measures the replicas' "
                    "speed: add --rebalance, or drop --rebalance-every");
  if (flags.rebalance) check_dealable(plan, req.csv.empty() ? req.name : "a CSV schedule");
  return req;
}

// Warns where a --plan's predictions do not hold for this run (rank 0 of a job calls it):
// - its stage times and memory are for microbatches of its profile's batch size (a plan made at
//   batch 8 run with --batch 16 charges every stage half the time and activation memory it takes);
// - its memory estimate charges the state of the optimizer it was made for (plan.json
//   "optimizer": sgd none, momentum one copy of the weights, adamw two), and pipeline-partition's
//   default is PipeDream's momentum while the trainers' is adamw;
// - its CPU times are for ranks that compute on as many threads as its profile was timed on
//   (plan.json "profile_threads"), and pipeline-profile takes every core by default while the
//   trainers give each rank its share of them;
// - its predicted rate is for its own schedule and microbatches (plan.json "schedule",
//   "microbatches"), which --schedule and --microbatches may change (a bubble of another size).
inline void warn_where_plan_differs(const Plan& plan, const ScheduleRequest& req,
                                    std::int64_t batch, const Optimizer& optimizer, Device device) {
  const bool other_schedule = req.csv.empty() ? req.name != plan.schedule : true;
  const bool other_count =
      !stashes(req) && plan.microbatches > 0 && req.microbatches != plan.microbatches;
  if (plan.predicted.samples_per_s > 0 && (other_schedule || other_count))
    log_info(
        "the plan's predicted rate is for {}{}; this run takes {} with {} microbatch(es), which "
        "pipeline-simulate --plan ... {} times",
        plan.schedule,
        plan.microbatches > 0 ? fmt::format(" with {} microbatches", plan.microbatches)
                              : std::string(),
        req.csv.empty() ? req.name : "a CSV schedule", req.microbatches,
        req.csv.empty() ? fmt::format("--schedule {} --microbatches {}", req.name, req.microbatches)
                        : fmt::format("--schedule-csv {}", req.csv));
  if (!device.is_cuda() && plan.profile_threads > 0 && plan.profile_threads != num_threads())
    log_warn(
        "the plan's times were measured on {} thread(s) per process, but this run's ranks compute "
        "on {} (--threads): its predicted rate is for ranks of {}; for a plan of this run, "
        "profile with --threads {}",
        plan.profile_threads, num_threads(), plan.profile_threads, num_threads());
  const std::int64_t samples = req.microbatches > 0 ? batch / req.microbatches : 0;
  if (plan.batch_size > 0 && samples > 0 && samples != plan.batch_size)
    log_warn(
        "the plan was made from a profile at batch {}, but this run's microbatches hold {} "
        "samples (--batch {} in {} microbatch(es)): the plan's times and memory are for {}; train "
        "with --batch {} to run it as planned, or, for a plan of this run, profile at --batch {}",
        plan.batch_size, samples, batch, req.microbatches, plan.batch_size,
        std::int64_t{plan.batch_size} * req.microbatches, samples);
  const std::string rule = update_rule(optimizer);
  if (!plan.optimizer.empty() && plan.optimizer != rule) {
    auto copies = [](const std::string& r) {
      const int n = static_cast<int>(optimizer_state_copies(r));
      return n == 0 ? std::string("no state")
                    : fmt::format("{} weight cop{}", n, n == 1 ? "y" : "ies");
    };
    log_warn(
        "the plan's memory estimate is for the {} optimizer ({} per stage) but this run trains "
        "with {} ({}): its stages hold {} than planned; for a plan of this run, partition with "
        "--optimizer {}",
        plan.optimizer, copies(plan.optimizer), rule, copies(rule),
        optimizer_state_copies(rule) > optimizer_state_copies(plan.optimizer) ? "more" : "less",
        rule);
  }
}

// Minibatches per run segment between speed measurements (PipelinedLoop::rebalance_every): 0
// when --rebalance is off or no stage of the layout is replicated (then there is nothing to
// re-deal, which rank 0 says).
inline int rebalance_segment(const PipelineFlags& flags, const PipelineLayout& layout, int rank) {
  if (!flags.rebalance) return 0;
  for (auto& r : layout.stage_ranks)
    if (r.size() > 1) return flags.rebalance_every;
  if (rank == 0) log_warn("--rebalance: no stage of the plan is replicated; nothing to re-deal");
  return 0;
}

// Which stages of the plan recompute their activations under --recompute.
inline std::vector<bool> recompute_stages(const PipelineFlags& flags, const Plan& plan) {
  std::vector<bool> out;
  for (const PlanStage& s : plan.stages)
    out.push_back(flags.recompute == "all" || (flags.recompute == "auto" && s.recompute));
  return out;
}

inline ExecutorOptions executor_options(const PipelineFlags& flags, const Plan& plan,
                                        std::uint64_t seed, float clip_norm, Device device) {
  return {.seed = seed,
          .device = device,
          .transfer_dtype = flags.wire_dtype(&plan),
          .compute_dtype = flags.compute_dtype(&plan),
          .clip_norm = clip_norm,
          .record_trace = !flags.trace.empty(),
          .recompute = recompute_stages(flags, plan)};
}

// Writes this rank's executed actions to --trace (one file per rank), if it was given.
inline void write_trace_if_asked(const PipelineFlags& flags, Communicator& comm,
                                 const StageExecutor& executor, const Schedule& schedule) {
  if (flags.trace.empty()) return;
  const std::string path = per_rank_path(flags.trace, comm.rank(), comm.size());
  write_rank_trace(path, executor.trace_events(), schedule,
                   fmt::format("{} rank {}", schedule.name, comm.rank()));
  if (comm.rank() == 0)
    log_info("--trace: wrote {}{}", path,
             comm.size() > 1
                 ? fmt::format(" and one such file for each of the other {} ranks", comm.size() - 1)
                 : "");
}

}  // namespace pipeline::examples
