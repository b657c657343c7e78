// Small text helpers: for the hand-written readers (CSV schedules, availability traces,
// PipeDream graphs) and for messages.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace pipeline {

// `s` without the blanks (spaces, tabs, carriage returns) at either end.
inline std::string_view trim(std::string_view s) {
  constexpr auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

// A byte count as a message gives it: "1.50 GiB", "12.00 MiB", "3.00 KiB", "17 B".
inline std::string format_bytes(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (std::int64_t{1} << 20)) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (bytes >= (std::int64_t{1} << 10)) return fmt::format("{:.2f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

}  // namespace pipeline
