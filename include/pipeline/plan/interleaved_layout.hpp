// The layout of an interleaved plan (Plan::virtual_stages > 1): v·p stages over p ranks per
// pipeline, stage k on the ranks of stage k mod p, and optionally r such pipelines (data
// parallelism over interleaved pipelines): every stage has r replicas, replica j of stage k on
// the rank of replica j of stage k mod p, the p·r ranks distinct.
#pragma once

#include <vector>

namespace pipeline {

// `positions` ranks per pipeline (p), `stages_per_rank` (v) and `replicas` (r) of every stage.
struct InterleavedShape {
  int positions = 1;
  int stages_per_rank = 1;
  int replicas = 1;
};

// The shape of `stage_ranks` (stage -> its replicas' ranks) as an interleaved layout; ConfigError
// naming the stage and ranks that break it.
InterleavedShape interleaved_shape(const std::vector<std::vector<int>>& stage_ranks);

}  // namespace pipeline
