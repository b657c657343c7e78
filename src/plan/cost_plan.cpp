#include <pipeline/plan/cost_plan.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/plan/topology_io.hpp>
#include <pipeline/plan/typed_partition.hpp>

#include "../core/json_io.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace pipeline {
namespace {

constexpr double kHuge = 1e300;

double checked_price(const Topology& t, std::size_t type) {
  const auto p = type_price(t, type);
  PIPELINE_CHECK_AS(
      ConfigError, p.has_value(),
      "worker type '{}' has no price; give it \"price_per_worker_hour\" in the topology "
      "(or --type NAME:COUNT:PRICE)",
      t.types[type].name);
  return *p;
}

void finish_cost(CostedPlan& c, double samples, int batch) {
  c.time_s = c.plan.predicted.time_per_minibatch_s * samples / batch;
  c.cost = c.time_s / 3600.0 * c.price_per_hour;
}

// Sub-clusters of whole groups: 2..M groups of the outermost level, then one group's own
// sub-clusters (one level: 1..M workers).
void sub_topologies(Topology t, std::vector<Topology>& out) {
  const int m = t.levels.back().count;
  for (int k = m; k >= 2; --k) {
    Topology s = t;
    s.levels.back().count = k;
    out.push_back(std::move(s));
  }
  if (t.levels.size() == 1) {
    t.levels.back().count = 1;
    out.push_back(std::move(t));
    return;
  }
  t.levels.pop_back();
  sub_topologies(std::move(t), out);
}

// The workers a plan trains on, for messages: "1 h100 + 3 a100" (types in the order its stages
// first use them) on a typed plan, "4 workers" otherwise.
std::string plan_workers(const Plan& plan) {
  std::vector<std::pair<std::string, int>> types;
  for (const PlanStage& st : plan.stages) {
    if (st.device.empty())
      return fmt::format("{} worker{}", plan.workers, plan.workers == 1 ? "" : "s");
    auto it = std::find_if(types.begin(), types.end(),
                           [&](const auto& t) { return t.first == st.device; });
    if (it == types.end()) {
      types.push_back({st.device, 0});
      it = types.end() - 1;
    }
    it->second += st.replicas;
  }
  std::string s;
  for (const auto& [name, n] : types) s += fmt::format("{}{} {}", s.empty() ? "" : " + ", n, name);
  return s;
}

// Candidate order of preference on equal keys: fewer workers, then the earlier candidate.
bool fewer(const CostedPlan& a, const CostedPlan& b) {
  return a.plan.workers < b.plan.workers;
}

}  // namespace

std::vector<CostedPlan> cost_candidates(const DeviceProfiles& profiles, const Topology& topology,
                                        const PartitionOptions& options, double samples) {
  validate_topology(topology);
  check_device_profiles(profiles);
  PIPELINE_CHECK_AS(ConfigError, std::isfinite(samples) && samples > 0,
                    "the number of samples to train must be positive, got {}", samples);
  const int batch = profiles.begin()->second.batch_size;
  PIPELINE_CHECK_AS(ConfigError, batch > 0,
                    "the profile does not say its batch size, so samples cannot be turned into "
                    "minibatches; pass --batch");
  std::vector<CostedPlan> out;
  if (topology.typed()) {
    std::vector<double> prices;
    for (std::size_t t = 0; t < topology.types.size(); ++t)
      prices.push_back(checked_price(topology, t));
    TypedPartitioner planner(profiles, topology, options);
    for (std::size_t v = 1; v < planner.num_usages(); ++v) {
      if (!std::isfinite(planner.best_time(v))) continue;
      CostedPlan c;
      c.plan = planner.plan(v);
      c.workers = planner.usage(v);
      for (std::size_t t = 0; t < prices.size(); ++t) c.price_per_hour += c.workers[t] * prices[t];
      finish_cost(c, samples, batch);
      out.push_back(std::move(c));
    }
    if (out.empty()) planner.fastest();  // throws, naming what is missing
    return out;
  }
  PIPELINE_CHECK_AS(ConfigError, profiles.size() == 1,
                    "the topology has one kind of worker but {} profiles were given; give one "
                    "profile, or worker types in the topology",
                    profiles.size());
  PIPELINE_CHECK_AS(
      ConfigError, topology.price_per_worker_hour.has_value(),
      "the topology has no price; give \"price_per_worker_hour\" in the topology or --price");
  const Profile& profile = profiles.begin()->second;
  std::vector<Topology> subs;
  sub_topologies(topology, subs);
  for (const Topology& s : subs) {
    // A sub-cluster that cannot take the plan asked for (an interleaved plan on 1 worker, or on a
    // count that makes no pipelines of 2) is no candidate; where none can, the whole cluster's
    // plan below says why.
    std::optional<Plan> p;
    try {
      p = try_partition(profile, s, options);
    } catch (const ConfigError&) {
      if (s.workers() == topology.workers()) throw;
    }
    if (!p) continue;
    CostedPlan c;
    c.plan = std::move(*p);
    c.workers = {c.plan.workers};
    c.price_per_hour = c.plan.workers * *topology.price_per_worker_hour;
    finish_cost(c, samples, batch);
    out.push_back(std::move(c));
  }
  if (out.empty()) partition(profile, topology, options);  // throws with the memory that would fit
  std::reverse(out.begin(), out.end());                    // ascending in workers
  return out;
}

