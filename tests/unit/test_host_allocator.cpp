// The caching host allocator: reuse by size class, statistics, limits, threads, and a training
// step that reaches the system for nothing once warm.
#include <pipeline/core/host_allocator.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include "support/gradcheck.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace test_host_allocator {

using namespace pipeline;

namespace {

bool cached_build() {
  // Under AddressSanitizer every request goes to the C library.
  HostAllocator a;
  void* p = a.allocate(1 << 20);
  a.deallocate(p, 1 << 20);
  return a.stats().cached_bytes > 0;
}

}  // namespace

TEST_CASE("size classes: 64-byte aligned, 8 per power of two from 64 KiB") {
  CHECK(HostAllocator::rounded_size(1) == 64);
  CHECK(HostAllocator::rounded_size(100) == 128);
  if (!cached_build()) return;
  CHECK(HostAllocator::rounded_size(64 << 10) == 64 << 10);
  CHECK(HostAllocator::rounded_size((64 << 10) + 1) == (64 << 10) + (8 << 10));
  CHECK(HostAllocator::rounded_size(1000000) == 1048576);  // step 65536 below 2^20
  for (std::size_t n = 64 << 10; n < (std::size_t{1} << 26); n = n * 5 / 4 + 13) {
    const std::size_t r = HostAllocator::rounded_size(n);
    CHECK(r >= n);
    CHECK(r % 64 == 0);
    CHECK(static_cast<double>(r - n) <= 0.125 * static_cast<double>(n) + 64);
  }
}

TEST_CASE("freed large blocks are reused; small ones go to the C library") {
  HostAllocator a;
  void* p = a.allocate(300000);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
  static_cast<char*>(p)[299999] = 1;  // the whole request is writable
  a.deallocate(p, 300000);
  if (!cached_build()) return;
  HostAllocatorStats s = a.stats();
  CHECK(s.in_use_bytes == 0);
  CHECK(s.cached_bytes == static_cast<std::int64_t>(HostAllocator::rounded_size(300000)));
  CHECK(s.system_allocations == 1);
  // Another request of the same class gets the block back.
  void* q = a.allocate(310000);
  CHECK(q == p);
  s = a.stats();
  CHECK(s.cache_hits == 1);
  CHECK(s.cached_bytes == 0);
  CHECK(s.peak_in_use_bytes == static_cast<std::int64_t>(HostAllocator::rounded_size(300000)));
  a.deallocate(q, 310000);
  void* small = a.allocate(1000);
  a.deallocate(small, 1000);
  CHECK(a.stats().system_allocations == 1);  // small requests are not counted
  a.release_cached();
  CHECK(a.stats().cached_bytes == 0);
  // Beyond the limit a freed block goes back to the system.
  a.set_cache_limit(100000);
  void* big = a.allocate(1 << 20);
  a.deallocate(big, 1 << 20);
  CHECK(a.stats().cached_bytes == 0);
}

TEST_CASE("a reset peak starts from what is in use; only requests from 64 KiB on are counted") {
  HostAllocator a;
  void* kept = a.allocate(100000);
  void* brief = a.allocate(300000);
  a.deallocate(brief, 300000);
  const auto kept_size = static_cast<std::int64_t>(HostAllocator::rounded_size(100000));
  CHECK(a.stats().peak_in_use_bytes ==
        kept_size + static_cast<std::int64_t>(HostAllocator::rounded_size(300000)));
  a.reset_peak();
  CHECK(a.stats().peak_in_use_bytes == kept_size);
  void* small = a.allocate(1000);
  CHECK(a.stats().in_use_bytes == kept_size);
  a.deallocate(small, 1000);
  a.deallocate(kept, 100000);
  CHECK(a.stats().in_use_bytes == 0);
  CHECK(a.stats().peak_in_use_bytes == kept_size);
}

