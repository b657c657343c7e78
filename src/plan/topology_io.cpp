#include <pipeline/plan/topology_io.hpp>

#include <pipeline/core/error.hpp>

#include "../core/json_io.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

namespace pipeline {
namespace {

struct Unit {
  const char* name;
  double factor;
  bool bits;
};

constexpr Unit kUnits[] = {
    {"", 1, false},
    {"b", 1, false},
    {"kb", 1e3, false},
    {"mb", 1e6, false},
    {"gb", 1e9, false},
    {"tb", 1e12, false},
    {"kib", 1024.0, false},
    {"mib", 1048576.0, false},
    {"gib", 1073741824.0, false},
    {"tib", 1099511627776.0, false},
    {"bit", 1.0 / 8, true},
    {"kbit", 1e3 / 8, true},
    {"mbit", 1e6 / 8, true},
    {"gbit", 1e9 / 8, true},
    {"tbit", 1e12 / 8, true},
};

// Splits "25 Gbit/s" into 25 and "gbit" (lower case, "/s" or "ps" removed when allowed).
double parse_quantity(std::string_view text, bool rate, const char* what) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' ||
                          s[i] == '+' || s[i] == '-' ||
                          ((s[i] == 'e' || s[i] == 'E') && i > 0 && i + 1 < s.size() &&
                           (std::isdigit(static_cast<unsigned char>(s[i + 1])) || s[i + 1] == '-' ||
                            s[i + 1] == '+'))))
    ++i;
  double value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + i, value);
  std::string unit = s.substr(i);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  bool ok = ec == std::errc() && ptr == s.data() + i && i > 0;
  if (rate) {
    if (unit.size() >= 2 && unit.compare(unit.size() - 2, 2, "/s") == 0)
      unit.resize(unit.size() - 2);
    else if (unit.size() >= 3 && unit.compare(unit.size() - 3, 3, "bps") == 0)
      unit.replace(unit.size() - 3, 3, "bit");
  }
  const Unit* found = nullptr;
  for (const Unit& u : kUnits)
    if (unit == u.name && (rate || !u.bits)) found = &u;
  if (!ok || !found || !std::isfinite(value) || value <= 0)
    PIPELINE_FAIL(ConfigError,
                  "cannot parse {} '{}': expected a positive number optionally followed by a unit "
                  "({}), e.g. {}",
                  what, text,
                  rate ? "B, KB, MB, GB, TB, KiB..TiB, bit, Kbit..Tbit, with or without /s"
                       : "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB",
                  rate ? "300GB/s or 25Gbit/s or 1.25e9" : "80GiB or 16e9");
  double bytes = value * found->factor;
  PIPELINE_CHECK_AS(ConfigError, std::isfinite(bytes) && bytes > 0, "{} '{}' is out of range", what,
                    text);
  return bytes;
}

double json_quantity(const nlohmann::json& v, bool rate, const char* what,
                     std::string_view origin) {
  if (v.is_number()) {
    double x = v.get<double>();
    PIPELINE_CHECK_AS(ConfigError, std::isfinite(x) && x > 0, "{}: {} must be positive, got {}",
                      origin, what, v.dump());
    return x;
  }
  PIPELINE_CHECK_AS(ConfigError, v.is_string(),
                    "{}: {} must be a number or a string with a unit, got {}", origin, what,
                    v.dump());
  return parse_quantity(v.get<std::string>(), rate, what);
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return fmt::format("{:.4g} {}", b, units[u]);
}

}  // namespace

double parse_bandwidth(std::string_view text) {
  return parse_quantity(text, true, "bandwidth");
}
double parse_bytes(std::string_view text) {
  return parse_quantity(text, false, "memory size");
}

TopologyLevel parse_level(std::string_view text) {
  auto colon = text.find(':');
  PIPELINE_CHECK_AS(ConfigError, colon != std::string_view::npos,
                    "cannot parse level '{}': expected COUNT:BANDWIDTH, e.g. 4:1e10 or 8:300GB/s",
                    text);
  std::string_view count = text.substr(0, colon);
  int n = 0;
  auto [ptr, ec] = std::from_chars(count.data(), count.data() + count.size(), n);
  PIPELINE_CHECK_AS(ConfigError, ec == std::errc() && ptr == count.data() + count.size() && n >= 1,
                    "cannot parse level '{}': the worker count '{}' must be a positive integer",
                    text, count);
  TopologyLevel level;
  level.count = n;
  level.bandwidth_bytes_per_s = parse_bandwidth(text.substr(colon + 1));
  return level;
}

