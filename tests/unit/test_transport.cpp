// choose_transport: the decision table of --comm auto|nccl|mpi|local and its errors, without a
// GPU (the environment is plain data).
#include <doctest/doctest.h>

#include <pipeline/comm/transport.hpp>

#include <cstdlib>
#include <string>

namespace test_transport {

using namespace pipeline;

namespace {

TransportEnvironment env(bool nccl, int local_rank, int local_size, int devices) {
  return TransportEnvironment{nccl, local_rank, local_size, devices};
}

std::string config_error(TransportRequest r, const TransportEnvironment& e) {
  try {
    choose_transport(r, e);
  } catch (const ConfigError& err) {
    return err.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("parse_transport_request: the four spellings, and an error naming them") {
  CHECK(parse_transport_request("auto") == TransportRequest::Auto);
  CHECK(parse_transport_request("nccl") == TransportRequest::Nccl);
  CHECK(parse_transport_request("mpi") == TransportRequest::Mpi);
  CHECK(parse_transport_request("local") == TransportRequest::Local);
  try {
    parse_transport_request("gloo");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("'--comm gloo'") != std::string::npos);
    CHECK(std::string(e.what()).find("nccl, mpi, local or auto") != std::string::npos);
  }
  CHECK(transport_name(Transport::Nccl) == "nccl");
  CHECK(transport_name(Transport::Mpi) == "mpi");
  CHECK(transport_name(Transport::Local) == "local");
}

TEST_CASE("auto: NCCL when every rank of the host has a GPU of its own") {
  auto c = choose_transport(TransportRequest::Auto, env(true, 3, 4, 8));
  CHECK(c.transport == Transport::Nccl);
  CHECK(c.device == 3);
  CHECK(c.reason == "NCCL: 4 ranks on this host, 8 GPUs: one each");

  c = choose_transport(TransportRequest::Auto, env(true, 0, 1, 1));
  CHECK(c.transport == Transport::Nccl);
  CHECK(c.device == 0);
  CHECK(c.reason == "NCCL: 1 rank on this host, 1 GPU: one each");

  c = choose_transport(TransportRequest::Auto, env(true, 7, 8, 8));
  CHECK(c.transport == Transport::Nccl);
  CHECK(c.device == 7);
}

TEST_CASE("auto: MPI with device staging when ranks share a GPU or NCCL is missing") {
  auto c = choose_transport(TransportRequest::Auto, env(true, 1, 2, 1));
  CHECK(c.transport == Transport::Mpi);
  CHECK(c.device == 0);
  CHECK(c.reason == "MPI with device staging: 2 ranks share 1 GPU");

  c = choose_transport(TransportRequest::Auto, env(true, 4, 6, 4));
  CHECK(c.transport == Transport::Mpi);
  CHECK(c.device == 0);  // round-robin: local rank 4 of 6 on 4 GPUs
  CHECK(c.reason == "MPI with device staging: 6 ranks share 4 GPUs");

  c = choose_transport(TransportRequest::Auto, env(false, 1, 2, 2));
  CHECK(c.transport == Transport::Mpi);
  CHECK(c.device == 1);
  CHECK(c.reason.find("this build has no NCCL") != std::string::npos);
}

TEST_CASE("auto: MPI on the CPU without a visible GPU") {
  for (bool nccl : {false, true}) {
    auto c = choose_transport(TransportRequest::Auto, env(nccl, 0, 2, 0));
    CHECK(c.transport == Transport::Mpi);
    CHECK(c.device == -1);
    CHECK(c.reason == "MPI: no GPU visible, tensors stay on the CPU");
  }
}

TEST_CASE("explicit mpi and local are always possible") {
  auto c = choose_transport(TransportRequest::Mpi, env(true, 0, 4, 8));
  CHECK(c.transport == Transport::Mpi);
  CHECK(c.device == 0);
  CHECK(c.reason.find("device staging (--comm mpi)") != std::string::npos);

  c = choose_transport(TransportRequest::Mpi, env(false, 0, 1, 0));
  CHECK(c.transport == Transport::Mpi);
  CHECK(c.device == -1);

  c = choose_transport(TransportRequest::Local, env(false, 0, 1, 0));
  CHECK(c.transport == Transport::Local);
  CHECK(c.device == -1);
  CHECK(c.reason.find("in-process") != std::string::npos);
}

TEST_CASE("explicit nccl where it works, and ConfigErrors naming why it cannot") {
  auto c = choose_transport(TransportRequest::Nccl, env(true, 1, 2, 2));
  CHECK(c.transport == Transport::Nccl);
  CHECK(c.device == 1);
  CHECK(c.reason == "NCCL (--comm nccl): 2 ranks on this host, 2 GPUs: one each");

  std::string e = config_error(TransportRequest::Nccl, env(false, 0, 1, 1));
  CHECK(e.find("this build has no NCCL") != std::string::npos);
  CHECK(e.find("--comm mpi") != std::string::npos);

  e = config_error(TransportRequest::Nccl, env(true, 0, 1, 0));
  CHECK(e.find("sees no CUDA device") != std::string::npos);

  e = config_error(TransportRequest::Nccl, env(true, 2, 3, 2));
  CHECK(e.find("3 ranks on this host share 2 GPUs") != std::string::npos);
  CHECK(e.find("at most 2 ranks per host") != std::string::npos);
  CHECK(e.find("--comm mpi") != std::string::npos);

  e = config_error(TransportRequest::Nccl, env(true, 0, 2, 1));
  CHECK(e.find("2 ranks on this host share 1 GPU;") != std::string::npos);
}

TEST_CASE("an impossible environment is a ConfigError") {
  CHECK(config_error(TransportRequest::Auto, env(true, 2, 2, 4)).find("not a valid position") !=
        std::string::npos);
  CHECK(config_error(TransportRequest::Auto, env(true, 0, 0, 4)).find("not a valid position") !=
        std::string::npos);
  CHECK(config_error(TransportRequest::Auto, env(true, 0, 1, -1)).find("visible CUDA devices") !=
        std::string::npos);
}

TEST_CASE("local_rank_from_env reads Open MPI's node-local rank and size") {
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  LocalRank r = local_rank_from_env();
  CHECK(r.rank == 0);
  CHECK(r.size == 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  r = local_rank_from_env();
  CHECK(r.rank == 2);
  CHECK(r.size == 4);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x", 1);
  CHECK_THROWS_AS(local_rank_from_env(), ConfigError);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "4", 1);
  CHECK_THROWS_AS(local_rank_from_env(), ConfigError);
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
}

TEST_CASE("a CPU run: MPI whatever the GPUs, NCCL refused naming --device cuda") {
  TransportEnvironment e = env(true, 0, 2, 8);
  e.cpu_run = true;
  for (TransportRequest r : {TransportRequest::Auto, TransportRequest::Mpi}) {
    const TransportChoice c = choose_transport(r, e);
    CHECK(c.transport == Transport::Mpi);
    CHECK(c.device == -1);
    CHECK(c.reason == "MPI: the run trains on the CPU");
  }
  CHECK(choose_transport(TransportRequest::Local, e).transport == Transport::Local);
  const std::string err = config_error(TransportRequest::Nccl, e);
  CHECK(err.find("--comm nccl moves tensors between GPUs") != std::string::npos);
  CHECK(err.find("add --device cuda") != std::string::npos);
}

}  // namespace test_transport
