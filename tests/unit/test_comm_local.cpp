// The in-process communicator: point-to-point matching by (peer, tag), neighbours on one rank,
// bitwise-exact allreduce over groups (also non-blocking, several in flight), timeouts that say
// what they waited for, and failures that end every rank instead of hanging. Also the tag codec
// shared with MPI.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/local.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>

namespace test_comm_local {

using namespace pipeline;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A tensor whose every element is `base + index`: integers, so sums are exact in float.
Tensor ramp(Shape shape, float base) {
  Tensor t = Tensor::empty(std::move(shape));
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = base + static_cast<float>(i);
  return t;
}

bool bitwise_equal(const Tensor& a, const std::vector<float>& b) {
  if (a.numel() != static_cast<std::int64_t>(b.size())) return false;
  return std::memcmp(a.raw(), b.data(), b.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("tag codec: distinct tags encode to distinct values within the MPI bound") {
  TagCodec codec(32767, 4);
  CHECK(codec.max_stages() == 4);
  CHECK(codec.microbatch_window() >= kMinMicrobatchWindow);
  std::set<int> seen;
  for (int k = 0; k < kNumTagKinds; ++k)
    for (int s = 0; s < 4; ++s)
      for (int u = 0; u < codec.microbatch_window(); ++u) {
        Tag t{static_cast<TagKind>(k), s, u};
        int v = codec.encode(t);
        REQUIRE(v >= 0);
        REQUIRE(v <= 32767);
        REQUIRE(codec.decode(v) == t);
        seen.insert(v);
      }
  CHECK(seen.size() == static_cast<std::size_t>(kNumTagKinds * 4 * codec.microbatch_window()));
  // Microbatches wrap modulo the window.
  CHECK(codec.encode(Tag::activation(1, 3)) ==
        codec.encode(Tag::activation(1, 3 + static_cast<int>(codec.microbatch_window()))));
  CHECK(codec.encode(Tag::activation(1, 3)) != codec.encode(Tag::gradient(1, 3)));
  CHECK(codec.encode(Tag::activation(1, 3)) != codec.encode(Tag::activation(2, 3)));

  TagCodec wide(2147483647, 1024);
  CHECK(wide.microbatch_window() >= (1 << 17));
  CHECK_THROWS_AS(wide.encode(Tag::activation(1024, 0)), Error);
  CHECK_THROWS_AS(wide.encode(Tag::activation(0, -1)), Error);
  CHECK_THROWS_AS(TagCodec(32767, 1 << 12), ConfigError);
  CHECK_THROWS_AS(TagCodec(1000, 1), ConfigError);
}

TEST_CASE("local: messages are matched by tag, not by arrival order") {
  run_local(2, [](Communicator& comm) {
    if (comm.rank() == 0) {
      for (int u = 4; u >= 0; --u) comm.send(ramp({3}, 100.0f * u), 1, Tag::activation(0, u));
      // Two messages with one tag arrive in the order they were sent.
      comm.send(Tensor::full({2}, 7.0f), 1, Tag::control(0, 0));
      comm.send(Tensor::full({2}, 8.0f), 1, Tag::control(0, 0));
    } else {
      std::vector<Tensor> got(5);
      std::vector<Request> reqs;
      for (int u = 0; u < 5; ++u) {
        got[static_cast<std::size_t>(u)] = Tensor::zeros({3});
        reqs.push_back(comm.irecv(got[static_cast<std::size_t>(u)], 0, Tag::activation(0, u)));
      }
      wait_all(reqs);
      for (int u = 0; u < 5; ++u)
        CHECK(bitwise_equal(got[static_cast<std::size_t>(u)],
                            {100.0f * u, 100.0f * u + 1, 100.0f * u + 2}));
      Tensor a = Tensor::zeros({2}), b = Tensor::zeros({2});
      Request ra = comm.irecv(a, 0, Tag::control(0, 0));
      Request rb = comm.irecv(b, 0, Tag::control(0, 0));
      rb.wait();
      ra.wait();
      CHECK(a.values()[0] == 7.0f);
      CHECK(b.values()[0] == 8.0f);
    }
  });
}

TEST_CASE("local: both neighbours on the same rank, in both directions") {
  // Rank 0 holds stages 0 and 2, rank 1 holds stage 1: rank 1 receives stage 0's activation and
  // stage 2's gradient from the same peer, and sends it both an activation and a gradient.
  run_local(2, [](Communicator& comm) {
    const int mb = 9;
    if (comm.rank() == 0) {
      Tensor grad_in = Tensor::zeros({4}), act_in = Tensor::zeros({4});
      // Post the gradient receive first: the activation sent first must not land in it.
      Request rg = comm.irecv(grad_in, 1, Tag::gradient(1, mb));
      Request ra = comm.irecv(act_in, 1, Tag::activation(1, mb));
      comm.send(Tensor::full({4}, 1.0f), 1, Tag::activation(0, mb));
      comm.send(Tensor::full({4}, 3.0f), 1, Tag::gradient(2, mb));
      ra.wait();
      rg.wait();
      CHECK(act_in.values()[3] == 2.0f);
      CHECK(grad_in.values()[3] == -2.0f);
      // A rank can also message itself (two stages on one rank exchanging through the hub).
      Tensor self_in = Tensor::zeros({1});
      Request rs = comm.irecv(self_in, 0, Tag::activation(0, mb + 1));
      comm.send(Tensor::full({1}, 5.0f), 0, Tag::activation(0, mb + 1));
      rs.wait();
      CHECK(self_in.values()[0] == 5.0f);
    } else {
      Tensor act = Tensor::zeros({4}), grad = Tensor::zeros({4});
      Request rg = comm.irecv(grad, 0, Tag::gradient(2, mb));
      Request ra = comm.irecv(act, 0, Tag::activation(0, mb));
      comm.send(Tensor::full({4}, 2.0f), 0, Tag::activation(1, mb));
      comm.send(Tensor::full({4}, -2.0f), 0, Tag::gradient(1, mb));
      ra.wait();
      rg.wait();
      CHECK(act.values()[0] == 1.0f);
      CHECK(grad.values()[0] == 3.0f);
    }
  });
}

TEST_CASE("local: test() reports completion without blocking") {
  run_local(2, [](Communicator& comm) {
    if (comm.rank() == 1) {
      Tensor x = Tensor::zeros({2});
      Request r = comm.irecv(x, 0, Tag::activation(0, 0));
      CHECK_FALSE(r.test());  // rank 0 sends only after our barrier
      comm.barrier();
      while (!r.test()) std::this_thread::yield();
      CHECK_FALSE(r.pending());
      CHECK(x.values()[1] == 4.0f);
    } else {
      comm.barrier();
      comm.send(Tensor::full({2}, 4.0f), 1, Tag::activation(0, 0));
    }
  });
}

TEST_CASE("local: a timeout beyond any run waits as one of a minute does") {
  // (--comm-timeout 1e10 overflowed the deadline: every wait timed out at once.)
  run_local(2, [](Communicator& comm) {
    comm.set_timeout(1e10);
    if (comm.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      comm.send(Tensor::full({2}, 3.0f), 1, Tag::control(0, 0));
    } else {
      Tensor got = Tensor::zeros({2});
      comm.irecv(got, 0, Tag::control(0, 0)).wait();
      CHECK(got.values()[0] == 3.0f);
    }
  });
}

TEST_CASE("local: a message of the wrong size is an error naming both sizes") {
  CHECK_THROWS_WITH_AS(run_local(2,
                                 [](Communicator& comm) {
                                   if (comm.rank() == 0) {
                                     comm.send(Tensor::zeros({5}), 1, Tag::gradient(1, 2));
                                   } else {
                                     Tensor into = Tensor::zeros({2, 3});
                                     comm.recv(into, 0, Tag::gradient(1, 2));
                                   }
                                 }),
                       doctest::Contains("holds 5 float32 elements"), Error);
}

TEST_CASE("local: allreduce is bitwise exact on every member, over the world and groups") {
  const int n = 4;
  run_local(n, [&](Communicator& comm) {
    const int r = comm.rank();
    // World: two tensors of different shapes, integer-valued so the sum is exact.
    std::vector<Tensor> ts = {ramp({2, 3}, 1000.0f * r), ramp({5}, -10.0f * r)};
    comm.allreduce_sum(ts, comm.world());
    std::vector<float> want0(6), want1(5);
    for (int i = 0; i < 6; ++i) want0[static_cast<std::size_t>(i)] = 1000.0f * 6 + 4.0f * i;
    for (int i = 0; i < 5; ++i) want1[static_cast<std::size_t>(i)] = -10.0f * 6 + 4.0f * i;
    CHECK(bitwise_equal(ts[0], want0));
    CHECK(bitwise_equal(ts[1], want1));

    // Groups: the replicas {0, 2} and {3, 1} (given out of order) of two stages.
    Group g = r % 2 == 0 ? comm.create_group({0, 2}) : comm.create_group({3, 1});
    CHECK(g.size() == 2);
    CHECK(g.index() == (r == 0 || r == 3 ? 0 : 1));
    Tensor x = Tensor::full({7}, static_cast<float>(r + 1));
    comm.allreduce_sum(x, g);
    float expect = r % 2 == 0 ? 1.0f + 3.0f : 2.0f + 4.0f;
    CHECK(bitwise_equal(x, std::vector<float>(7, expect)));

    // A scalar over the world (the global gradient norm): everyone gets the same bits even
    // when the terms are not exact, because the sum is computed once.
    Tensor s = Tensor::full({}, 0.1f * static_cast<float>(r + 1));
    comm.allreduce_sum(s, comm.world());
    if (r != 0) {
      comm.send(s, 0, Tag::control(0, 1));
    } else {
      for (int p = 1; p < n; ++p) {
        Tensor other = Tensor::zeros({});
        comm.recv(other, p, Tag::control(0, 1));
        CHECK(std::memcmp(other.raw(), s.raw(), sizeof(float)) == 0);
      }
    }

    // A group of one is a no-op; a group without the caller is refused.
    Group solo = comm.create_group({r});
    Tensor y = Tensor::full({1}, 3.0f);
    comm.allreduce_sum(y, solo);
    CHECK(y.values()[0] == 3.0f);
    CHECK_THROWS_AS(comm.create_group({(r + 1) % n}), ConfigError);
    CHECK_THROWS_AS(comm.create_group({r, r}), ConfigError);
    CHECK_THROWS_AS(comm.create_group({r, n}), ConfigError);
  });
}

TEST_CASE("local: a receive that never comes times out naming peer, tag and context") {
  auto t0 = std::chrono::steady_clock::now();
  std::string message;
  try {
    run_local(2, [](Communicator& comm) {
      if (comm.rank() == 1) return;  // never sends
      comm.set_timeout(0.3);
      comm.set_context([] { return std::string("stage 0, action 3 of 8 (0RG5@1)"); });
      Tensor into = Tensor::zeros({4});
      comm.recv(into, 1, Tag::gradient(1, 5));
    });
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  double elapsed = seconds_since(t0);
  CHECK(elapsed >= 0.3);
  CHECK(elapsed < 5.0);
  CAPTURE(message);
  CHECK(message.find("gradient of stage 1, microbatch 5 from rank 1") != std::string::npos);
  CHECK(message.find("stage 0, action 3 of 8 (0RG5@1)") != std::string::npos);
  CHECK(message.find("PIPELINE_COMM_TIMEOUT") != std::string::npos);
  CHECK(message.find("limit 0.3 s") != std::string::npos);
}

TEST_CASE("local: an allreduce that a member never joins times out") {
  CHECK_THROWS_AS(run_local(3,
                            [](Communicator& comm) {
                              if (comm.rank() == 2) return;
                              comm.set_timeout(0.2);
                              Tensor x = Tensor::zeros({1});
                              comm.allreduce_sum(x, comm.world());
                            }),
                  TimeoutError);
}

TEST_CASE("local: an exception on one rank stops the ranks waiting for it") {
  auto t0 = std::chrono::steady_clock::now();
  std::atomic<int> aborted{0};
  CHECK_THROWS_WITH_AS(
      run_local(3,
                [&](Communicator& comm) {
                  // Default timeout (minutes): only the abort can free them.
                  try {
                    if (comm.rank() == 0) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(50));
                      PIPELINE_FAIL(ConfigError, "bad plan on rank 0");
                    }
                    if (comm.rank() == 1) {
                      Tensor x = Tensor::zeros({1});
                      comm.recv(x, 0, Tag::activation(0, 0));
                    } else {
                      comm.barrier();
                    }
                  } catch (const CommAbortedError& e) {
                    CHECK(std::string(e.what()).find("bad plan on rank 0") != std::string::npos);
                    ++aborted;
                    throw;
                  }
                }),
      doctest::Contains("bad plan on rank 0"), ConfigError);
  CHECK(aborted == 2);
  CHECK(seconds_since(t0) < 5.0);
}

TEST_CASE("local: abort() ends every rank with the reason") {
  CHECK_THROWS_WITH_AS(run_local(2,
                                 [](Communicator& comm) {
                                   if (comm.rank() == 0) comm.abort("peer of stage 1 lost");
                                   Tensor x = Tensor::zeros({1});
                                   comm.recv(x, 0, Tag::activation(0, 0));
                                 }),
                       doctest::Contains("peer of stage 1 lost"), CommAbortedError);
  LocalHub hub(2);
  auto c0 = hub.endpoint(0);
  hub.abort(1, "test");
  Tensor x = Tensor::zeros({1});
  CHECK_THROWS_AS(c0->isend(x, 1, Tag::activation(0, 0)), CommAbortedError);
}

TEST_CASE("local: timeout from PIPELINE_COMM_TIMEOUT, validated") {
  LocalHub hub(1);
  CHECK(hub.endpoint(0)->timeout() == kDefaultCommTimeoutSeconds);
  ::setenv("PIPELINE_COMM_TIMEOUT", "12.5", 1);
  CHECK(hub.endpoint(0)->timeout() == 12.5);
  ::setenv("PIPELINE_COMM_TIMEOUT", "soon", 1);
  CHECK_THROWS_AS(hub.endpoint(0), ConfigError);
  ::unsetenv("PIPELINE_COMM_TIMEOUT");
  auto c = hub.endpoint(0);
  CHECK_THROWS_AS(c->set_timeout(0), ConfigError);
  CHECK_THROWS_AS(c->set_timeout(-1), ConfigError);
  Tensor x = Tensor::zeros({1});
  CHECK_THROWS_AS(c->isend(x, 1, Tag::activation(0, 0)), ConfigError);  // peer out of range
}

TEST_CASE("local: non-blocking allreduces, several in flight, equal one allreduce bit for bit") {
  const int n = 3;
  // Non-exact values (thirds of integers), so the check also covers the order of summation.
  auto values = [](int r, int size, float shift) {
    Tensor t = Tensor::empty({size});
    for (int i = 0; i < size; ++i)
      t.data<float>()[i] = (static_cast<float>(i * (r + 2)) + shift) / 3.0f;
    return t;
  };
  run_local(n, [&](Communicator& comm) {
    const int r = comm.rank();
    // The same data as three buckets in flight at once, and as one blocking allreduce.
    std::vector<Tensor> buckets = {values(r, 100, 0.5f), values(r, 7, 1.5f), values(r, 33, 2.5f)};
    std::vector<Tensor> whole = {buckets[0].clone(), buckets[1].clone(), buckets[2].clone()};
    // Ranks start them at different moments: rank 2 only after its own first one completed
    // elsewhere, so rounds of one group are filled in different orders by different members.
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::vector<Request> reqs;
    for (auto& b : buckets) reqs.push_back(comm.iallreduce_sum(b, comm.world()));
    // Nothing was summed before every member started: rank 0 and 1 see them pending or not,
    // but they complete in any order of tests and waits.
    while (!reqs[2].test()) std::this_thread::yield();
    reqs[0].wait();
    CHECK(reqs[1].test());  // the last member to join summed every round at once
    comm.allreduce_sum(whole, comm.world());
    for (std::size_t k = 0; k < buckets.size(); ++k)
      CHECK(std::memcmp(buckets[k].raw(), whole[k].raw(), whole[k].nbytes()) == 0);
    // The closed form of the first element of bucket 1: (1.5 / 3) summed three times, in order.
    const float third = 1.5f / 3.0f;
    CHECK(std::memcmp(buckets[1].raw(), std::vector<float>{(third + third) + third}.data(),
                      sizeof(float)) == 0);
    // A group of one completes at once.
    Group solo = comm.create_group({r});
    Tensor y = Tensor::full({2}, 4.0f);
    Request q = comm.iallreduce_sum(y, solo);
    CHECK(q.test());
    CHECK(y.values()[1] == 4.0f);
  });
}

TEST_CASE("local: a non-blocking allreduce that a member never joins times out naming it") {
  std::string message;
  try {
    run_local(2, [](Communicator& comm) {
      if (comm.rank() == 1) return;
      comm.set_timeout(0.2);
      Tensor x = Tensor::zeros({3});
      Request q = comm.iallreduce_sum(x, comm.world());
      CHECK_FALSE(q.test());
      q.wait();
    });
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("allreduce_sum over ranks [0, 1] (1 of 2 members arrived)") !=
        std::string::npos);
}

}  // namespace test_comm_local
