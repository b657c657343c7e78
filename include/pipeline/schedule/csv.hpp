// Schedules as CSV: one row per rank, so they can be read, written and hand-tuned in a
// spreadsheet or an editor.
//
//   # pipeline.schedule/1 name=1f1b-flush policy=flush microbatches=4 minibatches=1 vertical_sync=0
//   rank,actions
//   0,0F0,0SA0@1,0F1,0SA1@1,0RG0@1,0B0,...
//   1,1RA0@0,1F0,1B0,1SG0@0,...
//
// The first cell of a row is the rank; every further cell holds one or more space-separated
// action tokens (schedule.hpp). The `#` line is optional: without it the policy is inferred (a
// step after every backward on rank 0: stash; otherwise flush), minibatches are the steps of
// rank 0 (flush) and the microbatch count follows from the highest microbatch number. Which
// ranks hold a stage is read from the actions (replicas in rank order). Lines starting with `#`
// otherwise, empty lines and a header row whose first cell is `rank` are skipped. Reading only
// parses: call validate() to check the schedule.
#pragma once

#include <pipeline/schedule/schedule.hpp>

#include <string>
#include <string_view>

namespace pipeline {

std::string schedule_to_csv(const Schedule& schedule);
// Throws ConfigError naming the line and the cell that cannot be parsed.
Schedule schedule_from_csv(std::string_view text);

// File versions; IoError when the file cannot be opened or written.
void write_schedule_csv(const std::string& path, const Schedule& schedule);
Schedule read_schedule_csv(const std::string& path);

}  // namespace pipeline
