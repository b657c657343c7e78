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
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/runtime/in_process.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <functional>

#include "common/pipeline_flags.hpp"

namespace pipeline::examples {

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
  auto report = [](const std::exception& e) {
    std::fflush(stdout);  // so that the error follows what was printed before it
    fmt::print(stderr, "error: {}\n", e.what());
    std::fflush(stderr);
  };
  if (flags.in_process) {
    try {
      flags.check();
      const Plan plan = read_plan(flags.plan);
      const Device device = parse_device(flags.device);
      log_info("in-process pipeline: the plan's {} ranks as threads of this process, on {}{}",
               plan.workers, device.str(), device.is_cuda() ? " (a stream per rank)" : "");
      std::atomic<int> status{0};
      run_in_process({.ranks = plan.workers, .device = device, .comm_timeout_s = flags.comm_timeout},
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
      if (flags.comm_timeout > 0) comm.set_timeout(flags.comm_timeout);
      return pipelined(comm, Device::cpu());
    } catch (const std::exception& e) {
      report(e);
      comm.abort(e.what());
    }
  }
  try {
    return single();
  } catch (const std::exception& e) {
    report(e);
    return 1;
  }
}

}  // namespace pipeline::examples
