// bench_pipeline: training throughput of a balanced P-stage pipeline on P ranks against the same
// model on one rank (same threads per rank), for 1f1b-stash, 1f1b-flush and gpipe on one plan,
// next to the simulator's prediction of each run from a profile measured in the same job; with
// --configs, of plans with replicated stages too (PipeDream's notation, replicas per stage:
// "2" is data parallelism on 2 ranks, "2-1" a replicated first stage and one more stage).
//
//   mpirun -np 2 bench_pipeline [--model mlp] [--width 3] [--batch 64] [--microbatches 8]
//                               [--samples-per-run 6144] [--threads 1] [--repeat 3]
//                               [--configs 2,1-1,1-2,2-1,3-1] [--trace DIR] [--results FILE]
//
// Configs whose replicas do not add up to the job's P ranks are skipped (so one list serves
// -np 2, 3 and 4). A config's split is the contiguous one whose slowest stage, forward +
// backward over its replicas, is fastest. Replicated stages reduce their gradients in buckets
// that overlap the backward (ExecutorOptions defaults), and the simulator models the same
// (SimulateOptions::overlap_allreduce, same bucket size), with the allreduce's bytes at the
// ping-pong's bandwidth like the activations; the allreduce also takes the replicas' cores (ranks
// of one host move the bytes themselves), at the rate a blocking allreduce among the job's ranks
// measures (allreduce_cost_per_byte; at least the copy and sum alone, reduce_cost_per_byte),
// which the simulator charges too (SimulateOptions::allreduce_cpu_s_per_byte).
//
// One job measures everything, so that the ratios compare numbers taken under the same load:
//  1. rank 0 profiles the model (pipeline::profile, --threads threads, microbatch-sized batches)
//     while the other ranks wait; the P-stage split is the contiguous one whose slowest stage
//     (forward + backward) is fastest; rank 0 also times one SGD step (and, for 1f1b-stash, the
//     copy of a stashed weight version) per stage;
//  2. ranks 0 and 1 time a ping-pong of the boundary activation (the simulator's link model);
//  3. --repeat times, per schedule: rank 0 alone runs the schedule on a 1-stage pipeline of the
//     whole model (a StageExecutor over MPI_COMM_SELF, so both runs execute the same code), then
//     all ranks run it on the P-stage plan; each run is warmed up first and timed between
//     barriers. Every run trains the same number of samples: --samples-per-run, in microbatches
//     of --batch samples (1f1b-stash: one microbatch per minibatch; flush schedules:
//     --microbatches per minibatch);
//  4. rank 0 simulates every run (same plan, schedule and microbatch count) and prints
//       predicted samples/s = samples per run / simulated makespan
//     (the quantity the measurement takes: warm-up and drain included), the ratio measured /
//     predicted (for P ranks also divided by the 1-rank run's ratio, which removes the error of
//     the profile that both predictions share and leaves that of the schedule model), and the
//     speedup of P ranks over one: the median over the repetitions of each P-rank run divided by
//     the 1-rank run just before it. The flush schedules' bubble bounds
//     their speedup by P·m / (m + P − 1) (m microbatches per minibatch).
// The per-rank lines come from the executor's trace of the median P-rank run: compute (F, B,
// ST), allreduce waits (AR: what the backward did not hide), waiting in receives (RA, RG) and the
// rest (sends, bookkeeping); the process's CPU time
// over the wall time and its involuntary context switches (another program on the rank's core
// shows there); and, over all messages that arrived while their receiver was already waiting,
// the median time from the send's post to the end of the wait (transfer plus wait-loop reaction).
#include <pipeline/comm/comms/mpi.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/flatten.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/profile/profiler.hpp>
#include <pipeline/runtime/pipeline_setup.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/simulator.hpp>
#include <pipeline/schedule/trace.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "pipeline_costs.hpp"

using namespace pipeline;
using pipeline::bench::median;
using pipeline::bench::ping_pong;
using pipeline::bench::allreduce_cost_per_byte;
using pipeline::bench::reduce_cost_per_byte;
using pipeline::bench::seconds_since;
using pipeline::bench::StepCost;
using pipeline::bench::time_step;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = "mlp";
  double width = 3.0;
  int batch = 64;
  int microbatches = 8;
  int samples_per_run = 6144;
  int threads = 1;
  int repeat = 3;
  int warmup_microbatches = 16;
  int profile_repeat = 30;
  double lr = 1e-3;
  std::vector<std::string> schedules{"1f1b-stash", "1f1b-flush", "gpipe"};
  std::vector<std::string> configs;  // empty: P stages of one replica each
  bool overlap = true;               // ExecutorOptions::overlap_allreduce, and the simulator's
  std::string trace;
  std::string results;
};