std::vector<CostedPlan> pareto_frontier(const std::vector<CostedPlan>& candidates) {
  std::vector<const CostedPlan*> order;
  for (const CostedPlan& c : candidates) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const CostedPlan* a, const CostedPlan* b) {
    if (a->time_s != b->time_s) return a->time_s < b->time_s;
    if (a->cost != b->cost) return a->cost < b->cost;
    return fewer(*a, *b);
  });
  std::vector<CostedPlan> out;
  for (const CostedPlan* c : order)
    if (out.empty() || c->cost < out.back().cost) out.push_back(*c);
  return out;
}

const CostedPlan& cheapest_within_deadline(const std::vector<CostedPlan>& candidates,
                                           double deadline_s, double samples) {
  PIPELINE_CHECK_AS(ConfigError, !candidates.empty(), "no candidate plans");
  const CostedPlan* best = nullptr;
  const CostedPlan* fastest = &candidates.front();
  for (const CostedPlan& c : candidates) {
    if (c.time_s < fastest->time_s || (c.time_s == fastest->time_s && c.cost < fastest->cost))
      fastest = &c;
    if (c.time_s > deadline_s) continue;
    if (!best || c.cost < best->cost ||
        (c.cost == best->cost &&
         (c.time_s < best->time_s || (c.time_s == best->time_s && fewer(c, *best)))))
      best = &c;
  }
  if (!best)
    PIPELINE_FAIL(ConfigError,
                  "the fastest plan takes {} for {:.6g} samples ({}, config {}, {:.4g} s per "
                  "minibatch); the deadline is {}: raise --deadline to {} or add workers",
                  format_duration(fastest->time_s), samples, plan_workers(fastest->plan),
                  fastest->plan.config, fastest->plan.predicted.time_per_minibatch_s,
                  format_duration(deadline_s), format_duration(fastest->time_s, true));
  return *best;
}

const CostedPlan& fastest_within_budget(const std::vector<CostedPlan>& candidates, double budget,
                                        double samples) {
  PIPELINE_CHECK_AS(ConfigError, !candidates.empty(), "no candidate plans");
  const CostedPlan* best = nullptr;
  const CostedPlan* cheapest = &candidates.front();
  for (const CostedPlan& c : candidates) {
    if (c.cost < cheapest->cost || (c.cost == cheapest->cost && c.time_s < cheapest->time_s))
      cheapest = &c;
    if (c.cost > budget) continue;
    if (!best || c.time_s < best->time_s ||
        (c.time_s == best->time_s &&
         (c.cost < best->cost || (c.cost == best->cost && fewer(c, *best)))))
      best = &c;
  }
  if (!best) {
    const double need = std::ceil(cheapest->cost * 100.0) / 100.0;
    PIPELINE_FAIL(ConfigError,
                  "the cheapest plan costs {:.2f} for {:.6g} samples ({} for {}, config {}); the "
                  "budget is {:.2f}: raise --budget to {:.2f} or use cheaper workers",
                  need, samples, plan_workers(cheapest->plan), format_duration(cheapest->time_s),
                  cheapest->plan.config, budget, need);
  }
  return *best;
}

