// Structural checks of a schedule, then a dry run of the engine for deadlocks and stash counts.
#include <pipeline/schedule/validate.hpp>

#include <fmt/ranges.h>

#include "engine.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace pipeline {
namespace detail {
namespace {

// What has happened to one microbatch of one stage on its rank.
enum Done : std::uint8_t {
  kRecvAct = 1,
  kForward = 2,
  kSendAct = 4,
  kRecvGrad = 8,
  kInputGrad = 16,   // B or I
  kWeightGrad = 32,  // B or W
  kSendGrad = 64,
};

// One stage on one rank. Round-robin gives replica k of a stage with R replicas microbatches
// k, k + R, k + 2R, ..., so `done` holds only those: microbatch u is done[u / R]. A schedule with
// its own dealing numbers each replica's microbatches in order instead (`position`).
struct Slot {
  int stage = 0;
  int replicas = 1;
  int replica = 0;
  int steps = 0;
  int allreduces = 0;
  int backwards = 0;
  int outstanding = 0;  // forwards whose backward has not finished
  int actions = 0;
  int dealt = 0;                               // microbatches of the run dealt to this replica
  const std::vector<int>* position = nullptr;  // dealing: u -> its index among the replica's
  std::vector<std::uint8_t> done;

  std::size_t index(int u) const {
    return static_cast<std::size_t>(position ? (*position)[static_cast<std::size_t>(u)]
                                             : u / replicas);
  }
};

[[noreturn]] void fail_at(int rank, std::size_t index, const Action& a, const std::string& what) {
  PIPELINE_FAIL(ConfigError, "rank {}, action #{} `{}`: {}", rank, index, to_string(a), what);
}

}  // namespace

void check_local(const Schedule& s) {
  const int stages = s.num_stages();
  const int last = stages - 1;
  PIPELINE_CHECK_AS(ConfigError, stages > 0, "schedule '{}' has no stages", s.name);
  PIPELINE_CHECK_AS(ConfigError, s.microbatches > 0 && s.minibatches > 0,
                    "schedule '{}' needs positive microbatches and minibatches, got {} and {}",
                    s.name, s.microbatches, s.minibatches);
  PIPELINE_CHECK_AS(ConfigError,
                    std::int64_t{s.microbatches} * s.minibatches <= std::numeric_limits<int>::max(),
                    "schedule '{}' has {} microbatches per minibatch x {} minibatches, more than "
                    "{} microbatches in all",
                    s.name, s.microbatches, s.minibatches, std::numeric_limits<int>::max());
  const int units = s.num_microbatches();
  const int nranks = s.num_ranks();
  std::vector<std::vector<int>> rank_stages(static_cast<std::size_t>(nranks));
  for (int st = 0; st < stages; ++st) {
    PIPELINE_CHECK_AS(ConfigError, !s.stage_ranks[st].empty(), "stage {} has no ranks", st);
    for (int r : s.stage_ranks[st]) {
      PIPELINE_CHECK_AS(ConfigError, r >= 0 && r < nranks,
                        "stage {} lists rank {}, but the schedule has ranks 0..{}", st, r,
                        nranks - 1);
      PIPELINE_CHECK_AS(ConfigError, rank_stages[r].empty() || rank_stages[r].back() != st,
                        "stage {} lists rank {} twice; each replica is a different rank", st, r);
      rank_stages[r].push_back(st);
    }
  }
  // A dealing other than round-robin: every microbatch on one replica, flush schedules only (the
  // weight versions and allreduce pairing of the others follow the round-robin rotation).
  PIPELINE_CHECK_AS(ConfigError, s.dealing.size() <= static_cast<std::size_t>(stages),
                    "schedule '{}' deals microbatches for {} stages but has {}", s.name,
                    s.dealing.size(), stages);
  std::vector<std::vector<int>> position(static_cast<std::size_t>(stages));
  std::vector<std::vector<int>> dealt(static_cast<std::size_t>(stages));
  for (int st = 0; st < stages; ++st) {
    const int reps = s.replicas(st);
    auto& count = dealt[static_cast<std::size_t>(st)];
    count.assign(static_cast<std::size_t>(reps), 0);
    if (s.round_robin(st)) {
      for (int k = 0; k < reps; ++k) count[k] = units > k ? (units - 1 - k) / reps + 1 : 0;
      continue;
    }
    PIPELINE_CHECK_AS(ConfigError, s.policy == UpdatePolicy::Flush,
                      "schedule '{}' ({}) deals stage {}'s microbatches other than round-robin; "
                      "only flush schedules can",
                      s.name, update_policy_name(s.policy), st);
    const auto& d = s.dealing[static_cast<std::size_t>(st)];
    PIPELINE_CHECK_AS(ConfigError, static_cast<std::int64_t>(d.size()) == units,
                      "schedule '{}' deals {} microbatches of stage {} but the run has {}", s.name,
                      d.size(), st, units);
    auto& pos = position[static_cast<std::size_t>(st)];
    pos.resize(d.size());
    for (std::size_t u = 0; u < d.size(); ++u) {
      PIPELINE_CHECK_AS(ConfigError, d[u] >= 0 && d[u] < reps,
                        "schedule '{}' deals microbatch {} of stage {} to replica {}, but the "
                        "stage has replicas 0..{}",
                        s.name, u, st, d[u], reps - 1);
      pos[u] = count[static_cast<std::size_t>(d[u])]++;
    }
  }
  std::vector<int> allreduces(static_cast<std::size_t>(stages), -1);
  std::vector<int> allreduce_rank(static_cast<std::size_t>(stages), -1);

  for (int r = 0; r < nranks; ++r) {
    const auto& actions = s.ranks[r];
    std::vector<Slot> slots;
    for (int st : rank_stages[r]) {
      const auto& holders = s.stage_ranks[st];
      Slot slot;
      slot.stage = st;
      slot.replicas = static_cast<int>(holders.size());
      slot.replica =
          static_cast<int>(std::find(holders.begin(), holders.end(), r) - holders.begin());
      slot.dealt = dealt[static_cast<std::size_t>(st)][static_cast<std::size_t>(slot.replica)];
      if (!s.round_robin(st)) slot.position = &position[static_cast<std::size_t>(st)];
      slots.push_back(std::move(slot));
    }
    // Every microbatch dealt to a slot needs at least a forward and a backward there, so a slot
    // with fewer actions than microbatches is wrong; saying so first keeps the memory and time
    // of the checks below proportional to the schedule's actions, whatever counts it declares.
    for (const Action& a : actions)
      for (auto& sl : slots)
        if (sl.stage == a.stage) ++sl.actions;
    for (auto& sl : slots) {
      if (sl.actions < sl.dealt)
        PIPELINE_FAIL(ConfigError,
                      "rank {}: stage {} is dealt {} of the run's {} microbatches ({} per "
                      "minibatch x {} minibatches) but the rank has only {} actions for it; each "
                      "microbatch needs at least a forward and a backward",
                      r, sl.stage, sl.dealt, units, s.microbatches, s.minibatches, sl.actions);
      sl.done.assign(static_cast<std::size_t>(sl.dealt), 0);
    }
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      auto fail = [&](const std::string& what) { fail_at(r, i, a, what); };
      if (a.stage < 0 || a.stage >= stages)
        fail(fmt::format("stage {} does not exist; the schedule has stages 0..{}", a.stage, last));
      Slot* slot = nullptr;
      for (auto& sl : slots)
        if (sl.stage == a.stage) slot = &sl;
      if (!slot)
        fail(fmt::format("rank {} does not hold stage {} (it runs on ranks {})", r, a.stage,
                         fmt::join(s.stage_ranks[a.stage], ", ")));
      const int st = a.stage, u = a.microbatch;
      const int minibatch = u / s.microbatches;

      if (a.kind == ActionKind::AllReduce) {
        if (u != slot->allreduces)
          fail(fmt::format("allreduce number {} out of order; expected {}", u, slot->allreduces));
        ++slot->allreduces;
        continue;
      }
      if (a.kind == ActionKind::Step) {
        if (u != slot->steps)
          fail(fmt::format("step number {} out of order; expected {}", u, slot->steps));
        if (s.replicas(st) > 1 && slot->allreduces < u + 1)
          fail(
              fmt::format("stage {} has {} replicas, so step {} needs its allreduce `{}AR{}` first",
                          st, s.replicas(st), u, st, u));
        if (s.policy != UpdatePolicy::Stash) {
          if (u >= s.minibatches)
            fail(fmt::format("step {} closes no minibatch; the run has {} minibatches", u,
                             s.minibatches));
          // Under 2BW the next minibatches' forwards may be in flight; under Flush nothing may.
          if (s.policy == UpdatePolicy::Flush && slot->outstanding > 0) {
            int open = 0;
            while (open < units && !(s.replica_of(st, open) == slot->replica &&
                                     (slot->done[slot->index(open)] & kForward) &&
                                     !(slot->done[slot->index(open)] & kWeightGrad)))
              ++open;
            fail(
                fmt::format("step {} closes minibatch {} while microbatch {} still waits for its "
                            "backward `{}B{}`",
                            u, u, open, st, open));
          }
          // The minibatch's microbatches dealt to this replica.
          const int first = u * s.microbatches;
          for (int v = first; v < first + s.microbatches; ++v)
            if (s.replica_of(st, v) == slot->replica && !(slot->done[slot->index(v)] & kWeightGrad))
              fail(
                  fmt::format("step {} closes minibatch {} before the backward of its microbatch "
                              "{} `{}B{}`",
                              u, u, v, st, v));
        } else if (slot->steps >= slot->backwards) {
          fail(
              fmt::format("stash schedules step once after each backward; this is step {} after "
                          "{} backwards",
                          u + 1, slot->backwards));
        }
        ++slot->steps;
        continue;
      }

      if (u < 0 || u >= units)
        fail(
            fmt::format("microbatch {} does not exist; the run has microbatches 0..{} ({} per "
                        "minibatch x {} minibatches)",
                        u, units - 1, s.microbatches, s.minibatches));
      if (s.rank_of(st, u) != r)
        fail(
            fmt::format("microbatch {} of stage {} is dealt to rank {} (replica {} of {}), not to "
                        "rank {}",
                        u, st, s.rank_of(st, u), s.replica_of(st, u), s.replicas(st), r));
      std::uint8_t& d = slot->done[slot->index(u)];
      auto once = [&](std::uint8_t bit, const char* what) {
        if (d & bit)
          fail(fmt::format("{} of microbatch {} on stage {} happens twice", what, u, st));
        d |= bit;
      };
      auto version_check = [&](const char* what) {
        if (s.policy == UpdatePolicy::Stash) return;
        if (s.policy == UpdatePolicy::DoubleBuffered) {
          // The weights after max(0, k - 1) steps must exist, and step k must not have run.
          const int version = double_buffered_version(minibatch);
          if (slot->steps < version)
            fail(
                fmt::format("{} of microbatch {} (minibatch {}) needs the weights after {} "
                            "steps, but step `{}ST{}` has not run yet",
                            what, u, minibatch, version, st, version - 1));
          if (slot->steps > minibatch)
            fail(
                fmt::format("{} of microbatch {} after step `{}ST{}` already closed its "
                            "minibatch {}",
                            what, u, st, minibatch, minibatch));
          return;
        }
        if (slot->steps < minibatch)
          fail(
              fmt::format("{} of microbatch {} (minibatch {}) before step `{}ST{}` closes the "
                          "previous minibatch",
                          what, u, minibatch, st, minibatch - 1));
        if (slot->steps > minibatch)
          fail(
              fmt::format("{} of microbatch {} after step `{}ST{}` already closed its minibatch {}",
                          what, u, st, minibatch, minibatch));
      };
      auto check_peer = [&](int peer_stage, const char* role) {
        if (peer_stage < 0 || peer_stage > last)
          fail(fmt::format("stage {} is the {} stage and has no {}", st,
                           peer_stage < 0 ? "first" : "last", role));
        int expected = s.rank_of(peer_stage, u);
        if (a.peer != expected)
          fail(fmt::format("the peer is rank {}, but microbatch {} of stage {} runs on rank {}",
                           a.peer, u, peer_stage, expected));
      };

      switch (a.kind) {
        case ActionKind::Forward:
          version_check("forward");
          if (st > 0 && !(d & kRecvAct))
            fail(
                fmt::format("forward of microbatch {} on stage {} before receiving its input "
                            "(expected `{}RA{}@{}` earlier on rank {})",
                            u, st, st, u, s.rank_of(st - 1, u), r));
          once(kForward, "the forward");
          ++slot->outstanding;
          break;
        case ActionKind::Backward:
        case ActionKind::BackwardInput:
          version_check("backward");
          if (!(d & kForward))
            fail(fmt::format("backward of microbatch {} on stage {} before its forward `{}F{}`", u,
                             st, st, u));
          if (st < last && !(d & kRecvGrad))
            fail(
                fmt::format("backward of microbatch {} on stage {} before receiving its output "
                            "gradient (expected `{}RG{}@{}` earlier on rank {})",
                            u, st, st, u, s.rank_of(st + 1, u), r));
          once(kInputGrad, "the backward");
          if (a.kind == ActionKind::Backward) {
            d |= kWeightGrad;
            --slot->outstanding;
            ++slot->backwards;
          }
          break;
        case ActionKind::BackwardWeight:
          version_check("weight gradient");
          if (!(d & kInputGrad))
            fail(
                fmt::format("weight gradient of microbatch {} on stage {} before its input "
                            "gradient `{}I{}`",
                            u, st, st, u));
          once(kWeightGrad, "the weight gradient");
          --slot->outstanding;
          ++slot->backwards;
          break;
        case ActionKind::SendActivation:
          check_peer(st + 1, "next stage to send activations to");
          if (!(d & kForward))
            fail(fmt::format("sends the activation of microbatch {} before computing it in `{}F{}`",
                             u, st, u));
          once(kSendAct, "sending the activation");
          break;
        case ActionKind::RecvActivation:
          check_peer(st - 1, "previous stage to receive activations from");
          once(kRecvAct, "receiving the activation");
          break;
        case ActionKind::SendGradient:
          check_peer(st - 1, "previous stage to send gradients to");
          if (!(d & kInputGrad))
            fail(fmt::format(
                "sends the input gradient of microbatch {} before computing it in `{}B{}`", u, st,
                u));
          once(kSendGrad, "sending the gradient");
          break;
        case ActionKind::RecvGradient:
          check_peer(st + 1, "next stage to receive gradients from");
          once(kRecvGrad, "receiving the gradient");
          break;
        case ActionKind::AllReduce:
        case ActionKind::Step:
          break;
      }
    }

    // Everything dealt to this rank happened, with all its communication.
    for (auto& sl : slots) {
      const int st = sl.stage;
      auto missing = [&](int u, const std::string& what) {
        PIPELINE_FAIL(ConfigError, "rank {}: {} for microbatch {} of stage {} is missing", r, what,
                      u, st);
      };
      const bool rr = s.round_robin(st);
      for (int u = rr ? sl.replica : 0; u < units; u += rr ? sl.replicas : 1) {
        if (!rr && s.replica_of(st, u) != sl.replica) continue;
        const std::uint8_t d = sl.done[sl.index(u)];
        if (st > 0 && !(d & kRecvAct))
          missing(u, fmt::format("the receive `{}RA{}@{}`", st, u, s.rank_of(st - 1, u)));
        if (!(d & kForward)) missing(u, fmt::format("the forward `{}F{}`", st, u));
        if (st < last && !(d & kSendAct))
          missing(u, fmt::format("the send `{}SA{}@{}` (after `{}F{}`)", st, u,
                                 s.rank_of(st + 1, u), st, u));
        if (st < last && !(d & kRecvGrad))
          missing(u, fmt::format("the receive `{}RG{}@{}`", st, u, s.rank_of(st + 1, u)));
        if (!(d & kInputGrad)) missing(u, fmt::format("the backward `{}B{}`", st, u));
        if (!(d & kWeightGrad)) missing(u, fmt::format("the weight gradient `{}W{}`", st, u));
        if (st > 0 && !(d & kSendGrad))
          missing(u, fmt::format("the send `{}SG{}@{}` (after `{}B{}`)", st, u,
                                 s.rank_of(st - 1, u), st, u));
      }
      int expected_steps = s.policy == UpdatePolicy::Stash ? sl.backwards : s.minibatches;
      if (sl.steps != expected_steps)
        PIPELINE_FAIL(
            ConfigError,
            "rank {}: stage {} takes {} optimizer steps; a {} schedule needs {} (`{}ST{}` is "
            "missing)",
            r, st, sl.steps, update_policy_name(s.policy), expected_steps, st, sl.steps);
      if (allreduces[st] < 0) {
        allreduces[st] = sl.allreduces;
        allreduce_rank[st] = r;
      } else if (allreduces[st] != sl.allreduces) {
        PIPELINE_FAIL(ConfigError,
                      "rank {}: stage {} runs {} allreduces here but {} on rank {}; all replicas "
                      "must run the same allreduces",
                      r, st, sl.allreduces, allreduces[st], allreduce_rank[st]);
      }
    }
  }
}

}  // namespace detail

ValidationReport validate(const Schedule& schedule) {
  detail::check_local(schedule);
  auto result = detail::execute_schedule(schedule, nullptr, false);
  ValidationReport report;
  for (std::size_t r = 0; r < result.ranks.size(); ++r)
    report.ranks.push_back({static_cast<int>(r), result.ranks[r].peak_activations,
                            result.ranks[r].peak_weight_versions});
  return report;
}

std::string validation_error(const Schedule& schedule) {
  try {
    validate(schedule);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return {};
}

}  // namespace pipeline
