// Fault-injection hook for testing only: lets one rank of a pipelined run die mid-training, so
// that tests can check what the surviving ranks do (tests/examples.cmake, peer_death tests).
//
//   PIPELINE_TEST_DIE_AT_STEP=RANK:STEP[:kill]
//
// makes rank RANK end itself when it reaches optimizer step STEP (0-based, counted over the
// whole run): with _exit(1), as a crash that skips every destructor and MPI_Finalize would, or
// with SIGKILL when ":kill" is given. Unset (the normal case) it does nothing. The variable is
// read once; a malformed value is a ConfigError, so a test cannot silently inject nothing.
#pragma once

#include <pipeline/core/error.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

}  // namespace pipeline::examples
