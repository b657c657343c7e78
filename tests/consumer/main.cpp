// Builds against the installed package and runs the README's library example at a tiny size.
#include <pipeline/pipeline.hpp>

#include <fmt/format.h>

int main() {
  pipeline::ZooModel z = pipeline::make_model("fashion-cnn");
  pipeline::ProfileOptions options;
  options.warmup = 0;
  options.repeat = 1;
  pipeline::Profile profile = pipeline::profile(z, /*batch=*/2, pipeline::Device::cpu(), options);
  pipeline::Topology topology{{pipeline::parse_level("4:10Gbit/s")}};
  pipeline::Plan plan = pipeline::partition(profile, topology);
  fmt::print("consumer ok: {} layers, config {}\n", profile.size(), plan.config);
  return profile.size() == z.model.size() && plan.workers == 4 ? 0 : 1;
}
