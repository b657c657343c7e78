// The CUDA device layer: tensors on cuda:0 (copies both ways, zero, fill, clone), the caching
// allocator (no driver call in a steady state, statistics, the out-of-memory message), streams and
// events, and the error of host access to a device tensor.
#include <pipeline/core/rng.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/cuda/device_memory.hpp>
#include <pipeline/cuda/stream.hpp>

#include <doctest/doctest.h>

#include <vector>

namespace test_device_memory {

using namespace pipeline;

namespace {

Tensor random_tensor(Shape shape, std::uint64_t seed) {
  Rng rng(seed, "device-memory");
  Tensor t = Tensor::empty(std::move(shape));
  for (float& v : t.values()) v = rng.uniform(-2.f, 2.f);
  return t;
}

}  // namespace

TEST_CASE("host -> device -> host copies are exact; zero, fill and clone on the device") {
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000003}}) {
    const Tensor host = random_tensor(Shape{n}, static_cast<std::uint64_t>(n));
    const Tensor dev = host.to(Device::cuda(0));
    CHECK(dev.device() == Device::cuda(0));
    CHECK(dev.to(Device::cuda(0)).same_storage(dev));  // already there: no copy
    const Tensor clone = dev.clone();
    CHECK(!clone.same_storage(dev));
    CHECK(clone.to(Device::cpu()).to_vector() == host.to_vector());
    Tensor z = dev.clone();
    z.zero();
    CHECK(z.to(Device::cpu()).to_vector() == std::vector<float>(static_cast<std::size_t>(n), 0.f));
    Tensor f = Tensor::full(Shape{n}, 2.5f, Device::cuda(0));
    CHECK(f.to(Device::cpu()).to_vector() == std::vector<float>(static_cast<std::size_t>(n), 2.5f));
  }
  const Tensor empty = Tensor::zeros(Shape{0}, DType::Float32, Device::cuda(0));
  CHECK(empty.to(Device::cpu()).numel() == 0);
}

TEST_CASE("host access to a device tensor is an error naming the device") {
  Tensor dev = Tensor::zeros(Shape{4}, DType::Float32, Device::cuda(0));
  CHECK_THROWS_WITH_AS(dev.data<float>(), doctest::Contains("tensor on cuda:0"), Error);
  CHECK_THROWS_WITH_AS(Tensor::empty(Shape{1}, DType::Float32, Device::cuda(1000)),
                       doctest::Contains("cuda:1000 does not exist"), ConfigError);
}

TEST_CASE("caching allocator: a repeated step reaches the driver only the first time") {
  const auto before = cuda::device_memory_stats(0);
  for (int step = 0; step < 10; ++step) {
    std::vector<Tensor> held;
    for (std::int64_t n : {1000, 250000, 3000000, 17})
      held.push_back(Tensor::empty(Shape{n}, DType::Float32, Device::cuda(0)));
  }
  const auto after = cuda::device_memory_stats(0);
  CHECK(after.requests - before.requests == 40);
  CHECK(after.driver_allocations - before.driver_allocations <= 4);
  CHECK(after.peak_in_use_bytes >= 4 * (3000000 + 250000 + 1000 + 17));
  CHECK(after.cached_bytes >= 4 * 3000000);
}

TEST_CASE("out of memory names what was asked, what is in use and the device") {
  const std::int64_t huge = std::int64_t{1} << 48;  // 1 PiB of floats
  CHECK_THROWS_WITH_AS(Tensor::empty(Shape{huge}, DType::Float32, Device::cuda(0)),
                       doctest::Contains("out of memory on cuda:0: asked for"), CudaError);
  // The device is usable afterwards.
  CHECK(Tensor::full(Shape{3}, 1.f, Device::cuda(0)).to(Device::cpu()).to_vector() ==
        std::vector<float>{1.f, 1.f, 1.f});
}

TEST_CASE("streams and events order work and time it; the current stream is per thread") {
  cuda::Stream s = cuda::Stream::create(0);
  CHECK(s.owned());
  CHECK(cuda::current_stream(0) == nullptr);
  {
    cuda::StreamGuard guard(s);
    CHECK(cuda::current_stream(0) == s.get());
    cuda::Event start = cuda::Event::create(0, /*timing=*/true);
    cuda::Event end = cuda::Event::create(0, /*timing=*/true);
    start.record(s.get());
    Tensor big = Tensor::full(Shape{1 << 24}, 3.f, Device::cuda(0));  // on s
    end.record(s.get());
    end.synchronize();
    CHECK(end.done());
    CHECK(cuda::Event::elapsed_ms(start, end) >= 0.f);
    CHECK(big.to(Device::cpu()).values()[12345] == 3.f);
  }
  CHECK(cuda::current_stream(0) == nullptr);
  cuda::Stream moved = std::move(s);
  CHECK(moved.owned());
  CHECK(!s.owned());
  moved.synchronize();
}

}  // namespace test_device_memory