// Stage times of the profile: forward + backward of layers [begin, end).
double range_time(const Profile& p, int begin, int end) {
  double t = 0;
  for (int i = begin; i < end; ++i)
    t += p.layers[static_cast<std::size_t>(i)].forward_s +
         p.layers[static_cast<std::size_t>(i)].backward_s;
  return t;
}

// The contiguous split of the profile's layers into as many ranges as `replicas` has stages
// whose slowest stage (its time over its replicas) is fastest (a small dynamic program);
// returns the stage boundaries {0, c1, ..., n}.
std::vector<int> balanced_split(const Profile& p, const std::vector<int>& replicas) {
  const int stages = static_cast<int>(replicas.size());
  const int n = p.size();
  PIPELINE_CHECK_AS(ConfigError, stages <= n, "{} stages for a model of {} layers", stages, n);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[k][i]: slowest stage of the best split of layers [0, i) into k stages.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stages) + 1,
                                        std::vector<double>(static_cast<std::size_t>(n) + 1, kInf));
  std::vector<std::vector<int>> cut = std::vector<std::vector<int>>(
      static_cast<std::size_t>(stages) + 1, std::vector<int>(static_cast<std::size_t>(n) + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j) {
        const double v = std::max(best[k - 1][static_cast<std::size_t>(j)],
                                  range_time(p, j, i) / replicas[static_cast<std::size_t>(k) - 1]);
        if (v < best[k][static_cast<std::size_t>(i)]) {
          best[k][static_cast<std::size_t>(i)] = v;
          cut[k][static_cast<std::size_t>(i)] = j;
        }
      }
  std::vector<int> bounds{n};
  for (int k = stages, i = n; k >= 1; --k) {
    i = cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
    bounds.push_back(i);
  }
  std::reverse(bounds.begin(), bounds.end());
  return bounds;
}

// Stage s holds layers [bounds[s], bounds[s + 1]) on replicas[s] ranks, ranks in stage order.
Plan make_plan(const std::string& model, const std::vector<int>& bounds,
               const std::vector<int>& replicas) {
  Plan plan;
  plan.model = model;
  int rank = 0;
  for (int s = 0; s + 1 < static_cast<int>(bounds.size()); ++s) {
    PlanStage st{bounds[static_cast<std::size_t>(s)],
                 bounds[static_cast<std::size_t>(s) + 1],
                 replicas[static_cast<std::size_t>(s)],
                 {}};
    for (int r = 0; r < st.replicas; ++r) st.ranks.push_back(rank++);
    plan.stages.push_back(st);
  }
  plan.workers = rank;
  plan.config = fmt::format("{}", fmt::join(replicas, "-"));
  return plan;
}

// "2-1" -> {2, 1}; ConfigError for anything but positive counts joined by '-'.
std::vector<int> parse_config(const std::string& text) {
  std::vector<int> out;
  for (std::size_t at = 0; at <= text.size();) {
    std::size_t dash = text.find('-', at);
    if (dash == std::string::npos) dash = text.size();
    const std::string part = text.substr(at, dash - at);
    PIPELINE_CHECK_AS(ConfigError,
                      !part.empty() && part.size() < 5 &&
                          part.find_first_not_of("0123456789") == std::string::npos &&
                          std::stoi(part) > 0,
                      "--configs: '{}' is not replicas per stage joined by '-' (e.g. 2-1)", text);
    out.push_back(std::stoi(part));
    at = dash + 1;
  }
  return out;
}

// A double carried through a float allreduce: hi + lo.
void put_double(float* out, double x) {
  out[0] = static_cast<float>(x);
  out[1] = static_cast<float>(x - static_cast<double>(out[0]));
}
double get_double(const float* in) {
  return static_cast<double>(in[0]) + static_cast<double>(in[1]);
}

struct RankBreakdown {
  // allreduce_s: the AR actions, i.e. the waits for what the backward did not hide.
  double compute_s = 0, allreduce_s = 0, recv_wait_s = 0, other_s = 0;
  // CPU seconds of the process over the run's wall time, and the times the kernel took the core
  // away (involuntary context switches): a rank that shares its core with another program shows
  // a low share or many switches, and its run says little about the pipeline.
  double cpu_share = 0;
  double preempted = 0;
};

