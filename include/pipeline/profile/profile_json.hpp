// profile.json I/O: the "pipeline.profile/1" format of DESIGN.md, with full validation.
//
// Reading checks everything a partitioner or simulator would trip over later: the `format`
// string, types and presence of every field, finite non-negative times and sizes, `inputs` that
// name existing layers and form no cycle. Failures throw ConfigError (bad contents) or IoError
// (unreadable or unwritable file); the message names the file, the layer and field, and the
// offending value. Writing goes through a temporary file and a rename, so a failed write never
// leaves a truncated profile behind.
//
// Extension fields beyond DESIGN.md: "source": true on a layer with no predecessor that is not
// layer 0; "backward_input_s", "backward_weight_s", "forward_spread_s", "backward_spread_s",
// "flops" (all optional, default 0).
#pragma once

#include <pipeline/profile/profile.hpp>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace pipeline {

inline constexpr std::string_view kProfileFormat = "pipeline.profile/1";

// The largest output or parameter size a profile holds, in bytes: a round bound below INT64_MAX,
// so that a size read from JSON as a double converts to std::int64_t in range. A profile from any
// source (profiler, profile.json, PipeDream import) must stay within it to be written and read.
inline constexpr std::int64_t kMaxProfileBytes = 9'000'000'000'000'000'000;

// Throws ConfigError naming `origin` when the profile is not usable (see the header comment).
void validate_profile(const Profile& profile, std::string_view origin);

Profile profile_from_json(const nlohmann::json& j, std::string_view origin);
nlohmann::json profile_to_json(const Profile& profile);

// Parses the text of a profile.json; `origin` names it in error messages (a path, "stdin").
Profile parse_profile(std::string_view text, std::string_view origin);
Profile read_profile(const std::string& path);
void write_profile(const Profile& profile, const std::string& path);

}  // namespace pipeline
