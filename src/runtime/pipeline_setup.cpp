// Plan, schedule and trace set-up of a pipelined run.
#include <pipeline/runtime/pipeline_setup.hpp>

#include <pipeline/core/log.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/profile/profile_json.hpp>
#include <pipeline/profile/profiler.hpp>
#include <pipeline/schedule/csv.hpp>
#include <pipeline/schedule/dealing.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/trace.hpp>
#include <pipeline/schedule/validate.hpp>

#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace pipeline {

int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  return 1;
}

std::string broadcast_string(Communicator& comm, const std::string& text, int root) {
  // Length first, then the bytes packed four to an int32.
  const int me = comm.rank();
  Tensor len = Tensor::from_ints(Shape{1}, {static_cast<std::int32_t>(text.size())});
  if (me == root) {
    PIPELINE_CHECK(text.size() < (1u << 30), "broadcast of {} bytes is too large", text.size());
    const std::int64_t words = (static_cast<std::int64_t>(text.size()) + 3) / 4;
    Tensor body = Tensor::zeros(Shape{std::max<std::int64_t>(words, 1)}, DType::Int32);
    std::memcpy(body.raw(), text.data(), text.size());
    std::vector<Request> sends;
    for (int r = 0; r < comm.size(); ++r) {
      if (r == root) continue;
      sends.push_back(comm.isend(len, r, Tag::control(0, 0)));
      sends.push_back(comm.isend(body, r, Tag::control(0, 1)));
    }
    wait_all(sends);
    return text;
  }
  comm.recv(len, root, Tag::control(0, 0));
  const std::int64_t n = len.data<std::int32_t>()[0];
  PIPELINE_CHECK(n >= 0, "broadcast: negative length {}", n);
  Tensor body = Tensor::empty(Shape{std::max<std::int64_t>((n + 3) / 4, 1)}, DType::Int32);
  comm.recv(body, root, Tag::control(0, 1));
  return std::string(static_cast<const char*>(body.raw()), static_cast<std::size_t>(n));
}

void check_plan_for_job(const Plan& plan, const Sequential& model, int world_size) {
  PIPELINE_CHECK_AS(ConfigError, plan.workers == world_size,
                    "the plan is for {} workers but the job has {} ranks: run it with mpirun -np "
                    "{}, or partition the model for {} workers{}",
                    plan.workers, world_size, plan.workers, world_size,
                    world_size == 1 ? ", or run all its stages in this process (the trainers' "
                                      "--in-process)"
                                    : "");
  PipelineLayout layout = PipelineLayout::from_plan(plan, model);
  PIPELINE_CHECK_AS(ConfigError, layout.num_ranks() == world_size,
                    "the plan's stages use {} ranks but the job has {}", layout.num_ranks(),
                    world_size);
}

void check_plan_for_job(const Plan& plan, const ZooModel& model, int world_size) {
  if (plan.model == model.model.name())
    if (const auto d = first_difference(plan.architecture, model.architecture))
      PIPELINE_FAIL(ConfigError,
                    "the plan was made for {} with {} but this run builds it with {}: train with "
                    "{}, or profile and partition the model this run trains (pipeline-profile, "
                    "then pipeline-partition)",
                    plan.model, d->recorded_flags, d->our_flags, d->recorded_flags);
  check_plan_for_job(plan, model.model, world_size);
}

