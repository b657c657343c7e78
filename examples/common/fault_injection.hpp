// Fault-injection hooks for testing only: let one rank of a pipelined run die mid-training, or
// straggle, so that tests can check what the other ranks do (tests/examples.cmake).
//
//   PIPELINE_TEST_DIE_AT_STEP=RANK:STEP[:kill]
//
// makes rank RANK end itself when it reaches optimizer step STEP (0-based, counted over the
// whole run): with _exit(1), as a crash that skips every destructor and MPI_Finalize would, or
// with SIGKILL when ":kill" is given.
//
//   PIPELINE_TEST_SLOW_RANK=RANK:FACTOR
//
// makes rank RANK compute FACTOR (>= 1) times slower: after each forward and backward it spins
// for (FACTOR - 1) times the action's measured time (ExecutorOptions::after_compute), as a slower
// device would; `pipeline-simulate --slow-rank RANK:FACTOR` predicts the effect.
//
// Unset (the normal case) they do nothing. Each variable is read once; a malformed value is a
// ConfigError, so a test cannot silently inject nothing.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/schedule.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

namespace pipeline::examples {

struct InjectedDeath {
  int rank = -1;
  std::int64_t step = -1;
  bool kill = false;  // SIGKILL instead of _exit(1)
};

// The PIPELINE_TEST_DIE_AT_STEP request, if any.
inline std::optional<InjectedDeath> injected_death_from_env() {
  const char* v = std::getenv("PIPELINE_TEST_DIE_AT_STEP");
  if (v == nullptr || *v == '\0') return std::nullopt;
  InjectedDeath d;
  char how[8] = {};
  long long step = -1;
  const int n = std::sscanf(v, "%d:%lld:%7s", &d.rank, &step, how);
  d.step = step;
  d.kill = n == 3 && std::string(how) == "kill";
  PIPELINE_CHECK_AS(ConfigError, (n == 2 || (n == 3 && d.kill)) && d.rank >= 0 && d.step >= 0,
                    "PIPELINE_TEST_DIE_AT_STEP='{}' is not RANK:STEP or RANK:STEP:kill (a "
                    "testing hook: unset it for normal runs)",
                    v);
  return d;
}

// Call on every rank at every optimizer step; ends this process when the request names it.
inline void fault_injection_point(int rank, std::int64_t step) {
  static const std::optional<InjectedDeath> death = injected_death_from_env();
  if (!death || death->rank != rank || death->step != step) return;
  std::fflush(stdout);
  const std::string line =
      fmt::format("[rank {}] PIPELINE_TEST_DIE_AT_STEP: rank {} ends itself at step {} ({})\n",
                  rank, rank, step, death->kill ? "SIGKILL" : "_exit(1)");
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  if (death->kill) std::raise(SIGKILL);
  ::_exit(1);
}

struct InjectedSlowdown {
  int rank = -1;
  double factor = 1;
};

// The PIPELINE_TEST_SLOW_RANK request, if any.
inline std::optional<InjectedSlowdown> injected_slowdown_from_env() {
  const char* v = std::getenv("PIPELINE_TEST_SLOW_RANK");
  if (v == nullptr || *v == '\0') return std::nullopt;
  InjectedSlowdown d;
  char rest = 0;
  const int n = std::sscanf(v, "%d:%lf%c", &d.rank, &d.factor, &rest);
  PIPELINE_CHECK_AS(ConfigError, n == 2 && d.rank >= 0 && std::isfinite(d.factor) && d.factor >= 1,
                    "PIPELINE_TEST_SLOW_RANK='{}' is not RANK:FACTOR with a factor >= 1 (a "
                    "testing hook: unset it for normal runs)",
                    v);
  return d;
}

// The PIPELINE_TEST_SLOW_RANK request, read once.
inline const std::optional<InjectedSlowdown>& injected_slowdown_request() {
  static const std::optional<InjectedSlowdown> slow = injected_slowdown_from_env();
  return slow;
}

// For ExecutorOptions::after_compute: on the slowed rank, spins for (FACTOR - 1) times each
// compute action's time; elsewhere (and unset) empty.
inline std::function<void(const Action&, double)> injected_slowdown(int rank) {
  const std::optional<InjectedSlowdown>& slow = injected_slowdown_request();
  if (!slow || slow->rank != rank || slow->factor == 1) return {};
  const double extra = slow->factor - 1;
  // Spins rather than sleeps: a slower device keeps its core busy, and a sleeping rank would
  // hand its core to other processes and then wait to get it back (on a loaded machine a 3x
  // slowdown measured 3.6x with sleep_for).
  return [extra](const Action&, double seconds) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(extra * seconds));
    while (std::chrono::steady_clock::now() < until) {
    }
  };
}

// `options` with the PIPELINE_TEST_SLOW_RANK hook for `comm`'s rank, if it is the slowed one;
// ConfigError where it names a rank the job does not have.
inline ExecutorOptions with_injected_slowdown(ExecutorOptions options, const Communicator& comm) {
  const std::optional<InjectedSlowdown>& slow = injected_slowdown_request();
  PIPELINE_CHECK_AS(ConfigError, !slow || slow->rank < comm.size(),
                    "PIPELINE_TEST_SLOW_RANK slows rank {}, but the job has {} ranks (0-{})",
                    slow ? slow->rank : 0, comm.size(), comm.size() - 1);
  if (auto hook = injected_slowdown(comm.rank())) options.after_compute = std::move(hook);
  return options;
}

}  // namespace pipeline::examples
