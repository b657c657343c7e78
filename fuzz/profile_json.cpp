// profile.json (src/profile/profile_json.cpp): parse, then write what was accepted and read it
// back — a profile the reader accepts must survive its own writer unchanged in shape.
#include "fuzz_support.hpp"

#include <pipeline/profile/profile_json.hpp>

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeline;
  Profile profile;
  if (!fuzz::accepts([&] { profile = parse_profile(fuzz::as_text(data, size), "fuzz"); })) return 0;
  fuzz::expect("profile round trip", [&] {
    Profile again = parse_profile(profile_to_json(profile).dump(), "round trip");
    if (again.size() != profile.size()) return false;
    for (int i = 0; i < profile.size(); ++i)
      if (again.predecessors(i) != profile.predecessors(i)) return false;
    return true;
  });
  return 0;
}
