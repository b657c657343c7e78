#include <pipeline/plan/topology_io.hpp>

#include <pipeline/core/error.hpp>

#include "../core/json_io.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

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

// Splits "25 Gbit/s" into 25 and "gbit" (lower case, "/s" or "ps" removed when allowed). In a
// rate, as in network speeds, a lower-case b is a bit and an upper-case B a byte: "10Gb/s" and
// "10Gbps" are 1.25 GB/s, "10GB/s" and "10GBps" 10 GB/s. Sizes are bytes whatever the case.
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
  const auto ends_with = [&](std::string_view tail) {
    return unit.size() >= tail.size() &&
           unit.compare(unit.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (rate) {
    if (ends_with("/s") || ends_with("/S") || ends_with("ps") || ends_with("PS"))
      unit.resize(unit.size() - 2);
    if (ends_with("b")) unit += "it";
  }
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  bool ok = ec == std::errc() && ptr == s.data() + i && i > 0;
  const Unit* found = nullptr;
  for (const Unit& u : kUnits)
    if (unit == u.name && (rate || !u.bits)) found = &u;
  if (!ok || !found || !std::isfinite(value) || value <= 0)
    PIPELINE_FAIL(ConfigError,
                  "cannot parse {} '{}': expected a positive number optionally followed by a unit "
                  "({}), e.g. {}",
                  what, text,
                  rate ? "B, KB, MB, GB, TB, KiB..TiB for bytes, bit or b, Kbit..Tbit or "
                         "Kb..Tb for bits, with or without /s or ps"
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

double json_price(const nlohmann::json& v, const char* what, std::string_view origin) {
  PIPELINE_CHECK_AS(ConfigError,
                    v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0,
                    "{}: {} must be a non-negative number (currency units per worker-hour), got {}",
                    origin, what, v.dump());
  return v.get<double>();
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

// Type names are written into plan.json and given on command lines as NAME=FILE.
void check_type_name(std::string_view name) {
  const bool ok =
      !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
      });
  PIPELINE_CHECK_AS(ConfigError, ok,
                    "worker type name '{}' must be 1 to 64 letters, digits, '_', '-' or '.'", name);
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
  if (t.price_per_worker_hour)
    PIPELINE_CHECK_AS(
        ConfigError, std::isfinite(*t.price_per_worker_hour) && *t.price_per_worker_hour >= 0,
        "price per worker-hour is {}; need a non-negative number", *t.price_per_worker_hour);
  if (!t.typed()) return;
  PIPELINE_CHECK_AS(ConfigError, t.levels.size() == 1,
                    "a topology with worker types has one level (the network every stage may "
                    "use), got {}; give one level whose count is the types' total",
                    t.levels.size());
  long long typed = 0;
  for (std::size_t i = 0; i < t.types.size(); ++i) {
    const WorkerType& w = t.types[i];
    check_type_name(w.name);
    for (std::size_t k = 0; k < i; ++k)
      PIPELINE_CHECK_AS(ConfigError, t.types[k].name != w.name, "worker type '{}' is listed twice",
                        w.name);
    PIPELINE_CHECK_AS(ConfigError, w.count >= 1, "worker type '{}' has {} workers; need at least 1",
                      w.name, w.count);
    typed += w.count;
    if (w.memory_bytes_per_worker)
      PIPELINE_CHECK_AS(ConfigError,
                        std::isfinite(*w.memory_bytes_per_worker) && *w.memory_bytes_per_worker > 0,
                        "worker type '{}' has memory {} bytes; need a positive size", w.name,
                        *w.memory_bytes_per_worker);
    if (w.price_per_worker_hour)
      PIPELINE_CHECK_AS(ConfigError,
                        std::isfinite(*w.price_per_worker_hour) && *w.price_per_worker_hour >= 0,
                        "worker type '{}' has price {} per hour; need a non-negative number",
                        w.name, *w.price_per_worker_hour);
  }
  PIPELINE_CHECK_AS(ConfigError, typed == t.levels.front().count,
                    "the worker types have {} workers in all but the level has {}; make them equal",
                    typed, t.levels.front().count);
}

std::optional<double> type_memory(const Topology& t, std::size_t type) {
  const auto& m = t.types.at(type).memory_bytes_per_worker;
  return m ? m : t.memory_bytes_per_worker;
}

std::optional<double> type_price(const Topology& t, std::size_t type) {
  const auto& p = t.types.at(type).price_per_worker_hour;
  return p ? p : t.price_per_worker_hour;
}

double parse_price(std::string_view text) {
  std::string s(text);
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  PIPELINE_CHECK_AS(
      ConfigError,
      ec == std::errc() && ptr == s.data() + s.size() && !s.empty() && std::isfinite(v) && v >= 0,
      "cannot parse price '{}': expected a non-negative number (currency units per "
      "worker-hour), e.g. 2.5",
      text);
  return v;
}

WorkerType parse_worker_type(std::string_view text) {
  std::vector<std::string_view> parts;
  for (std::size_t pos = 0;;) {
    const auto colon = text.find(':', pos);
    parts.push_back(text.substr(pos, colon == std::string_view::npos ? colon : colon - pos));
    if (colon == std::string_view::npos) break;
    pos = colon + 1;
  }
  PIPELINE_CHECK_AS(ConfigError, parts.size() >= 2 && parts.size() <= 4,
                    "cannot parse worker type '{}': expected NAME:COUNT[:PRICE[:MEMORY]], e.g. "
                    "h100:8:4.5:80GiB",
                    text);
  WorkerType w;
  w.name = std::string(parts[0]);
  check_type_name(w.name);
  int n = 0;
  auto [ptr, ec] = std::from_chars(parts[1].data(), parts[1].data() + parts[1].size(), n);
  PIPELINE_CHECK_AS(
      ConfigError,
      ec == std::errc() && ptr == parts[1].data() + parts[1].size() && n >= 1 && n <= (1 << 20),
      "cannot parse worker type '{}': the count '{}' must be a positive integer", text, parts[1]);
  w.count = n;
  if (parts.size() >= 3 && !parts[2].empty()) w.price_per_worker_hour = parse_price(parts[2]);
  if (parts.size() == 4) w.memory_bytes_per_worker = parse_bytes(parts[3]);
  return w;
}

// A misspelt key would otherwise leave its setting at the default without a word (a
// "memroy_per_worker" plans with no memory limit).
void check_known_keys(const nlohmann::json& object, std::initializer_list<std::string_view> known,
                      const char* what, std::string_view origin) {
  for (const auto& item : object.items())
    PIPELINE_CHECK_AS(ConfigError, std::find(known.begin(), known.end(), item.key()) != known.end(),
                      "{}: unknown key \"{}\" in {}; the keys are {}", origin, item.key(), what,
                      fmt::join(known, ", "));
}

Topology topology_from_json(const nlohmann::json& j, std::string_view origin) {
  PIPELINE_CHECK_AS(ConfigError, j.is_object() && j.contains("levels") && j.at("levels").is_array(),
                    "{}: a topology is an object with a \"levels\" array", origin);
  check_known_keys(j, {"levels", "memory_per_worker", "price_per_worker_hour", "types"},
                   "the topology", origin);
  Topology t;
  for (const auto& lj : j.at("levels")) {
    PIPELINE_CHECK_AS(
        ConfigError, lj.is_object() && lj.contains("count") && lj.contains("bandwidth"),
        "{}: each level needs \"count\" and \"bandwidth\", got {}", origin, lj.dump());
    check_known_keys(lj, {"count", "bandwidth"}, "a level", origin);
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
  if (j.contains("price_per_worker_hour") && !j.at("price_per_worker_hour").is_null())
    t.price_per_worker_hour =
        json_price(j.at("price_per_worker_hour"), "price_per_worker_hour", origin);
  if (j.contains("types")) {
    PIPELINE_CHECK_AS(ConfigError, j.at("types").is_array(),
                      "{}: \"types\" must be an array of worker types, got {}", origin,
                      j.at("types").dump());
    for (const auto& tj : j.at("types")) {
      PIPELINE_CHECK_AS(ConfigError,
                        tj.is_object() && tj.contains("name") && tj.at("name").is_string() &&
                            tj.contains("count"),
                        "{}: each worker type needs a \"name\" string and a \"count\", got {}",
                        origin, tj.dump());
      check_known_keys(tj, {"name", "count", "memory_per_worker", "price_per_worker_hour"},
                       "a worker type", origin);
      PIPELINE_CHECK_AS(ConfigError,
                        tj.at("count").is_number_integer() &&
                            tj.at("count").get<long long>() >= 1 &&
                            tj.at("count").get<long long>() <= (1 << 20),
                        "{}: worker type count must be a positive integer, got {}", origin,
                        tj.at("count").dump());
      WorkerType w;
      w.name = tj.at("name").get<std::string>();
      w.count = tj.at("count").get<int>();
      if (tj.contains("memory_per_worker") && !tj.at("memory_per_worker").is_null())
        w.memory_bytes_per_worker =
            json_quantity(tj.at("memory_per_worker"), false, "memory_per_worker", origin);
      if (tj.contains("price_per_worker_hour") && !tj.at("price_per_worker_hour").is_null())
        w.price_per_worker_hour =
            json_price(tj.at("price_per_worker_hour"), "price_per_worker_hour", origin);
      t.types.push_back(std::move(w));
    }
    PIPELINE_CHECK_AS(ConfigError, !t.types.empty(),
                      "{}: \"types\" is empty; leave it out for one kind of worker", origin);
  }
  validate_topology(t);
  return t;
}

nlohmann::json topology_to_json(const Topology& t) {
  nlohmann::json levels = nlohmann::json::array();
  for (const auto& l : t.levels)
    levels.push_back({{"count", l.count}, {"bandwidth", l.bandwidth_bytes_per_s}});
  nlohmann::json j = {{"levels", levels}};
  if (t.memory_bytes_per_worker) j["memory_per_worker"] = *t.memory_bytes_per_worker;
  if (t.price_per_worker_hour) j["price_per_worker_hour"] = *t.price_per_worker_hour;
  if (t.typed()) {
    nlohmann::json types = nlohmann::json::array();
    for (const WorkerType& w : t.types) {
      nlohmann::json tj = {{"name", w.name}, {"count", w.count}};
      if (w.memory_bytes_per_worker) tj["memory_per_worker"] = *w.memory_bytes_per_worker;
      if (w.price_per_worker_hour) tj["price_per_worker_hour"] = *w.price_per_worker_hour;
      types.push_back(std::move(tj));
    }
    j["types"] = std::move(types);
  }
  return j;
}

constexpr std::string_view kTopologyFileHint =
    "; expected a topology JSON object with a \"levels\" array";

Topology parse_topology(std::string_view text, std::string_view origin) {
  return topology_from_json(detail::parse_json_text(text, origin, kTopologyFileHint), origin);
}

Topology read_topology(const std::string& path) {
  return topology_from_json(detail::read_json_file(path, "topology file", kTopologyFileHint), path);
}

std::string describe_topology(const Topology& t) {
  std::string s;
  for (std::size_t i = 0; i < t.levels.size(); ++i) {
    if (i) s += ", ";
    s += fmt::format("{}x{}/s", t.levels[i].count, human_bytes(t.levels[i].bandwidth_bytes_per_s));
  }
  if (t.memory_bytes_per_worker)
    s += fmt::format(", {} per worker", human_bytes(*t.memory_bytes_per_worker));
  if (t.price_per_worker_hour)
    s += fmt::format(", {:.4g} per worker-hour", *t.price_per_worker_hour);
  for (const WorkerType& w : t.types) {
    s += fmt::format("; {} x {}", w.count, w.name);
    if (w.memory_bytes_per_worker)
      s += fmt::format(" ({})", human_bytes(*w.memory_bytes_per_worker));
    if (w.price_per_worker_hour) s += fmt::format(" at {:.4g}/h", *w.price_per_worker_hour);
  }
  return s;
}

}  // namespace pipeline
