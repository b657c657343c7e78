// bench_schedules: the schedules of one model on P CPU ranks side by side — measured throughput
// and per-stage peak memory, each beside the simulator's prediction from a profile measured in
// the same job.
//
//   mpirun -np 4 bench_schedules [--model transformer-lm] [--batch 8] [--microbatches 8]
//                                [--minibatches 4] [--threads 1] [--repeat 3]
//                                [--schedules 1f1b-flush,zb-h1,interleaved-1f1b,interleaved-zb-h1,
//                                             zb-v,1f1b-stash,2bw]
//                                [--results FILE]
//
// One job measures everything, so that the ratios compare numbers taken under the same load:
//  1. rank 0 profiles the model at the microbatch size with the backward split into its input-
//     and weight-gradient halves (what zb-h1 schedules), times one SGD step per layer range, and
//     ranks 0 and 1 time a ping-pong of the largest boundary activation (the simulator's link);
//  2. the partitioner plans a straight P-stage pipeline and, for the interleaved schedules, a
//     pipeline of 2P stages over the P ranks (stage k on rank k mod P; --straight), and for zb-v
//     one of 2P stages in a V (stages k and 2P - 1 - k on rank k);
//  3. --repeat times, per schedule: the ranks train --minibatches minibatches of --microbatches
//     microbatches of --batch samples (1f1b-stash: as many minibatches of one microbatch, the
//     same samples) after a warm-up, timed between barriers; every rank reports its peak bytes
//     held (StageExecutor's StageMemory);
//  4. rank 0 simulates every run (same plan, schedule and counts; warm-up and drain included, as
//     in the measurement) and prints measured and predicted samples/s, their ratio, the bubble
//     the simulator predicts, and per rank the measured peak memory beside the simulator's.
// Memory, like for like: the simulator counts weight versions and stashed activations, so the
// measured side is the executor's weights (latest and stashed versions) plus its per-microbatch
// state; gradients and optimizer state, which no schedule changes, are printed apart.
#include <pipeline/comm/comms/mpi.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/profile/profile_json.hpp>
#include <pipeline/profile/profiler.hpp>
#include <pipeline/runtime/pipeline_setup.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "pipeline_costs.hpp"

using namespace pipeline;
using pipeline::bench::median;

namespace {

struct Options {
  std::string model = "transformer-lm";
  int blocks = 8;  // transformer-lm: enough layers for 2 stages on each of 4 ranks
  int dim = 128;
  int batch = 8;
  int microbatches = 8;
  int minibatches = 4;
  int threads = 1;
  int repeat = 3;
  int virtual_stages = 2;
  std::vector<std::string> schedules{
      "1f1b-flush", "zb-h1", "interleaved-1f1b", "interleaved-zb-h1", "zb-v", "1f1b-stash", "2bw"};
  std::string results;
};

bool is_stash(const std::string& name) { return name.rfind("1f1b-stash", 0) == 0; }
bool is_interleaved(const std::string& name) {
  return name.rfind("interleaved-", 0) == 0;
}
bool is_v(const std::string& name) {
  return name == "zb-v";
}

// Every schedule trains the same samples: stash schedules as minibatches of one microbatch.
// (The stages' times as the trainers take them from the plan: zb-v orders by them.)
ScheduleRequest request_for(const std::string& name, const Options& o, const Plan& plan) {
  ScheduleRequest req;
  req.name = name;
  req.microbatches = is_stash(name) ? 1 : o.microbatches;
  req.stage_seconds = plan.stage_seconds();
  return req;
}
int minibatches_for(const std::string& name, const Options& o) {
  return is_stash(name) ? o.minibatches * o.microbatches : o.minibatches;
}

// Random inputs of the model's kind (token ids below the vocabulary, or normal floats) and
// labels: the values do not change the time.
Batch random_batch(const ZooModel& z, std::int64_t n) {
  Rng rng(3, "bench_schedules.data");
  Batch b;
  b.inputs = Tensor::empty(z.input_shape(n), z.input_dtype);
  if (z.input_dtype == DType::Int32) {
    auto* p = b.inputs.data<std::int32_t>();
    for (std::int64_t i = 0; i < b.inputs.numel(); ++i)
      p[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(z.num_classes)));
    b.labels = Tensor::empty(z.input_shape(n), DType::Int32);  // next token at every position
  } else {
    rng.fill_normal(b.inputs, 0.f, 1.f);
    b.labels = Tensor::empty(Shape{n}, DType::Int32);
  }
  auto* l = b.labels.data<std::int32_t>();
  for (std::int64_t i = 0; i < b.labels.numel(); ++i)
    l[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(z.num_classes)));
  return b;
}