double parse_duration(std::string_view text, bool allow_zero) {
  std::string s;
  for (char c : text)
    if (c != ' ') s.push_back(c);
  double unit = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 's':
        unit = 1;
        s.pop_back();
        break;
      case 'm':
        unit = 60;
        s.pop_back();
        break;
      case 'h':
        unit = 3600;
        s.pop_back();
        break;
      case 'd':
        unit = 86400;
        s.pop_back();
        break;
      default:
        break;
    }
  }
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  PIPELINE_CHECK_AS(
      ConfigError,
      !s.empty() && ec == std::errc() && ptr == s.data() + s.size() && std::isfinite(v) &&
          (allow_zero ? v >= 0 : v > 0),
      "cannot parse duration '{}': expected a {} number of seconds, or one with a unit s, m, h "
      "or d, e.g. 90s, 45m, 6h, 2d",
      text, allow_zero ? "non-negative" : "positive");
  return v * unit;
}

std::string format_duration(double seconds, bool round_up) {
  const char* unit = "s";
  double v = seconds;
  if (seconds >= 2 * 86400) {
    unit = "d";
    v = seconds / 86400;
  } else if (seconds >= 3600) {
    unit = "h";
    v = seconds / 3600;
  } else if (seconds >= 120) {
    unit = "m";
    v = seconds / 60;
  }
  if (round_up && v > 0) {
    // Up to 3 significant digits, never below the value.
    const double step = std::pow(10.0, std::floor(std::log10(v)) - 2);
    v = std::ceil(v / step * (1 - 1e-12)) * step;
  }
  return fmt::format("{:.3g}{}", v, unit);
}

std::string describe_workers(const CostedPlan& c, const Topology& t) {
  if (!t.typed()) return fmt::format("{} worker{}", c.plan.workers, c.plan.workers == 1 ? "" : "s");
  std::string s;
  for (std::size_t i = 0; i < t.types.size() && i < c.workers.size(); ++i)
    if (c.workers[i] > 0)
      s += fmt::format("{}{} {}", s.empty() ? "" : " + ", c.workers[i], t.types[i].name);
  return s;
}

nlohmann::json frontier_to_json(const std::vector<CostedPlan>& frontier, const Topology& topology,
                                double samples) {
  nlohmann::json points = nlohmann::json::array();
  for (const CostedPlan& c : frontier) {
    nlohmann::json workers = nlohmann::json::object();
    if (topology.typed())
      for (std::size_t i = 0; i < topology.types.size(); ++i)
        workers[topology.types[i].name] = c.workers[i];
    else
      workers["workers"] = c.plan.workers;
    nlohmann::json devices = nlohmann::json::array();
    for (const PlanStage& s : c.plan.stages) devices.push_back(s.device);
    nlohmann::json p = {{"time_s", c.time_s},
                        {"time", format_duration(c.time_s)},
                        {"cost", c.cost},
                        {"price_per_hour", c.price_per_hour},
                        {"workers", workers},
                        {"config", c.plan.config},
                        {"time_per_minibatch_s", c.plan.predicted.time_per_minibatch_s}};
    if (topology.typed()) p["devices"] = devices;
    points.push_back(std::move(p));
  }
  return {{"samples", samples}, {"points", points}};
}

void write_frontier_json(const std::string& path, const std::vector<CostedPlan>& frontier,
                         const Topology& topology, double samples) {
  detail::write_file_atomically(path, frontier_to_json(frontier, topology, samples).dump(1) + '\n');
}

