// Command-line checks the example programs share, beyond CLI11's own (Range, IsMember, ...).
#pragma once

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
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

// A file the run writes at its end (parameters, a trace): its directory must exist and be
// writable, checked before training rather than after it.
inline CLI::Validator file_to_write() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        namespace fs = std::filesystem;
        const fs::path path(s);
        std::error_code ec;
        if (fs::is_directory(path, ec)) return "'" + s + "' is a directory: name a file in it";
        const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
        if (!fs::is_directory(dir, ec))
          return "cannot write '" + s + "': directory '" + dir.string() +
                 "' does not exist (create it first)";
        if (::access(dir.c_str(), W_OK) != 0)
          return "cannot write '" + s + "': directory '" + dir.string() + "' is not writable";
        return {};
      },
      "FILE");
}

}  // namespace pipeline::examples
