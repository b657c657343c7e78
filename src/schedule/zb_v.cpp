// ZB-V: a V pipeline's F, I and W actions in the order of plan/zb_v_order.hpp.
#include <pipeline/plan/interleaved_layout.hpp>
#include <pipeline/plan/zb_v_order.hpp>
#include <pipeline/schedule/schedules/zb_v.hpp>

#include <map>
#include <utility>

namespace pipeline {

namespace {

// The times the order is built on: thirds of a replica's stage_seconds (a microbatch's whole
// time on a replica; stage_seconds is its time over the replicas), with the spec's messages.
StagePassTimes order_times(const ScheduleSpec& spec, const InterleavedShape& shape) {
  std::vector<double> seconds = spec.stage_seconds;
  for (double& s : seconds) s *= shape.replicas;
  return v_times_in_thirds(shape.positions, seconds, spec.input_message_seconds);
}

}  // namespace

Schedule zero_bubble_v_schedule(const ScheduleSpec& spec) {
  const std::string name = "zb-v";
  check_spec(spec, /*one_stage_per_rank=*/false);
  detail::require_round_robin(spec, name);
  const InterleavedShape shape = interleaved_shape(spec.stage_ranks);
  PIPELINE_CHECK_AS(ConfigError, shape.placement == StagePlacement::V,
                    "zb-v runs a V-shape layout (2 stages per rank, stage k and 2p - 1 - k on rank "
                    "k; pipeline-partition --stage-placement v plans one), but these "
                    "{} stages on {} ranks per pipeline are {} with {} stages per rank{}",
                    spec.num_stages(), shape.positions, to_string(shape.placement),
                    shape.stages_per_rank,
                    shape.stages_per_rank == 2 ? "; run it with interleaved-1f1b" : "");
  const int p = shape.positions, replicas = shape.replicas;
  PIPELINE_CHECK_AS(ConfigError, spec.microbatches >= replicas,
                    "zb-v deals microbatches round-robin to its {} pipelines, so a minibatch needs "
                    "at least {} microbatches; got {}",
                    replicas, replicas, spec.microbatches);
  Schedule sched = detail::empty_schedule(spec, name, UpdatePolicy::Flush);
  const StagePassTimes times = order_times(spec, shape);
  std::map<int, PassOrder> orders;  // by microbatches per pipeline
  for (int pipe = 0; pipe < replicas; ++pipe)
    for (int j = 0; j < spec.minibatches; ++j) {
      // This pipeline's microbatches of the minibatch (round-robin: pipe, pipe + r, ...).
      const std::vector<int> mbs =
          detail::replica_microbatches(spec, 0, pipe, j * spec.microbatches, spec.microbatches);
      const int m = static_cast<int>(mbs.size());
      auto it = orders.find(m);
      if (it == orders.end()) it = orders.emplace(m, zero_bubble_v_order(p, m, times)).first;
      for (int r = 0; r < p; ++r) {
        auto& out = sched.ranks[static_cast<std::size_t>(spec.stage_ranks[r][pipe])];
        const auto& mine = it->second[static_cast<std::size_t>(r)];
        // Room for the communication too, which insert_communication adds in place.
        if (j == 0)
          out.reserve(static_cast<std::size_t>(spec.minibatches) * (mine.size() * 7 / 3 + 4));
        for (const StagePass& a : mine)
          out.push_back(
              {action_kind(a.kind), a.stage, mbs[static_cast<std::size_t>(a.microbatch)], -1});
        const int stages_of_rank[] = {r, 2 * p - 1 - r};
        if (replicas > 1)
          for (int s : stages_of_rank) out.push_back({ActionKind::AllReduce, s, j, -1});
        for (int s : stages_of_rank) out.push_back({ActionKind::Step, s, j, -1});
      }
    }
  insert_communication(sched);
  return sched;
}

}  // namespace pipeline
