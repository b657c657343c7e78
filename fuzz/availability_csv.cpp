// Availability trace CSV (src/schedule/availability.cpp): parse, and what is accepted must be a
// trace the replay can take (first row at 0, times increasing, worker counts >= 0).
#include "fuzz_support.hpp"

#include <pipeline/schedule/availability.hpp>

#include <cmath>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeline;
  std::vector<AvailabilityChange> trace;
  if (!fuzz::accepts([&] { trace = parse_availability_csv(fuzz::as_text(data, size)); })) return 0;
  fuzz::expect("availability trace well-formed", [&] {
    if (trace.empty() || trace.front().time_s != 0) return false;
    for (std::size_t i = 0; i < trace.size(); ++i) {
      if (!std::isfinite(trace[i].time_s) || trace[i].workers < 0 || trace[i].line < 1)
        return false;
      if (i > 0 && !(trace[i].time_s > trace[i - 1].time_s && trace[i].line > trace[i - 1].line))
        return false;
    }
    return true;
  });
  return 0;
}
