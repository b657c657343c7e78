// The NCCL communicator at world size 1 (one process, one GPU): a message to itself inside a
// batch, allreduce and barrier, groups of one, argument errors, and the watchdog — a wait that
// cannot complete ends with the TimeoutError of communicator.hpp, naming the operation, the peer
// and the caller's context, instead of hanging. The multi-rank behaviour (depth-2 send/receive,
// groups of several members) needs mpirun with one GPU per rank and is not covered here.
//
// tests/gpu/ runs under the GPU main (no MPI), so MPI is initialised here on first use by an
// MpiSession that lives until exit (MPI can be initialised only once per process).
#include <doctest/doctest.h>

#if PIPELINE_WITH_CUDA

#include <pipeline/comm/comms/mpi.hpp>
#include <pipeline/comm/comms/nccl.hpp>
#include <pipeline/cuda/stream.hpp>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace test_nccl {

using namespace pipeline;

namespace {

MpiSession& mpi_session() {
  static MpiSession session;  // finalises MPI at exit
  return session;
}

Tensor counting_tensor(std::int64_t n, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = scale * static_cast<float>(i % 997 - 498) + 0.25f;
  return Tensor::from_vector(Shape{n}, v);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.numel() == y.numel() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("nccl: a message to itself inside a batch arrives intact") {
  mpi_session();
  MpiCommunicator mpi;
  REQUIRE(mpi.size() == 1);
  NcclCommunicator comm(mpi, 0);
  CHECK(comm.backend() == "nccl");
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);

  const Device gpu = Device::cuda(0);
  // Two messages of different sizes, so that a mix-up of the pairing would show.
  Tensor a = counting_tensor(1 << 20, 0.5f).to(gpu);
  Tensor b = counting_tensor(4099, -3.0f).to(gpu);
  Tensor a_in = Tensor::zeros(Shape{1 << 20}, DType::Float32, gpu);
  Tensor b_in = Tensor::zeros(Shape{4099}, DType::Float32, gpu);
  std::vector<Request> requests;
  comm.begin_batch();
  requests.push_back(comm.isend(a, 0, Tag::activation(0, 0)));
  requests.push_back(comm.irecv(a_in, 0, Tag::activation(0, 0)));
  requests.push_back(comm.isend(b, 0, Tag::gradient(0, 0)));
  requests.push_back(comm.irecv(b_in, 0, Tag::gradient(0, 0)));
  comm.end_batch();
  wait_all(requests);  // device-side: orders the current stream after the transfers
  CHECK(same_bits(a_in, a));
  CHECK(same_bits(b_in, b));

  // Again, tested instead of waited for, with the host polling the events.
  Tensor c_in = Tensor::zeros(Shape{4099}, DType::Float32, gpu);
  comm.begin_batch();
  Request s = comm.isend(b, 0, Tag::activation(0, 1));
  Request r = comm.irecv(c_in, 0, Tag::activation(0, 1));
  comm.end_batch();
  const auto t0 = std::chrono::steady_clock::now();
  while (!(r.test() && s.test())) REQUIRE(seconds_since(t0) < 30.0);
  CHECK(same_bits(c_in, b));
  comm.synchronize();
}

TEST_CASE("nccl: allreduce of one member equals its input; barrier; groups of one") {
  mpi_session();
  MpiCommunicator mpi;
  NcclCommunicator comm(mpi, 0);
  const Device gpu = Device::cuda(0);
  Tensor x0 = counting_tensor(12345, 0.125f);
  Tensor x1 = counting_tensor(77, 2.0f);
  std::vector<Tensor> xs = {x0.to(gpu), x1.to(gpu)};
  comm.allreduce_sum(xs, comm.world());
  CHECK(same_bits(xs[0], x0));
  CHECK(same_bits(xs[1], x1));

  Group solo = comm.create_group({0});
  CHECK(solo.size() == 1);
  CHECK(solo.index() == 0);
  Request r = comm.iallreduce_sum(xs[0], solo);
  r.wait();
  CHECK(same_bits(xs[0], x0));

  comm.barrier();  // an NCCL allreduce of one float on the world communicator, waited for
  comm.barrier();
  comm.synchronize();
}

TEST_CASE("nccl: host tensors travel over MPI; other devices and ranks are ConfigErrors") {
  mpi_session();
  MpiCommunicator mpi;
  NcclCommunicator comm(mpi, 0);
  // The runtime's small host messages (statistics, agreements) go over the MPI communicator.
  Tensor cpu = Tensor::full(Shape{4}, 2.5f);
  Tensor cpu_into = Tensor::full(Shape{4}, -7.f);
  Request sent = comm.isend(cpu, 0, Tag::activation(0, 0));
  comm.irecv(cpu_into, 0, Tag::activation(0, 0)).wait();
  sent.wait();
  CHECK(same_bits(cpu_into, cpu));
  Tensor gpu = Tensor::zeros(Shape{4}, DType::Float32, Device::cuda(0));
  CHECK_THROWS_AS(comm.isend(gpu, 1, Tag::activation(0, 0)), ConfigError);  // no rank 1
  CHECK_THROWS_AS([&] { NcclCommunicator bad(mpi, cuda::device_count()); }(), ConfigError);
  // A batched Request cannot be waited for before its batch is launched.
  comm.begin_batch();
  Tensor into = Tensor::zeros(Shape{4}, DType::Float32, Device::cuda(0));
  Request s = comm.isend(gpu, 0, Tag::control(0, 0));
  Request r = comm.irecv(into, 0, Tag::control(0, 0));
  CHECK_THROWS_AS(r.wait(), Error);
  comm.end_batch();
  s.wait();
  comm.synchronize();
}

TEST_CASE("nccl watchdog: a wait that cannot complete ends with a TimeoutError, no hang") {
  mpi_session();
  MpiCommunicator mpi;
  NcclCommunicator comm(mpi, 0);
  comm.set_timeout(0.5);
  comm.set_context([] { return std::string("stage 0, action 3 of 8 (watchdog test)"); });
  Tensor into = Tensor::zeros(Shape{16}, DType::Float32, Device::cuda(0));
  // The communication stream is held for 3 s: the receive cannot complete within 0.5 s.
  Request r = comm.inject_stalled_receive(into, 0, Tag::activation(0, 5), 3.0);
  r.wait();  // device-side: returns at once; the watchdog times the operation from here
  const auto t0 = std::chrono::steady_clock::now();
  std::string message;
  try {
    comm.synchronize();
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  const double waited = seconds_since(t0);
  MESSAGE("watchdog: ", message, " (", waited, " s)");
  CHECK(contains(message, "timed out after"));
  CHECK(contains(message, "a receive of"));
  CHECK(contains(message, "from rank 0"));
  CHECK(contains(message, "stage 0, action 3 of 8"));
  CHECK(contains(message, "--comm-timeout"));
  CHECK(waited < 10.0);
  // The communicator stays failed: every later call says so.
  CHECK_THROWS_AS(comm.barrier(), TimeoutError);
}

TEST_CASE("nccl watchdog: a receive that no send matches is aborted, no hang") {
  mpi_session();
  MpiCommunicator mpi;
  NcclCommunicator comm(mpi, 0);
  comm.set_timeout(0.5);
  Tensor into = Tensor::zeros(Shape{1 << 16}, DType::Float32, Device::cuda(0));
  const auto t0 = std::chrono::steady_clock::now();
  std::string message;
  bool timed_out = false;
  try {
    Request r = comm.irecv(into, 0, Tag::gradient(0, 9));
    r.wait();
    comm.synchronize();
  } catch (const TimeoutError& e) {
    message = e.what();
    timed_out = true;
  } catch (const NcclError& e) {
    // NCCL may refuse a receive from itself without a send in the same group at launch time
    // instead of letting it wait: that, too, must name the operation and end without a hang.
    message = e.what();
  }
  const double waited = seconds_since(t0);
  MESSAGE("unmatched receive (", timed_out ? "timeout" : "NCCL error", "): ", message, " (",
          waited, " s)");
  CHECK(contains(message, "a receive of"));
  CHECK(contains(message, "from rank 0"));
  CHECK(waited < 10.0);
}

#endif  // PIPELINE_WITH_CUDA

}  // namespace test_nccl
