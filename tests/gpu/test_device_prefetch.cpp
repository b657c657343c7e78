// DevicePrefetcher on cuda:0: staged batches arrive on the device intact and in order while the
// current stream keeps working, with pinned buffers reused across many batches.
#include <pipeline/core/rng.hpp>
#include <pipeline/cuda/stream.hpp>
#include <pipeline/data/device_prefetch.hpp>

#include <doctest/doctest.h>

#include <vector>

namespace test_device_prefetch {

using namespace pipeline;

TEST_CASE("staged batches reach cuda:0 intact, in order, over reused pinned buffers") {
  Rng rng(8, "prefetch");
  std::vector<Batch> host;
  for (int i = 0; i < 9; ++i) {
    const std::int64_t n = 16 + i % 3;  // sizes change: the buffers grow
    Batch b{Tensor::empty(Shape{n, 3, 5}), Tensor::empty(Shape{n}, DType::Int32)};
    for (float& v : b.inputs.values()) v = rng.uniform(-1.f, 1.f);
    for (std::int64_t j = 0; j < n; ++j)
      b.labels.data<std::int32_t>()[j] = static_cast<std::int32_t>(rng.below(10));
    host.push_back(b);
  }
  cuda::Stream compute = cuda::Stream::create(0);
  const cuda::StreamGuard guard(compute);
  DevicePrefetcher prefetch(Device::cuda(0));
  prefetch.stage(host[0]);
  for (std::size_t i = 0; i < host.size(); ++i) {
    const Batch got = prefetch.take();
    if (i + 1 < host.size()) prefetch.stage(host[i + 1]);
    // Work on the compute stream that reads the batch (a copy back), then check.
    CHECK(got.inputs.device() == Device::cuda(0));
    CHECK(got.inputs.to(Device::cpu()).to_vector() == host[i].inputs.to_vector());
    const Tensor labels = got.labels.to(Device::cpu());
    for (std::int64_t j = 0; j < labels.numel(); ++j)
      CHECK(labels.data<std::int32_t>()[j] == host[i].labels.data<std::int32_t>()[j]);
  }
}

}  // namespace test_device_prefetch
