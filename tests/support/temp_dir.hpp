// A scratch directory for tests that write files: created empty under the system temporary
// directory with a name unique to the process (prefix, pid, counter), and removed with everything
// in it when the object goes out of scope.
#pragma once

#include <fmt/format.h>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace pipeline::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           fmt::format("{}_{}_{}", prefix, ::getpid(), counter++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The path of `name` inside the directory.
  std::string file(const std::string& name) const { return (path / name).string(); }

  // The names directly inside the directory, sorted.
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::filesystem::path path;
};

}  // namespace pipeline::testing