struct Measured {
  double samples_per_s = 0;
  std::vector<StageMemory> memory;  // per rank
};

// Trains the schedule on `plan` (after one warm-up minibatch group), timed between barriers.
Measured run_schedule(const ZooModel& z, const Options& o, const std::string& name,
                      const Plan& plan, Communicator& comm, const MinibatchFeed& feed) {
  const PipelineLayout layout = PipelineLayout::from_plan(plan, z.model);
  const ScheduleRequest req = request_for(name, o, plan);
  const int n = minibatches_for(name, o);
  const Schedule warm = make_schedule(req, layout, is_stash(name) ? comm.size() : 1);
  const Schedule timed = make_schedule(req, layout, n);
  StageExecutor ex(z.model, z.sample_shape, z.input_dtype, layout, comm,
                   std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f}), {.seed = 1});
  const LrFunction lr = [](std::int64_t) { return 1e-4f; };
  ex.train(warm, feed, 0, lr);
  comm.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  const TrainResult r = ex.train(timed, feed, warm.minibatches, lr);
  comm.barrier();
  const double wall = bench::seconds_since(t0);
  Measured m;
  m.samples_per_s = static_cast<double>(n) * req.microbatches * o.batch / wall;
  // Every rank's peak, gathered as floats of MiB (exact enough for a table).
  Tensor all = Tensor::zeros(Shape{6 * comm.size()});
  float* v = all.data<float>();
  const StageMemory& p = r.peak_memory;
  const std::int64_t fields[6] = {p.parameter_bytes,      p.gradient_bytes,   p.optimizer_bytes,
                                  p.stashed_weight_bytes, p.activation_bytes, p.total_bytes};
  for (int k = 0; k < 6; ++k)
    v[6 * comm.rank() + k] = static_cast<float>(static_cast<double>(fields[k]) / 1024.0);
  comm.allreduce_sum(all, comm.world());
  for (int q = 0; q < comm.size(); ++q) {
    auto kib = [&](int k) { return static_cast<std::int64_t>(v[6 * q + k]) * 1024; };
    m.memory.push_back({kib(0), kib(1), kib(2), kib(3), kib(4), kib(5)});
  }
  return m;
}

