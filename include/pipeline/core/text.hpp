// Small text helpers for the hand-written readers (CSV schedules, availability traces,
// PipeDream graphs).
#pragma once

#include <string_view>

namespace pipeline {

// `s` without the blanks (spaces, tabs, carriage returns) at either end.
inline std::string_view trim(std::string_view s) {
  constexpr auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace pipeline
