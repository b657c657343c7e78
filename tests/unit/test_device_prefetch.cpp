// DevicePrefetcher on the CPU: batches pass through unchanged, in order, and misuse (take without
// stage, stage twice) is an error.
#include <pipeline/data/device_prefetch.hpp>

#include <doctest/doctest.h>

namespace test_device_prefetch {

using namespace pipeline;

TEST_CASE("on the CPU the prefetcher hands the staged batch back as it is") {
  DevicePrefetcher prefetch(Device::cpu());
  Batch b{Tensor::from_vector(Shape{2, 2}, {1, 2, 3, 4}), Tensor::from_ints(Shape{2}, {0, 1})};
  prefetch.stage(b);
  CHECK_THROWS_WITH_AS(prefetch.stage(b), doctest::Contains("twice"), Error);
  const Batch got = prefetch.take();
  CHECK(got.inputs.same_storage(b.inputs));
  CHECK(got.labels.same_storage(b.labels));
  CHECK_THROWS_WITH_AS(prefetch.take(), doctest::Contains("without stage"), Error);
#if !PIPELINE_WITH_CUDA
  CHECK_THROWS_WITH_AS(DevicePrefetcher(Device::cuda(0)), doctest::Contains("no CUDA support"),
                       ConfigError);
#endif
}

}  // namespace test_device_prefetch
