// Built-in schedule generators (GPipe, 1F1B flush and stash), the registry, and the insertion of
// point-to-point communication.
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/straight_order.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/schedules/gpipe.hpp>
#include <pipeline/schedule/schedules/interleaved.hpp>
#include <pipeline/schedule/schedules/one_f_one_b.hpp>
#include <pipeline/schedule/schedules/two_buffered.hpp>
#include <pipeline/schedule/schedules/zb_v.hpp>
#include <pipeline/schedule/schedules/zero_bubble.hpp>
#include <pipeline/schedule/validate.hpp>

#include "engine.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

namespace pipeline {

int ScheduleSpec::num_ranks() const {
  int n = 0;
  for (auto& s : stage_ranks)
    for (int r : s) n = std::max(n, r + 1);
  return n;
}

ScheduleSpec ScheduleSpec::straight(int stages, int microbatches, int minibatches) {
  PIPELINE_CHECK_AS(ConfigError, stages > 0, "a pipeline needs at least one stage, got {}", stages);
  ScheduleSpec s;
  for (int i = 0; i < stages; ++i) s.stage_ranks.push_back({i});
  s.microbatches = microbatches;
  s.minibatches = minibatches;
  return s;
}

ScheduleSpec ScheduleSpec::interleaved(int ranks, int stages_per_rank, int microbatches,
                                       int minibatches, int replicas) {
  ScheduleSpec s;
  s.stage_ranks = interleaved_stage_ranks(ranks, stages_per_rank, replicas, StagePlacement::Looped);
  s.microbatches = microbatches;
  s.minibatches = minibatches;
  return s;
}

ScheduleSpec ScheduleSpec::v_shape(int ranks, int microbatches, int minibatches, int replicas) {
  ScheduleSpec s;
  s.stage_ranks = interleaved_stage_ranks(ranks, 2, replicas, StagePlacement::V);
  s.microbatches = microbatches;
  s.minibatches = minibatches;
  return s;
}

ScheduleSpec ScheduleSpec::from_plan(const Plan& plan, int microbatches, int minibatches) {
  if (plan.interleaved()) {
    // v·p stages, stage k on the ranks of the stage at its place (looped or V; plan_from_json
    // checks that plan.json says so); plans written by hand may leave the ranks out: pipeline j
    // then holds ranks j·p .. j·p + p − 1, looped.
    const int v = plan.virtual_stages;
    PIPELINE_CHECK_AS(ConfigError, plan.num_stages() % v == 0,
                      "an interleaved plan of {} stages per rank has {} stages, not a multiple "
                      "of {}",
                      v, plan.num_stages(), v);
    ScheduleSpec s = interleaved(plan.num_stages() / v, v, microbatches, minibatches,
                                 plan.stages.front().replicas);
    for (int k = 0; k < plan.num_stages(); ++k)
      if (!plan.stages[k].ranks.empty()) s.stage_ranks[k] = plan.stages[k].ranks;
    const InterleavedShape shape = interleaved_shape(s.stage_ranks);
    PIPELINE_CHECK_AS(ConfigError, shape.stages_per_rank == v,
                      "the interleaved plan says {} stages per rank but its {} stages run on {} "
                      "ranks per pipeline",
                      v, plan.num_stages(), shape.positions);
    s.stage_seconds = plan.stage_seconds();
    for (auto& st : plan.stages) s.input_message_seconds.push_back(st.input_message_s);
    s.microbatch_group = plan.microbatch_group;
    return s;
  }
  ScheduleSpec s;
  int next = 0;
  for (auto& st : plan.stages) {
    std::vector<int> ranks = st.ranks;
    // Plans written by hand may leave ranks out: replicas are then consecutive ranks in order.
    if (ranks.empty())
      for (int i = 0; i < st.replicas; ++i) ranks.push_back(next + i);
    next += static_cast<int>(ranks.size());
    s.stage_ranks.push_back(std::move(ranks));
  }
  s.microbatches = microbatches;
  s.minibatches = minibatches;
  s.in_flight = plan.in_flight > 1 ? plan.in_flight : 0;
  for (auto& st : plan.stages) {
    s.stage_in_flight.push_back(st.in_flight);
    s.stage_may_delay.push_back(st.delay_allreduce);
  }
  s.stage_seconds = plan.stage_seconds();
  for (auto& st : plan.stages) s.input_message_seconds.push_back(st.input_message_s);
  return s;
}

void check_spec(const ScheduleSpec& spec, bool one_stage_per_rank) {
  PIPELINE_CHECK_AS(ConfigError, !spec.stage_ranks.empty(), "the schedule has no stages");
  PIPELINE_CHECK_AS(ConfigError, spec.microbatches > 0,
                    "microbatches per minibatch must be positive, got {}", spec.microbatches);
  PIPELINE_CHECK_AS(ConfigError, spec.minibatches > 0, "minibatches must be positive, got {}",
                    spec.minibatches);
  PIPELINE_CHECK_AS(ConfigError, spec.in_flight >= 0, "in_flight must be >= 0, got {}",
                    spec.in_flight);
  int workers = spec.num_ranks();
  std::vector<int> owner(static_cast<std::size_t>(workers), -1);
  for (int s = 0; s < spec.num_stages(); ++s) {
    PIPELINE_CHECK_AS(ConfigError, !spec.stage_ranks[s].empty(), "stage {} has no ranks", s);
    for (int r : spec.stage_ranks[s]) {
      PIPELINE_CHECK_AS(ConfigError, r >= 0, "stage {} lists negative rank {}", s, r);
      PIPELINE_CHECK_AS(ConfigError, owner[r] < 0 || (!one_stage_per_rank && owner[r] != s),
                        "rank {} is listed by stage {} and stage {}; each rank runs one stage", r,
                        owner[r], s);
      if (owner[r] >= 0) continue;
      owner[r] = s;
    }
  }
  for (int r = 0; r < workers; ++r)
    PIPELINE_CHECK_AS(ConfigError, owner[r] >= 0,
                      "rank {} belongs to no stage; ranks must be 0..{} without gaps", r,
                      workers - 1);
  PIPELINE_CHECK_AS(ConfigError, spec.dealing.size() <= spec.stage_ranks.size(),
                    "the dealing names {} stages but the schedule has {}", spec.dealing.size(),
                    spec.stage_ranks.size());
  const std::int64_t units = std::int64_t{spec.microbatches} * spec.minibatches;
  for (std::size_t s = 0; s < spec.dealing.size(); ++s) {
    const auto& d = spec.dealing[s];
    if (d.empty()) continue;
    PIPELINE_CHECK_AS(ConfigError, static_cast<std::int64_t>(d.size()) == units,
                      "the dealing of stage {} gives {} microbatches a replica but the run has {} "
                      "({} per minibatch x {} minibatches)",
                      s, d.size(), units, spec.microbatches, spec.minibatches);
    const int r = static_cast<int>(spec.stage_ranks[s].size());
    for (std::size_t u = 0; u < d.size(); ++u)
      PIPELINE_CHECK_AS(ConfigError, d[u] >= 0 && d[u] < r,
                        "the dealing gives microbatch {} of stage {} to replica {}, but the stage "
                        "has replicas 0..{}",
                        u, s, d[u], r - 1);
  }
}

namespace detail {

int one_f_one_b_warmup(const ScheduleSpec& spec, int stage) {
  int before = 0;
  for (int s = 0; s < stage; ++s) before += static_cast<int>(spec.stage_ranks[s].size());
  int replicas = static_cast<int>(spec.stage_ranks[stage].size());
  return std::max(0, (spec.num_ranks() - 1 - before) / replicas);
}

namespace {

// capped_warmups (plan/straight_order.hpp) from PipeDream's depths, the stages' in-flight counts
// and spec.in_flight.
std::vector<int> capped_warmups(const ScheduleSpec& spec, bool deepen) {
  std::vector<int> warmups;
  for (int s = 0; s < spec.num_stages(); ++s) warmups.push_back(one_f_one_b_warmup(spec, s));
  return pipeline::capped_warmups(std::move(warmups), spec.stage_in_flight, deepen, spec.in_flight);
}

}  // namespace

std::vector<int> stash_warmups(const ScheduleSpec& spec) {
  return capped_warmups(spec, false);
}

std::vector<int> planned_warmups(const ScheduleSpec& spec) {
  return capped_warmups(spec, true);
}

void require_round_robin(const ScheduleSpec& spec, const std::string& schedule) {
  for (std::size_t s = 0; s < spec.dealing.size(); ++s)
    PIPELINE_CHECK_AS(ConfigError, spec.dealing[s].empty(),
                      "{} deals microbatches to the replicas of a stage round-robin (its weight "
                      "versions and allreduces depend on it), so it cannot follow the dealing "
                      "given for stage {}; deal by speed with a flush schedule (gpipe, 1f1b-flush, "
                      "zb-h1)",
                      schedule, s);
}

std::vector<int> replica_microbatches(const ScheduleSpec& spec, int stage, int replica, int first,
                                      int count) {
  const int r = static_cast<int>(spec.stage_ranks[stage].size());
  const bool dealt =
      static_cast<std::size_t>(stage) < spec.dealing.size() && !spec.dealing[stage].empty();
  std::vector<int> out;
  if (!dealt) {  // round robin: every r-th unit (a scan of every unit per replica was quadratic)
    for (int u = first + ((replica - first) % r + r) % r; u < first + count; u += r)
      out.push_back(u);
    return out;
  }
  for (int u = first; u < first + count; ++u)
    if (spec.dealing[stage][static_cast<std::size_t>(u)] == replica) out.push_back(u);
  return out;
}

Schedule empty_schedule(const ScheduleSpec& spec, std::string name, UpdatePolicy policy) {
  Schedule s;
  s.name = std::move(name);
  s.policy = policy;
  s.vertical_sync = spec.vertical_sync;
  s.microbatches = spec.microbatches;
  s.minibatches = spec.minibatches;
  s.stage_ranks = spec.stage_ranks;
  s.dealing = spec.dealing;
  s.ranks.resize(static_cast<std::size_t>(spec.num_ranks()));
  return s;
}

}  // namespace detail

namespace {

bool has_replicated_stage(const ScheduleSpec& spec) {
  return std::any_of(spec.stage_ranks.begin(), spec.stage_ranks.end(),
                     [](const auto& r) { return r.size() > 1; });
}

// Whether the spec deals some stage's microbatches other than round-robin.
bool deals_by_list(const ScheduleSpec& spec) {
  return std::any_of(spec.dealing.begin(), spec.dealing.end(),
                     [](const auto& d) { return !d.empty(); });
}

// The same for a dealing other than round-robin, where a replica's share of the microbatches is
// uneven: before the backward of microbatch u, the forwards of all its microbatches up to
// u + depth (global numbers). With a depth that never rises along the pipeline, a stage that
// waits for the gradient of u has already sent every activation the next stage needs for its
// own backward of u, so no dealing deadlocks. The flush schedules use the depth of round-robin
// dealing, warm-up x replicas: floor((ranks after the stage's first - 1) / r) r falls by at
// least one per stage, and on round-robin dealing it gives the warm-ups above.
std::vector<int> forwards_before_by_depth(const std::vector<int>& mbs, int depth) {
  std::vector<int> out(mbs.size());
  std::size_t f = 0;
  for (std::size_t k = 0; k < mbs.size(); ++k) {
    f = std::max(f, k + 1);
    while (f < mbs.size() && mbs[f] <= mbs[k] + depth) ++f;
    out[k] = static_cast<int>(f);
  }
  return out;
}

// Forwards and backwards (oldest first) of `mbs`, with `before[k]` forwards run before the k-th
// backward (forwards_before, plan/straight_order.hpp). `after_backward` runs after each backward
// (the stash schedules step there).
template <typename AfterBackward>
void one_f_one_b_order(std::vector<Action>& out, int stage, const std::vector<int>& mbs,
                       const std::vector<int>& before, AfterBackward&& after_backward) {
  one_f_one_b_passes(mbs, before, [&](PassKind kind, int u) {
    out.push_back({action_kind(kind), stage, u, -1});
    if (kind == PassKind::Backward) after_backward();
  });
}

template <typename AfterBackward>
void one_f_one_b_order(std::vector<Action>& out, int stage, const std::vector<int>& mbs, int warmup,
                       AfterBackward&& after_backward) {
  one_f_one_b_order(out, stage, mbs, forwards_before(mbs.size(), warmup), after_backward);
}

// ZB-H1's order (zero_bubble_passes, plan/straight_order.hpp) as actions.
void zero_bubble_order(std::vector<Action>& out, int stage, const std::vector<int>& mbs,
                       const std::vector<int>& before, int lag) {
  zero_bubble_passes(mbs, before, lag, [&](PassKind kind, int u) {
    out.push_back({action_kind(kind), stage, u, -1});
  });
}

// Actions of one replica of `stage`, communication included: per microbatch a forward and a
// backward with a receive and a send each, and a step (after an allreduce when replicated) per
// minibatch (flush) or per backward (stash).
// A split backward (I and W) makes that seven actions per microbatch.
std::size_t compute_capacity(const ScheduleSpec& spec, int stage, bool step_per_backward = false,
                             bool split_backward = false) {
  const std::size_t r = spec.stage_ranks[static_cast<std::size_t>(stage)].size();
  const std::size_t units =
      static_cast<std::size_t>(spec.microbatches) * static_cast<std::size_t>(spec.minibatches);
  const std::size_t mine = (units + r - 1) / r;
  const std::size_t closing = r > 1 ? 2 : 1;  // the allreduce (replicated stages) and the step
  return (split_backward ? 7 : 6) * mine +
         closing * (step_per_backward ? mine : static_cast<std::size_t>(spec.minibatches));
}

void close_minibatch(std::vector<Action>& out, int stage, int replicas, int minibatch) {
  if (replicas > 1) out.push_back({ActionKind::AllReduce, stage, minibatch, -1});
  out.push_back({ActionKind::Step, stage, minibatch, -1});
}

// A flush schedule: every rank runs its share of each minibatch's microbatches, in the order
// `order(out, stage, microbatches, before)` appends them (before: forwards_before for the
// stage's 1F1B warm-up — `warmups`, or PipeDream's depth when null — by depth when the spec
// deals other than round-robin), and then closes the minibatch.
template <typename Order>
Schedule flush_schedule(const ScheduleSpec& spec, std::string name, Order&& order,
                        bool split_backward = false, const std::vector<int>* warmups = nullptr) {
  check_spec(spec);
  Schedule sched = detail::empty_schedule(spec, std::move(name), UpdatePolicy::Flush);
  const bool dealt = deals_by_list(spec);
  for (int s = 0; s < spec.num_stages(); ++s) {
    int r = static_cast<int>(spec.stage_ranks[s].size());
    const int warmup =
        warmups ? (*warmups)[static_cast<std::size_t>(s)] : detail::one_f_one_b_warmup(spec, s);
    // The depth round-robin dealing runs at (warmup forwards of every replica), which falls
    // along the pipeline (see forwards_before_by_depth).
    const int depth = warmup * r;
    for (int i = 0; i < r; ++i) {
      auto& out = sched.ranks[spec.stage_ranks[s][i]];
      // Room for every action this rank gets, communication included (insert_communication
      // then fills it in place instead of allocating a second list).
      if (!dealt)
        out.reserve(compute_capacity(spec, s, /*step_per_backward=*/false, split_backward));
      for (int j = 0; j < spec.minibatches; ++j) {
        auto mbs =
            detail::replica_microbatches(spec, s, i, j * spec.microbatches, spec.microbatches);
        order(out, s, mbs,
              dealt ? forwards_before_by_depth(mbs, depth) : forwards_before(mbs.size(), warmup));
        close_minibatch(out, s, r, j);
      }
    }
  }
  insert_communication(sched);
  return sched;
}

}  // namespace

Schedule gpipe_schedule(const ScheduleSpec& spec) {
  return flush_schedule(spec, "gpipe", [](auto& out, int s, const auto& mbs, const auto&) {
    for (int u : mbs) out.push_back(forward(s, u));
    for (int u : mbs) out.push_back(backward(s, u));
  });
}

Schedule detail::one_f_one_b_flush_with(const ScheduleSpec& spec, const std::vector<int>* warmups) {
  return flush_schedule(
      spec, "1f1b-flush",
      [](auto& out, int s, const auto& mbs, const std::vector<int>& before) {
        one_f_one_b_order(out, s, mbs, before, [] {});
      },
      /*split_backward=*/false, warmups);
}

bool detail::searches_flush_warmups(const ScheduleSpec& spec) {
  // A straight pipeline runs at its rate under PipeDream's depths; a dealing by speed keeps
  // them, since its depths must not rise along the pipeline (forwards_before_by_depth).
  return has_replicated_stage(spec) && !deals_by_list(spec);
}

std::optional<std::vector<int>> detail::flush_warmups(const ScheduleSpec& spec,
                                                      bool split_backward) {
  if (searches_flush_warmups(spec)) return replicated_flush_warmups(spec, split_backward);
  // A pipeline without replicas under the plan's depths (PipeDream's, or more where the plan
  // found that its transfers need them), beyond a minibatch's microbatches to no effect.
  if (!has_replicated_stage(spec) && !spec.stage_in_flight.empty()) return planned_warmups(spec);
  return std::nullopt;
}

Schedule one_f_one_b_flush_schedule(const ScheduleSpec& spec) {
  check_spec(spec);
  const auto warmups = detail::flush_warmups(spec, /*split_backward=*/false);
  return detail::one_f_one_b_flush_with(spec, warmups ? &*warmups : nullptr);
}

Schedule detail::zero_bubble_h1_with(const ScheduleSpec& spec, const std::vector<int>* warmups) {
  std::vector<int> depths;  // each stage's warm-up, which sets its W's lag (zero_bubble_lag)
  for (int s = 0; s < spec.num_stages(); ++s)
    depths.push_back(warmups ? (*warmups)[static_cast<std::size_t>(s)]
                             : detail::one_f_one_b_warmup(spec, s));
  return flush_schedule(
      spec, "zb-h1",
      [&](auto& out, int s, const auto& mbs, const std::vector<int>& before) {
        zero_bubble_order(out, s, mbs, before, zero_bubble_lag(depths, s));
      },
      /*split_backward=*/true, warmups);
}

Schedule zero_bubble_h1_schedule(const ScheduleSpec& spec) {
  check_spec(spec);
  const auto warmups = detail::flush_warmups(spec, /*split_backward=*/true);
  return detail::zero_bubble_h1_with(spec, warmups ? &*warmups : nullptr);
}

Schedule two_buffered_schedule(const ScheduleSpec& spec) {
  check_spec(spec);
  detail::require_round_robin(spec, "2bw");
  for (int s = 0; s < spec.num_stages(); ++s) {
    const int r = static_cast<int>(spec.stage_ranks[s].size());
    const int need = detail::one_f_one_b_warmup(spec, s) * r;
    PIPELINE_CHECK_AS(ConfigError, spec.microbatches >= need,
                      "2bw: stage {} runs {} warm-up forwards on each of its {} replica(s), so a "
                      "minibatch needs at least {} microbatches for its weights to be ready at "
                      "its first forward; got {} — use --microbatches {} or more",
                      s, need / r, r, need, spec.microbatches, need);
  }
  Schedule sched = detail::empty_schedule(spec, "2bw", UpdatePolicy::DoubleBuffered);
  const int m = spec.microbatches;
  const int units = m * spec.minibatches;
  for (int s = 0; s < spec.num_stages(); ++s) {
    const int r = static_cast<int>(spec.stage_ranks[s].size());
    for (int i = 0; i < r; ++i) {
      auto& out = sched.ranks[spec.stage_ranks[s][i]];
      out.reserve(compute_capacity(spec, s));
      const auto mbs = detail::replica_microbatches(spec, s, i, 0, units);
      // Minibatch k closes once this replica's microbatches below (k + 1) m are done; a replica
      // dealt none of a minibatch's microbatches closes it with the others all the same.
      std::size_t backwards = 0;
      int closed = 0;
      auto close_done = [&] {
        while (closed < spec.minibatches &&
               (backwards == mbs.size() || mbs[backwards] >= (closed + 1) * m))
          close_minibatch(out, s, r, closed++);
      };
      close_done();
      one_f_one_b_order(out, s, mbs, detail::one_f_one_b_warmup(spec, s), [&] {
        ++backwards;
        close_done();
      });
    }
  }
  insert_communication(sched);
  return sched;
}

Schedule detail::stash_schedule_with(const ScheduleSpec& spec, const StashShape& shape) {
  Schedule sched = detail::empty_schedule(
      spec, spec.vertical_sync ? "1f1b-stash-vsync" : "1f1b-stash", UpdatePolicy::Stash);
  const int units = spec.minibatches;
  for (int s = 0; s < spec.num_stages(); ++s) {
    const auto si = static_cast<std::size_t>(s);
    const int r = static_cast<int>(spec.stage_ranks[si].size());
    const int delaying = si < shape.delaying.size() ? shape.delaying[si] : 0;
    for (int i = 0; i < r; ++i) {
      auto& out = sched.ranks[spec.stage_ranks[si][static_cast<std::size_t>(i)]];
      // Room for every action this rank gets, communication included (insert_communication
      // then fills it in place instead of allocating a second list).
      out.reserve(compute_capacity(spec, s, /*step_per_backward=*/true));
      const auto mbs = detail::replica_microbatches(spec, s, i, 0, units);
      const auto before = forwards_before(mbs.size(), shape.warmups[si]);
      std::size_t f = 0;
      for (std::size_t k = 0; k < mbs.size(); ++k) {
        for (; f < static_cast<std::size_t>(before[k]); ++f) out.push_back(forward(s, mbs[f]));
        out.push_back(backward(s, mbs[k]));
        // A delaying replica closes the round of its previous backward (and, at the end, its
        // last one).
        if (i >= delaying) {
          close_minibatch(out, s, r, static_cast<int>(k));
          continue;
        }
        if (k > 0) close_minibatch(out, s, r, static_cast<int>(k) - 1);
        if (k + 1 == mbs.size()) close_minibatch(out, s, r, static_cast<int>(k));
      }
    }
  }
  insert_communication(sched);
  return sched;
}

Schedule one_f_one_b_stash_schedule(const ScheduleSpec& spec) {
  check_spec(spec);
  detail::require_round_robin(spec, "1f1b-stash");
  PIPELINE_CHECK_AS(ConfigError, spec.microbatches == 1,
                    "1f1b-stash steps after every minibatch and has no microbatches; got {} "
                    "microbatches per minibatch — use 1 (or a flush schedule)",
                    spec.microbatches);
  for (int s = 0; s < spec.num_stages(); ++s) {
    const int r = static_cast<int>(spec.stage_ranks[s].size());
    PIPELINE_CHECK_AS(ConfigError, spec.minibatches % r == 0,
                      "1f1b-stash: {} minibatches cannot be dealt evenly to the {} replicas of "
                      "stage {} (their allreduces must pair up); use a multiple of {}",
                      spec.minibatches, r, s, r);
  }
  // A pipeline without replicas runs under the planner's depths: PipeDream's, or more where its
  // transfers need them (stash_in_flights with transfers).
  if (!has_replicated_stage(spec))
    return detail::stash_schedule_with(spec, {detail::planned_warmups(spec), {}});
  detail::StashShape shape = detail::replicated_stash_shape(spec);
  Schedule sched = detail::stash_schedule_with(spec, shape);
  // The shape was chosen on a shorter run; the schedule's own length is checked too.
  detail::lower_until_valid(spec, shape, sched);
  return sched;
}

namespace detail {
namespace {

// The stage of every rank.
std::vector<int> stages_of_ranks(const ScheduleSpec& spec) {
  std::vector<int> out(static_cast<std::size_t>(spec.num_ranks()));
  for (int s = 0; s < spec.num_stages(); ++s)
    for (int r : spec.stage_ranks[static_cast<std::size_t>(s)])
      out[static_cast<std::size_t>(r)] = s;
  return out;
}

// Whether the spec carries every stage's time (ScheduleSpec::stage_seconds).
bool has_stage_seconds(const ScheduleSpec& spec) {
  return spec.stage_seconds.size() == spec.stage_ranks.size() &&
         std::all_of(spec.stage_seconds.begin(), spec.stage_seconds.end(),
                     [](double t) { return t > 0; });
}

// The time the schedule takes on a balanced pipeline — the pipeline the planner builds, every
// stage taking the same time per minibatch: a replica of a stage with r replicas spends r units
// on a forward and 2r on a backward (r each on its input- and weight-gradient halves) — with free
// communication and allreduces that start with each replica's closing backward, as the runtime's
// do; infinity when it deadlocks. With `planned_costs` and the spec's stage_seconds, on the plan's
// own pipeline instead: each stage's time (a third forward, two thirds backward) and its input
// messages on the links as the simulator charges them (round_robin_pair_share), so that depths
// which hide slow transfers win.
double probe_makespan(const ScheduleSpec& spec, const Schedule& schedule, bool planned_costs,
                      std::span<const double> rank_slowdown = {}) {
  const bool costed = planned_costs && has_stage_seconds(spec);
  EngineCosts costs;
  costs.rank_slowdown.assign(rank_slowdown.begin(), rank_slowdown.end());
  for (std::size_t s = 0; s < spec.stage_ranks.size(); ++s) {
    const auto r = static_cast<double>(spec.stage_ranks[s].size());
    // (stage_seconds is a replica's time over the replica count, PlanStage::compute_s.)
    const double replica_s = costed ? spec.stage_seconds[s] * r : 3 * r;
    StageCosts c;
    c.forward_s = replica_s / 3;
    c.backward_s = replica_s - c.forward_s;
    c.backward_input_s = c.backward_weight_s = c.backward_s / 2;
    // The runtime's allreduce overlaps: it starts with each replica's closing backward.
    c.bucket_ready = {1.0};
    c.bucket_s = {0.0};
    costs.stages.push_back(c);
  }
  std::vector<double> message;  // per stage: one input message on a pair's channel
  if (costed && spec.input_message_seconds.size() == spec.stage_ranks.size()) {
    message.assign(spec.stage_ranks.size(), 0.0);
    for (std::size_t s = 1; s < message.size(); ++s)
      message[s] = std::max(0.0, spec.input_message_seconds[s]) /
                   round_robin_pair_share(static_cast<int>(spec.stage_ranks[s - 1].size()),
                                          static_cast<int>(spec.stage_ranks[s].size()));
  }
  if (!message.empty())
    costs.transfer_s = [&message](int src, int dst, int stage, ActionKind kind) {
      if (src == dst) return 0.0;
      return message[static_cast<std::size_t>(kind == ActionKind::SendActivation ? stage + 1
                                                                                 : stage)];
    };
  try {
    const EngineResult result = execute_schedule(schedule, &costs, false);
    double end = 0;
    for (auto& r : result.ranks) end = std::max(end, r.finish_s);
    return end;
  } catch (const ScheduleDeadlock&) {
    return std::numeric_limits<double>::infinity();
  }
}

// A schedule timed on the plan's pipeline (`planned`, where the spec has its stage times and the
// caller asks for them; else the balanced one's) and on the balanced one. Of schedules equally
// fast on the first (as where a slow link, not the order, sets the pace), the one faster on the
// second keeps its stages from waiting on each other when their times drift (a straggler).
struct ProbeTime {
  double planned = 0, balanced = 0;
  bool finite() const { return std::isfinite(planned); }
  bool operator<(const ProbeTime& o) const {
    return planned < o.planned * (1 - 1e-9) ||
           (planned <= o.planned * (1 + 1e-9) && balanced < o.balanced * (1 - 1e-9));
  }
};

ProbeTime probe_time(const ScheduleSpec& spec, const Schedule& schedule, bool planned_costs) {
  ProbeTime t;
  t.balanced = probe_makespan(spec, schedule, false);
  t.planned = planned_costs && has_stage_seconds(spec) && std::isfinite(t.balanced)
                  ? probe_makespan(spec, schedule, true)
                  : t.balanced;
  return t;
}

}  // namespace

double probe_makespan_slowed(const ScheduleSpec& spec, const Schedule& schedule,
                             std::span<const double> rank_slowdown) {
  return probe_makespan(spec, schedule, /*planned_costs=*/true, rank_slowdown);
}

void lower_until_valid(const ScheduleSpec& spec, StashShape& shape, Schedule& sched) {
  const std::vector<int> stage_of = stages_of_ranks(spec);
  auto& warmups = shape.warmups;
  auto& delaying = shape.delaying;
  delaying.resize(warmups.size(), 0);
  // Without delays and warm-ups a microbatch's backward depends on earlier microbatches only,
  // so this ends with a schedule that runs.
  for (;;) {
    try {
      validate(sched);
      return;
    } catch (const ScheduleDeadlock& d) {
      bool delayed = false;
      int deepest = -1;
      for (int r : d.ranks()) {
        const auto s = static_cast<std::size_t>(stage_of[static_cast<std::size_t>(r)]);
        delayed = delayed || delaying[s] > 0;
        delaying[s] = 0;
        if (warmups[s] > 0 &&
            (deepest < 0 || warmups[s] > warmups[static_cast<std::size_t>(deepest)]))
          deepest = static_cast<int>(s);
      }
      if (!delayed) {
        if (deepest < 0) throw;  // not the shape's doing: a bug the message names
        --warmups[static_cast<std::size_t>(deepest)];
      }
      sched = stash_schedule_with(spec, shape);
    }
  }
}

constexpr int kMaxSearchedRanks = 64;

std::vector<int> stash_depth_limits(const ScheduleSpec& spec) {
  const int stages = spec.num_stages();
  std::vector<int> replicas, limits(static_cast<std::size_t>(stages));
  for (const auto& ranks : spec.stage_ranks) replicas.push_back(static_cast<int>(ranks.size()));
  const std::vector<int> flights = stash_in_flights(spec.num_ranks(), replicas);
  for (int s = 0; s < stages; ++s) {
    const auto si = static_cast<std::size_t>(s);
    int cap = si < spec.stage_in_flight.size() && spec.stage_in_flight[si] > 0
                  ? spec.stage_in_flight[si]
                  : flights[si];
    if (s == 0 && spec.in_flight > 0) cap = std::min(cap, spec.in_flight);
    limits[si] = std::max(0, cap - 1);
  }
  return limits;
}

}  // namespace detail

std::int64_t steady_state_minibatches(const std::vector<int>& replicas, std::int64_t limit) {
  std::int64_t lcm = 1, workers = 0;
  for (int r : replicas) {
    lcm = std::lcm(lcm, std::int64_t{std::max(r, 1)});
    workers += std::max(r, 1);
    if (lcm > limit) return 0;  // also before it could overflow
  }
  const std::int64_t minibatches = lcm * ((8 * workers + lcm - 1) / lcm);
  return minibatches <= limit ? minibatches : 0;
}

std::int64_t steady_state_minibatches(const Plan& plan, std::int64_t limit) {
  const std::vector<int> replicas = plan.replica_counts();
  const std::int64_t rounds = steady_state_minibatches(replicas, limit);
  if (rounds == 0) return rounds;
  std::int64_t longer = 0;
  if (std::all_of(replicas.begin(), replicas.end(), [](int r) { return r == 1; })) {
    // The first stage's warm-up is its in-flight count less one, which slow links deepen.
    int deepest = 1;
    for (const PlanStage& s : plan.stages) deepest = std::max(deepest, s.in_flight);
    longer = 8 * std::int64_t{deepest};
  } else {
    std::int64_t held = 0, lcm = 1;
    for (const PlanStage& s : plan.stages) {
      held += std::int64_t{s.replicas} * std::max(s.in_flight, 1);
      lcm = std::lcm(lcm, std::int64_t{std::max(s.replicas, 1)});
    }
    longer = lcm * ((8 * held + lcm - 1) / lcm);
  }
  return longer > rounds && longer <= limit ? longer : rounds;
}

int default_flush_microbatches(int ranks, bool interleaved, int batch) {
  PIPELINE_CHECK_AS(ConfigError, ranks >= 1 && batch >= 0,
                    "default microbatches of {} ranks for a batch of {}", ranks, batch);
  const auto divides = [&](int m) { return batch == 0 || batch % m == 0; };
  if (interleaved) {
    for (int per_rank = 4; per_rank >= 1; --per_rank)
      if (divides(per_rank * ranks)) return per_rank * ranks;
    // None divides: microbatches of unequal size, still a multiple of the ranks.
    if (batch >= ranks) return ranks * std::min(4, batch / ranks);
  }
  int m = batch > 0 ? std::min(batch, 4 * ranks) : 4 * ranks;
  while (!divides(m)) --m;
  return m;
}

int default_microbatches(const Plan& plan, const std::string& schedule, int batch) {
  if (stashes_weights(schedule)) return 1;
  if (plan.microbatches > 0) return plan.microbatches;
  return default_flush_microbatches(plan.ranks_run(), plan.interleaved(), batch);
}

namespace detail {

StashShape replicated_stash_shape(const ScheduleSpec& spec) {
  // With replicas the allreduces couple the replicas' orders, and PipeDream's warm-ups may wait
  // on each other across uneven replica counts (its 4-2-3-3-2-1-1 deadlocks) or leave stages
  // starved. The shape is searched instead: a hill climb over one-step changes of a stage's
  // depth or delaying replicas that minimises the makespan of the plan's pipeline (its stage
  // times and messages where the spec has them, else a balanced one without transfers:
  // probe_makespan) on a run of a few rounds per worker, from the two most promising of several
  // starts without delays, then from the best shape found with every replica but the last
  // delaying. Depths stay within the stages' in-flight counts (stash_depth_limits).
  ScheduleSpec probe = spec;
  std::vector<int> counts;
  for (auto& r : spec.stage_ranks) counts.push_back(static_cast<int>(r.size()));
  const std::int64_t rounds = steady_state_minibatches(counts, kMaxSimulatedMinibatches);
  // Replica counts whose rounds are too many to probe: the run asked for is its own probe.
  probe.minibatches = rounds > 0 ? static_cast<int>(rounds) : spec.minibatches;
  const auto stages = static_cast<std::size_t>(spec.num_stages());
  std::vector<int> limit = stash_depth_limits(spec), replicas, delay_limit;
  for (std::size_t s = 0; s < stages; ++s) {
    replicas.push_back(static_cast<int>(spec.stage_ranks[s].size()));
    // The input stage's replicas load their minibatches together and meet at each allreduce
    // together: a delay there would buy nothing but a second gradient set, which the planner does
    // not charge for it (plan/cost_model.hpp, delayed_allreduce_bytes).
    const bool may = s > 0 && (s >= spec.stage_may_delay.size() || spec.stage_may_delay[s]);
    delay_limit.push_back(may && replicas.back() > 1 ? replicas.back() : 0);
  }
  auto lowered = [&](StashShape shape) {
    Schedule sched = stash_schedule_with(probe, shape);
    lower_until_valid(probe, shape, sched);
    return shape;
  };
  // The climbs come back to shapes they have timed (a step and its reverse; the second climb
  // along the first one's path): each shape is simulated once.
  using Timing = ProbeTime;
  std::map<std::pair<std::vector<int>, std::vector<int>>, Timing> timed;
  auto makespan = [&](const StashShape& shape) {
    auto [it, fresh] = timed.try_emplace({shape.warmups, shape.delaying}, Timing{});
    if (fresh) it->second = probe_time(probe, stash_schedule_with(probe, shape), true);
    return it->second;
  };
  // Starts: PipeDream's depths lowered until they run; depths that keep every stage's window of
  // microbatches in flight (replicas × (depth + 1)) no larger than the stage before it; PipeDream's
  // depths with only the input stage capped, lowered until they run; none.
  std::vector<StashShape> starts;
  starts.push_back(lowered({stash_warmups(probe), std::vector<int>(stages, 0)}));
  std::vector<int> windowed;
  int window = 0;
  for (std::size_t s = 0; s < stages; ++s) {
    const int w = s == 0 ? limit[0] : std::clamp(window / replicas[s] - 1, 0, limit[s]);
    windowed.push_back(w);
    window = replicas[s] * (w + 1);
  }
  starts.push_back({windowed, std::vector<int>(stages, 0)});
  std::vector<int> uncapped;
  for (std::size_t s = 0; s < stages; ++s)
    uncapped.push_back(std::min(one_f_one_b_warmup(spec, static_cast<int>(s)), limit[s]));
  starts.push_back(lowered({uncapped, std::vector<int>(stages, 0)}));
  starts.push_back({std::vector<int>(stages, 0), std::vector<int>(stages, 0)});
  starts.push_back(lowered({planned_warmups(probe), std::vector<int>(stages, 0)}));
  // Each evaluation simulates the whole probe run: beyond 64 ranks the search would take longer
  // than the run it plans, so the first start is taken as it is.
  if (spec.num_ranks() > kMaxSearchedRanks) return starts.front();

  // From `at`, whose makespan is at_s, to a local optimum (its makespan left in at_s).
  auto climb = [&](StashShape at, Timing& at_s) {
    for (bool improved = at_s.finite(); improved;) {
      improved = false;
      for (std::size_t s = 0; s < stages; ++s)
        for (int* value : {&at.warmups[s], &at.delaying[s]})
          for (int step : {+1, -1}) {
            const int hi = value == &at.warmups[s] ? limit[s] : delay_limit[s];
            if (*value + step < 0 || *value + step > hi) continue;
            *value += step;
            const Timing t = makespan(at);
            if (t < at_s) {
              at_s = t;
              improved = true;
            } else {
              *value -= step;
            }
          }
    }
    return at;
  };
  StashShape best;
  const double inf = std::numeric_limits<double>::infinity();
  Timing best_s{inf, inf};
  auto consider = [&](const StashShape& start, Timing s_time) {
    StashShape found = climb(start, s_time);
    if (s_time < best_s) {
      best = std::move(found);
      best_s = s_time;
    }
  };
  // The climbs take most of the time: only from the two distinct starts that run fastest.
  std::vector<std::pair<Timing, std::size_t>> promise;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    bool seen = false;
    for (std::size_t j = 0; j < i; ++j) seen = seen || starts[j].warmups == starts[i].warmups;
    if (!seen) promise.push_back({makespan(starts[i]), i});
  }
  std::sort(promise.begin(), promise.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.planned, a.first.balanced, a.second) <
           std::tie(b.first.planned, b.first.balanced, b.second);
  });
  for (std::size_t k = 0; k < std::min<std::size_t>(2, promise.size()); ++k)
    if (promise[k].first.finite()) consider(starts[promise[k].second], promise[k].first);
  PIPELINE_CHECK(best_s.finite(),
                 "no 1F1B-stash shape without deadlock was found for stages on ranks {}",
                 spec.stage_ranks);
  StashShape delayed = best;
  for (std::size_t s = 0; s < stages; ++s)
    delayed.delaying[s] = std::min(replicas[s] - 1, delay_limit[s]);
  if (delayed.delaying != best.delaying) {
    delayed = lowered(delayed);
    consider(delayed, makespan(delayed));
  }
  return best;
}

