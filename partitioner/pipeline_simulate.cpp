// pipeline-simulate: predict a plan's throughput, bubbles and memory under a schedule.
//
//   pipeline-simulate --profile profile.json --plan plan.json [--schedule NAME | --schedule-csv
//   FILE]
//                     [--microbatches M] [--minibatches N] [--trace FILE] [--svg FILE] [--json]
//
// `--schedule interleaved` names the schedule of an interleaved plan (plan.json "virtual_stages"
// > 1), which is also its default: interleaved-1f1b, or zb-v for stages placed in a V; such a
// plan's default microbatch count is 4 per worker (a multiple of the workers, as the first needs).
//
// Prints a per-rank table (or, with --json, one JSON object) on stdout. The topology for transfer
// and allreduce costs is given innermost level first with repeated --level COUNT:BANDWIDTH, or
// as a topology JSON file (--topology, the partitioner's format); without either communication
// is free (and a note says so where the plan was made with transfers or allreduces).
//
// Plans over a mixed cluster (stages with a "device" type) take a profile per type:
// --profile h100=h100.json --profile a100=a100.json; each stage is timed from its type's.
//
// Stragglers: --slow-rank RANK:FACTOR (repeatable) makes that rank's forwards and backwards take
// FACTOR times as long (the runtime's PIPELINE_TEST_SLOW_RANK=RANK:FACTOR); --jitter CV
// multiplies every one by a lognormal factor of mean 1 and that coefficient of variation,
// reproducible from --seed S. --rebalance deals the microbatches of replicated stages by their
// ranks' speed under those factors, as the trainers' --rebalance does from measured speeds (flush
// schedules; schedule/dealing.hpp), instead of round-robin.
//
// Transient resources: --availability trace.csv --samples N (no --plan) replays a run of N
// samples on the trace's rows `time_s,workers`, re-planned by the partitioner at each change
// with --restart-cost (default 60s) per re-plan, against a static plan on the workers always
// there, and prints the time and cost of each (price from --price or the topology's) and the
// elastic run's segments (schedule/availability.hpp).
#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/plan/cost_plan.hpp>
#include <pipeline/plan/device_profiles.hpp>
#include <pipeline/plan/interleaved_layout.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/plan/topology_io.hpp>
#include <pipeline/profile/profile_json.hpp>
#include <pipeline/schedule/availability.hpp>
#include <pipeline/schedule/csv.hpp>
#include <pipeline/schedule/dealing.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>
#include <pipeline/schedule/trace.hpp>

#include "../examples/common/validators.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using nlohmann::json;
using namespace pipeline;

// --level COUNT:BANDWIDTH, innermost first, with the partitioner's units (4:1e10, 8:300GB/s).
Topology parse_levels(const std::vector<std::string>& levels) {
  Topology t;
  for (const auto& l : levels) t.levels.push_back(parse_level(l));
  return t;
}

// --slow-rank RANK:FACTOR, into per-rank factors (1 for ranks not named).
std::vector<double> parse_slow_ranks(const std::vector<std::string>& specs) {
  std::vector<double> out;
  for (const std::string& s : specs) {
    const std::size_t colon = s.find(':');
    int rank = -1;
    double factor = 0;
    bool ok = colon != std::string::npos;
    if (ok) {
      auto [p, ec] = std::from_chars(s.data(), s.data() + colon, rank);
      ok = ec == std::errc() && p == s.data() + colon && rank >= 0 && rank < 1 << 20;
    }
    if (ok) {
      auto [p, ec] = std::from_chars(s.data() + colon + 1, s.data() + s.size(), factor);
      // (Beyond a million-fold the times overflow any useful figure: a rank that slow is gone.)
      ok = ec == std::errc() && p == s.data() + s.size() && factor > 0 && factor <= 1e6 &&
           factor >= 1e-6;
    }
    PIPELINE_CHECK_AS(ConfigError, ok,
                      "--slow-rank '{}' is not RANK:FACTOR with a rank >= 0 and a factor from "
                      "1e-6 to 1e6 (e.g. 1:3 for rank 1 three times slower)",
                      s);
    if (out.size() <= static_cast<std::size_t>(rank))
      out.resize(static_cast<std::size_t>(rank) + 1, 0.0);
    PIPELINE_CHECK_AS(ConfigError, out[static_cast<std::size_t>(rank)] == 0.0,
                      "--slow-rank gives rank {} twice; give each rank once", rank);
    out[static_cast<std::size_t>(rank)] = factor;
  }
  for (double& factor : out)
    if (factor == 0.0) factor = 1.0;  // ranks not given run at their profiled speed
  return out;
}

