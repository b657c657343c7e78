// Shared pieces of the libFuzzer targets in this folder.
//
// Every target feeds its bytes to one of the library's real parsers. A pipeline::Error is the
// parser rejecting bad input, which is what it should do, so it is swallowed; anything else — a
// different exception, a crash, a leak, undefined behaviour, a hang or an allocation beyond
// libFuzzer's -rss_limit_mb — is a finding. What a parser accepts must also survive the checks
// each target adds (writing it back and reading it again), and a failure there is a finding too:
// expect() aborts so that libFuzzer saves the input.
#pragma once

#include <pipeline/core/error.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace pipeline::fuzz {

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `parse`; returns false when it rejected the input with a pipeline::Error. Any other
// exception escapes and ends the process, which libFuzzer reports.
template <typename F>
bool accepts(F&& parse) {
  try {
    parse();
    return true;
  } catch (const pipeline::Error&) {
    return false;
  }
}

// A property of accepted input: `check` must not throw and must return true.
template <typename F>
void expect(const char* what, F&& check) {
  try {
    if (check()) return;
    std::fprintf(stderr, "fuzz: %s: check failed\n", what);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: %s: threw %s\n", what, e.what());
  }
  std::abort();
}

// One file per process for parsers that only read from a path (IDX through zlib, safetensors).
// It lives in /dev/shm where there is one (memory: thousands of rewrites a second never touch a
// disk), otherwise in the temporary directory, and is removed at exit.
class ScratchFile {
 public:
  explicit ScratchFile(std::string_view name)
      : m_path((directory() /
                ("pipeline-fuzz-" + std::to_string(::getpid()) + "-" + std::string(name)))
                   .string()) {}
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile() {
    std::error_code ec;
    std::filesystem::remove(m_path, ec);
  }

  // Replaces the file's contents; aborts when the file cannot be written, since that is the
  // fuzzing machine's problem and not a finding in the parser.
  const std::string& write(const std::uint8_t* data, std::size_t size) {
    std::ofstream out(m_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    if (!out) {
      std::fprintf(stderr, "fuzz: cannot write the scratch file %s\n", m_path.c_str());
      std::abort();
    }
    return m_path;
  }

 private:
  static std::filesystem::path directory() {
    std::error_code ec;
    if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
    return std::filesystem::temp_directory_path();
  }

  std::string m_path;
};

}  // namespace pipeline::fuzz