long involuntary_switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nivcsw;
}

RankBreakdown breakdown(const std::vector<TraceEvent>& events, double wall_s) {
  RankBreakdown b;
  for (const TraceEvent& e : events) {
    const double d = e.end_s - e.start_s;
    switch (e.action.kind) {
      case ActionKind::Forward:
      case ActionKind::Backward:
      case ActionKind::BackwardInput:
      case ActionKind::BackwardWeight:
      case ActionKind::Step:
        b.compute_s += d;
        break;
      case ActionKind::AllReduce:
        b.allreduce_s += d;
        break;
      case ActionKind::RecvActivation:
      case ActionKind::RecvGradient:
        b.recv_wait_s += d;
        break;
      default:
        break;
    }
  }
  b.other_s = std::max(0.0, wall_s - b.compute_s - b.allreduce_s - b.recv_wait_s);
  return b;
}

struct Run {
  double samples_per_s = 0;
  std::vector<RankBreakdown> ranks;  // rank 0: every rank's, gathered
  // Messages whose receiver was already waiting when the sender posted them: how long after the
  // post the receiver's wait ended (transfer plus the wait loop's reaction), median and count.
  double delivery_delay_s = 0;
  int delivered_while_waiting = 0;
};

// Slot of one message in the gathered timing table: boundary b (between stages b and b + 1),
// kind 0 activation / 1 gradient, microbatch u; three values: send post, wait start, wait end.
std::size_t message_slot(int b, int kind, int u, int n) {
  return (static_cast<std::size_t>(b) * 2 + static_cast<std::size_t>(kind)) *
             static_cast<std::size_t>(n) +
         static_cast<std::size_t>(u);
}

// Every rank's sends and receive waits, summed into one table (each slot is written by one
// rank), then the delivery delays of the messages a receiver was already waiting for.
void delivery_delays(Communicator& comm, const std::vector<TraceEvent>& events, int n, Run& r) {
  const int P = comm.size();
  const std::size_t slots =
      static_cast<std::size_t>(std::max(0, P - 1)) * 2 * static_cast<std::size_t>(n);
  if (slots == 0) return;
  // Times relative to the first event, as two floats each (hi + lo), 3 per slot.
  double t0 = events.empty() ? 0 : events.front().start_s;
  Tensor first = Tensor::zeros(Shape{2});
  put_double(first.data<float>(), comm.rank() == 0 ? t0 : 0.0);
  comm.allreduce_sum(first, comm.world());
  t0 = get_double(first.data<float>());
  Tensor table = Tensor::zeros(Shape{static_cast<std::int64_t>(slots) * 6});
  float* v = table.data<float>();
  const int me = comm.rank();
  for (const TraceEvent& e : events) {
    const int u = e.action.microbatch;
    if (u < 0 || u >= n) continue;
    std::size_t slot = slots;
    int value = 0;
    switch (e.action.kind) {
      case ActionKind::SendActivation:
        slot = message_slot(me, 0, u, n);
        value = 0;
        break;
      case ActionKind::RecvActivation:
        slot = message_slot(me - 1, 0, u, n);
        value = 1;
        break;
      case ActionKind::SendGradient:
        slot = message_slot(me - 1, 1, u, n);
        value = 0;
        break;
      case ActionKind::RecvGradient:
        slot = message_slot(me, 1, u, n);
        value = 1;
        break;
      default:
        break;
    }
    if (slot >= slots) continue;
    put_double(v + 6 * slot + 2 * value, e.start_s - t0);
    if (value == 1) put_double(v + 6 * slot + 4, e.end_s - t0);
  }
  comm.allreduce_sum(table, comm.world());
  std::vector<double> delays;
  for (std::size_t k = 0; k < slots; ++k) {
    const double sent = get_double(v + 6 * k), start = get_double(v + 6 * k + 2),
                 end = get_double(v + 6 * k + 4);
    if (end == 0) continue;  // no such message (the last stage sends no activation)
    if (start < sent) delays.push_back(end - sent);
  }
  r.delivered_while_waiting = static_cast<int>(delays.size());
  r.delivery_delay_s = median(delays);
}

