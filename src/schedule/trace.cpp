// Chrome-trace JSON and SVG timelines of simulated runs.
#include <pipeline/schedule/trace.hpp>

#include "../core/output_file.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace pipeline {
namespace {

const char* kind_name(ActionKind k) {
  switch (k) {
    case ActionKind::Forward:
      return "forward";
    case ActionKind::Backward:
      return "backward";
    case ActionKind::BackwardInput:
      return "backward-input";
    case ActionKind::BackwardWeight:
      return "backward-weight";
    case ActionKind::SendActivation:
      return "send-activation";
    case ActionKind::RecvActivation:
      return "recv-activation";
    case ActionKind::SendGradient:
      return "send-gradient";
    case ActionKind::RecvGradient:
      return "recv-gradient";
    case ActionKind::AllReduce:
      return "allreduce";
    case ActionKind::Step:
      return "step";
  }
  return "?";
}

const char* colour(ActionKind k) {
  switch (k) {
    case ActionKind::Forward:
      return "#4e79a7";
    case ActionKind::Backward:
      return "#59a14f";
    case ActionKind::BackwardInput:
      return "#8cd17d";
    case ActionKind::BackwardWeight:
      return "#2f7a3a";
    case ActionKind::AllReduce:
      return "#f28e2b";
    case ActionKind::Step:
      return "#b07aa1";
    default:
      return "#999999";
  }
}

void check_events(const Simulation& sim) {
  PIPELINE_CHECK_AS(ConfigError, !sim.events.empty(),
                    "the simulation of '{}' has no recorded events; simulate with "
                    "SimulateOptions::record_trace = true",
                    sim.schedule);
}

// A tick spacing of 1, 2 or 5 times a power of ten giving about `n` ticks over `span`.
double tick_step(double span, int n) {
  double raw = span / n;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

}  // namespace

std::string chrome_trace_json(const Simulation& sim, const Schedule& schedule) {
  check_events(sim);
  using nlohmann::json;
  json events = json::array();
  auto us = [](double s) { return s * 1e6; };
  std::vector<int> rank_stage(schedule.ranks.size(), 0);
  for (int s = schedule.num_stages() - 1; s >= 0; --s)
    for (int r : schedule.stage_ranks[s]) rank_stage[r] = s;
  events.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"args", {{"name", sim.schedule}}}});
  for (std::size_t r = 0; r < schedule.ranks.size(); ++r) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", fmt::format("rank {} (stage {})", r, rank_stage[r])}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"sort_index", r}}}});
  }
  for (const TraceEvent& e : sim.events) {
    const Action& a = e.action;
    json args = {{"stage", a.stage}, {"microbatch", a.microbatch}, {"action", to_string(a)}};
    if (is_send(a.kind)) {
      // A zero-length slice marks the post; the arrow starts there.
      events.push_back({{"ph", "X"},
                        {"name", fmt::format("send {} to {}", a.microbatch, a.peer)},
                        {"cat", kind_name(a.kind)},
                        {"pid", 0},
                        {"tid", e.rank},
                        {"ts", us(e.start_s)},
                        {"dur", 0},
                        {"args", args}});
      events.push_back({{"ph", "s"},
                        {"name", kind_name(a.kind)},
                        {"cat", "p2p"},
                        {"id", e.flow},
                        {"pid", 0},
                        {"tid", e.rank},
                        {"ts", us(e.start_s)}});
      continue;
    }
    std::string name = is_recv(a.kind) ? fmt::format("wait {}", a.microbatch)
                                       : fmt::format("{}{}", action_code(a.kind), a.microbatch);
    events.push_back({{"ph", "X"},
                      {"name", name},
                      {"cat", kind_name(a.kind)},
                      {"pid", 0},
                      {"tid", e.rank},
                      {"ts", us(e.start_s)},
                      {"dur", us(e.end_s - e.start_s)},
                      {"args", args}});
    if (is_recv(a.kind) && e.flow >= 0)
      events.push_back(
          {{"ph", "f"},
           {"bp", "e"},
           {"name", a.kind == ActionKind::RecvActivation ? "send-activation" : "send-gradient"},
           {"cat", "p2p"},
           {"id", e.flow},
           {"pid", 0},
           {"tid", e.rank},
           {"ts", us(e.end_s)}});
  }
  json doc = {{"traceEvents", events},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"schedule", sim.schedule},
                {"time_per_minibatch_s", sim.time_per_minibatch_s},
                {"bubble_fraction", sim.bubble_fraction}}}};
  return doc.dump();
}

