// Checkpoint manifests (parse_checkpoint_manifest in src/runtime/checkpoint.cpp): parse, then
// write what was accepted and read it back, as every resume after a checkpoint does.
#include "fuzz_support.hpp"

#include <pipeline/runtime/checkpoint_manifest.hpp>

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipeline;
  const std::string text(fuzz::as_text(data, size));
  CheckpointManifest manifest;
  if (!fuzz::accepts([&] { manifest = parse_checkpoint_manifest(text, "fuzz"); })) return 0;
  fuzz::expect("manifest round trip", [&] {
    CheckpointManifest again =
        parse_checkpoint_manifest(manifest_to_json(manifest).dump(), "round trip");
    if (again.step != manifest.step || again.shards.size() != manifest.shards.size()) return false;
    for (std::size_t i = 0; i < manifest.shards.size(); ++i)
      if (again.shards[i].tensors.size() != manifest.shards[i].tensors.size() ||
          again.shards[i].layer_end != manifest.shards[i].layer_end)
        return false;
    return true;
  });
  return 0;
}