bool is_stash(const std::string& schedule) {
  return schedule.rfind("1f1b-stash", 0) == 0;
}

// The schedule request of a run: 1f1b-stash steps after every microbatch (one per minibatch),
// the flush schedules accumulate o.microbatches per minibatch.
ScheduleRequest request_for(const std::string& name, const Options& o) {
  ScheduleRequest req;
  req.name = name;
  req.microbatches = is_stash(name) ? 1 : o.microbatches;
  return req;
}

// Trains `total` microbatches of the schedule (after a warm-up) on `comm` and returns the
// throughput measured on rank 0 between barriers, and every rank's time breakdown.
Run run_schedule(const ZooModel& z, const Options& o, const std::string& name,
                 const PipelineLayout& layout, Communicator& comm, const MinibatchFeed& feed,
                 const std::string& trace_path) {
  const ScheduleRequest req = request_for(name, o);
  const int m = req.microbatches;
  const int minibatches = o.samples_per_run / (o.batch * m);
  // 1f1b-stash steps a replicated stage once per round of its replicas' minibatches.
  const int granularity = minibatch_granularity(name, layout);
  const int warm_min = std::max(1, o.warmup_microbatches / m);
  const int warm = (warm_min + granularity - 1) / granularity * granularity;
  const Schedule warm_schedule = make_schedule(req, layout, warm);
  const Schedule schedule = make_schedule(req, layout, minibatches);
  ExecutorOptions eo;
  eo.seed = 1;
  eo.overlap_allreduce = o.overlap;
  StageExecutor warm_ex(z.model, z.sample_shape, z.input_dtype, layout, comm,
                        std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f}), eo);
  const LrFunction lr = [&](std::int64_t) { return static_cast<float>(o.lr); };
  warm_ex.train(warm_schedule, feed, 0, lr);
  eo.record_trace = true;
  StageExecutor ex(z.model, z.sample_shape, z.input_dtype, layout, comm,
                   std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f}), eo);
  ex.train(warm_schedule, feed, 0, lr);  // this executor's own buffers and code paths, warm
  comm.barrier();
  const auto t0 = Clock::now();
  const double cpu0 = bench::cpu_seconds();
  const long switches0 = involuntary_switches();
  const std::size_t first_event = ex.trace_events().size();
  ex.train(schedule, feed, warm, lr);
  comm.barrier();
  const double wall = seconds_since(t0);
  const double cpu = bench::cpu_seconds() - cpu0;
  const long switches = involuntary_switches() - switches0;
  Run r;
  r.samples_per_s = static_cast<double>(minibatches) * m * o.batch / wall;
  std::vector<TraceEvent> events(ex.trace_events().begin() + static_cast<long>(first_event),
                                 ex.trace_events().end());
  const RankBreakdown mine = breakdown(events, wall);
  Tensor all = Tensor::zeros(Shape{6 * comm.size()});
  float* v = all.data<float>();
  v[6 * comm.rank()] = static_cast<float>(mine.compute_s);
  v[6 * comm.rank() + 1] = static_cast<float>(mine.allreduce_s);
  v[6 * comm.rank() + 2] = static_cast<float>(mine.recv_wait_s);
  v[6 * comm.rank() + 3] = static_cast<float>(mine.other_s);
  v[6 * comm.rank() + 4] = static_cast<float>(cpu / wall);
  v[6 * comm.rank() + 5] = static_cast<float>(switches);
  comm.allreduce_sum(all, comm.world());
  for (int k = 0; k < comm.size(); ++k)
    r.ranks.push_back(
        {v[6 * k], v[6 * k + 1], v[6 * k + 2], v[6 * k + 3], v[6 * k + 4], v[6 * k + 5]});
  delivery_delays(comm, events, minibatches * m, r);
  if (!trace_path.empty())
    write_rank_trace(per_rank_path(trace_path, comm.rank(), comm.size()), events, schedule,
                     fmt::format("{} rank {} (measured)", name, comm.rank()));
  return r;
}

// One plan the job measures: replicas per stage, the split and what rank 0 timed of it.
struct Config {
  std::string name;
  std::vector<int> replicas;
  std::vector<int> bounds;
  Plan plan;
  PipelineLayout layout;
  std::vector<StepCost> steps;  // rank 0: per stage
};