void validate_topology(const Topology& t) {
  PIPELINE_CHECK_AS(
      ConfigError, !t.levels.empty(),
      "the topology has no levels; give --workers N --bandwidth B or --level COUNT:BANDWIDTH");
  long long workers = 1;
  for (std::size_t i = 0; i < t.levels.size(); ++i) {
    const TopologyLevel& l = t.levels[i];
    PIPELINE_CHECK_AS(ConfigError, l.count >= 1,
                      "topology level {} has {} workers; need at least 1", i, l.count);
    PIPELINE_CHECK_AS(ConfigError,
                      std::isfinite(l.bandwidth_bytes_per_s) && l.bandwidth_bytes_per_s > 0,
                      "topology level {} has bandwidth {} bytes/s; need a positive number", i,
                      l.bandwidth_bytes_per_s);
    workers *= l.count;
    PIPELINE_CHECK_AS(ConfigError, workers <= (1 << 20), "the topology has more than {} workers",
                      1 << 20);
  }
  if (t.memory_bytes_per_worker)
    PIPELINE_CHECK_AS(
        ConfigError, std::isfinite(*t.memory_bytes_per_worker) && *t.memory_bytes_per_worker > 0,
        "memory per worker is {} bytes; need a positive size", *t.memory_bytes_per_worker);
}

Topology topology_from_json(const nlohmann::json& j, std::string_view origin) {
  PIPELINE_CHECK_AS(ConfigError, j.is_object() && j.contains("levels") && j.at("levels").is_array(),
                    "{}: a topology is an object with a \"levels\" array", origin);
  Topology t;
  for (const auto& lj : j.at("levels")) {
    PIPELINE_CHECK_AS(
        ConfigError, lj.is_object() && lj.contains("count") && lj.contains("bandwidth"),
        "{}: each level needs \"count\" and \"bandwidth\", got {}", origin, lj.dump());
    PIPELINE_CHECK_AS(ConfigError,
                      lj.at("count").is_number_integer() && lj.at("count").get<long long>() >= 1 &&
                          lj.at("count").get<long long>() <= (1 << 20),
                      "{}: level count must be a positive integer, got {}", origin,
                      lj.at("count").dump());
    TopologyLevel l;
    l.count = lj.at("count").get<int>();
    l.bandwidth_bytes_per_s = json_quantity(lj.at("bandwidth"), true, "bandwidth", origin);
    t.levels.push_back(l);
  }
  if (j.contains("memory_per_worker") && !j.at("memory_per_worker").is_null())
    t.memory_bytes_per_worker =
        json_quantity(j.at("memory_per_worker"), false, "memory_per_worker", origin);
  validate_topology(t);
  return t;
}

nlohmann::json topology_to_json(const Topology& t) {
  nlohmann::json levels = nlohmann::json::array();
  for (const auto& l : t.levels)
    levels.push_back({{"count", l.count}, {"bandwidth", l.bandwidth_bytes_per_s}});
  nlohmann::json j = {{"levels", levels}};
  if (t.memory_bytes_per_worker) j["memory_per_worker"] = *t.memory_bytes_per_worker;
  return j;
}

Topology parse_topology(std::string_view text, std::string_view origin) {
  return topology_from_json(detail::parse_json_text(text, origin, ""), origin);
}

Topology read_topology(const std::string& path) {
  return topology_from_json(detail::read_json_file(path, "topology file", ""), path);
}

std::string describe_topology(const Topology& t) {
  std::string s;
  for (std::size_t i = 0; i < t.levels.size(); ++i) {
    if (i) s += ", ";
    s += fmt::format("{}x{}/s", t.levels[i].count, human_bytes(t.levels[i].bandwidth_bytes_per_s));
  }
  if (t.memory_bytes_per_worker)
    s += fmt::format(", {} per worker", human_bytes(*t.memory_bytes_per_worker));
  return s;
}

}  // namespace pipeline
