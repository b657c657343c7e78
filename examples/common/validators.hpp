// Command-line checks the example programs share, beyond CLI11's own (Range, IsMember, ...).
#pragma once

#include <pipeline/core/output_path.hpp>

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

namespace pipeline::examples {

// A finite number > 0. CLI::PositiveNumber would also pass "inf" and "nan", and a Range needs
// an arbitrary upper bound; rates and time-outs need neither.
inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& s) {
        double v = 0;
        try {
          v = std::stod(s);
        } catch (...) {
        }
        return v > 0 && std::isfinite(v) ? std::string() : "must be a positive number, got " + s;
      },
      "POSITIVE");
}

// A file the run writes at its end (parameters, a trace, a plan): checked before the work that
// fills it rather than after it.
inline CLI::Validator file_to_write() {
  return CLI::Validator([](std::string& s) { return output_path_problem(s); }, "FILE");
}

}  // namespace pipeline::examples