std::vector<int> replicated_flush_warmups(const ScheduleSpec& spec, bool split_backward) {
  // As for 1F1B-stash, round-robin dealing couples the replicas with the stages around them
  // (the stage before a replicated one feeds its replicas in turn, and each replica's 1F1B waits
  // for its own gradients), and PipeDream's depths can leave the pipeline waiting on those round
  // trips: on a balanced 1-2-1 plan with 16 microbatches they take 28% longer than one more
  // forward in flight at the input stage. The depths are searched by the same hill climb over
  // one-step changes (timed as the stash shapes are), from PipeDream's depths or the plan's,
  // whichever is faster (so never slower there); minibatches are independent under a flush, so
  // two of them stand for the run. Beyond 64
  // ranks, or 16384 microbatches times ranks (each evaluation simulates the probe), PipeDream's
  // depths are kept.
  std::vector<int> warmups;
  for (int s = 0; s < spec.num_stages(); ++s) warmups.push_back(one_f_one_b_warmup(spec, s));
  if (spec.num_ranks() > kMaxSearchedRanks ||
      std::int64_t{spec.microbatches} * spec.num_ranks() > 16384)
    return warmups;
  ScheduleSpec probe = spec;
  probe.minibatches = std::min(spec.minibatches, 2);
  // A replica's warm-up beyond its share of a minibatch's microbatches changes nothing, nor
  // beyond the microbatches the plan gave it memory for (ScheduleSpec::stage_in_flight).
  std::vector<int> limit, planned;
  bool all_planned = true;
  for (std::size_t s = 0; s < spec.stage_ranks.size(); ++s) {
    const int r = static_cast<int>(spec.stage_ranks[s].size());
    limit.push_back(std::max(0, (spec.microbatches + r - 1) / r - 1));
    const bool given = s < spec.stage_in_flight.size() && spec.stage_in_flight[s] > 0;
    all_planned = all_planned && given;
    if (given) limit.back() = std::min(limit.back(), spec.stage_in_flight[s] - 1);
    planned.push_back(given ? spec.stage_in_flight[s] - 1 : warmups[s]);
  }
  // Timed on the plan's own stages and links where it gives every stage's memory (a plan made for
  // this schedule), else on the balanced pipeline only.
  std::map<std::vector<int>, ProbeTime> timed;  // each depth vector simulated once
  auto makespan = [&](const std::vector<int>& w) {
    auto [it, fresh] = timed.try_emplace(w, ProbeTime{});
    if (fresh)
      it->second = probe_time(
          probe,
          split_backward ? zero_bubble_h1_with(probe, &w) : one_f_one_b_flush_with(probe, &w),
          all_planned);
    return it->second;
  };
  ProbeTime best_s = makespan(warmups);
  if (planned != warmups) {
    const ProbeTime t = makespan(planned);
    if (t < best_s) {
      warmups = planned;
      best_s = t;
    }
  }
  for (bool improved = best_s.finite(); improved;) {
    improved = false;
    for (std::size_t s = 0; s < warmups.size(); ++s)
      for (int step : {+1, -1}) {
        std::vector<int> candidate = warmups;
        candidate[s] += step;
        if (candidate[s] < 0 || candidate[s] > std::max(limit[s], warmups[s])) continue;
        const ProbeTime t = makespan(candidate);
        if (t < best_s) {
          warmups = std::move(candidate);
          best_s = t;
          improved = true;
        }
      }
  }
  return warmups;
}

}  // namespace detail