int run_bench(const Options& o, Communicator& world) {
  const int P = world.size();
  set_num_threads(o.threads);
  ZooOptions zo;
  zo.width = o.width;
  ZooModel z = make_model(o.model, zo);
  PIPELINE_CHECK_AS(ConfigError, z.input_dtype == DType::Float32,
                    "bench_pipeline feeds synthetic images; '{}' takes token ids", o.model);
  PIPELINE_CHECK_AS(ConfigError, o.samples_per_run % (o.batch * o.microbatches) == 0,
                    "--samples-per-run {} must be a multiple of --batch x --microbatches = {}",
                    o.samples_per_run, o.batch * o.microbatches);

  // The configs of this job's size.
  std::vector<Config> configs;
  std::vector<std::string> skipped;
  if (o.configs.empty()) {
    configs.push_back({fmt::format("{}", fmt::join(std::vector<int>(P, 1), "-")),
                       std::vector<int>(P, 1),
                       {},
                       {},
                       {},
                       {}});
  }
  for (const std::string& text : o.configs) {
    std::vector<int> replicas = parse_config(text);
    if (std::accumulate(replicas.begin(), replicas.end(), 0) == P)
      configs.push_back({text, std::move(replicas), {}, {}, {}, {}});
    else
      skipped.push_back(text);
  }
  PIPELINE_CHECK_AS(ConfigError, !configs.empty(),
                    "none of --configs {} runs on {} ranks (the replicas must add up to the job's "
                    "size)",
                    o.configs, P);

  // 1. Profile, splits and step costs, on rank 0 while the others wait.
  Profile prof;
  std::string split_text;
  if (world.rank() == 0) {
    ProfileOptions po;
    po.warmup = 3;
    po.repeat = o.profile_repeat;
    po.split_backward = false;
    prof = profile(z, o.batch, Device::cpu(), po);
    for (Config& c : configs) {
      c.bounds = balanced_split(prof, c.replicas);
      for (std::size_t s = 0; s < c.replicas.size(); ++s)
        c.steps.push_back(time_step(z.model, {c.bounds[s], c.bounds[s + 1]}));
      split_text += fmt::format("{}{}", split_text.empty() ? "" : ";", fmt::join(c.bounds, ","));
    }
  }
  world.barrier();
  split_text = broadcast_string(world, split_text, 0);
  {
    std::size_t at = 0;
    for (Config& c : configs) {
      std::size_t end = split_text.find(';', at);
      if (end == std::string::npos) end = split_text.size();
      c.bounds.clear();
      for (std::size_t i = at; i < end;) {
        std::size_t comma = split_text.find(',', i);
        if (comma == std::string::npos || comma > end) comma = end;
        c.bounds.push_back(std::stoi(split_text.substr(i, comma - i)));
        i = comma + 1;
      }
      at = end + 1;
      c.plan = make_plan(o.model, c.bounds, c.replicas);
      c.layout = PipelineLayout::from_plan(c.plan, z.model);
    }
  }
  const Plan whole = make_plan(o.model, {0, z.model.size()}, {1});
  const PipelineLayout one = PipelineLayout::from_plan(whole, z.model);

  // 2. The link: the largest boundary activation of one microbatch over every config.
  std::int64_t boundary_bytes = 0;
  for (const Config& c : configs)
    for (std::size_t s = 1; s + 1 < c.bounds.size(); ++s)
      boundary_bytes = std::max<std::int64_t>(
          boundary_bytes,
          z.model.shapes(z.input_shape(o.batch), {0, c.bounds[s]}).back().numel() * 4);
  if (boundary_bytes == 0)  // data parallelism only: a message of the size of the input
    boundary_bytes = z.input_shape(o.batch).numel() * 4;
  const double one_way_s = ping_pong(world, boundary_bytes);
  world.barrier();
  // What a replica's core spends per byte of a peer's gradients, which the simulator charges to
  // the replicas of a replicated stage: a whole allreduce among the job's ranks, measured (their
  // cores move the bytes); beside it, the copy and sum alone, which rank 0 measures.
  const double allreduce_s_per_byte = allreduce_cost_per_byte(world);
  double copy_sum_s_per_byte = world.rank() == 0 ? reduce_cost_per_byte() : 0;
  {
    Tensor shared = Tensor::full(Shape{1}, static_cast<float>(copy_sum_s_per_byte * 1e12));
    world.allreduce_sum(shared, world.world());
    copy_sum_s_per_byte = static_cast<double>(shared.values()[0]) * 1e-12;
  }
  const double reduce_s_per_byte = std::max(allreduce_s_per_byte, copy_sum_s_per_byte);

  // The data: one synthetic minibatch, fed again for every minibatch (its values do not change
  // the time of a float model).
  const int mb_samples_max = o.batch * o.microbatches;
  SyntheticDataset data(z.sample_shape, static_cast<int>(z.num_classes), mb_samples_max, 3);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(mb_samples_max));
  std::iota(idx.begin(), idx.end(), 0);
  const Batch full = data.get(idx);

  std::unique_ptr<MpiCommunicator> self;
  if (world.rank() == 0) self = std::make_unique<MpiCommunicator>(MPI_COMM_SELF);

  struct Row {
    std::size_t config = 0;
    std::string schedule;
    std::vector<double> single, pipelined;
    std::vector<std::vector<RankBreakdown>> ranks;
    std::vector<double> delay;
    std::vector<int> delivered;
  };
  std::vector<Row> rows;
  for (std::size_t c = 0; c < configs.size(); ++c)
    for (const std::string& name : o.schedules) rows.push_back({c, name, {}, {}, {}, {}, {}});
  for (int rep = 0; rep < o.repeat; ++rep) {
    for (Row& row : rows) {
      const Config& cfg = configs[row.config];
      const std::string& name = row.schedule;
      const std::int64_t mb_samples = is_stash(name) ? o.batch : mb_samples_max;
      const Batch b = full.slice(0, mb_samples);
      const MinibatchFeed feed{[b](std::int64_t) { return b; },
                               [mb_samples](std::int64_t) { return mb_samples; }};
      const bool last_rep = rep + 1 == o.repeat;
      std::string trace;
      if (!o.trace.empty() && last_rep) {
        std::filesystem::create_directories(o.trace);
        trace = fmt::format("{}/{}.{}.json", o.trace, cfg.name, name);
      }
      if (world.rank() == 0) {
        Run r = run_schedule(z, o, name, one, *self, feed,
                             trace.empty() ? "" : fmt::format("{}/{}.1rank.json", o.trace, name));
        row.single.push_back(r.samples_per_s);
      }
      world.barrier();
      if (P > 1) {
        Run r = run_schedule(z, o, name, cfg.layout, world, feed, trace);
        row.pipelined.push_back(r.samples_per_s);
        row.ranks.push_back(r.ranks);
        row.delay.push_back(r.delivery_delay_s);
        row.delivered.push_back(r.delivered_while_waiting);
      }
      world.barrier();
    }
  }
  if (world.rank() != 0) return 0;

  // 4. Predictions and the table.
  Topology topo;
  if (P > 1 && one_way_s > 0)
    topo.levels.push_back({P, static_cast<double>(boundary_bytes) / one_way_s});
  auto predict = [&](const std::string& name, const Plan& pl, const PipelineLayout& lay,
                     const std::vector<StepCost>& steps, const std::string& trace_path) {
    const ScheduleRequest req = request_for(name, o);
    const Schedule s = make_schedule(req, lay, o.samples_per_run / (o.batch * req.microbatches));
    double step_s = 0, copy_s = 0;
    for (const StepCost& c : steps) {
      step_s = std::max(step_s, c.step_s);
      copy_s = std::max(copy_s, c.copy_s);
    }
    SimulateOptions so;
    so.microbatch_size = o.batch;
    so.full_duplex = true;
    // A stash step copies the weights when an in-flight microbatch still holds them (every
    // stage but the last of a pipeline); one stage never has another microbatch in flight.
    so.optimizer_step_s = step_s + (is_stash(name) && lay.num_stages() > 1 ? copy_s : 0);
    // The executor's allreduce: buckets overlapping the backward, of its default size.
    so.overlap_allreduce = o.overlap;
    so.allreduce_bucket_bytes = ExecutorOptions{}.allreduce_bucket_bytes;
    so.allreduce_cpu_s_per_byte = reduce_s_per_byte;
    so.record_trace = !trace_path.empty();
    const Simulation sim = simulate(s, prof, pl, lay.num_ranks() > 1 ? topo : Topology{}, so);
    if (!trace_path.empty()) write_chrome_trace(trace_path, sim, s);
    return o.samples_per_run / sim.makespan_s;
  };
  const StepCost whole_step = time_step(z.model, {0, z.model.size()});

  std::string stages;
  for (const Config& c : configs) {
    double slowest = 0, fastest = std::numeric_limits<double>::infinity();
    for (std::size_t s = 0; s < c.replicas.size(); ++s) {
      const double t = range_time(prof, c.bounds[s], c.bounds[s + 1]) / c.replicas[s];
      slowest = std::max(slowest, t);
      fastest = std::min(fastest, t);
    }
    stages += fmt::format(
        "config {}: {} stage(s), slowest stage over its replicas / fastest = "
        "{:.3f}\n",
        c.name, c.replicas.size(), slowest / fastest);
    for (std::size_t s = 0; s < c.replicas.size(); ++s) {
      const int b0 = c.bounds[s], b1 = c.bounds[s + 1];
      std::int64_t param_bytes = 0;
      for (int l = b0; l < b1; ++l)
        param_bytes += prof.layers[static_cast<std::size_t>(l)].parameter_bytes;
      stages += fmt::format(
          "  stage {}: layers [{}, {}) {}-{} on {} replica(s), {:.2f} ms fwd+bwd per microbatch, "
          "{:.2f} MB of gradients, step {:.3f} ms, weight copy {:.3f} ms\n",
          s, b0, b1, z.model.layer(b0).name(), z.model.layer(b1 - 1).name(), c.replicas[s],
          1e3 * range_time(prof, b0, b1), 1e-6 * static_cast<double>(param_bytes),
          1e3 * c.steps[s].step_s, 1e3 * c.steps[s].copy_s);
    }
  }
  std::string header = fmt::format(
      "bench_pipeline: {} (width {}), microbatches of {} samples, {} samples per run, {} thread(s) "
      "per rank, {} ranks, {} repeat(s); {}, load average {} at the end, {:%Y-%m-%d %H:%M}\n"
      "profile: {} layers, whole model {:.2f} ms fwd+bwd per microbatch\n{}{}"
      "link: {} bytes one way in {:.1f} us (ping-pong), simulated at {:.2f} GB/s full duplex "
      "(activations and allreduce buckets of {} MiB, {}); gradient allreduce {:.3f} ns/byte of "
      "each replica's core (a blocking 16 MiB allreduce over the ranks; the copy and sum alone "
      "{:.3f})\n"
      "flush schedules: {} microbatches per minibatch (bubble bound on the speedup of P stages "
      "P*m/(m+P-1) = {:.2f}); 1f1b-stash: 1 microbatch per minibatch\n",
      o.model, o.width, o.batch, o.samples_per_run, o.threads, P, o.repeat, bench::cpu_name(),
      bench::load_average(), fmt::localtime(std::time(nullptr)), prof.size(),
      1e3 * range_time(prof, 0, prof.size()), stages,
      skipped.empty() ? std::string()
                      : fmt::format("skipped (not {} ranks): {}\n", P, fmt::join(skipped, ", ")),
      boundary_bytes, 1e6 * one_way_s,
      one_way_s > 0 ? 1e-9 * static_cast<double>(boundary_bytes) / one_way_s : 0.0,
      ExecutorOptions{}.allreduce_bucket_bytes >> 20,
      o.overlap ? "overlapping the backward" : "no overlap: one allreduce at AR (--no-overlap)",
      1e9 * reduce_s_per_byte, 1e9 * copy_sum_s_per_byte,
      o.microbatches, static_cast<double>(P) * o.microbatches / (o.microbatches + P - 1));

  auto spread = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("-");
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return fmt::format("{:.0f}-{:.0f}", *lo, *hi);
  };
  std::string table =
      "| config | schedule | ranks | measured samples/s (median) | spread (min-max) | predicted "
      "samples/s | measured/predicted | speedup over 1 rank, median of the repetitions' ratios "
      "(min-max) |\n"
      "|---|---|---|---|---|---|---|---|\n";
  std::string detail;
  std::vector<std::string> single_done;
  for (const Row& row : rows) {
    const Config& cfg = configs[row.config];
    const std::string& name = row.schedule;
    const double single = median(row.single);
    const double pred1 =
        predict(name, whole, one, {whole_step},
                o.trace.empty() ? "" : fmt::format("{}/{}.1rank.sim.json", o.trace, name));
    if (std::find(single_done.begin(), single_done.end(), name) == single_done.end()) {
      table += fmt::format("| 1 | {} | 1 | {:.0f} | {} | {:.0f} | {:.3f} | 1 |\n", name, single,
                           spread(row.single), pred1, single / pred1);
      single_done.push_back(name);
    }
    if (P == 1) continue;
    const double piped = median(row.pipelined);
    const double predP =
        predict(name, cfg.plan, cfg.layout, cfg.steps,
                o.trace.empty() ? "" : fmt::format("{}/{}.{}.sim.json", o.trace, cfg.name, name));
    // Each repetition's P-rank run divided by the 1-rank run just before it: a burst of load
    // from other programs then spoils one ratio, not the medians of both columns.
    std::vector<double> ratios;
    for (std::size_t i = 0; i < row.pipelined.size(); ++i)
      ratios.push_back(row.pipelined[i] / row.single[i]);
    auto [rlo, rhi] = std::minmax_element(ratios.begin(), ratios.end());
    // The P-rank ratio over the 1-rank one: what remains when the profile's own error, which
    // both predictions share, is divided out — the simulator's model of the schedule.
    table += fmt::format(
        "| {} | {} | {} | {:.0f} | {} | {:.0f} | {:.3f} ({:.3f} of the 1-rank ratio) | {:.2f}x "
        "({:.2f}-{:.2f}) |\n",
        cfg.name, name, P, piped, spread(row.pipelined), predP, piped / predP,
        (piped / predP) / (single / pred1), median(ratios), *rlo, *rhi);
    // The breakdown of the run with the median throughput.
    std::vector<std::size_t> order(row.pipelined.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](auto a, auto b) { return row.pipelined[a] < row.pipelined[b]; });
    const std::size_t mid = order[order.size() / 2];
    const auto& br = row.ranks[mid];
    detail += fmt::format(
        "  {} {}: {} messages arrived while their receiver waited; median delay "
        "from the send's post to the end of the wait {:.1f} us\n",
        cfg.name, name, row.delivered[mid], 1e6 * row.delay[mid]);
    for (int r = 0; r < P; ++r)
      detail += fmt::format(
          "  {} {} rank {}: compute {:.3f} s, allreduce waits {:.3f} s, waiting in receives "
          "{:.3f} s, other {:.3f} s; CPU time / wall {:.2f}, {:.0f} involuntary context "
          "switches\n",
          cfg.name, name, r, br[static_cast<std::size_t>(r)].compute_s,
          br[static_cast<std::size_t>(r)].allreduce_s, br[static_cast<std::size_t>(r)].recv_wait_s,
          br[static_cast<std::size_t>(r)].other_s, br[static_cast<std::size_t>(r)].cpu_share,
          br[static_cast<std::size_t>(r)].preempted);
  }
  std::string out = header + table;
  if (P > 1) out += "per-rank time of the median P-rank run (executor trace):\n" + detail;
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  if (!o.results.empty() && !bench::append_results(o.results, "", out)) return 1;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Pipelined training throughput against one rank, and the simulator's prediction"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // later wins
  app.add_option("--model", o.model, "zoo model with float inputs")->capture_default_str();
  app.add_option("--width", o.width, "the zoo's width multiplier")->capture_default_str();
  app.add_option("--batch", o.batch, "samples per microbatch")->check(CLI::Range(1, 65536));
  app.add_option("--microbatches", o.microbatches, "microbatches per minibatch (flush schedules)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--samples-per-run", o.samples_per_run, "samples trained per timed run")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--threads", o.threads, "threads per rank")->check(CLI::Range(1, 1024));
  app.add_option("--repeat", o.repeat, "timed runs per schedule")->check(CLI::Range(1, 1000));
  app.add_option("--warmup-microbatches", o.warmup_microbatches)->check(CLI::Range(1, 1 << 20));
  app.add_option("--profile-repeat", o.profile_repeat)->check(CLI::Range(1, 10000));
  app.add_option("--schedules", o.schedules, "schedules to run")->delimiter(',');
  app.add_option("--configs", o.configs,
                 "plans to run, replicas per stage joined by '-' (2, 1-1, 2-1, ...); those whose "
                 "replicas do not add up to the job's ranks are skipped (default: one stage per "
                 "rank)")
      ->delimiter(',');
  app.add_flag("!--no-overlap", o.overlap,
               "replicated stages reduce all gradients at the AR action, not in buckets during "
               "the backward (runtime and simulator)");
  app.add_option("--trace", o.trace, "write measured and simulated Chrome traces into this folder");
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
