// PipeDream graph.txt import (src/profile/pipedream_graph.cpp): the profile it builds must be
// one that profile.json accepts, since the partitioner takes either.
#include "fuzz_support.hpp"

#include <pipeline/profile/pipedream_graph.hpp>
#include <pipeline/profile/profile_json.hpp>

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeline;
  Profile profile;
  if (!fuzz::accepts(
          [&] { profile = parse_pipedream_graph(fuzz::as_text(data, size), "fuzz", "fuzz"); }))
    return 0;
  fuzz::expect("imported profile as profile.json", [&] {
    return parse_profile(profile_to_json(profile).dump(), "round trip").size() == profile.size();
  });
  return 0;
}