int run_bench(const Options& o, Communicator& world) {
  const int P = world.size();
  set_num_threads(o.threads);
  ZooOptions zo;
  zo.blocks = o.blocks;
  zo.dim = o.dim;
  ZooModel z = make_model(o.model, zo);
  PIPELINE_CHECK_AS(ConfigError, P >= 2, "bench_schedules compares pipelines: run it on 2 or more "
                                         "ranks (mpirun -np 4)");

  // 1. Profile (split backward), broadcast; plans; step and link costs.
  std::string profile_text;
  if (world.rank() == 0) {
    ProfileOptions po;
    po.warmup = 3;
    po.repeat = 20;
    po.split_backward = true;
    profile_text = profile_to_json(profile(z, o.batch, Device::cpu(), po)).dump();
  }
  world.barrier();
  const Profile prof =
      parse_profile(broadcast_string(world, profile_text, 0), "the measured profile");
  std::int64_t boundary_bytes = 0;
  for (auto& l : prof.layers) boundary_bytes = std::max(boundary_bytes, l.output_bytes);
  const double one_way_s = bench::ping_pong(world, boundary_bytes);
  world.barrier();
  Tensor link = Tensor::zeros(Shape{2});
  if (world.rank() == 0) link.data<float>()[0] = static_cast<float>(one_way_s);
  world.allreduce_sum(link, world.world());
  const double bandwidth =
      static_cast<double>(boundary_bytes) / std::max(1e-9, static_cast<double>(link.data<float>()[0]));
  Topology topo;
  topo.levels.push_back({P, bandwidth});
  PartitionOptions straight;
  straight.straight = true;
  const Plan plan = partition(prof, topo, straight);
  PartitionOptions interleaved = straight;
  interleaved.virtual_stages = o.virtual_stages;
  const bool any_interleaved =
      std::any_of(o.schedules.begin(), o.schedules.end(), [](auto& n) { return is_interleaved(n); });
  const Plan iplan = any_interleaved ? partition(prof, topo, interleaved) : plan;
  PartitionOptions v_shape = straight;
  v_shape.virtual_stages = 2;
  v_shape.placement = StagePlacement::V;
  const bool any_v = std::any_of(o.schedules.begin(), o.schedules.end(), is_v);
  const Plan vplan = any_v ? partition(prof, topo, v_shape) : plan;
  // The plan each schedule runs.
  const auto plan_for = [&](const std::string& name) -> const Plan& {
    return is_v(name) ? vplan : is_interleaved(name) ? iplan : plan;
  };
  double step_s = 0;
  for (const Plan* pl : {&plan, &iplan, &vplan})
    for (auto& st : pl->stages)
      step_s = std::max(step_s, bench::time_step(z.model, {st.begin, st.end}).step_s);

  const Batch data = random_batch(z, static_cast<std::int64_t>(o.batch) * o.microbatches);
  struct Row {
    std::vector<double> rates;
    std::vector<StageMemory> memory;
  };
  std::vector<Row> rows(o.schedules.size());
  for (int rep = 0; rep < o.repeat; ++rep)
    for (std::size_t k = 0; k < o.schedules.size(); ++k) {
      const std::string& name = o.schedules[k];
      const std::int64_t samples =
          static_cast<std::int64_t>(o.batch) * request_for(name, o, plan_for(name)).microbatches;
      const Batch b = data.slice(0, samples);
      const MinibatchFeed feed{[b](std::int64_t) { return b; },
                               [samples](std::int64_t) { return samples; }};
      Measured m = run_schedule(z, o, name, plan_for(name), world, feed);
      rows[k].rates.push_back(m.samples_per_s);
      if (rows[k].memory.empty()) rows[k].memory = m.memory;
      for (std::size_t q = 0; q < m.memory.size(); ++q) rows[k].memory[q].include(m.memory[q]);
      world.barrier();
    }
  if (world.rank() != 0) return 0;

  // 4. Predictions and the table.
  std::string table = fmt::format(
      "{:<17} {:>10} {:>10} {:>6} {:>7}   {}\n", "schedule", "measured", "predicted", "ratio",
      "bubble", "per rank: measured / predicted MiB held (besides working memory)");
  std::string detail;
  for (std::size_t k = 0; k < o.schedules.size(); ++k) {
    const std::string& name = o.schedules[k];
    const Plan& pl = plan_for(name);
    const PipelineLayout layout = PipelineLayout::from_plan(pl, z.model);
    const ScheduleRequest req = request_for(name, o, pl);
    const int n = minibatches_for(name, o);
    SimulateOptions so;
    so.microbatch_size = o.batch;
    so.full_duplex = true;
    so.optimizer_step_s = step_s;
    const Simulation sim = simulate(make_schedule(req, layout, n), prof, pl, topo, so);
    const double predicted = static_cast<double>(n) * req.microbatches * o.batch / sim.makespan_s;
    const double measured = median(rows[k].rates);
    std::string mem;
    for (int q = 0; q < P; ++q)
      mem += fmt::format(
          "{}{:.1f}/{:.1f}", q ? "  " : "",
          static_cast<double>(rows[k].memory[q].total_bytes) / (1 << 20),
          static_cast<double>(sim.ranks[q].peak_memory_bytes - sim.ranks[q].workspace_bytes) /
              (1 << 20));
    table += fmt::format("{:<17} {:>10.1f} {:>10.1f} {:>6.2f} {:>6.1f}%   {}\n", name, measured,
                         predicted, measured / predicted, 100 * sim.bubble_fraction, mem);
    for (int q = 0; q < P; ++q) {
      const StageMemory& m = rows[k].memory[q];
      // The planner's estimate counts minibatches of the profile's batch: p - s of them in flight
      // for 1F1B-stash, whose minibatch here is one microbatch of that batch, so only that row
      // compares like with like (the others hold microbatches of a larger minibatch).
      double planned = 0;
      for (auto& st : pl.stages)
        if (!st.ranks.empty() && st.ranks[0] == q) planned += st.memory_bytes;
      const std::string planner =
          is_stash(name) ? fmt::format("; planner {:.1f}", planned / 1048576.0) : std::string();
      detail += fmt::format(
          "  {} rank {}: weights {:.1f} MiB, stashed versions {:.1f}, activations {:.1f}, "
          "gradients {:.1f}, optimizer {:.1f}, total {:.1f} MiB (simulated: weights {:.1f}, "
          "activations {:.1f}, gradients and optimizer {:.1f}{})\n",
          name, q, m.parameter_bytes / 1048576.0, m.stashed_weight_bytes / 1048576.0,
          m.activation_bytes / 1048576.0, m.gradient_bytes / 1048576.0,
          m.optimizer_bytes / 1048576.0, m.total_bytes / 1048576.0,
          sim.ranks[q].peak_weight_bytes / 1048576.0,
          sim.ranks[q].peak_activation_bytes / 1048576.0, sim.ranks[q].peak_state_bytes / 1048576.0,
          planner);
    }
  }
  std::string stages;
  for (const Plan* pl : {&plan, &iplan, &vplan}) {
    if (pl != &plan && pl->num_stages() == plan.num_stages()) continue;  // not asked for
    std::vector<std::string> ranges;
    for (auto& st : pl->stages) ranges.push_back(fmt::format("[{},{})", st.begin, st.end));
    stages += fmt::format("  {} stages: {}\n", pl->num_stages(), fmt::join(ranges, " "));
  }
  const std::string header = fmt::format(
      "bench_schedules: {} ({} blocks of width {}) on {} ranks ({}), {} thread(s) per rank, "
      "load {}\n"
      "  microbatch {} samples, {} microbatches x {} minibatches per run (1f1b-stash: {} "
      "minibatches of 1), median of {} runs; link {:.2f} GB/s (ping-pong of {} bytes), step "
      "{:.3f} ms\n{}",
      o.model, o.blocks, o.dim, P, bench::cpu_name(), o.threads, bench::load_average(), o.batch, o.microbatches,
      o.minibatches, o.minibatches * o.microbatches, o.repeat, bandwidth / 1e9, boundary_bytes,
      step_s * 1e3, stages);
  std::printf("%s%s%s", header.c_str(), table.c_str(), detail.c_str());
  if (!o.results.empty()) bench::append_results(o.results, header, table + detail);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Pipeline schedules side by side: measured throughput and memory beside the simulator's"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--model", o.model, "zoo model")->capture_default_str();
  app.add_option("--blocks", o.blocks, "transformer-lm blocks")->check(CLI::Range(1, 1024));
  app.add_option("--dim", o.dim, "transformer-lm width")->check(CLI::Range(8, 65536));
  app.add_option("--batch", o.batch, "samples per microbatch")->check(CLI::Range(1, 65536));
  app.add_option("--microbatches", o.microbatches, "microbatches per minibatch")
      ->check(CLI::Range(1, 4096));
  app.add_option("--minibatches", o.minibatches, "minibatches per timed run")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--threads", o.threads, "threads per rank")->check(CLI::Range(1, 1024));
  app.add_option("--repeat", o.repeat, "timed runs per schedule")->check(CLI::Range(1, 1000));
  app.add_option("--virtual-stages", o.virtual_stages, "stages per rank of the interleaved plan")
      ->check(CLI::Range(2, 64));
  app.add_option("--schedules", o.schedules, "schedules to run")->delimiter(',');
  app.add_option("--results", o.results, "append the table to this file");
  CLI11_PARSE(app, argc, argv);
  MpiSession mpi(&argc, &argv);
  MpiCommunicator world;
  try {
    return run_bench(o, world);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    world.abort(e.what());
  }
}
