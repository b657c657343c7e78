// The main() of an example program: parses the command line, then trains either in this process,
// as a pipeline over an MPI job (PipelineFlags::pipelined), or as a pipeline whose ranks are
// threads of this process (--in-process, runtime/in_process.hpp), and turns any error into one
// "error: <message>" line on stderr and a failed exit.
//
// A pipelined run that fails on one rank aborts the whole job through the communicator, so that
// no peer is left waiting for a message that will never come; the message already names the rank.
// A rank that dies without a word (killed, crashed) is reported by every survivor when mpirun
// ends it (report_termination_on_sigterm).
#pragma once

#include <pipeline/comm/comms/mpi.hpp>
#include <pipeline/comm/transport.hpp>
#if PIPELINE_WITH_CUDA
#include <pipeline/comm/comms/nccl.hpp>
#endif
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/runtime/in_process.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdio>
#include <exception>
#include <functional>

#include "common/checkpointing.hpp"
#include "common/pipeline_flags.hpp"

namespace pipeline::examples {

// The transport and device of this rank of an MPI job (comm/transport.hpp).
inline TransportChoice rank_transport(const PipelineFlags& flags) {
  const LocalRank local = local_rank_from_env();
  TransportEnvironment env;
#if PIPELINE_WITH_CUDA
  env.build_has_nccl = true;  // NCCL is linked with CUDA
#endif
  env.local_rank = local.rank;
  env.local_size = local.size;
  env.cpu_run = parse_device(flags.device).is_cpu();
  env.visible_devices = env.cpu_run ? 0 : cuda_device_count();
  PIPELINE_CHECK_AS(ConfigError, env.cpu_run || env.visible_devices > 0,
                    "--device {}: this rank sees no CUDA device (no GPU, no driver, "
                    "CUDA_VISIBLE_DEVICES hides them, or the build has no CUDA); use --device cpu",
                    flags.device);
  return choose_transport(parse_transport_request(flags.comm), env);
}

// Runs `pipelined` on an NCCL communicator bootstrapped over `mpi`, on cuda:`device`; an error
// aborts the NCCL communicators before the job.
inline int pipelined_over_nccl(MpiCommunicator& mpi, int device,
                               const std::function<int(Communicator&, Device)>& pipelined) {
#if PIPELINE_WITH_CUDA
  NcclCommunicator nccl(mpi, device);
  try {
    return pipelined(nccl, Device::cuda(device));
  } catch (const std::exception& e) {
    nccl.abort(e.what());
  }
#else
  PIPELINE_FAIL(ConfigError, "NCCL was chosen but this build has no CUDA (device {})", device);
#endif
}

// `single()` trains in this process; `pipelined(comm, device)` on each rank with the job's world
// communicator (--comm-timeout applied, the pipeline flags checked) and the device the rank
// computes on. Returns main()'s exit status (rank 0's for an in-process job).
inline int run_main(int argc, char** argv, CLI::App& app, const PipelineFlags& flags,
                    const std::function<int()>& single,
                    const std::function<int(Communicator&, Device)>& pipelined) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Options left out that the plan and the checkpoint resumed from record (their own checks
  // refuse those given otherwise).
  const std::string from_plan = take_plan_model_options(app, flags.plan);
  const std::string from_checkpoint = take_checkpoint_options(app);
  const auto note_taken = [&](int rank) {
    if (rank != 0) return;
    if (!from_plan.empty()) log_info("--plan: {}, as the plan was made", from_plan);
    if (!from_checkpoint.empty())
      log_info("--resume: {}, as the checkpoint was written", from_checkpoint);
  };
  auto report = [](const std::exception& e) {
    std::fflush(stdout);  // so that the error follows what was printed before it
    fmt::print(stderr, "error: {}\n", e.what());
    std::fflush(stderr);
  };
  if (flags.runs_in_process()) {
    try {
      flags.check();
      note_taken(0);
      const Plan plan = compact_ranks(read_plan(flags.plan));
      const Device device = parse_device(flags.device);
      log_info("in-process pipeline: the plan's {} ranks as threads of this process, on {}{}",
               plan.workers, device.str(), device.is_cuda() ? " (a stream per rank)" : "");
      std::atomic<int> status{0};
      run_in_process(
          {.ranks = plan.workers, .device = device, .comm_timeout_s = flags.comm_timeout},
          [&](Communicator& comm, Device d) {
            const int s = pipelined(comm, d);
            if (comm.rank() == 0) status = s;
          });
      return status;
    } catch (const std::exception& e) {
      report(e);
      return 1;
    }
  }
  if (flags.pipelined()) {
    MpiSession mpi(&argc, &argv);
    MpiCommunicator comm;
    // A rank that dies takes no part in abort(): mpirun then ends the others with SIGTERM, and
    // each says where it was instead of vanishing.
    report_termination_on_sigterm();
    try {
      flags.check();
      note_taken(comm.rank());
      if (flags.comm_timeout > 0) comm.set_timeout(flags.comm_timeout);
      const TransportChoice t = rank_transport(flags);
      if (comm.rank() == 0) log_info("transport: {}", t.reason);
      if (t.transport == Transport::Nccl) return pipelined_over_nccl(comm, t.device, pipelined);
      return pipelined(comm, t.device >= 0 ? Device::cuda(t.device) : Device::cpu());
    } catch (const std::exception& e) {
      comm.abort(e.what());  // which prints the error, once
    }
  }
  try {
    if (const auto ignored = pipeline_only_flags_given(app); !ignored.empty())
      log_warn(
          "ignoring {}: this run trains in one process; pipeline flags apply with --plan, "
          "--in-process or mpirun -np N",
          fmt::join(ignored, ", "));
    note_taken(0);
    const ops::ComputeDTypeScope precision(flags.compute_dtype());
    log_precision(flags);
    return single();
  } catch (const std::exception& e) {
    report(e);
    return 1;
  }
}

}  // namespace pipeline::examples
