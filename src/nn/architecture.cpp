#include <pipeline/nn/architecture.hpp>

#include <pipeline/core/error.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace pipeline {

nlohmann::ordered_json architecture_to_json(const Architecture& architecture) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [option, value] : architecture) {
    if (value == std::trunc(value) && std::abs(value) < 0x1p53)
      j[option] = static_cast<std::int64_t>(value);
    else
      j[option] = value;
  }
  return j;
}

Architecture architecture_from_json(const nlohmann::json& j, const std::string& what,
                                    const std::string& origin) {
  const bool numbers =
      j.is_object() && std::all_of(j.begin(), j.end(), [](const auto& v) { return v.is_number(); });
  PIPELINE_CHECK_AS(ConfigError, numbers,
                    "{} '{}': 'architecture' must be an object of the model's options and their "
                    "numbers, e.g. {{\"dim\": 128, \"heads\": 4}}",
                    what, origin);
  Architecture a;
  for (const auto& [option, value] : j.items()) {
    // Every option of the zoo's models is a size or a multiplier: a trainer would otherwise
    // suggest "--channels -1" to match a damaged file.
    const double v = value.get<double>();
    PIPELINE_CHECK_AS(ConfigError, std::isfinite(v) && v > 0,
                      "{} '{}': architecture option '{}' is {}; the model's options are positive "
                      "sizes and multipliers",
                      what, origin, option, value.dump());
    a.emplace_back(option, v);
  }
  return a;
}

std::optional<ArchitectureDifference> first_difference(const Architecture& recorded,
                                                       const Architecture& ours) {
  std::optional<ArchitectureDifference> out;
  for (const auto& [option, value] : recorded) {
    const std::string& name = option;
    const auto mine =
        std::find_if(ours.begin(), ours.end(), [&name](const auto& o) { return o.first == name; });
    if (mine == ours.end() || mine->second == value) continue;
    std::string flag = "--" + option;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const std::string theirs = fmt::format("{}", value),
                      mine_text = fmt::format("{}", mine->second);
    if (!out) {
      out = ArchitectureDifference{flag, theirs, mine_text, "", ""};
    } else {
      out->recorded_flags += ' ';
      out->our_flags += ' ';
    }
    out->recorded_flags += flag + ' ' + theirs;
    out->our_flags += flag + ' ' + mine_text;
  }
  return out;
}

}  // namespace pipeline
