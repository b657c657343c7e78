// Command-line checks the example programs share, beyond CLI11's own (Range, IsMember, ...).
#pragma once

#include <pipeline/core/output_path.hpp>

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

namespace pipeline::examples {

namespace detail {
// A finite number above (strict) or at least 0; the message names the rule, not CLI11's bounds
// (CLI::PositiveNumber prints the largest double, 309 digits, and passes "inf").
inline CLI::Validator finite_number_from_zero(bool strict, const char* name) {
  return CLI::Validator(
      [strict](std::string& s) {
        double v = -1;
        std::size_t used = 0;
        try {
          v = std::stod(s, &used);
        } catch (...) {
        }
        const bool ok = used == s.size() && std::isfinite(v) && (strict ? v > 0 : v >= 0);
        return ok ? std::string()
                  : std::string(strict ? "must be a positive number" : "must be a number >= 0") +
                        ", got " + s;
      },
      name);
}
}  // namespace detail

// A finite number > 0 (rates, time-outs, sizes).
inline CLI::Validator positive_number() {
  return detail::finite_number_from_zero(true, "POSITIVE");
}
// A finite number >= 0 (counts where 0 means none or off).
inline CLI::Validator non_negative_number() {
  return detail::finite_number_from_zero(false, "NON-NEGATIVE");
}

// A path an option names: an empty one (a job script's `--checkpoint-dir "$DIR"` with DIR unset)
// is refused rather than taken as the option left out (no checkpoints, no resume, silently).
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& s) {
        return s.empty() ? std::string(
                               "names no path (an empty value: an unset variable in a "
                               "job script?); leave the option out for none")
                         : std::string();
      },
      "PATH");
}

// A file the run writes at its end (parameters, a trace, a plan): checked before the work that
// fills it rather than after it.
inline CLI::Validator file_to_write() {
  return CLI::Validator([](std::string& s) { return output_path_problem(s); }, "FILE");
}

}  // namespace pipeline::examples
