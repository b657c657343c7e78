// Replaying a training run on an availability trace (see availability.hpp for the model).
#include <pipeline/schedule/availability.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/core/text.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace pipeline {
namespace {

constexpr double kForever = std::numeric_limits<double>::infinity();

template <typename T>
bool parse_number(std::string_view v, T& out) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && p == v.data() + v.size();
}

// The plan on k available workers, once per k (nullopt: none fits, or k = 0).
class PlanCache {
 public:
  PlanCache(const Profile& profile, const Topology& topology, const PartitionOptions& options)
      : m_profile(profile), m_topology(topology), m_options(options) {}

  const std::optional<Plan>& plan(int available) {
    auto it = m_plans.find(available);
    if (it != m_plans.end()) return it->second;
    std::optional<Plan> p;
    if (available > 0)
      p = try_partition(m_profile, topology_for_workers(m_topology, available), m_options);
    return m_plans.emplace(available, std::move(p)).first->second;
  }

 private:
  const Profile& m_profile;
  const Topology& m_topology;
  const PartitionOptions& m_options;
  std::map<int, std::optional<Plan>> m_plans;
};

double rate_of(const Plan& p, int batch) {
  return p.predicted.time_per_minibatch_s > 0 ? batch / p.predicted.time_per_minibatch_s : kForever;
}

// The run of `samples` on a sequence of (start, available) intervals. `elastic` false: the plan
// of the first interval for ever (the static run).
AvailabilityRun run_trace(PlanCache& plans, const std::vector<AvailabilityChange>& trace,
                          const AvailabilityOptions& options, int batch, double price) {
  AvailabilityRun run;
  const Plan* current = nullptr;
  double left = options.samples;
  double pending_restart = 0;
  bool started = false;
  for (std::size_t i = 0; i < trace.size() && left > 0; ++i) {
    const double start = trace[i].time_s;
    const double end = i + 1 < trace.size() ? trace[i + 1].time_s : kForever;
    const int available = trace[i].workers;
    const std::optional<Plan>& candidate = plans.plan(available);
    AvailabilitySegment seg;
    seg.start_s = start;
    seg.available = available;
    const Plan* next = current;
    if (current == nullptr || current->ranks_run() > available) {
      next = candidate ? &*candidate : nullptr;  // must (or now can) re-plan
    } else if (candidate && &*candidate != current) {
      // More workers: switch only if it pays for its restart on the work left.
      const double stay = left / rate_of(*current, batch) + pending_restart;
      const double move = left / rate_of(*candidate, batch) + options.restart_s;
      if (move < stay) next = &*candidate;
    }
    if (next != current) {
      // The first start is no restart, even after waiting for workers: there is nothing to
      // checkpoint and load yet.
      seg.replanned = next != nullptr;
      const bool restart = seg.replanned && started;
      pending_restart = restart ? options.restart_s : 0;
      if (restart) ++run.restarts;
      started = started || seg.replanned;
      current = next;
    }
    if (current == nullptr) {
      PIPELINE_CHECK_AS(ConfigError, std::isfinite(end),
                        "the trace ends (line {}, time {} s) with {} workers, on which no plan "
                        "fits, so training never finishes ({:.6g} of {:.6g} samples left); end the "
                        "trace with workers that can train the model",
                        trace[i].line, start, available, left, options.samples);
      seg.end_s = end;
      run.segments.push_back(seg);
      continue;
    }
    seg.workers = current->ranks_run();  // (a plan may leave workers idle)
    seg.config = current->config;
    seg.time_per_minibatch_s = current->predicted.time_per_minibatch_s;
    seg.restart_s = std::min(pending_restart, end - start);
    pending_restart -= seg.restart_s;
    const double rate = rate_of(*current, batch);
    const double train_s = end - start - seg.restart_s;
    if (train_s * rate >= left) {
      seg.end_s = start + seg.restart_s + left / rate;
      seg.samples = left;
      left = 0;
    } else {
      seg.end_s = end;
      seg.samples = train_s * rate;
      left -= seg.samples;
    }
    const double hours = (seg.end_s - seg.start_s) / 3600.0 * seg.workers;
    seg.cost = hours * price;
    run.worker_hours += hours;
    run.cost += seg.cost;
    run.segments.push_back(seg);
  }
  run.time_s = run.segments.empty() ? 0 : run.segments.back().end_s;
  return run;
}

}  // namespace

