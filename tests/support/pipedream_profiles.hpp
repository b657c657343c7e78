// Where PipeDream's shipped graph.txt profiles are: $PIPELINE_PIPEDREAM_PROFILES, else the
// shared/ folder beside the source tree. Tests that need them skip when it is absent.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace pipeline::testing {

inline std::string pipedream_profiles_dir() {
  if (const char* env = std::getenv("PIPELINE_PIPEDREAM_PROFILES")) return env;
  auto p = std::filesystem::path(__FILE__).parent_path() / ".." / ".." / ".." / "shared" / "reference" /
           "pipedream-profiles";
  return std::filesystem::exists(p / "vgg16" / "graph.txt") ? std::filesystem::weakly_canonical(p).string() : std::string();
}

}  // namespace pipeline::testing
