// Checking an output path before the work that fills it.
#pragma once

#include <string>

namespace pipeline {

// Why `path` cannot take an output file, or an empty string when it can: it names no directory,
// its directory exists and takes a new file of its name (a probe is made and removed there), or
// it is a FIFO or device that is writable. The writers replace
// files whole (a temporary beside the file, then a rename; links followed), so the directory is
// what must be writable. Programs check their outputs with it before hours of training or
// profiling rather than fail at the end.
std::string output_path_problem(const std::string& path);

}  // namespace pipeline
