#include <pipeline/core/threads.hpp>

#include "../../src/core/parallel.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <vector>

#include <sys/syscall.h>
#include <unistd.h>

namespace test_parallel {

using namespace pipeline;

namespace {

// Restores the process's thread count when a test case ends, whatever it set.
struct ThreadCount {
  explicit ThreadCount(int n) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(default_num_threads()); }
};

}  // namespace

TEST_CASE("on_threads calls every thread index once, with more indices than the team") {
  const ThreadCount team(4);
  for (int threads : {1, 2, 3, 4, 5, 9}) {
    CAPTURE(threads);
    std::vector<std::atomic<int>> calls(static_cast<std::size_t>(threads));
    detail::on_threads(threads, [&](int t) {
      REQUIRE((t >= 0 && t < threads));
      calls[static_cast<std::size_t>(t)].fetch_add(1);
    });
    for (const auto& c : calls) CHECK(c.load() == 1);
  }
}

TEST_CASE("static_range splits like OpenMP's static schedule") {
  // 10 over 4: the first 10 % 4 parts one longer.
  const std::vector<std::pair<std::int64_t, std::int64_t>> want = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
  for (int t = 0; t < 4; ++t) {
    const detail::Range r = detail::static_range(10, 4, t);
    CHECK(r.begin == want[static_cast<std::size_t>(t)].first);
    CHECK(r.end == want[static_cast<std::size_t>(t)].second);
  }
  for (std::int64_t n : {0, 1, 7, 33, 1000})
    for (int threads : {1, 2, 3, 16}) {
      CAPTURE(n);
      CAPTURE(threads);
      std::int64_t at = 0, shortest = n, longest = 0;
      for (int t = 0; t < threads; ++t) {
        const detail::Range r = detail::static_range(n, threads, t);
        CHECK(r.begin == at);
        shortest = std::min(shortest, r.end - r.begin);
        longest = std::max(longest, r.end - r.begin);
        at = r.end;
      }
      CHECK(at == n);
      CHECK(longest - shortest <= 1);
    }
}

TEST_CASE("parallel_for and parallel_for_dynamic visit every index once") {
  const ThreadCount team(3);
  for (std::int64_t n : {0, 1, 2, 7, 100, 1001})
    for (int threads : {1, 2, 3, 8}) {
      CAPTURE(n);
      CAPTURE(threads);
      std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n)),
          seen_dynamic(static_cast<std::size_t>(n));
      std::atomic<bool> bad_thread{false};
      detail::parallel_for(n, threads, [&](std::int64_t i) { seen[i].fetch_add(1); });
      detail::parallel_for_dynamic(n, threads, [&](std::int64_t i, int t) {
        if (t < 0 || t >= threads) bad_thread = true;
        seen_dynamic[i].fetch_add(1);
      });
      CHECK_FALSE(bad_thread.load());
      CHECK(std::all_of(seen.begin(), seen.end(), [](const auto& c) { return c.load() == 1; }));
      CHECK(std::all_of(seen_dynamic.begin(), seen_dynamic.end(),
                        [](const auto& c) { return c.load() == 1; }));
    }
}

TEST_CASE("a region inside a region runs its indices on the calling thread") {
  const ThreadCount team(2);
  std::vector<std::atomic<int>> pairs(3 * 4);
  detail::on_threads(3, [&](int outer) {
    detail::on_threads(4, [&](int inner) { pairs[outer * 4 + inner].fetch_add(1); });
  });
  for (const auto& c : pairs) CHECK(c.load() == 1);
}

TEST_CASE("regions of varying width reuse one team of threads") {
  // OpenMP runtimes may end a pool's surplus threads when a region asks for fewer than the one
  // before; the helpers always open the whole team, so a training step's regions of 1 to N
  // working threads run on the same N threads from first to last.
  const ThreadCount team(4);
  std::mutex mutex;
  std::set<long> ids;
  for (int round = 0; round < 50; ++round)
    for (int threads : {4, 2, 3, 1, 4, 2}) {
      detail::on_threads(threads, [&](int) {
        const long id = syscall(SYS_gettid);
        const std::lock_guard<std::mutex> lock(mutex);
        ids.insert(id);
      });
    }
  CHECK(ids.size() <= 4);
}

TEST_CASE("for_each_piece_of covers every element of every array once, in aligned pieces") {
  const ThreadCount team(4);
  const std::vector<std::vector<std::int64_t>> cases = {
      {}, {0}, {5}, {0, 0, 3}, {1, 10, 17, 1023, 0, 65'541, 3}, {100'000, 1, 100'000}};
  for (const auto& sizes : cases)
    for (std::int64_t min_piece : {1, 64, 1'000'000}) {
      CAPTURE(sizes.size());
      CAPTURE(min_piece);
      std::vector<std::vector<std::atomic<int>>> seen;
      for (std::int64_t n : sizes) seen.emplace_back(static_cast<std::size_t>(n));
      std::atomic<bool> bad{false};
      detail::for_each_piece_of(
          sizes, min_piece, 16, [&](std::size_t i, std::int64_t begin, std::int64_t count) {
            if (i >= sizes.size() || count <= 0 || begin % 16 != 0 || begin + count > sizes[i])
              bad = true;
            else
              for (std::int64_t k = begin; k < begin + count; ++k)
                seen[i][static_cast<std::size_t>(k)].fetch_add(1);
          });
      CHECK_FALSE(bad.load());
      for (const auto& s : seen)
        CHECK(std::all_of(s.begin(), s.end(), [](const auto& c) { return c.load() == 1; }));
    }
}

}  // namespace test_parallel
