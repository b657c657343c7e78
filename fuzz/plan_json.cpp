// plan.json (src/plan/plan_json.cpp): parse, then write what was accepted and read it back.
#include "fuzz_support.hpp"

#include <pipeline/plan/plan_json.hpp>

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeline;
  Plan plan;
  if (!fuzz::accepts([&] { plan = parse_plan(fuzz::as_text(data, size), "fuzz"); })) return 0;
  fuzz::expect("plan round trip", [&] {
    Plan again = parse_plan(plan_to_json(plan).dump(), "round trip");
    if (again.num_stages() != plan.num_stages() || again.workers != plan.workers) return false;
    for (int s = 0; s < plan.num_stages(); ++s) {
      const PlanStage& a = plan.stages[static_cast<std::size_t>(s)];
      const PlanStage& b = again.stages[static_cast<std::size_t>(s)];
      if (a.begin != b.begin || a.end != b.end || a.ranks != b.ranks || a.layer_ids != b.layer_ids)
        return false;
    }
    return true;
  });
  return 0;
}
