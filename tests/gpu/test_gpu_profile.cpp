// The profiler on a GPU: CUDA-event timing of every layer inside whole training passes, the same
// byte counts as on the CPU, and the GPU named in the profile.
#include <pipeline/nn/zoo.hpp>
#include <pipeline/profile/profiler.hpp>

#include <doctest/doctest.h>

namespace test_gpu_profile {

using namespace pipeline;

TEST_CASE("profiling the mlp on cuda:0 times every layer and counts bytes as the CPU does") {
  ZooOptions zo;
  zo.width = 0.5;
  const ZooModel z = make_model("mlp", zo);
  ProfileOptions o;
  o.warmup = 1;
  o.repeat = 3;
  const Profile gpu = profile(z, 64, Device::cuda(0), o);
  const Profile cpu = profile(z, 64, Device::cpu(), o);
  CHECK(gpu.device.rfind("cuda: ", 0) == 0);
  REQUIRE(gpu.layers.size() == cpu.layers.size());
  for (std::size_t i = 0; i < gpu.layers.size(); ++i) {
    const LayerProfile& g = gpu.layers[i];
    CAPTURE(g.name);
    CHECK(g.forward_s > 0);
    CHECK(g.backward_s > 0);
    CHECK(g.forward_s < 1.0);  // device times in seconds, not milliseconds
    CHECK(g.output_bytes == cpu.layers[i].output_bytes);
    CHECK(g.parameter_bytes == cpu.layers[i].parameter_bytes);
    CHECK(g.saved_bytes == cpu.layers[i].saved_bytes);
    if (g.parameter_bytes > 0) {
      CHECK(g.backward_input_s > 0);
      CHECK(g.backward_weight_s > 0);
    }
  }
  CHECK_THROWS_WITH_AS(profile(z, 64, Device::cuda(999), o), doctest::Contains("cuda:999"),
                       ConfigError);
}

}  // namespace test_gpu_profile