// --availability: the elastic run against the static one, and the elastic run's segments.
int replay_trace(const Profile& profile, const std::string& trace_path, const Topology& topology,
                 double samples, const std::string& restart_text, const std::string& price_text,
                 const std::string& optimizer) {
  PIPELINE_CHECK_AS(ConfigError, samples > 0,
                    "--availability needs --samples N, the samples to train (> 0)");
  PIPELINE_CHECK_AS(ConfigError, !topology.levels.empty(),
                    "--availability needs the links: --level COUNT:BANDWIDTH or --topology "
                    "(the outermost count is taken from the trace)");
  AvailabilityOptions o;
  o.samples = samples;
  o.restart_s = parse_duration(restart_text, /*allow_zero=*/true);
  if (!price_text.empty()) o.price_per_worker_hour = parse_price(price_text);
  // Each plan as pipeline-partition makes it by default (the optimizer's step and state, the
  // profile's transfer dtype), on as many of the available workers as train fastest.
  o.partition.recompute = Recompute::Auto;
  o.partition.optimizer = optimizer;
  o.partition.optimizer_state_factor = optimizer_state_copies(optimizer);
  if (profile.bf16()) set_transfer_dtype(o.partition, DType::BFloat16);
  o.partition.allow_idle = true;
  const auto trace = read_availability_csv(trace_path);
  const AvailabilityReplay r = replay_availability(profile, topology, trace, o);
  const auto money = [&](double v) {
    return r.priced ? fmt::format("{:.2f}", v) : std::string("-");
  };
  fmt::print("{}: {} rows, {:g} samples, restart {} per re-plan\n", trace_path, trace.size(),
             samples, format_duration(o.restart_s));
  fmt::print("{:>9} {:>9} {:>6} {:>8} {:<16} {:>12} {:>8} {:>12} {:>10}\n", "start", "end", "avail",
             "workers", "config", "s/minibatch", "restart", "samples", "cost");
  for (const AvailabilitySegment& s : r.elastic.segments)
    fmt::print("{:>9} {:>9} {:>6} {:>8} {:<16} {:>12.6f} {:>8} {:>12.4g} {:>10}\n",
               format_duration(s.start_s), format_duration(s.end_s), s.available, s.workers,
               s.workers ? (s.replanned ? "*" : "") + s.config : "(waiting)",
               s.time_per_minibatch_s, format_duration(s.restart_s), s.samples, money(s.cost));
  fmt::print("(*: a new plan starts there; each but the first pays the restart)\n");
  fmt::print("elastic: {} ({:.0f} s), cost {}, {:.1f} worker-hours, {} restart(s)\n",
             format_duration(r.elastic.time_s), r.elastic.time_s, money(r.elastic.cost),
             r.elastic.worker_hours, r.elastic.restarts);
  if (r.fixed.feasible)
    fmt::print("static on {} worker{}{} (config {}): {} ({:.0f} s), cost {}, {:.1f} worker-hours\n",
               r.fixed.segments.front().workers, r.fixed.segments.front().workers == 1 ? "" : "s",
               r.fixed.segments.front().workers < r.static_workers
                   ? fmt::format(" of the {} always there", r.static_workers)
                   : std::string(),
               r.fixed.segments.front().config, format_duration(r.fixed.time_s), r.fixed.time_s,
               money(r.fixed.cost), r.fixed.worker_hours);
  else
    fmt::print(
        "static: none (the trace has no workers, or none a plan fits on, for the whole run)\n");
  if (r.fixed.feasible && r.elastic.time_s > 0)
    fmt::print("elastic / static: time {:.2f}x, cost {}\n", r.elastic.time_s / r.fixed.time_s,
               r.priced && r.fixed.cost > 0 ? fmt::format("{:.2f}x", r.elastic.cost / r.fixed.cost)
                                            : std::string("-"));
  return 0;
}

