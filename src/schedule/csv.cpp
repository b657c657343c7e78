// CSV import and export of schedules.
#include <pipeline/schedule/csv.hpp>

#include <pipeline/core/text.hpp>

#include "../core/output_file.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace pipeline {
namespace {

int parse_int_field(std::string_view v, std::string_view what, int line) {
  int out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size())
    PIPELINE_FAIL(ConfigError, "schedule CSV line {}: {} '{}' is not an integer", line, what, v);
  return out;
}

}  // namespace

std::string schedule_to_csv(const Schedule& s) {
  std::string out = fmt::format(
      "# pipeline.schedule/1 name={} policy={} microbatches={} minibatches={} vertical_sync={}\n",
      s.name.empty() ? "custom" : s.name, update_policy_name(s.policy), s.microbatches,
      s.minibatches, s.vertical_sync ? 1 : 0);
  out += "rank,actions\n";
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    out += std::to_string(r);
    for (const Action& a : s.ranks[r]) {
      out += ',';
      out += to_string(a);
    }
    out += '\n';
  }
  return out;
}

Schedule schedule_from_csv(std::string_view text) {
  Schedule s;
  s.name = "custom";
  std::map<std::string, std::string> meta;
  std::map<int, std::vector<Action>> rows;
  int line_no = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = trim(text.substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty()) continue;
    if (line.front() == '#') {
      std::string_view rest = trim(line.substr(1));
      if (rest.rfind("pipeline.schedule/", 0) == 0) {
        PIPELINE_CHECK_AS(ConfigError, rest.rfind("pipeline.schedule/1", 0) == 0,
                          "schedule CSV line {}: unsupported format '{}'; this version reads "
                          "pipeline.schedule/1",
                          line_no, rest.substr(0, rest.find(' ')));
        std::istringstream in{std::string(rest)};
        std::string kv;
        in >> kv;  // the format tag
        while (in >> kv) {
          auto eq = kv.find('=');
          PIPELINE_CHECK_AS(ConfigError, eq != std::string::npos,
                            "schedule CSV line {}: '{}' is not key=value", line_no, kv);
          meta[kv.substr(0, eq)] = kv.substr(eq + 1);
        }
      }
      continue;
    }
    std::size_t comma = line.find(',');
    std::string_view first = trim(line.substr(0, comma));
    if (first == "rank") continue;
    int rank = parse_int_field(first, "rank", line_no);
    PIPELINE_CHECK_AS(ConfigError, rank >= 0 && rank < (1 << 20),
                      "schedule CSV line {}: rank {} out of range", line_no, rank);
    PIPELINE_CHECK_AS(ConfigError, !rows.count(rank),
                      "schedule CSV line {}: rank {} has a second row; write one row per rank",
                      line_no, rank);
    auto& actions = rows[rank];
    int cell = 1;
    while (comma != std::string_view::npos) {
      std::size_t next = line.find(',', comma + 1);
      std::string_view c = line.substr(
          comma + 1, next == std::string_view::npos ? std::string_view::npos : next - comma - 1);
      ++cell;
      try {
        for (const Action& a : parse_actions(c)) actions.push_back(a);
      } catch (const ConfigError& e) {
        PIPELINE_FAIL(ConfigError, "schedule CSV line {} (rank {}), cell {}: {}", line_no, rank,
                      cell, e.what());
      }
      comma = next;
    }
  }
  PIPELINE_CHECK_AS(ConfigError, !rows.empty(), "schedule CSV has no rank rows");

  int nranks = rows.rbegin()->first + 1;
  s.ranks.resize(static_cast<std::size_t>(nranks));
  int max_stage = -1, max_unit = -1;
  for (auto& [r, actions] : rows) {
    for (auto& a : actions) {
      max_stage = std::max(max_stage, a.stage);
      if (a.kind != ActionKind::AllReduce && a.kind != ActionKind::Step)
        max_unit = std::max(max_unit, a.microbatch);
    }
    s.ranks[r] = std::move(actions);
  }
  PIPELINE_CHECK_AS(ConfigError, max_stage >= 0, "schedule CSV has no actions");
  PIPELINE_CHECK_AS(ConfigError, max_stage < (1 << 20), "schedule CSV names stage {}", max_stage);
  s.stage_ranks.resize(static_cast<std::size_t>(max_stage + 1));
  for (int r = 0; r < nranks; ++r)
    for (auto& a : s.ranks[r]) {
      if (a.stage < 0) continue;  // reported by validate()
      auto& ranks = s.stage_ranks[a.stage];
      if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
    }

  // Inferred counts, overridden by the metadata line.
  int steps0 = 0, backwards0 = 0;
  for (auto& a : s.ranks[0]) {
    steps0 += a.kind == ActionKind::Step;
    backwards0 += a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight;
  }
  s.policy = steps0 == backwards0 && steps0 > 1 ? UpdatePolicy::Stash : UpdatePolicy::Flush;
  if (meta.count("policy")) s.policy = parse_update_policy(meta["policy"]);
  // The run's microbatches are numbered with ints (Schedule::num_microbatches()).
  PIPELINE_CHECK_AS(ConfigError, max_unit < std::numeric_limits<int>::max(),
                    "schedule CSV names microbatch {}; a run has at most {} microbatches", max_unit,
                    std::numeric_limits<int>::max());
  const int units = max_unit + 1;
  if (s.policy == UpdatePolicy::Stash) {
    s.microbatches = 1;
    s.minibatches = std::max(1, units);
  } else {
    s.minibatches = std::max(1, steps0);
    s.microbatches = std::max(1, units / s.minibatches + (units % s.minibatches != 0));
  }
  if (meta.count("name")) s.name = meta["name"];
  if (meta.count("microbatches"))
    s.microbatches = parse_int_field(meta["microbatches"], "microbatches", 1);
  if (meta.count("minibatches"))
    s.minibatches = parse_int_field(meta["minibatches"], "minibatches", 1);
  if (meta.count("vertical_sync"))
    s.vertical_sync = meta["vertical_sync"] == "1" || meta["vertical_sync"] == "true";
  return s;
}

void write_schedule_csv(const std::string& path, const Schedule& schedule) {
  detail::write_file_atomically(path, schedule_to_csv(schedule));  // never a truncated schedule
}

Schedule read_schedule_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open schedule CSV '{}'", path);
  std::stringstream buf;
  buf << in.rdbuf();
  return schedule_from_csv(buf.str());
}

}  // namespace pipeline
