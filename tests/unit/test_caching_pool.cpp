// The device caching allocator's policy (cuda/caching_pool.hpp) on a fake driver: size classes,
// reuse without the driver in a steady state, stream order, cross-stream events, statistics, and
// the out-of-memory path (cache released and retried, then an error naming the figures), and the
// pool shared by the stage threads of an in-process pipeline.
#include <pipeline/cuda/caching_pool.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

namespace test_caching_pool {

using namespace pipeline;
using namespace pipeline::cuda;

namespace {

// A device of `capacity` bytes; events complete when the test says so.
struct FakeDevice {
  std::size_t capacity = std::size_t{1} << 30;
  std::size_t used = 0;
  std::map<void*, std::size_t> blocks;
  std::map<EventHandle, bool> events;
  int next_event = 1;
  int waits = 0;

  FakeDevice() = default;
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;
  // Blocks the pool still lends out (live tensors) go with the device, as a GPU's do.
  ~FakeDevice() {
    for (auto& [p, bytes] : blocks) std::free(p);
  }

  PoolDriver driver() {
    PoolDriver d;
    d.allocate = [this](std::size_t bytes) -> void* {
      if (used + bytes > capacity) return nullptr;
      void* p = std::malloc(bytes);
      blocks[p] = bytes;
      used += bytes;
      return p;
    };
    d.free = [this](void* p) {
      used -= blocks.at(p);
      blocks.erase(p);
      std::free(p);
    };
    d.record_event = [this](StreamHandle) {
      auto e = reinterpret_cast<EventHandle>(static_cast<std::intptr_t>(next_event++));
      events[e] = false;
      return e;
    };
    d.event_done = [this](EventHandle e) { return events.at(e); };
    d.wait_event = [this](EventHandle e) {
      ++waits;
      events.at(e) = true;
    };
    d.destroy_event = [this](EventHandle e) { events.erase(e); };
    return d;
  }
  void complete_all() {
    for (auto& [e, done] : events) done = true;
  }
};

StreamHandle stream(int i) { return reinterpret_cast<StreamHandle>(static_cast<std::intptr_t>(i)); }

}  // namespace

TEST_CASE("size classes: 512-byte steps up to 1 MiB, then eighths of a power of two") {
  CHECK(CachingPool::size_class(0) == 512);
  CHECK(CachingPool::size_class(1) == 512);
  CHECK(CachingPool::size_class(513) == 1024);
  CHECK(CachingPool::size_class(std::size_t{1} << 20) == std::size_t{1} << 20);
  CHECK(CachingPool::size_class((std::size_t{1} << 20) + 1) == (std::size_t{1} << 20) + (1 << 17));
  for (std::size_t bytes : {std::size_t{3'000'000}, std::size_t{123'456'789}, std::size_t{1} << 33}) {
    const std::size_t c = CachingPool::size_class(bytes);
    CHECK(c >= bytes);
    CHECK(static_cast<double>(c) <= 1.125 * static_cast<double>(bytes));
  }
}

TEST_CASE("a steady state of the same sizes makes no driver call") {
  FakeDevice dev;
  CachingPool pool(dev.driver(), "cuda:0");
  const std::vector<std::size_t> step = {4096, 1 << 20, 3'000'000, 100, 4096};
  for (int iteration = 0; iteration < 5; ++iteration) {
    std::vector<void*> held;
    for (std::size_t b : step) held.push_back(pool.allocate(b, stream(1)));
    std::set<void*> distinct(held.begin(), held.end());
    CHECK(distinct.size() == held.size());
    for (void* p : held) pool.deallocate(p);
  }
  const PoolStats s = pool.stats();
  CHECK(s.requests == 25);
  CHECK(s.driver_allocations == 5);  // the first iteration only
  CHECK(s.in_use_bytes == 0);
  CHECK(s.cached_bytes == static_cast<std::int64_t>(dev.used));
  CHECK(s.peak_in_use_bytes == static_cast<std::int64_t>(dev.used));
  pool.release_cached();
  CHECK(dev.used == 0);
  CHECK(pool.stats().driver_frees == 5);
  CHECK(pool.stats().cached_bytes == 0);
}

TEST_CASE("stream order: a freed block is reused on its stream at once, never on another") {
  FakeDevice dev;
  CachingPool pool(dev.driver(), "cuda:0");
  void* a = pool.allocate(1000, stream(1));
  pool.deallocate(a);
  CHECK(pool.allocate(1000, stream(1)) == a);  // same stream: reused
  void* b = pool.allocate(1000, stream(1));
  pool.deallocate(b);
  void* c = pool.allocate(1000, stream(2));  // another stream: a new block
  CHECK(c != b);
  CHECK(pool.stats().driver_allocations == 2 + 1);
}

TEST_CASE("a block used on another stream waits for that stream's event") {
  FakeDevice dev;
  CachingPool pool(dev.driver(), "cuda:0");
  void* a = pool.allocate(2048, stream(1));
  pool.record_stream(a, stream(2));
  pool.record_stream(a, stream(2));  // once is enough
  pool.record_stream(a, stream(1));  // its own stream: nothing to record
  pool.deallocate(a);
  CHECK(dev.events.size() == 1);
  void* b = pool.allocate(2048, stream(1));
  CHECK(b != a);  // stream 2 may still be using it
  dev.complete_all();
  pool.deallocate(b);
  void* c = pool.allocate(2048, stream(1));
  void* d = pool.allocate(2048, stream(1));
  CHECK(std::set<void*>{c, d} == std::set<void*>{a, b});
  CHECK(dev.events.empty());  // destroyed once done
  CHECK_THROWS_AS(pool.record_stream(reinterpret_cast<void*>(0x10), stream(2)), Error);
}

TEST_CASE("out of memory: the cache is released and the request retried, then a clear error") {
  FakeDevice dev;
  dev.capacity = 10 << 20;
  CachingPool pool(dev.driver(), "cuda:3");
  void* a = pool.allocate(6 << 20, stream(1));
  pool.deallocate(a);  // cached, 6 MiB
  void* b = pool.allocate(8 << 20, stream(1));  // needs the cache released first
  CHECK(b != nullptr);
  CHECK(pool.stats().driver_frees == 1);
  CHECK(pool.stats().cached_bytes == 0);
  try {
    (void)pool.allocate(4 << 20, stream(1));
    FAIL("expected an out-of-memory error");
  } catch (const CudaError& e) {
    const std::string m = e.what();
    CHECK(m.find("out of memory on cuda:3") != std::string::npos);
    CHECK(m.find("asked for 4.00 MiB") != std::string::npos);
    CHECK(m.find("8.00 MiB in use") != std::string::npos);
    CHECK(m.find("lower the microbatch size") != std::string::npos);
  }
  // A block waiting for another stream is waited for when memory is needed back.
  pool.record_stream(b, stream(2));
  pool.deallocate(b);
  void* c = pool.allocate(9 << 20, stream(1));
  CHECK(c != nullptr);
  CHECK(dev.waits == 1);
}

TEST_CASE("a destroyed stream's blocks pass to the default stream; no event is recorded on it") {
  FakeDevice dev;
  std::vector<StreamHandle> recorded_on;
  PoolDriver d = dev.driver();
  auto record = d.record_event;
  d.record_event = [&](StreamHandle s) {
    recorded_on.push_back(s);
    return record(s);
  };
  CachingPool pool(std::move(d), "cuda:0");
  void* cached = pool.allocate(4096, stream(1));
  pool.deallocate(cached);
  void* live = pool.allocate(8192, stream(1));
  void* shared = pool.allocate(1024, stream(2));
  pool.record_stream(shared, stream(1));  // used by stream 1's work too
  pool.forget_stream(stream(1));
  pool.deallocate(shared);  // stream 1 is gone: no event on it, straight back to stream 2
  CHECK(recorded_on.empty());
  CHECK(pool.allocate(1024, stream(2)) == shared);
  CHECK(pool.allocate(4096, nullptr) == cached);  // its cached block, now the default stream's
  pool.deallocate(live);
  CHECK(pool.allocate(8192, nullptr) == live);
  CHECK(pool.allocate(4096, stream(1)) != cached);  // a new stream with the old handle: nothing
  CHECK(pool.stats().driver_allocations == 4);
}

TEST_CASE("per-stream use: a block counts for the stream it was asked for, whoever frees it") {
  FakeDevice dev;
  CachingPool pool(dev.driver(), "cuda:0");
  void* a = pool.allocate(1024, stream(1));
  void* b = pool.allocate(2048, stream(1));
  void* c = pool.allocate(4096, stream(2));
  CHECK(pool.stream_use(stream(1)).in_use_bytes == 3072);
  CHECK(pool.stream_use(stream(2)).in_use_bytes == 4096);
  pool.deallocate(b);  // freed from stream 2's rank, still stream 1's bytes
  pool.deallocate(a);
  void* d = pool.allocate(512, stream(1));
  CHECK(pool.stream_use(stream(1)).in_use_bytes == 512);
  CHECK(pool.stream_use(stream(1)).peak_in_use_bytes == 3072);
  CHECK(pool.stream_use(stream(2)).peak_in_use_bytes == 4096);
  CHECK(pool.stats().peak_in_use_bytes == 3072 + 4096);
  CHECK(pool.stream_use(stream(3)).peak_in_use_bytes == 0);  // never used
  pool.forget_stream(stream(1));  // its live block passes to the default stream
  CHECK(pool.stream_use(stream(1)).peak_in_use_bytes == 0);
  CHECK(pool.stream_use(nullptr).in_use_bytes == 512);
  pool.deallocate(d);
  pool.deallocate(c);
  CHECK(pool.stream_use(nullptr).in_use_bytes == 0);
  CHECK(pool.stream_use(stream(2)).in_use_bytes == 0);
}

TEST_CASE("a capture's private pool: its blocks serve only it until the graph is released") {
  FakeDevice dev;
  CachingPool pool(dev.driver(), "cuda:0");
  // Before the capture: a block freed on the capturing stream is common and reusable.
  void* before = pool.allocate(4096, stream(1));
  void* held = pool.allocate(8192, stream(1));  // lives through the capture, freed in it
  pool.deallocate(before);

  const int id = pool.begin_private(stream(1));
  CHECK_THROWS_WITH_AS(pool.begin_private(stream(2)), doctest::Contains("one at a time"), Error);
  void* a = pool.allocate(4096, stream(1));
  CHECK(a == before);  // a common block of its stream joins the capture
  pool.deallocate(a);
  void* b = pool.allocate(4096, stream(1));
  CHECK(b == a);          // the capture reuses its own freed block, in stream order
  pool.deallocate(held);  // the graph may read it: the capture's now
  void* other = pool.allocate(8192, stream(2));  // another stream keeps to the common pools
  CHECK(other != held);
  pool.deallocate(b);
  pool.end_private();

  // After the capture, nothing outside the graph gets its blocks, not even on its stream, and
  // an out-of-memory release keeps them.
  const auto driver_allocations = pool.stats().driver_allocations;
  void* c = pool.allocate(4096, stream(1));
  void* d = pool.allocate(8192, stream(1));
  CHECK(c != a);
  CHECK(d != held);
  CHECK(pool.stats().driver_allocations == driver_allocations + 2);
  pool.release_cached();
  CHECK(dev.blocks.count(a) == 1);
  CHECK(dev.blocks.count(held) == 1);

  // Released with its graph, they serve everyone again.
  pool.release_private(id);
  pool.deallocate(c);
  pool.deallocate(d);
  pool.deallocate(other);
  void* e = pool.allocate(4096, stream(1));
  CHECK((e == a || e == c));
  pool.deallocate(e);
  pool.release_cached();
  CHECK(dev.blocks.empty());
}

TEST_CASE("a capture's live block freed after the capture returns to its private pool") {
  FakeDevice dev;
  CachingPool pool(dev.driver(), "cuda:0");
  const int id = pool.begin_private(stream(1));
  void* out = pool.allocate(512, stream(1));  // e.g. a graph's output, kept past the capture
  pool.end_private();
  pool.deallocate(out);
  void* x = pool.allocate(512, stream(1));
  CHECK(x != out);
  pool.release_private(id);
  pool.deallocate(x);
  void* y = pool.allocate(512, stream(1));
  void* z = pool.allocate(512, stream(1));
  CHECK(((y == out && z == x) || (y == x && z == out)));
  pool.deallocate(y);
  pool.deallocate(z);
}

TEST_CASE("stage threads sharing one pool: no block lent twice, the figures add up") {
  // Each thread is a stage on a stream of its own; every fifth block is also used on the next
  // stage's stream (an event then guards its reuse), and the device is small enough that the
  // cache is released and retried (waiting on those events) while the others allocate.
  constexpr int kThreads = 4, kIterations = 300;
  FakeDevice dev;
  dev.capacity = std::size_t{24} << 20;
  CachingPool pool(dev.driver(), "cuda:0");
  const std::vector<std::size_t> sizes = {512, 4096, 1 << 20, 3'000'000, 700};
  std::vector<int> corrupted(kThreads, 0);
  std::vector<std::thread> stages;
  for (int t = 0; t < kThreads; ++t) {
    stages.emplace_back([&, t] {
      std::vector<void*> held;
      for (int i = 0; i < kIterations; ++i) {
        const std::size_t bytes = sizes[static_cast<std::size_t>(i + t) % sizes.size()];
        void* p = pool.allocate(bytes, stream(t + 1));
        std::memset(p, t + 1, 64);  // a block lent to two stages at once is overwritten here
        held.push_back(p);
        if (held.size() < 3) continue;
        void* q = held.front();
        held.erase(held.begin());
        for (int b = 0; b < 64; ++b)
          corrupted[t] += static_cast<unsigned char>(static_cast<char*>(q)[b]) != t + 1;
        if (i % 5 == 0) pool.record_stream(q, stream((t + 1) % kThreads + 1));
        pool.deallocate(q);
      }
      for (void* q : held) pool.deallocate(q);
    });
  }
  for (auto& s : stages) s.join();
  for (int t = 0; t < kThreads; ++t) CHECK(corrupted[t] == 0);
  const PoolStats stats = pool.stats();
  CHECK(stats.requests == kThreads * kIterations);
  CHECK(stats.in_use_bytes == 0);
  CHECK(pool.live_blocks() == 0);
  CHECK(stats.peak_in_use_bytes <= static_cast<std::int64_t>(dev.capacity));
  CHECK(stats.driver_frees > 0);  // the out-of-memory path ran
  for (int t = 0; t < kThreads; ++t) CHECK(pool.stream_use(stream(t + 1)).in_use_bytes == 0);
  CHECK(stats.cached_bytes == static_cast<std::int64_t>(dev.used));
  pool.release_cached();
  CHECK(dev.blocks.empty());
  CHECK(pool.stats().cached_bytes == 0);
}

}  // namespace test_caching_pool