// The stages a rank runs (several on an interleaved plan's ranks).
std::vector<int> stages_of(const Schedule& schedule, int rank) {
  std::vector<int> out;
  for (int s = 0; s < schedule.num_stages(); ++s)
    for (int r : schedule.stage_ranks[static_cast<std::size_t>(s)])
      if (r == rank) out.push_back(s);
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"Predict a pipeline plan's throughput, bubbles and memory under a schedule"};
  std::string plan_path, schedule_name, schedule_csv, trace_path, svg_path;
  std::vector<std::string> profile_args;
  int microbatches = 0, minibatches = 0, microbatch_size = 0;
  std::vector<std::string> levels;
  double latency = 0;
  std::string transfer_dtype;
  bool as_json = false, full_duplex = false;
  app.add_option("--profile", profile_args,
                 "profile.json; for a plan over worker types TYPE=profile.json, once per type")
      ->required();
  app.add_option("--plan", plan_path, "plan.json (required but with --availability)");
  auto* by_name =
      app.add_option("--schedule", schedule_name,
                     "schedule generator (default: the plan's): " +
                         fmt::format("{}", fmt::join(GeneratorRegistry::builtin().names(), ", ")) +
                         " (interleaved = interleaved-1f1b)");
  auto* csv_opt = app.add_option("--schedule-csv", schedule_csv,
                                 "a schedule written as CSV (it fixes its own microbatches and "
                                 "minibatches)")
                      ->excludes(by_name);
  app.add_option(
         "--microbatches", microbatches,
         "microbatches per minibatch (default: the plan's, or as the trainers take them: 4 per "
         "rank, or the most below that which divide the plan's batch; 1 for stash)")
      ->check(CLI::Range(1, 1 << 20))
      ->excludes(csv_opt);
  app.add_option(
         "--minibatches", minibatches,
         "minibatches to simulate (default: 1; 2bw: 8; stash: 8 x workers, or 8 x the deepest "
         "stage's in-flight count where that is more, or with replicated stages 8 x the "
         "minibatches their replicas hold)")
      ->check(CLI::Range(1, 1 << 20))
      ->excludes(csv_opt);
  app.add_option("--microbatch-size", microbatch_size,
                 "samples per microbatch (default: the profile's batch)");
  std::string topology_path;
  auto* level_opt =
      app.add_option("--level", levels,
                     "topology level COUNT:BANDWIDTH, innermost first (repeat), e.g. 8:300GB/s");
  app.add_option("--topology", topology_path, "topology JSON file instead of --level")
      ->excludes(level_opt);
  app.add_option("--latency", latency, "seconds per message")
      ->check(pipeline::examples::non_negative_number());
  app.add_option(
         "--transfer-dtype", transfer_dtype,
         "element type of the activations and gradients sent between stages: float32 or "
         "bf16 (half the bytes; default: the plan's transfer_dtype, else the profile's dtype)")
      ->check(CLI::IsMember({"float32", "bf16"}));
  app.add_flag("--full-duplex", full_duplex, "links carry both directions at full bandwidth");
  // On by default: the trainers always overlap, so a prediction is for the run a user makes.
  bool overlap_allreduce = true;
  std::int64_t bucket_bytes = std::int64_t{4} << 20;
  app.add_flag("--overlap-allreduce,!--no-overlap-allreduce", overlap_allreduce,
               "replicated stages reduce their gradients in buckets overlapping their closing "
               "backward, as the runtime does (the default); --no-overlap-allreduce: one blocking "
               "allreduce once all replicas reach it, as the partitioner's formula assumes");
  double reduce_ns_per_byte = 0;
  app.add_option("--allreduce-cpu-ns", reduce_ns_per_byte,
                 "CPU ranks: nanoseconds of a replica's core per byte of a peer's gradients it "
                 "copies and sums in an allreduce (bench_pipeline measures it; default 0)")
      ->check(pipeline::examples::non_negative_number());
  app.add_option("--allreduce-bucket-bytes", bucket_bytes,
                 "bucket size with --overlap-allreduce (the runtime's default: 4 MiB)")
      ->check(pipeline::examples::positive_number());
  app.add_option("--trace", trace_path, "write a Chrome-trace / Perfetto JSON")
      ->check(pipeline::examples::file_to_write());
  app.add_option("--svg", svg_path, "write an SVG timeline")
      ->check(pipeline::examples::file_to_write());
  app.add_flag("--json", as_json, "print the result as JSON");
  std::vector<std::string> slow_ranks;
  double jitter_cv = 0;
  std::uint64_t seed = 0;
  app.add_option("--slow-rank", slow_ranks,
                 "RANK:FACTOR: that rank computes FACTOR times slower (repeat for several)");
  app.add_option("--jitter", jitter_cv,
                 "coefficient of variation of a lognormal factor (mean 1) on every compute "
                 "action's time (default 0: none)")
      ->check(pipeline::examples::non_negative_number());
  app.add_option("--seed", seed, "seed of the jitter (default 0)")
      ->check(pipeline::examples::non_negative_number());
  int cores = 0;
  app.add_option("--cores", cores,
                 "CPU cores the ranks share (one host, e.g. mpirun --oversubscribe): with fewer "
                 "cores than ranks (times the threads the profile was timed on), ranks computing "
                 "at once share them (default 0: a core each)")
      ->check(pipeline::examples::non_negative_number());
  double clip_grad = 0;
  app.add_option("--clip-grad", clip_grad,
                 "the run clips gradients to this global norm (the trainers' --clip-grad; "
                 "train_transformer_lm's default 1): every step first sums the norm over all "
                 "ranks, so each rank's step waits for the last to reach its own (default 0: off)")
      ->check(pipeline::examples::non_negative_number());
  bool rebalance = false;
  app.add_flag("--rebalance", rebalance,
               "deal replicated stages' microbatches by their ranks' speed under --slow-rank "
               "(flush schedules), as the trainers' --rebalance does");
  std::string availability_path, restart_text = "60s", price_text, optimizer = "momentum";
  double samples = 0;
  app.add_option("--availability", availability_path,
                 "CSV of rows time_s,workers: replay --samples N on these transient workers, "
                 "re-planned at each change, against a static plan (no --plan)");
  app.add_option("--samples", samples, "samples to train, with --availability");
  app.add_option("--restart-cost", restart_text,
                 "checkpoint-and-restart time per re-plan, with --availability (default 60s)");
  app.add_option("--price", price_text,
                 "price per worker-hour, with --availability (default: the topology's)");
  app.add_option("--optimizer", optimizer,
                 "the optimizer whose step and state the replay's plans charge, with "
                 "--availability: sgd, momentum (default, as pipeline-partition's) or adamw")
      ->check(CLI::IsMember({"sgd", "momentum", "adamw"}));
  CLI11_PARSE(app, argc, argv);

  DeviceProfiles profiles;
  bool named = false;
  for (std::size_t i = 0; i < profile_args.size(); ++i) {
    auto [type, path] = split_profile_argument(profile_args[i]);
    PIPELINE_CHECK_AS(ConfigError, i == 0 || named == !type.empty(),
                      "--profile '{}': give either one plain profile or TYPE=profile.json for "
                      "every worker type",
                      profile_args[i]);
    named = !type.empty();
    PIPELINE_CHECK_AS(ConfigError, profiles.count(type) == 0, "{}",
                      type.empty()
                          ? std::string("--profile is given twice: give one profile, "
                                        "or TYPE=profile.json for each worker type")
                          : fmt::format("--profile: worker type '{}' is given twice", type));
    profiles[type] = read_profile(path);
  }
  check_device_profiles(profiles);
  // (Several profiles time a typed plan's stages each by its device; anything else would take
  // one of them by the order of their names.)
  PIPELINE_CHECK_AS(ConfigError, profiles.size() == 1 || availability_path.empty(),
                    "--availability replays one kind of worker: give one --profile");
  const Profile& profile = profiles.begin()->second;
  const bool transfer_dtype_given = !transfer_dtype.empty();
  if (transfer_dtype.empty()) transfer_dtype = profile.bf16() ? "bf16" : "float32";
  if (!availability_path.empty()) {
    // The replay plans each segment itself: the options of a --plan run would be ignored.
    std::vector<std::string> given;
    for (const char* name : {"--plan",
                             "--schedule",
                             "--schedule-csv",
                             "--microbatches",
                             "--minibatches",
                             "--microbatch-size",
                             "--latency",
                             "--transfer-dtype",
                             "--full-duplex",
                             "--overlap-allreduce",
                             "--allreduce-cpu-ns",
                             "--allreduce-bucket-bytes",
                             "--trace",
                             "--svg",
                             "--json",
                             "--slow-rank",
                             "--jitter",
                             "--seed",
                             "--cores",
                             "--rebalance"})
      if (app.count(name) > 0) given.push_back(name);
    PIPELINE_CHECK_AS(ConfigError, given.empty(),
                      "--availability replays the trace with plans of its own; {} appl{} to a "
                      "--plan run only: drop {}",
                      fmt::join(given, ", "), given.size() == 1 ? "ies" : "y",
                      given.size() == 1 ? "it" : "them");
    return replay_trace(profile, availability_path,
                        topology_path.empty() ? parse_levels(levels) : read_topology(topology_path),
                        samples, restart_text, price_text, optimizer);
  }
  for (const char* name : {"--samples", "--restart-cost", "--price", "--optimizer"})
    PIPELINE_CHECK_AS(ConfigError, app.count(name) == 0,
                      "{} is for --availability (a replay of transient workers); drop it, or "
                      "give --availability trace.csv",
                      name);
  PIPELINE_CHECK_AS(ConfigError, !plan_path.empty(),
                    "--plan is required (but with --availability, which plans by itself)");
  Plan plan = read_plan(plan_path);  // (simulate() refuses another model's profile)
  if (profile.batch_size <= 0 && microbatch_size == 0) {
    // A profile that records no batch (an imported one) was planned with pipeline-partition
    // --batch N, which the plan records: its samples are counted at that batch.
    PIPELINE_CHECK_AS(ConfigError, plan.batch_size > 0,
                      "neither the profile nor the plan records the batch size the layers were "
                      "timed at (no \"batch_size\", or 0): give it with --microbatch-size N");
    for (auto& entry : profiles) entry.second.batch_size = plan.batch_size;
  }
  if (plan.batch_size > 0 && profile.batch_size > 0 && plan.batch_size != profile.batch_size &&
      microbatch_size == 0)
    fmt::print(stderr,
               "pipeline-simulate: note: the plan was made from a profile at batch {}, this one "
               "is at batch {}: its stages are timed at batch {} (give the profile the plan was "
               "made from to time the plan as made)\n",
               plan.batch_size, profile.batch_size, profile.batch_size);
  if (!transfer_dtype_given && !plan.transfer_dtype.empty())  // the plan's costs assume it
    transfer_dtype = plan.transfer_bf16() ? "bf16" : "float32";
  for (const PlanStage& st : plan.stages) {
    PIPELINE_CHECK_AS(ConfigError, st.device.empty() || profiles.count(st.device) == 1,
                      "{}: a stage runs on worker type '{}'; give its profile with --profile "
                      "{}=profile.json",
                      plan_path, st.device, st.device);
    PIPELINE_CHECK_AS(ConfigError, !st.device.empty() || profiles.size() == 1,
                      "{}: the stage of layers {}..{} names no worker type (a plan for one kind "
                      "of worker), so the {} profiles given cannot say which times it: give one "
                      "--profile",
                      plan_path, st.begin, st.end - 1, profiles.size());
  }
  Schedule schedule;
  std::optional<std::pair<std::string, ScheduleSpec>> dealt;  // --rebalance: the name and spec
  if (!schedule_csv.empty()) {
    schedule = read_schedule_csv(schedule_csv);
  } else {
    std::string name = schedule_name.empty() ? plan.schedule : schedule_name;
    if (name == "interleaved") name = interleaved_schedule_for(plan);
    check_schedule_for_plan(plan, name);
    const bool stash = stashes_weights(name);
    // As the trainers take them at the plan's batch.
    if (microbatches <= 0) microbatches = default_microbatches(plan, name, plan.batch_size);
    if (minibatches <= 0) {
      // 2BW's steady state spans minibatches (it never flushes): one holds no steady window.
      minibatches = name == "2bw" ? 8 : 1;
      if (stash) {
        const std::int64_t steady = steady_state_minibatches(plan, kMaxSimulatedMinibatches);
        PIPELINE_CHECK_AS(
            ConfigError, steady > 0,
            "under {} the plan's replica counts {} deal minibatches in rounds of "
            "their least common multiple, more than {} minibatches to a steady "
            "state: too long to simulate, and a run of this plan takes minibatches in "
            "multiples of it; plan with replica counts that share factors",
            name, fmt::join(plan.replica_counts(), "-"), kMaxSimulatedMinibatches);
        minibatches = static_cast<int>(steady);
      }
    }
    const ScheduleSpec spec = ScheduleSpec::from_plan(plan, microbatches, minibatches);
    if (rebalance) {  // (schedule_by_speed generates the round-robin schedule itself)
      check_dealable(plan, name);
      dealt.emplace(name, spec);
    } else {
      schedule = generate_schedule(name, spec);
    }
  }
  PIPELINE_CHECK_AS(ConfigError, !rebalance || schedule_csv.empty(),
                    "--rebalance generates the schedule's dealing; it cannot change a CSV "
                    "schedule's");
  SimulateOptions opt;
  opt.microbatch_size = microbatch_size;
  opt.latency_s = latency;
  opt.transfer_bytes_scale = transfer_dtype == "bf16" ? 0.5 : 1.0;
  opt.full_duplex = full_duplex;
  opt.overlap_allreduce = overlap_allreduce;
  opt.allreduce_bucket_bytes = bucket_bytes;
  opt.allreduce_cpu_s_per_byte = 1e-9 * reduce_ns_per_byte;
  opt.record_trace = !trace_path.empty() || !svg_path.empty();
  if (named) opt.device_profiles = &profiles;
  const Topology topology =
      topology_path.empty() ? parse_levels(levels) : read_topology(topology_path);
  opt.rank_slowdown = parse_slow_ranks(slow_ranks);
  const int ranks = dealt ? dealt->second.num_ranks() : schedule.num_ranks();
  PIPELINE_CHECK_AS(ConfigError, opt.rank_slowdown.size() <= static_cast<std::size_t>(ranks),
                    "--slow-rank names rank {}, but the schedule has ranks 0..{}",
                    opt.rank_slowdown.size() - 1, ranks - 1);
  opt.jitter_cv = jitter_cv;
  opt.jitter_seed = seed;
  opt.cores = cores;
  opt.threads_per_rank = std::max(1, profile.threads);
  opt.clip_by_global_norm = clip_grad > 0;
  if (dealt) {
    // Dealt by the ranks' speeds, or round-robin where the simulation finds that no slower.
    std::vector<double> seconds = opt.rank_slowdown;
    seconds.resize(static_cast<std::size_t>(ranks), 1.0);
    SimulateOptions timing = opt;
    timing.record_trace = false;
    schedule = schedule_by_speed(dealt->first, dealt->second, seconds, [&](const Schedule& s) {
      return simulate(s, profile, plan, topology, timing).makespan_s;
    });
  }
  Simulation sim = simulate(schedule, profile, plan, topology, opt);
  if (!trace_path.empty()) write_chrome_trace(trace_path, sim, schedule);
  if (!svg_path.empty()) write_timeline_svg(svg_path, sim, schedule);

  if (as_json) {
    json ranks = json::array();
    for (auto& r : sim.ranks)
      ranks.push_back({{"rank", r.rank},
                       {"stage", r.stage},
                       {"stages", stages_of(schedule, r.rank)},
                       {"bubble_fraction", r.bubble_fraction},
                       {"steady_state_bubble_fraction", r.steady_state_bubble_fraction},
                       {"peak_activations", r.peak_activations},
                       {"peak_weight_versions", r.peak_weight_versions},
                       {"peak_activation_bytes", r.peak_activation_bytes},
                       {"peak_weight_bytes", r.peak_weight_bytes},
                       {"peak_state_bytes", r.peak_state_bytes},
                       {"workspace_bytes", r.workspace_bytes},
                       {"peak_memory_bytes", r.peak_memory_bytes}});
    json out = {{"schedule", sim.schedule},
                {"ranks", schedule.num_ranks()},
                {"microbatches", schedule.microbatches},
                {"minibatches", schedule.minibatches},
                {"time_per_minibatch_s", sim.time_per_minibatch_s},
                {"samples_per_s", sim.samples_per_s},
                {"bubble_fraction", sim.bubble_fraction},
                {"steady_state_bubble_fraction", sim.steady_state_bubble_fraction},
                {"makespan_s", sim.makespan_s},
                {"per_rank", ranks}};
    if (!sim.core_stretch.empty()) out["core_stretch"] = sim.core_stretch;
    if (rebalance) {  // the text output's "stage S deals ..." lines
      json dealing = json::array();
      for (int st = 0; st < schedule.num_stages(); ++st)
        if (schedule.replicas(st) > 1)
          dealing.push_back({{"stage", st},
                             {"ranks", schedule.stage_ranks[st]},
                             {"microbatches", dealt_counts(schedule, st)}});
      out["dealing"] = std::move(dealing);
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("schedule {}: {} ranks, {} microbatch(es) x {} minibatch(es)\n", sim.schedule,
             schedule.num_ranks(), schedule.microbatches, schedule.minibatches);
  // Free links by default: say so where the plan was made with transfers or allreduces, which
  // this run then does not time (pipeline-partition times them on the links it was given).
  if (topology.levels.empty() && opt.latency_s == 0 &&
      std::any_of(plan.stages.begin(), plan.stages.end(), [](const PlanStage& s) {
        return s.transfer_s > 0 || s.input_message_s > 0 || s.sync_s > 0;
      }))
    fmt::print(
        "note: links are free here (no --level or --topology), but the plan was made with "
        "transfers or allreduces: give the partitioner's links (e.g. --level {}:10Gbit/s) to "
        "time them\n",
        schedule.num_ranks());
  fmt::print(
      "time per minibatch {:.6f} s, {:.1f} samples/s, bubble {:.1f}% (steady state {:.1f}%)\n",
      sim.time_per_minibatch_s, sim.samples_per_s, 100 * sim.bubble_fraction,
      100 * sim.steady_state_bubble_fraction);
  if (!sim.core_stretch.empty())
    fmt::print("{} ranks{} share {} cores: each rank's compute takes x{:.3f} as long\n",
               schedule.num_ranks(),
               opt.threads_per_rank > 1
                   ? fmt::format(" of {} threads (the profile's)", opt.threads_per_rank)
                   : "",
               cores, fmt::join(sim.core_stretch, "/x"));
  for (int st = 0; st < schedule.num_stages(); ++st)
    if (rebalance && schedule.replicas(st) > 1)
      fmt::print("stage {} deals {} of {} microbatches to ranks {}\n", st,
                 fmt::join(dealt_counts(schedule, st), ":"), schedule.microbatches,
                 fmt::join(schedule.stage_ranks[st], ","));
  fmt::print("{:>5} {:>7} {:>8} {:>8} {:>11} {:>9} {:>14}\n", "rank", "stages", "bubble", "steady",
             "activations", "versions", "peak memory");
  for (auto& r : sim.ranks)
    fmt::print("{:>5} {:>7} {:>7.1f}% {:>7.1f}% {:>11} {:>9} {:>14}\n", r.rank,
               fmt::format("{}", fmt::join(stages_of(schedule, r.rank), ",")),
               100 * r.bubble_fraction, 100 * r.steady_state_bubble_fraction, r.peak_activations,
               r.peak_weight_versions, r.peak_memory_bytes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const pipeline::Error& e) {
    fmt::print(stderr, "pipeline-simulate: error: {}\n", e.what());  // as the other tools
    return 1;
  }
}
