// ranks: 2 3 4
// The MPI communicator under mpirun: ring exchange, tags that keep messages apart (also when both
// neighbours are one rank, and when microbatch numbers wrap), allreduce (blocking and non-blocking,
// several in flight) over the world and over
// sub-groups checked bitwise on integer-valued inputs, and a receive that never comes timing out
// with a message that names the peer and the tag. Every rank runs every case.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/mpi.hpp>
#include <pipeline/comm/mpi_check.hpp>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

using namespace pipeline;

namespace {

// Every element is `base + index`: integers, so sums are exact in float whatever the order.
Tensor ramp(Shape shape, float base) {
  Tensor t = Tensor::empty(std::move(shape));
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = base + static_cast<float>(i);
  return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("MpiSession joins an MPI that is already initialised and sets the rank prefix") {
  int world_rank = -1, world_size = 0;
  PIPELINE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  PIPELINE_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  MpiSession session;
  CHECK_FALSE(session.owns_mpi());
  CHECK(session.rank() == world_rank);
  CHECK(session.size() == world_size);
  CHECK(detail::current_rank() == world_rank);
  MpiCommunicator comm;
  CHECK(comm.rank() == world_rank);
  CHECK(comm.size() == world_size);
  CHECK(comm.backend() == "mpi");
  CHECK(comm.tag_codec().microbatch_window() >= kMinMicrobatchWindow);
  CHECK(comm.tag_codec().max_stages() >= world_size);
}

TEST_CASE("ring exchange of several microbatches") {
  MpiCommunicator comm;
  const int r = comm.rank(), n = comm.size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int microbatches = 6;
  std::vector<Tensor> inbox;
  std::vector<Request> recvs, sends;
  for (int u = 0; u < microbatches; ++u) {
    inbox.push_back(Tensor::zeros({3, 5}));
    recvs.push_back(comm.irecv(inbox.back(), prev, Tag::activation(prev, u)));
  }
  std::vector<Tensor> outbox;
  for (int u = microbatches - 1; u >= 0; --u) {  // sent in the reverse order of the receives
    outbox.push_back(ramp({3, 5}, 1000.0f * r + 100.0f * u));
    sends.push_back(comm.isend(outbox.back(), next, Tag::activation(r, u)));
  }
  wait_all(recvs);
  wait_all(sends);
  for (int u = 0; u < microbatches; ++u)
    CHECK(bitwise_equal(inbox[static_cast<std::size_t>(u)],
                        ramp({3, 5}, 1000.0f * prev + 100.0f * u)));
}

TEST_CASE("tags keep activations and gradients apart when both neighbours are one rank") {
  MpiCommunicator comm;
  const int r = comm.rank(), n = comm.size();
  // With 2 ranks, next == prev: the same peer sends this rank an activation and a gradient for
  // the same microbatch. Pair ranks (0,1), (2,3); an odd last rank talks to itself.
  const int peer = (r % 2 == 0) ? std::min(r + 1, n - 1) : r - 1;
  const int mb = 7;
  Tensor act = Tensor::zeros({4}), grad = Tensor::zeros({4});
  Tensor labels = Tensor::from_ints({4}, {0, 0, 0, 0});
  // Receives posted in the opposite order of the sends.
  Request rl = comm.irecv(labels, peer, Tag::labels(peer, mb));
  Request rg = comm.irecv(grad, peer, Tag::gradient(peer, mb));
  Request ra = comm.irecv(act, peer, Tag::activation(peer, mb));
  Tensor a = Tensor::full({4}, 10.0f + r), g = Tensor::full({4}, -10.0f - r);
  Tensor l = Tensor::from_ints({4}, {r, r, r, r});
  Request sa = comm.isend(a, peer, Tag::activation(r, mb));
  Request sg = comm.isend(g, peer, Tag::gradient(r, mb));
  Request sl = comm.isend(l, peer, Tag::labels(r, mb));
  ra.wait();
  rg.wait();
  rl.wait();
  sa.wait();
  sg.wait();
  sl.wait();
  CHECK(act.values()[0] == 10.0f + peer);
  CHECK(grad.values()[3] == -10.0f - peer);
  CHECK(labels.data<std::int32_t>()[2] == peer);

  // Microbatch numbers wrap modulo the codec's window; equal wrapped tags still arrive in the
  // order they were sent.
  const int w = static_cast<int>(comm.tag_codec().microbatch_window());
  Tensor x0 = Tensor::zeros({1}), x1 = Tensor::zeros({1});
  Request r0 = comm.irecv(x0, peer, Tag::activation(peer, 3));
  Request r1 = comm.irecv(x1, peer, Tag::activation(peer, 3 + w));
  Tensor y0 = Tensor::full({1}, 1.0f), y1 = Tensor::full({1}, 2.0f);
  Request s0 = comm.isend(y0, peer, Tag::activation(r, 3));
  Request s1 = comm.isend(y1, peer, Tag::activation(r, 3 + w));
  r1.wait();
  r0.wait();
  s0.wait();
  s1.wait();
  CHECK(x0.values()[0] == 1.0f);
  CHECK(x1.values()[0] == 2.0f);
}

TEST_CASE("allreduce over the world and over sub-groups is bitwise exact") {
  MpiCommunicator comm;
  const int r = comm.rank(), n = comm.size();
  const float s1 = static_cast<float>(n * (n - 1) / 2);  // sum of ranks

  SUBCASE("one tensor, in place") {
    Tensor x = ramp({257}, 3.0f * r);
    comm.allreduce_sum(x, comm.world());
    Tensor want = Tensor::empty({257});
    for (int i = 0; i < 257; ++i) want.data<float>()[i] = 3.0f * s1 + static_cast<float>(n * i);
    CHECK(bitwise_equal(x, want));
  }
  SUBCASE("several tensors of different shapes, packed") {
    std::vector<Tensor> ts = {ramp({2, 3}, 1000.0f * r), ramp({5}, -7.0f * r), ramp({}, 1.0f * r)};
    comm.allreduce_sum(ts, comm.world());
    Tensor w0 = Tensor::empty({2, 3}), w1 = Tensor::empty({5});
    for (int i = 0; i < 6; ++i) w0.data<float>()[i] = 1000.0f * s1 + static_cast<float>(n * i);
    for (int i = 0; i < 5; ++i) w1.data<float>()[i] = -7.0f * s1 + static_cast<float>(n * i);
    CHECK(bitwise_equal(ts[0], w0));
    CHECK(bitwise_equal(ts[1], w1));
    CHECK(ts[2].values()[0] == s1);
  }
  SUBCASE("large tensors in place between runs of small ones, direct and through the first") {
    // 256 KiB and more go as messages of their own; the runs of small ones around them are
    // packed, one message per run.
    const std::vector<std::int64_t> sizes = {5, 3, 70000, 9, 100000, 65536, 1};
    for (int limit : {4, 1}) {
      CAPTURE(limit);
      comm.set_allreduce_direct_limit(limit);
      std::vector<Tensor> ts;
      for (std::size_t k = 0; k < sizes.size(); ++k)
        ts.push_back(ramp({sizes[k]}, 10.0f * static_cast<float>(k) * static_cast<float>(r)));
      comm.allreduce_sum(ts, comm.world());
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        CAPTURE(k);
        Tensor want = Tensor::empty({sizes[k]});
        for (std::int64_t i = 0; i < sizes[k]; ++i)
          want.data<float>()[i] = 10.0f * static_cast<float>(k) * s1 + static_cast<float>(n * i);
        CHECK(bitwise_equal(ts[k], want));
      }
    }
    comm.set_allreduce_direct_limit(4);
  }
  SUBCASE("sub-groups: even and odd ranks, listed in descending order") {
    std::vector<int> members;
    for (int q = n - 1; q >= 0; --q)
      if (q % 2 == r % 2) members.push_back(q);
    Group g = comm.create_group(members);
    CHECK(g.size() == static_cast<int>(members.size()));
    CHECK(g.ranks()[static_cast<std::size_t>(g.index())] == r);
    Tensor x = ramp({64}, 100.0f * (r + 1));
    comm.allreduce_sum(x, g);
    float base = 0;
    for (int q : members) base += 100.0f * (q + 1);
    Tensor want = Tensor::empty({64});
    for (int i = 0; i < 64; ++i)
      want.data<float>()[i] = base + static_cast<float>(static_cast<int>(members.size()) * i);
    CHECK(bitwise_equal(x, want));
  }
  SUBCASE("a non-exact scalar: every rank gets the same bits") {
    Tensor s = Tensor::full({}, 0.1f * static_cast<float>(r + 1));
    comm.allreduce_sum(s, comm.world());
    // Everyone sends its result to rank 0, which compares bits.
    if (r != 0) {
      comm.send(s, 0, Tag::control(0, 1));
    } else {
      for (int p = 1; p < n; ++p) {
        Tensor other = Tensor::zeros({});
        comm.recv(other, p, Tag::control(0, 1));
        CHECK(bitwise_equal(other, s));
      }
    }
  }
  comm.barrier();
}

TEST_CASE("non-blocking allreduces in flight together equal one allreduce, bit for bit") {
  MpiCommunicator comm;
  const int r = comm.rank(), n = comm.size();
  // Non-exact values, so that the order of summation shows in the bits: every member's result
  // must be ((x0 + x1) + x2) + ... in group order, however the tensors are split into calls and
  // whichever algorithm moves them (direct exchange, or gather to the first member).
  auto values = [r](int size, float shift) {
    Tensor t = Tensor::empty({size});
    for (int i = 0; i < size; ++i)
      t.data<float>()[i] = (static_cast<float>(i * (r + 2)) + shift) / 3.0f;
    return t;
  };
  // Larger than Open MPI's eager limit, so the big bucket goes by rendezvous.
  const int big = 300000;
  Tensor want = Tensor::empty({big});
  for (int i = 0; i < big; ++i) {
    float acc = 0;
    for (int q = 0; q < n; ++q) {
      const float x = (static_cast<float>(i * (q + 2)) + 0.5f) / 3.0f;
      acc = q == 0 ? x : acc + x;
    }
    want.data<float>()[i] = acc;
  }
  for (int limit : {4, 1}) {
    CAPTURE(limit);
    comm.set_allreduce_direct_limit(limit);
    std::vector<Tensor> buckets = {values(big, 0.5f), values(7, 1.5f), values(1000, 2.5f)};
    std::vector<Tensor> whole = {buckets[0].clone(), buckets[1].clone(), buckets[2].clone()};
    std::vector<Request> reqs;
    reqs.push_back(comm.iallreduce_sum(buckets[0], comm.world()));
    // Two tensors packed into one call, in flight beside the first.
    reqs.push_back(comm.iallreduce_sum(std::span<Tensor>(buckets.data() + 1, 2), comm.world()));
    // Progress by tests only, in reverse order, as the executor's polls between layers do.
    for (bool done = false; !done;) {
      done = true;
      for (std::size_t k = reqs.size(); k-- > 0;) done = reqs[k].test() && done;
    }
    comm.allreduce_sum(whole, comm.world());
    for (std::size_t k = 0; k < buckets.size(); ++k) CHECK(bitwise_equal(buckets[k], whole[k]));
    CHECK(bitwise_equal(buckets[0], want));
  }
  comm.set_allreduce_direct_limit(4);
  CHECK_THROWS_AS(comm.set_allreduce_direct_limit(0), ConfigError);
  // A sub-group of the even ranks beside the world: calls on different groups do not mix.
  std::vector<int> evens;
  for (int q = 0; q < n; q += 2) evens.push_back(q);
  std::vector<int> odds;
  for (int q = 1; q < n; q += 2) odds.push_back(q);
  Group g = comm.create_group(r % 2 == 0 ? evens : odds);
  Tensor a = ramp({5000}, static_cast<float>(r)), b = ramp({3}, 10.0f * r);
  Request qa = comm.iallreduce_sum(a, g);
  Request qb = comm.iallreduce_sum(b, comm.world());
  qb.wait();
  qa.wait();
  float base = 0;
  for (int q : g.ranks()) base += static_cast<float>(q);
  CHECK(a.values()[4999] == base + 4999.0f * static_cast<float>(g.size()));
  CHECK(b.values()[2] ==
        10.0f * static_cast<float>(n * (n - 1) / 2) + 2.0f * static_cast<float>(n));
  comm.barrier();
}

TEST_CASE("a receive that never comes times out within the limit, naming peer and tag") {
  MpiCommunicator comm;
  comm.barrier();
  if (comm.rank() == 0) {
    comm.set_timeout(0.5);
    comm.set_context([] { return std::string("stage 0, action 4 of 9 (0RG11@1)"); });
    Tensor into = Tensor::zeros({8});
    auto t0 = std::chrono::steady_clock::now();
    std::string message;
    try {
      comm.recv(into, 1, Tag::gradient(1, 11));
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(message);
    CHECK(waited >= 0.5);
    CHECK(waited < 3.0);
    CHECK(message.find("gradient of stage 1, microbatch 11 from rank 1") != std::string::npos);
    CHECK(message.find("limit 0.5 s") != std::string::npos);
    CHECK(message.find("stage 0, action 4 of 9") != std::string::npos);
    CHECK(message.find("PIPELINE_COMM_TIMEOUT") != std::string::npos);
    CHECK(message.find("pid") != std::string::npos);
  }
  comm.set_timeout(60);
  comm.barrier();
}

TEST_CASE("a message that does not fit the receive tensor is an error, not a truncation") {
  MpiCommunicator comm;
  if (comm.rank() == 0) {
    Tensor five = ramp({5}, 0.0f);
    comm.send(five, 1, Tag::activation(0, 0));
    comm.send(five, 1, Tag::activation(0, 1));
  } else if (comm.rank() == 1) {
    Tensor small = Tensor::zeros({3});
    CHECK_THROWS_WITH_AS(comm.recv(small, 0, Tag::activation(0, 0)),
                         doctest::Contains("larger than the receive tensor"), Error);
    Tensor large = Tensor::zeros({8});
    CHECK_THROWS_WITH_AS(comm.recv(large, 0, Tag::activation(0, 1)),
                         doctest::Contains("holds 5 elements"), Error);
  }
  Tensor x = Tensor::zeros({1});
  CHECK_THROWS_AS(comm.isend(x, comm.size(), Tag::activation(0, 0)), ConfigError);
  CHECK_THROWS_AS(comm.isend(x, 0, Tag::activation(comm.tag_codec().max_stages(), 0)), Error);
  comm.barrier();
}