TEST_CASE("threads allocate and free concurrently") {
  HostAllocator a;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&a, t] {
      for (int i = 0; i < 500; ++i) {
        const std::size_t n = (std::size_t{64} << 10) + static_cast<std::size_t>((i * 7 + t) % 5) * 40000;
        auto* p = static_cast<unsigned char*>(a.allocate(n));
        p[0] = p[n - 1] = static_cast<unsigned char>(i);
        a.deallocate(p, n);
      }
    });
  for (auto& t : threads) t.join();
  const HostAllocatorStats s = a.stats();
  CHECK(s.in_use_bytes == 0);
  if (cached_build()) CHECK(s.system_allocations <= 4 * 5);  // at most one per class per thread
}

TEST_CASE("a warm training step reaches the system for no tensor") {
  if (!cached_build()) return;
  set_num_threads(1);
  ZooOptions zo;
  zo.blocks = 2;
  const ZooModel z = make_model("transformer-lm", zo);
  SequentialTrainer trainer(z.model, z.model.init(1), std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f}), 1);
  Batch b;
  b.inputs = Tensor::zeros(z.input_shape(4), DType::Int32);
  b.labels = Tensor::zeros(z.input_shape(4), DType::Int32);
  for (int i = 0; i < 2; ++i) trainer.step(b, 1e-3f, 2);
  const std::int64_t before = host_allocator().stats().system_allocations;
  trainer.step(b, 1e-3f, 2);
  CHECK(host_allocator().stats().system_allocations == before);
  CHECK(host_allocator().stats().cache_hits > 0);
}

TEST_CASE(
    "a range's backward lets go of each layer's output gradient and, consuming them, its saved "
    "records") {
  // What the memory model assumes of a stage: one layer's gradient pair at a time, not the
  // stage's received gradient as well until its whole backward ends.
  if (!cached_build()) return;
  Sequential m("relus");
  for (int i = 0; i < 3; ++i) m.emplace<ReLU>("relu" + std::to_string(i));
  ModelParams params = m.init(1);
  ModelGrads grads = m.zero_grads(m.all());
  const Shape shape{64, 1024};  // 256 KiB: counted by the caching allocator
  const std::int64_t bytes =
      static_cast<std::int64_t>(HostAllocator::rounded_size(shape.numel() * 4));
  // One forward and backward of the three ReLUs; what the backward left in use and its peak,
  // both counted from its start. `move_dy`: the output gradient moved in; `consume`: the saved
  // records too.
  auto backward_use = [&](bool move_dy, bool consume) {
    std::vector<Saved> saved;
    Tensor y =
        m.forward(m.all(), params, testing::random_tensor(shape, 1), saved, {Mode::Train, 0});
    y = Tensor{};
    Tensor dy = testing::random_tensor(shape, 2);
    reset_memory_peak(Device::cpu());
    const std::int64_t start = memory_use(Device::cpu()).in_use_bytes;
    Tensor given = move_dy ? std::move(dy) : dy;
    Tensor dx = consume ? m.backward(m.all(), params, std::move(saved), std::move(given), grads)
                        : m.backward(m.all(), params, saved, std::move(given), grads);
    const MemoryUse use = memory_use(Device::cpu());
    return std::pair{use.in_use_bytes - start, use.peak_in_use_bytes - start};
  };
  const std::int64_t held = backward_use(false, false).second;
  const std::int64_t moved = backward_use(true, false).second;
  CAPTURE(held);
  CAPTURE(moved);
  CHECK(held - moved == bytes);

  // Consuming the saved records too: each ReLU keeps its output (one 256 KiB tensor), which goes
  // once its backward is done, so the three records are gone by the end; the peak (at the top
  // layer: the three records and its gradient pair) is the same.
  const std::pair<std::int64_t, std::int64_t> kept = backward_use(true, false);
  const std::pair<std::int64_t, std::int64_t> consumed = backward_use(true, true);
  CHECK(kept.first == 0);               // dx in, dy out
  CHECK(consumed.first == -3 * bytes);  // and the three records out
  CHECK(kept.second == consumed.second);
}

}  // namespace test_host_allocator