std::string frontier_svg(const std::vector<CostedPlan>& frontier,
                         const std::vector<CostedPlan>& candidates, const Topology& topology,
                         double samples) {
  const double W = 760, H = 460, left = 80, right = 200, top = 40, bottom = 60;
  // The axes span the frontier (candidates far slower than its slowest point would squeeze it
  // into a corner; they are left out and counted in the caption). Ends at round steps.
  double tmin = kHuge, tmax = 0, cmin = kHuge, cmax = 0;
  for (const CostedPlan& c : frontier) {
    tmin = std::min(tmin, c.time_s / 3600);
    tmax = std::max(tmax, c.time_s / 3600);
    cmin = std::min(cmin, c.cost);
    cmax = std::max(cmax, c.cost);
  }
  if (frontier.empty()) tmin = cmin = 0, tmax = cmax = 1;
  const auto step_of = [](double span) {
    const double raw = span / 5, p = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0})
      if (m * p >= raw) return m * p;
    return 10 * p;
  };
  const double tspan = std::max(tmax * 1.3, 1e-9), tstep = step_of(tspan),
               t1 = std::ceil(tspan / tstep) * tstep;
  double cspan = std::max(cmax - cmin, 1e-9 + 0.1 * cmax);
  const double cstep = step_of(cspan * 1.4);
  const double c0 = std::max(0.0, std::floor((cmin - 0.2 * cspan) / cstep) * cstep);
  const double c1 = std::ceil((cmax + 0.2 * cspan) / cstep) * cstep;
  const double pw = W - left - right, ph = H - top - bottom;
  auto X = [&](double hours) { return left + pw * hours / t1; };
  auto Y = [&](double cost) { return top + ph * (1 - (cost - c0) / (c1 - c0)); };
  auto inside = [&](const CostedPlan& c) {
    return c.time_s / 3600 <= t1 && c.cost >= c0 && c.cost <= c1;
  };
  std::size_t outside = 0;
  for (const CostedPlan& c : candidates) outside += inside(c) ? 0 : 1;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"{0}\" height=\"{1}\" "
      "fill=\"white\"/>\n",
      W, H);
  svg += fmt::format(
      "<text x=\"{}\" y=\"20\" font-size=\"13\">Plans for {:.6g} samples: time against cost (blue: "
      "the Pareto frontier; grey: other worker choices{})</text>\n",
      left, samples, outside ? fmt::format(", {} beyond the axes", outside) : std::string());
  for (double v = 0; v <= t1 * (1 + 1e-9); v += tstep) {
    svg +=
        fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>\n",
                    X(v), top, top + ph);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.4g}</text>\n", X(v),
                       top + ph + 16, v);
  }
  for (double v = c0; v <= c1 * (1 + 1e-9); v += cstep) {
    svg +=
        fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#eee\"/>\n",
                    Y(v), left, left + pw);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.4g}</text>\n", left - 6,
                       Y(v) + 4, v);
  }
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left,
      top, pw, ph);
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">time to train (hours)</text>\n",
      left + pw / 2, H - 18);
  svg += fmt::format(
      "<text x=\"18\" y=\"{:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {:.1f})\">cost "
      "(currency units)</text>\n",
      top + ph / 2, top + ph / 2);
  for (const CostedPlan& c : candidates)
    if (inside(c))
      svg += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"#bbb\"><title>{}: {}, "
          "{:.2f}</title>"
          "</circle>\n",
          X(c.time_s / 3600), Y(c.cost), describe_workers(c, topology), format_duration(c.time_s),
          c.cost);
  // The frontier as a step line: from each point, the cost holds until the next point's time.
  if (!frontier.empty()) {
    std::string path =
        fmt::format("M{:.1f},{:.1f}", X(frontier[0].time_s / 3600), Y(frontier[0].cost));
    for (std::size_t i = 1; i < frontier.size(); ++i)
      path += fmt::format(" H{:.1f} V{:.1f}", X(frontier[i].time_s / 3600), Y(frontier[i].cost));
    path += fmt::format(" H{:.1f}", left + pw);
    svg += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\"/>\n",
                       path);
  }
  double last_label_y = -kHuge;
  for (std::size_t i = 0; i < frontier.size(); ++i) {
    const CostedPlan& c = frontier[i];
    svg += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#1f77b4\"><title>{}: {}, {:.2f}, "
        "config "
        "{}</title></circle>\n",
        X(c.time_s / 3600), Y(c.cost), describe_workers(c, topology), format_duration(c.time_s),
        c.cost, c.plan.config);
    if (frontier.size() <= 12 || i % (frontier.size() / 12 + 1) == 0) {
      // Costs fall along the frontier, so labels go down the plot: keep each a line below the last.
      const double y = std::max(Y(c.cost) - 7, last_label_y + 13);
      last_label_y = y;
      svg +=
          fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#1f77b4\">{} ({}, {:.2f})</text>\n",
                      X(c.time_s / 3600) + 7, y, describe_workers(c, topology),
                      format_duration(c.time_s), c.cost);
    }
  }
  svg += "</svg>\n";
  return svg;
}

void write_frontier_svg(const std::string& path, const std::vector<CostedPlan>& frontier,
                        const std::vector<CostedPlan>& candidates, const Topology& topology,
                        double samples) {
  detail::write_file_atomically(path, frontier_svg(frontier, candidates, topology, samples));
}

}  // namespace pipeline