void insert_communication(Schedule& schedule) {
  const int last = schedule.num_stages() - 1;
  for (auto& list : schedule.ranks) {
    list.erase(
        std::remove_if(list.begin(), list.end(), [](const Action& a) { return is_p2p(a.kind); }),
        list.end());
    // Which messages a compute action needs: a receive before it and a send after it.
    auto needs = [last](const Action& a, bool& recv_act, bool& recv_grad, bool& send_act,
                        bool& send_grad) {
      const bool valid = a.stage >= 0 && a.stage <= last && a.microbatch >= 0;
      const bool fwd = valid && a.kind == ActionKind::Forward;
      const bool bwd =
          valid && (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput);
      recv_act = fwd && a.stage > 0;
      send_act = fwd && a.stage < last;
      recv_grad = bwd && a.stage < last;
      send_grad = bwd && a.stage > 0;
    };
    const std::size_t n = list.size();
    std::size_t total = n;
    for (const Action& a : list) {
      bool ra, rg, sa, sg;
      needs(a, ra, rg, sa, sg);
      total += ra + rg + sa + sg;
    }
    // Filled in place from the back: an action never moves to an earlier index, so it is read
    // before anything overwrites it, and the generators reserve enough that nothing reallocates.
    list.resize(total);
    std::size_t w = total;
    for (std::size_t i = n; i-- > 0;) {
      const Action a = list[i];
      bool ra, rg, sa, sg;
      needs(a, ra, rg, sa, sg);
      const int s = a.stage, u = a.microbatch;
      if (sg) list[--w] = {ActionKind::SendGradient, s, u, schedule.rank_of(s - 1, u)};
      if (sa) list[--w] = {ActionKind::SendActivation, s, u, schedule.rank_of(s + 1, u)};
      list[--w] = a;
      if (rg) list[--w] = {ActionKind::RecvGradient, s, u, schedule.rank_of(s + 1, u)};
      if (ra) list[--w] = {ActionKind::RecvActivation, s, u, schedule.rank_of(s - 1, u)};
    }
  }
}

