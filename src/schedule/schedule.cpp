// Text form of actions: `<stage><code><number>[@<peer>]`.
#include <pipeline/schedule/schedule.hpp>

#include <pipeline/plan/partition.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <map>

namespace pipeline {
namespace {

constexpr std::array<std::string_view, kNumActionKinds> kCodes = {"F",  "B",  "I",  "W",  "SA",
                                                                  "RA", "SG", "RG", "AR", "ST"};

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Parses the digits of `s` starting at `pos`; returns false when there are none or they overflow.
bool parse_int(std::string_view s, std::size_t& pos, std::int32_t& out) {
  std::size_t start = pos;
  while (pos < s.size() && is_digit(s[pos])) ++pos;
  if (pos == start) return false;
  auto [ptr, ec] = std::from_chars(s.data() + start, s.data() + pos, out);
  return ec == std::errc() && ptr == s.data() + pos;
}

}  // namespace

std::vector<std::int32_t> closing_backwards(const std::vector<Action>& actions, UpdatePolicy policy,
                                            int microbatches) {
  std::vector<std::int32_t> out(actions.size(), -1);
  // Per stage: backwards seen, and the round under way with its last backward so far. Every
  // schedule runs a stage's rounds in order, so a round is over when the next one starts.
  struct Open {
    std::int32_t backwards = 0;
    std::int32_t round = -1;
    std::size_t last = 0;
  };
  std::map<int, Open> open;
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.kind != ActionKind::Backward && a.kind != ActionKind::BackwardWeight) continue;
    Open& o = open[a.stage];
    const std::int32_t round =
        policy == UpdatePolicy::Stash ? o.backwards : a.microbatch / std::max(microbatches, 1);
    ++o.backwards;
    if (round != o.round && o.round >= 0) out[o.last] = o.round;
    o.round = round;
    o.last = i;
  }
  for (auto& [stage, o] : open)
    if (o.round >= 0) out[o.last] = o.round;
  return out;
}

std::string_view action_code(ActionKind kind) {
  return kCodes[static_cast<std::size_t>(kind)];
}

std::string_view update_policy_name(UpdatePolicy p) {
  switch (p) {
    case UpdatePolicy::Flush:
      return "flush";
    case UpdatePolicy::Stash:
      return "stash";
    case UpdatePolicy::DoubleBuffered:
      return "2bw";
  }
  return "?";
}

UpdatePolicy parse_update_policy(std::string_view s) {
  if (s == "flush") return UpdatePolicy::Flush;
  if (s == "stash") return UpdatePolicy::Stash;
  if (s == "2bw") return UpdatePolicy::DoubleBuffered;
  PIPELINE_FAIL(ConfigError, "unknown update policy '{}'; expected 'flush', 'stash' or '2bw'", s);
}

std::string to_string(const Action& a) {
  if (is_p2p(a.kind))
    return fmt::format("{}{}{}@{}", a.stage, action_code(a.kind), a.microbatch, a.peer);
  return fmt::format("{}{}{}", a.stage, action_code(a.kind), a.microbatch);
}

Action parse_action(std::string_view token) {
  constexpr std::string_view kExpected =
      "expected <stage><code><number>[@<peer>] with code one of F, B, I, W, SA, RA, SG, RG, AR, "
      "ST, e.g. 0F3 or 0SA3@1";
  Action a;
  std::size_t pos = 0;
  if (!parse_int(token, pos, a.stage))
    PIPELINE_FAIL(ConfigError, "action '{}' does not start with a stage number; {}", token,
                  kExpected);
  std::size_t code_start = pos;
  while (pos < token.size() && token[pos] >= 'A' && token[pos] <= 'Z') ++pos;
  std::string_view code = token.substr(code_start, pos - code_start);
  std::size_t k = 0;
  while (k < kCodes.size() && kCodes[k] != code) ++k;
  if (k == kCodes.size())
    PIPELINE_FAIL(ConfigError, "action '{}' has unknown code '{}'; {}", token, code, kExpected);
  a.kind = static_cast<ActionKind>(k);
  if (!parse_int(token, pos, a.microbatch))
    PIPELINE_FAIL(ConfigError, "action '{}' has no microbatch number after '{}'; {}", token, code,
                  kExpected);
  if (is_p2p(a.kind)) {
    if (pos >= token.size() || token[pos] != '@')
      PIPELINE_FAIL(ConfigError,
                    "action '{}' is a send or receive and needs its peer rank as '@<rank>'", token);
    ++pos;
    if (!parse_int(token, pos, a.peer))
      PIPELINE_FAIL(ConfigError, "action '{}' has no peer rank after '@'", token);
  }
  if (pos != token.size())
    PIPELINE_FAIL(ConfigError, "action '{}' has trailing characters '{}'; {}", token,
                  token.substr(pos), kExpected);
  return a;
}

std::string to_string(const std::vector<Action>& actions) {
  std::string out;
  for (std::size_t i = 0; i < actions.size(); ++i) {
    if (i) out += ' ';
    out += to_string(actions[i]);
  }
  return out;
}

std::vector<Action> parse_actions(std::string_view text) {
  std::vector<Action> out;
  std::size_t pos = 0;
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (pos < text.size()) {
    while (pos < text.size() && space(text[pos])) ++pos;
    std::size_t start = pos;
    while (pos < text.size() && !space(text[pos])) ++pos;
    if (pos > start) out.push_back(parse_action(text.substr(start, pos - start)));
  }
  return out;
}

bool global_norm_exists(const Schedule& schedule) {
  std::vector<int> replicas;
  for (const std::vector<int>& r : schedule.stage_ranks)
    replicas.push_back(static_cast<int>(r.size()));
  return global_norm_exists(schedule.policy == UpdatePolicy::Stash, replicas);
}

void check_global_norm_exists(const Schedule& schedule) {
  PIPELINE_CHECK_AS(ConfigError, global_norm_exists(schedule),
                    "gradient clipping under a stash schedule with replicated stages: the stages "
                    "step at different rates, so no global norm exists; use a flush schedule or no "
                    "clipping");
}

}  // namespace pipeline
