// Profiles per worker type, for planning and simulating over a mixed cluster (Topology::types).
//
// A mixed cluster runs the same model on every type, so each type's profile must describe the
// same layers (count, names and inputs) at the same batch size; only the times (and, say for
// another dtype, the sizes) differ. The partitioner times a stage placed on a type from that
// type's profile, and so does the simulator for a plan stage whose "device" names the type.
#pragma once

#include <pipeline/profile/profile.hpp>

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>

namespace pipeline {

// Worker type name -> its profile. For an untyped topology: one profile (its key is not used).
using DeviceProfiles = std::map<std::string, Profile, std::less<>>;

// Throws ConfigError unless there is at least one profile, every profile is valid, and all have
// the same layers (count, names, inputs) and batch size as the first.
void check_device_profiles(const DeviceProfiles& profiles);

// The command-line form of a profile argument: "h100=profile.json" -> {"h100", "profile.json"};
// a plain path (no '=' before the first '/', or an empty name) -> {"", path}.
std::pair<std::string, std::string> split_profile_argument(std::string_view text);

}  // namespace pipeline