// --- registry ---------------------------------------------------------------------------------

const GeneratorRegistry& GeneratorRegistry::builtin() {
  static const GeneratorRegistry registry = [] {
    GeneratorRegistry r;
    r.add("gpipe", gpipe_schedule);
    r.add("1f1b-flush", one_f_one_b_flush_schedule);
    r.add("1f1b-stash", one_f_one_b_stash_schedule);
    r.add("interleaved-1f1b", interleaved_one_f_one_b_schedule);
    r.add("interleaved-zb-h1", interleaved_zero_bubble_schedule);
    r.add("zb-h1", zero_bubble_h1_schedule);
    r.add("zb-v", zero_bubble_v_schedule);
    r.add("2bw", two_buffered_schedule);
    r.add("1f1b-stash-vsync", [](const ScheduleSpec& spec) {
      ScheduleSpec s = spec;
      s.vertical_sync = true;
      return one_f_one_b_stash_schedule(s);
    });
    return r;
  }();
  return registry;
}

void GeneratorRegistry::add(std::string name, ScheduleGenerator generator) {
  PIPELINE_CHECK_AS(ConfigError, generator != nullptr, "generator '{}' is empty", name);
  m_generators[std::move(name)] = std::move(generator);
}

std::vector<std::string> GeneratorRegistry::names() const {
  std::vector<std::string> out;
  for (auto& [name, g] : m_generators) out.push_back(name);
  return out;
}

Schedule GeneratorRegistry::generate(const std::string& name, const ScheduleSpec& spec) const {
  auto it = m_generators.find(name);
  if (it == m_generators.end())
    PIPELINE_FAIL(ConfigError, "unknown schedule '{}'; known schedules: {}", name,
                  fmt::join(names(), ", "));
  return it->second(spec);
}

Schedule generate_schedule(const std::string& name, const ScheduleSpec& spec) {
  return GeneratorRegistry::builtin().generate(name, spec);
}

}  // namespace pipeline
