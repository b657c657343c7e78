// Schedule CSV (src/schedule/csv.cpp): parse, validate as the trainer does for --schedule-csv,
// and write what was parsed and read it back.
#include "fuzz_support.hpp"

#include <pipeline/schedule/csv.hpp>
#include <pipeline/schedule/validate.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeline;
  Schedule schedule;
  if (!fuzz::accepts([&] { schedule = schedule_from_csv(fuzz::as_text(data, size)); })) return 0;
  fuzz::accepts([&] { validate(schedule); });
  fuzz::expect("schedule CSV round trip", [&] {
    Schedule again = schedule_from_csv(schedule_to_csv(schedule));
    return again.ranks == schedule.ranks && again.stage_ranks == schedule.stage_ranks &&
           again.policy == schedule.policy && again.microbatches == schedule.microbatches &&
           again.minibatches == schedule.minibatches;
  });
  return 0;
}
