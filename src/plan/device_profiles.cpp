#include <pipeline/plan/device_profiles.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/profile/profile_json.hpp>

namespace pipeline {

void check_device_profiles(const DeviceProfiles& profiles) {
  PIPELINE_CHECK_AS(ConfigError, !profiles.empty(), "no profile given; give one per worker type");
  const auto& [first_name, first] = *profiles.begin();
  for (const auto& [name, p] : profiles) {
    const std::string label =
        name.empty() ? std::string("profile") : fmt::format("profile of '{}'", name);
    validate_profile(p, label);
    if (&p == &first) continue;
    PIPELINE_CHECK_AS(ConfigError, p.size() == first.size(),
                      "the {} has {} layers but the profile of '{}' has {}; every type's profile "
                      "must describe the same model",
                      label, p.size(), first_name, first.size());
    PIPELINE_CHECK_AS(
        ConfigError, p.batch_size == first.batch_size,
        "the {} is at batch size {} but the profile of '{}' at {}; profile every type "
        "at the same batch size (pipeline-profile --batch N)",
        label, p.batch_size, first_name, first.batch_size);
    // Same layers may come from other options (a wider fashion-cnn), and a run computes in one
    // dtype on every rank: the plan takes both from one profile.
    PIPELINE_CHECK_AS(ConfigError, p.model.empty() || first.model.empty() || p.model == first.model,
                      "the {} is of model '{}' but the profile of '{}' of '{}'; every type's "
                      "profile must describe the same model",
                      label, p.model, first_name, first.model);
    if (const auto d = first_difference(first.architecture, p.architecture))
      PIPELINE_FAIL(ConfigError,
                    "the {} is of {} with {} but the profile of '{}' with {}; profile every type "
                    "with the same options",
                    label, p.model, d->our_flags, first_name, d->recorded_flags);
    PIPELINE_CHECK_AS(ConfigError, p.dtype == first.dtype,
                      "the {} was timed in {} but the profile of '{}' in {}; a run computes in "
                      "one dtype on every rank: profile every type with the same --dtype",
                      label, p.dtype, first_name, first.dtype);
    for (int i = 0; i < p.size(); ++i) {
      const auto& a = p.layers[static_cast<std::size_t>(i)];
      const auto& b = first.layers[static_cast<std::size_t>(i)];
      PIPELINE_CHECK_AS(
          ConfigError, a.name == b.name && p.predecessors(i) == first.predecessors(i),
          "layer {} of the {} is '{}' but in the profile of '{}' it is '{}' (or their "
          "inputs differ); every type's profile must describe the same model",
          i, label, a.name, first_name, b.name);
    }
  }
}

std::pair<std::string, std::string> split_profile_argument(std::string_view text) {
  const auto eq = text.find('=');
  const auto slash = text.find('/');
  if (eq == std::string_view::npos || eq == 0 || (slash != std::string_view::npos && slash < eq))
    return {std::string(), std::string(text)};
  return {std::string(text.substr(0, eq)), std::string(text.substr(eq + 1))};
}

}  // namespace pipeline
