// A model's architecture: the options that define it beyond its name, as the zoo resolved them
// ({"dim", 128}, {"heads", 4}, ...; ZooModel::architecture). Profiles, plans and checkpoints
// record it, so that a run can tell a file made for the same model under other options — which
// may give the same layers and even the same tensor shapes (transformer-lm's heads) — and say
// which option differs instead of training on a wrong plan or resuming wrong weights.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pipeline {

using Architecture = std::vector<std::pair<std::string, double>>;

// {"option": value, ...} in the architecture's order, whole numbers written as integers.
nlohmann::ordered_json architecture_to_json(const Architecture& architecture);

// From such an object; ConfigError naming `what` and `origin` when it is not one of numbers.
Architecture architecture_from_json(const nlohmann::json& j, const std::string& what,
                                    const std::string& origin);

// The first option recorded in both whose values differ, as the trainers' flags spell it:
// {"--heads", "4", "2"} for (recorded heads 4, ours heads 2), and every such option as flags
// ("--blocks 4 --heads 4" recorded, "--blocks 2 --heads 2" ours), so that one message names all
// the fix needs. Options only one side records are not compared (files written before an option
// was recorded).
struct ArchitectureDifference {
  std::string flag, recorded, ours;
  std::string recorded_flags, our_flags;
};
std::optional<ArchitectureDifference> first_difference(const Architecture& recorded,
                                                       const Architecture& ours);

}  // namespace pipeline