Plan auto_plan(const ZooModel& model, Communicator& comm, const AutoPlanOptions& options,
               Profile* profile_out) {
  std::string text, profile_text;
  const bool flush = plans_flush(options.schedule);
  const int microbatches = flush || plans_interleaved(options.schedule) ? options.microbatches : 1;
  PIPELINE_CHECK_AS(ConfigError, microbatches >= 1 && options.batch % microbatches == 0,
                    "planning for {} runs a minibatch of {} samples as {} microbatches, which must "
                    "divide it: give --microbatches a divisor of --batch (or a --plan)",
                    options.schedule, options.batch, microbatches);
  if (comm.rank() == 0) {
    // Rank 0 alone profiles, so the other ranks do not disturb its timings and every rank
    // ends up with the same plan.
    ProfileOptions po;
    po.repeat = std::max(1, options.profile_repeat);
    po.warmup = 1;
    po.compute_dtype = options.compute_dtype;
    Profile profile = pipeline::profile(model, options.batch / microbatches, Device::cpu(), po);
    Topology topo;
    topo.levels.push_back({comm.size(), options.bandwidth_bytes_per_s});
    PartitionOptions part;
    part.allow_idle = false;
    part.optimizer_state_factor = options.optimizer_state_factor;
    part.optimizer = options.optimizer;
    set_transfer_dtype(part, options.transfer_dtype);
    if (flush) {
      part.schedule = options.schedule;
      part.microbatches = microbatches;
    } else if (plans_interleaved(options.schedule)) {
      // Two stages per rank, looped or (zb-v) in a V, for the run's microbatches.
      part.virtual_stages = 2;
      if (options.schedule == "zb-v") part.placement = StagePlacement::V;
      part.microbatches = microbatches;
    }
    Plan plan = partition(profile, topo, part);
    plan.model = model.model.name();
    text = plan_to_json(plan).dump();
    if (profile_out != nullptr) profile_text = profile_to_json(profile).dump();
  }
  text = broadcast_string(comm, text, 0);
  if (profile_out != nullptr)
    *profile_out = profile_from_json(nlohmann::json::parse(broadcast_string(comm, profile_text, 0)),
                                     "the partitioner's profile");
  return plan_from_json(nlohmann::json::parse(text), "the partitioner's plan");
}

int minibatch_granularity(const std::string& schedule_name, const PipelineLayout& layout) {
  if (!stashes_weights(schedule_name)) return 1;
  int l = 1;
  for (auto& r : layout.stage_ranks) l = std::lcm(l, static_cast<int>(r.size()));
  return l;
}

void take_plan_hints(ScheduleRequest& request, const Plan& plan) {
  static_cast<ScheduleHints&>(request) = ScheduleSpec::from_plan(plan, request.microbatches);
}

Schedule make_schedule(const ScheduleRequest& request, const PipelineLayout& layout,
                       int minibatches) {
  Schedule s;
  if (!request.csv.empty()) {
    s = read_schedule_csv(request.csv);
  } else {
    ScheduleSpec spec;
    static_cast<ScheduleHints&>(spec) = request;
    spec.stage_ranks = layout.stage_ranks;
    spec.microbatches = request.microbatches;
    spec.minibatches = minibatches;
    spec.vertical_sync = request.vertical_sync;
    s = request.seconds_per_rank.empty()
            ? generate_schedule(request.name, spec)
            : schedule_by_speed(request.name, spec, request.seconds_per_rank);
  }
  PIPELINE_CHECK_AS(ConfigError, s.stage_ranks == layout.stage_ranks,
                    "schedule '{}' places stages on ranks {} but the plan has {}: write the "
                    "schedule for this plan",
                    s.name, s.stage_ranks, layout.stage_ranks);
  validate(s);
  return s;
}

std::string per_rank_path(const std::string& path, int rank, int world_size) {
  if (world_size <= 1) return path;
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
    return fmt::format("{}.rank{}", path, rank);
  return fmt::format("{}.rank{}{}", path.substr(0, dot), rank, path.substr(dot));
}

void write_rank_trace(const std::string& path, const std::vector<TraceEvent>& events,
                      const Schedule& schedule, const std::string& title) {
  Simulation sim;
  sim.schedule = title;
  sim.events = events;
  if (!events.empty()) {
    double first = events.front().start_s, last = events.front().end_s;
    for (auto& e : events) {
      first = std::min(first, e.start_s);
      last = std::max(last, e.end_s);
    }
    sim.makespan_s = last - first;
  }
  write_chrome_trace(path, sim, schedule);
}

}  // namespace pipeline
