// detail::poll_until, the wait loop behind every MPI wait: it returns as soon as the condition
// holds (also when another thread makes it true while the loop sleeps), gives up at the limit,
// and checks the condition once more at the limit.
#include <doctest/doctest.h>

#include <pipeline/comm/communicator.hpp>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

namespace test_poll_until {

using namespace pipeline;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("poll_until returns at once when the condition already holds") {
  int calls = 0;
  CHECK(detail::poll_until([&] { return ++calls >= 1; }, 10.0));
  CHECK(calls == 1);
}

TEST_CASE("poll_until sees a condition another thread sets, long before the limit") {
  std::atomic<bool> flag{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    flag.store(true);
  });
  const bool done = detail::poll_until([&] { return flag.load(); }, 60.0);
  const double waited = seconds_since(t0);
  setter.join();
  CHECK(done);
  CHECK(waited >= 0.029);
  // Far below the limit: the loop noticed the flag, it did not run into the timeout.
  CHECK(waited < 30.0);
}

TEST_CASE("a limit beyond any run means none: it neither overflows nor ends the wait at once") {
  // (The clock's nanoseconds overflow near 9.2e9 s: --comm-timeout 1e10 timed out at once.)
  for (const double limit : {1e10, 1e300, std::numeric_limits<double>::max()}) {
    CAPTURE(limit);
    CHECK(detail::deadline_after(limit) >
          std::chrono::steady_clock::now() + std::chrono::hours(24 * 365));
    int calls = 0;
    CHECK(detail::poll_until([&] { return ++calls >= 3; }, limit));
    CHECK(calls == 3);
  }
}

TEST_CASE("poll_until gives up after the limit and reports false") {
  int calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(detail::poll_until(
      [&] {
        ++calls;
        return false;
      },
      0.05));
  const double waited = seconds_since(t0);
  CHECK(waited >= 0.05);
  CHECK(waited < 5.0);
  CHECK(calls > 1);
}

TEST_CASE("poll_until checks once more at the limit") {
  // The condition becomes true only on a call made after the deadline has passed.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(detail::poll_until([&] { return seconds_since(t0) >= 0.02; }, 0.02));
}

TEST_CASE("poll_until with a zero limit still looks once") {
  CHECK(detail::poll_until([] { return true; }, 0.0));
  CHECK_FALSE(detail::poll_until([] { return false; }, 0.0));
}

}  // namespace test_poll_until
