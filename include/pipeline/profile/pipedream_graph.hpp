// Import of PipeDream's profiler output (`graph.txt`) into a Profile.
//
// Format (one node per line, then one TAB-indented edge per line):
//   <id> -- <description> -- forward_compute_time=<ms>, backward_compute_time=<ms>,
//          activation_size=<bytes or [a; b; c]>, parameter_size=<bytes>[ -- stage_id=<n>]
//   \t<src id> -- <dst id>
// Times are milliseconds per minibatch and become seconds; a list-valued activation size is
// summed. As PipeDream's optimizer does, sources whose description starts with "Input" (data
// loading) and sinks starting with "__getitem__" are dropped; other sources (GNMT's `hidden`)
// stay and are marked `source`. Layers are put in a topological order that follows the file
// order where the graph allows, so layer 0 is the file's first remaining source (the node
// PipeDream starts its antichain enumeration from) and every `inputs` entry points backwards.
// The batch size is recovered from the Input node's size for 3×224×224 or 3×299×299 images,
// and is 0 (unknown) otherwise.
#pragma once

#include <pipeline/profile/profile.hpp>

#include <string>
#include <string_view>

namespace pipeline {

// `origin` names the text in error messages; `model` becomes Profile::model.
Profile parse_pipedream_graph(std::string_view text, std::string_view origin, std::string model = {});

// Reads a graph.txt; the model name is the file's parent directory (".../vgg16/graph.txt").
Profile read_pipedream_graph(const std::string& path);

}  // namespace pipeline