std::vector<AvailabilityChange> parse_availability_csv(std::string_view text,
                                                       std::string_view source) {
  std::vector<AvailabilityChange> out;
  int line = 0;
  bool first_content = true;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view row = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line;
    if (const std::size_t hash = row.find('#'); hash != std::string_view::npos)
      row = row.substr(0, hash);
    row = trim(row);
    if (row.empty()) continue;
    const std::size_t comma = row.find(',');
    PIPELINE_CHECK_AS(ConfigError, comma != std::string_view::npos,
                      "{} line {}: '{}' is not a row time_s,workers", source, line, row);
    const std::string_view time_text = trim(row.substr(0, comma));
    const std::string_view workers_text = trim(row.substr(comma + 1));
    AvailabilityChange c;
    c.line = line;
    const bool numeric = parse_number(time_text, c.time_s);
    if (first_content && !numeric && time_text == "time_s" && workers_text == "workers") {
      first_content = false;  // the header
      continue;
    }
    first_content = false;
    PIPELINE_CHECK_AS(ConfigError, numeric && std::isfinite(c.time_s) && c.time_s >= 0,
                      "{} line {}: time '{}' is not a number of seconds >= 0", source, line,
                      time_text);
    PIPELINE_CHECK_AS(ConfigError, parse_number(workers_text, c.workers) && c.workers >= 0,
                      "{} line {}: workers '{}' is not a whole number >= 0", source, line,
                      workers_text);
    PIPELINE_CHECK_AS(ConfigError, !out.empty() || c.time_s == 0,
                      "{} line {}: the first row must be at time 0 (got {}); say how many "
                      "workers there are when the run starts",
                      source, line, time_text);
    PIPELINE_CHECK_AS(ConfigError, out.empty() || c.time_s > out.back().time_s,
                      "{} line {}: time {} s is not after the previous row's {} s (line {}); "
                      "rows must be in increasing time",
                      source, line, c.time_s, out.back().time_s, out.back().line);
    out.push_back(c);
  }
  PIPELINE_CHECK_AS(ConfigError, !out.empty(),
                    "{} has no rows; give rows time_s,workers, the first at time 0", source);
  return out;
}

std::vector<AvailabilityChange> read_availability_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open availability trace '{}'", path);
  std::stringstream buf;
  buf << in.rdbuf();
  return parse_availability_csv(buf.str(), path);
}

Topology topology_for_workers(const Topology& topology, int workers) {
  PIPELINE_CHECK_AS(ConfigError, !topology.typed(),
                    "an availability trace counts one kind of worker; the topology has worker "
                    "types");
  PIPELINE_CHECK_AS(ConfigError, !topology.levels.empty(), "the topology has no levels");
  PIPELINE_CHECK_AS(ConfigError, workers >= 1, "need at least one worker, got {}", workers);
  Topology t = topology;
  while (true) {
    int inner = 1;
    for (std::size_t l = 0; l + 1 < t.levels.size(); ++l) inner *= std::max(t.levels[l].count, 1);
    if (t.levels.size() == 1 || workers >= inner) {
      t.levels.back().count = std::max(workers / inner, 1);
      return t;
    }
    t.levels.pop_back();
  }
}

AvailabilityReplay replay_availability(const Profile& profile, const Topology& topology,
                                       const std::vector<AvailabilityChange>& trace,
                                       const AvailabilityOptions& options) {
  PIPELINE_CHECK_AS(ConfigError, !trace.empty(), "the availability trace has no rows");
  PIPELINE_CHECK_AS(ConfigError, profile.batch_size > 0,
                    "the profile does not say its batch size, so samples cannot be turned into "
                    "minibatches");
  PIPELINE_CHECK_AS(ConfigError, std::isfinite(options.samples) && options.samples > 0,
                    "the number of samples to train must be positive, got {}", options.samples);
  PIPELINE_CHECK_AS(ConfigError, std::isfinite(options.restart_s) && options.restart_s >= 0,
                    "the restart cost must be >= 0 seconds, got {}", options.restart_s);
  PIPELINE_CHECK_AS(ConfigError, !topology.typed(),
                    "an availability trace counts one kind of worker; the topology has worker "
                    "types");
  AvailabilityReplay out;
  const std::optional<double> price = options.price_per_worker_hour
                                          ? options.price_per_worker_hour
                                          : topology.price_per_worker_hour;
  out.priced = price.has_value();
  PlanCache plans(profile, topology, options.partition);
  out.elastic = run_trace(plans, trace, options, profile.batch_size, price.value_or(0));

  // The workers there throughout the static run: start from the first row's, lower to the
  // fewest of any row before that run would end, until it holds (w only falls, so this ends).
  int fewest = trace.front().workers;
  while (true) {
    out.static_workers = fewest;
    if (fewest == 0 || !plans.plan(fewest)) {
      out.fixed = AvailabilityRun{};
      out.fixed.feasible = false;
      break;
    }
    const std::vector<AvailabilityChange> constant = {{0.0, fewest, 0}};
    out.fixed = run_trace(plans, constant, options, profile.batch_size, price.value_or(0));
    int during = fewest;
    for (const AvailabilityChange& c : trace)
      if (c.time_s < out.fixed.time_s) during = std::min(during, c.workers);
    if (during >= fewest) break;
    fewest = during;
  }
  return out;
}

}  // namespace pipeline