std::string timeline_svg(const Simulation& sim, const Schedule& schedule,
                         const SvgOptions& options) {
  check_events(sim);
  const int label_w = 110, top = 44, legend_h = 48;
  const int rows = schedule.num_ranks();
  const int rh = std::max(options.row_height, 8);
  const double span = sim.makespan_s > 0 ? sim.makespan_s : 1.0;
  const double px = options.width / span;
  const int width = label_w + options.width + 20;
  const int height = top + rows * rh + 28 + legend_h;
  // The stages of each rank: one, or several on an interleaved schedule, whose later ones (the
  // rank's later virtual stages) are drawn lighter.
  std::vector<std::vector<int>> rank_stages(schedule.ranks.size());
  for (int s = 0; s < schedule.num_stages(); ++s)
    for (int r : schedule.stage_ranks[s]) rank_stages[static_cast<std::size_t>(r)].push_back(s);
  const auto chunk_opacity = [&](int rank, int stage) {
    const auto& mine = rank_stages[static_cast<std::size_t>(rank)];
    if (mine.size() < 2) return 1.0;
    const auto c = std::find(mine.begin(), mine.end(), stage) - mine.begin();
    return 1.0 - 0.5 * static_cast<double>(c) / static_cast<double>(mine.size() - 1);
  };
  bool interleaved = false;
  for (const auto& mine : rank_stages) interleaved = interleaved || mine.size() > 1;

  std::string title =
      options.title.empty()
          ? fmt::format("{}: {} ranks, {} microbatch(es) x {} minibatch(es), bubble {:.1f}%",
                        sim.schedule, rows, schedule.microbatches, schedule.minibatches,
                        100 * sim.bubble_fraction)
          : options.title;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
      width, height, width, height, label_w, title);
  for (int r = 0; r < rows; ++r) {
    int y = top + r * rh;
    const auto& mine = rank_stages[static_cast<std::size_t>(r)];
    const std::string stages = mine.size() == 1 ? fmt::format("stage {}", mine[0])
                               : mine.empty()   ? std::string("no stage")
                                                : fmt::format("stages {}", fmt::join(mine, ","));
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"end\">rank {} ({})</text>\n"
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#e8e8e8\"/>\n",
        label_w - 8, y + rh / 2 + 4, r, stages, label_w, y + 1, options.width, rh - 2);
  }
  for (const TraceEvent& e : sim.events) {
    const Action& a = e.action;
    if (is_p2p(a.kind)) continue;
    double x = label_w + e.start_s * px;
    double w = (e.end_s - e.start_s) * px;
    if (w <= 0) continue;
    int y = top + e.rank * rh;
    const double opacity = chunk_opacity(e.rank, a.stage);
    svg += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"{} "
        "stroke=\"white\" stroke-width=\"0.5\"><title>{} ({:.3f}-{:.3f} ms)</title></rect>\n",
        x, y + 1, w, rh - 2, colour(a.kind),
        opacity < 1 ? fmt::format(" fill-opacity=\"{:.2f}\"", opacity) : std::string(),
        to_string(a), e.start_s * 1e3, e.end_s * 1e3);
    std::string label = std::to_string(a.microbatch);
    if (w >= 7.0 * static_cast<double>(label.size()) + 2)
      svg += fmt::format(
          "<text x=\"{:.2f}\" y=\"{}\" font-size=\"11\" fill=\"white\" "
          "text-anchor=\"middle\">{}</text>\n",
          x + w / 2, y + rh / 2 + 4, label);
  }
  // Time axis.
  int axis_y = top + rows * rh + 4;
  double step = tick_step(span, 10);
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n", label_w,
                     axis_y, label_w + options.width, axis_y);
  for (double t = 0; t <= span * (1 + 1e-9); t += step) {
    double x = label_w + t * px;
    svg += fmt::format(
        "<line x1=\"{:.2f}\" y1=\"{}\" x2=\"{:.2f}\" y2=\"{}\" stroke=\"#333\"/>"
        "<text x=\"{:.2f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{:g} ms</text>\n",
        x, axis_y, x, axis_y + 4, x, axis_y + 17, t * 1e3);
  }
  // Legend.
  int ly = axis_y + 30;
  int lx = label_w;
  struct Entry {
    ActionKind kind;
    const char* text;
  };
  std::vector<Entry> legend = {{ActionKind::Forward, "forward"},
                               {ActionKind::Backward, "backward"}};
  bool split = false, allreduce = false;
  for (auto& e : sim.events) {
    split = split || e.action.kind == ActionKind::BackwardInput;
    allreduce = allreduce || e.action.kind == ActionKind::AllReduce;
  }
  if (split) {
    legend.push_back({ActionKind::BackwardInput, "input gradient"});
    legend.push_back({ActionKind::BackwardWeight, "weight gradient"});
  }
  if (allreduce) legend.push_back({ActionKind::AllReduce, "allreduce"});
  for (auto& item : legend) {
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>\n",
        lx, ly, colour(item.kind), lx + 19, ly + 11, item.text);
    lx += 130;
  }
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"#e8e8e8\"/>"
      "<text x=\"{}\" y=\"{}\" font-size=\"12\">idle (bubble)</text>\n",
      lx, ly, lx + 19, ly + 11);
  if (interleaved)
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"12\">(lighter: a rank's later virtual "
        "stages)</text>\n",
        lx + 130, ly + 11);
  svg += "</svg>\n";
  return svg;
}

void write_chrome_trace(const std::string& path, const Simulation& sim, const Schedule& schedule) {
  detail::write_file_atomically(path, chrome_trace_json(sim, schedule));
}

void write_timeline_svg(const std::string& path, const Simulation& sim, const Schedule& schedule,
                        const SvgOptions& options) {
  detail::write_file_atomically(path, timeline_svg(sim, schedule, options));
}

}  // namespace pipeline
