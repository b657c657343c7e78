// Pictures of a simulated run, so a user sees where the bubbles are.
//
//  - Chrome-trace / Perfetto JSON (open in ui.perfetto.dev or chrome://tracing): one track per
//    rank, a slice per compute action, allreduce and step, receive waits as slices, and a flow
//    arrow from every send to its receive.
//  - SVG timeline: ranks as rows, forward / backward / split backward / allreduce / step
//    coloured, microbatch numbers in the boxes, idle time left grey.
// Both need a Simulation made with SimulateOptions::record_trace.
#pragma once

#include <pipeline/schedule/schedule.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <string>

namespace pipeline {

std::string chrome_trace_json(const Simulation& sim, const Schedule& schedule);

struct SvgOptions {
  int width = 1200;  // pixels of the time axis
  int row_height = 26;
  std::string title;  // default: schedule name, ranks, microbatches
};
std::string timeline_svg(const Simulation& sim, const Schedule& schedule,
                         const SvgOptions& options = {});

// File versions; IoError when the file cannot be written. ConfigError when the simulation has no
// recorded events.
void write_chrome_trace(const std::string& path, const Simulation& sim, const Schedule& schedule);
void write_timeline_svg(const std::string& path, const Simulation& sim, const Schedule& schedule,
                        const SvgOptions& options = {});

}  // namespace pipeline
