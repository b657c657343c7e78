#include <pipeline/profile/pipedream_graph.hpp>

#include <pipeline/core/error.hpp>
#include <pipeline/core/text.hpp>
#include <pipeline/profile/profile_json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace pipeline {
namespace {

struct RawNode {
  std::string id;
  std::string desc;
  double forward_ms = 0, backward_ms = 0, activation = 0, parameters = 0;
  std::vector<int> in, out;
  bool removed = false;
};

std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> parts;
  std::size_t pos = 0;
  while (true) {
    std::size_t q = s.find(sep, pos);
    if (q == std::string_view::npos) {
      parts.push_back(s.substr(pos));
      return parts;
    }
    parts.push_back(s.substr(pos, q - pos));
    pos = q + sep.size();
  }
}

double parse_double(std::string_view s, std::string_view origin, int line, std::string_view field) {
  s = trim(s);
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v) || v < 0)
    PIPELINE_FAIL(ConfigError, "{}:{}: {} must be a finite non-negative number, got '{}'", origin,
                  line, field, s);
  return v;
}

// "key=value" with the expected key.
std::string_view field_value(std::string_view kv, std::string_view key, std::string_view origin, int line) {
  kv = trim(kv);
  auto eq = kv.find('=');
  if (eq == std::string_view::npos || trim(kv.substr(0, eq)) != key)
    PIPELINE_FAIL(ConfigError, "{}:{}: expected '{}=<value>', got '{}'", origin, line, key, kv);
  return trim(kv.substr(eq + 1));
}

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. Node ids and
// descriptions become layer names and kinds, which profile.json (JSON) can only hold as UTF-8.
bool is_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace

Profile parse_pipedream_graph(std::string_view text, std::string_view origin, std::string model) {
  std::vector<RawNode> nodes;
  std::unordered_map<std::string, int> index;
  int line_no = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (trim(line).empty()) continue;
    if (line.front() == '\t') {
      auto parts = split(trim(line), " -- ");
      if (parts.size() != 2)
        PIPELINE_FAIL(ConfigError, "{}:{}: an edge line must be '<src> -- <dst>', got '{}'", origin,
                      line_no, trim(line));
      auto a = index.find(std::string(trim(parts[0])));
      auto b = index.find(std::string(trim(parts[1])));
      if (a == index.end() || b == index.end())
        PIPELINE_FAIL(ConfigError, "{}:{}: edge '{}' names a node that is not defined above it",
                      origin, line_no, trim(line));
      PIPELINE_CHECK_AS(ConfigError, a->second != b->second, "{}:{}: self-loop on node '{}'", origin,
                        line_no, trim(parts[0]));
      nodes[static_cast<std::size_t>(a->second)].out.push_back(b->second);
      nodes[static_cast<std::size_t>(b->second)].in.push_back(a->second);
      continue;
    }
    auto parts = split(trim(line), " -- ");
    if (parts.size() < 3 || parts.size() > 4)
      PIPELINE_FAIL(ConfigError,
                    "{}:{}: a node line must be '<id> -- <description> -- <metadata>[ -- stage_id=<n>]', "
                    "got '{}'",
                    origin, line_no, trim(line).substr(0, 200));
    RawNode n;
    n.id = std::string(trim(parts[0]));
    n.desc = std::string(trim(parts[1]));
    PIPELINE_CHECK_AS(ConfigError, is_utf8(n.id) && is_utf8(n.desc),
                      "{}:{}: the node's id or description is not UTF-8 text; is this a PipeDream "
                      "graph.txt?",
                      origin, line_no);
    auto meta = split(parts[2], ", ");
    if (meta.size() != 4)
      PIPELINE_FAIL(ConfigError,
                    "{}:{}: node '{}' metadata must have forward_compute_time, backward_compute_time, "
                    "activation_size and parameter_size, got '{}'",
                    origin, line_no, n.id, parts[2]);
    n.forward_ms = parse_double(field_value(meta[0], "forward_compute_time", origin, line_no), origin,
                                line_no, "forward_compute_time");
    n.backward_ms = parse_double(field_value(meta[1], "backward_compute_time", origin, line_no),
                                 origin, line_no, "backward_compute_time");
    std::string_view act = field_value(meta[2], "activation_size", origin, line_no);
    if (!act.empty() && act.front() == '[') {
      PIPELINE_CHECK_AS(ConfigError, act.back() == ']', "{}:{}: unterminated activation list '{}'",
                        origin, line_no, act);
      for (auto item : split(act.substr(1, act.size() - 2), "; "))
        n.activation += parse_double(item, origin, line_no, "activation_size");
    } else {
      n.activation = parse_double(act, origin, line_no, "activation_size");
    }
    n.parameters = parse_double(field_value(meta[3], "parameter_size", origin, line_no), origin,
                                line_no, "parameter_size");
    // Checked here, where the line is known: beyond it llround() has no defined result.
    PIPELINE_CHECK_AS(ConfigError,
                      n.activation <= static_cast<double>(kMaxProfileBytes) &&
                          n.parameters <= static_cast<double>(kMaxProfileBytes),
                      "{}:{}: node '{}' has activation_size {} and parameter_size {}; sizes above "
                      "{} bytes are not plausible",
                      origin, line_no, n.id, n.activation, n.parameters, kMaxProfileBytes);
    PIPELINE_CHECK_AS(ConfigError, !index.count(n.id), "{}:{}: node '{}' is defined twice", origin,
                      line_no, n.id);
    index.emplace(n.id, static_cast<int>(nodes.size()));
    nodes.push_back(std::move(n));
  }
  PIPELINE_CHECK_AS(ConfigError, !nodes.empty(), "{}: no nodes found; is this a PipeDream graph.txt?",
                    origin);

  // Batch size from the data-loading node, before it goes.
  int batch = 0;
  for (const RawNode& n : nodes) {
    if (n.in.empty() && n.desc.rfind("Input", 0) == 0 && batch == 0) {
      for (double pixels : {3.0 * 224 * 224, 3.0 * 299 * 299}) {
        double b = n.activation / (4.0 * pixels);
        if (b >= 1 && b == std::floor(b)) {
          batch = static_cast<int>(b);
          break;
        }
      }
    }
  }

  auto detach = [&](int v) {
    RawNode& n = nodes[static_cast<std::size_t>(v)];
    n.removed = true;
    for (int s : n.out) {
      auto& in = nodes[static_cast<std::size_t>(s)].in;
      in.erase(std::remove(in.begin(), in.end(), v), in.end());
    }
    for (int p : n.in) {
      auto& out = nodes[static_cast<std::size_t>(p)].out;
      out.erase(std::remove(out.begin(), out.end(), v), out.end());
    }
    n.in.clear();
    n.out.clear();
  };
  // Sources and sinks are determined once, before anything is removed (as PipeDream does).
  std::vector<int> input_sources, getitem_sinks;
  for (int v = 0; v < static_cast<int>(nodes.size()); ++v) {
    const RawNode& n = nodes[static_cast<std::size_t>(v)];
    if (n.in.empty() && n.desc.rfind("Input", 0) == 0) input_sources.push_back(v);
  }
  for (int v : input_sources) detach(v);
  for (int v = 0; v < static_cast<int>(nodes.size()); ++v) {
    const RawNode& n = nodes[static_cast<std::size_t>(v)];
    if (!n.removed && n.out.empty() && n.desc.rfind("__getitem__", 0) == 0) getitem_sinks.push_back(v);
  }
  for (int v : getitem_sinks) detach(v);

  // Topological order, smallest file position first among the ready nodes.
  std::vector<int> indegree(nodes.size(), 0);
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  int alive = 0;
  for (int v = 0; v < static_cast<int>(nodes.size()); ++v) {
    const RawNode& n = nodes[static_cast<std::size_t>(v)];
    if (n.removed) continue;
    ++alive;
    indegree[static_cast<std::size_t>(v)] = static_cast<int>(n.in.size());
    if (n.in.empty()) ready.push(v);
  }
  PIPELINE_CHECK_AS(ConfigError, alive > 0, "{}: the graph has no layers besides Input and __getitem__ nodes",
                    origin);
  std::vector<int> order, position(nodes.size(), -1);
  while (!ready.empty()) {
    int v = ready.top();
    ready.pop();
    position[static_cast<std::size_t>(v)] = static_cast<int>(order.size());
    order.push_back(v);
    for (int s : nodes[static_cast<std::size_t>(v)].out)
      if (--indegree[static_cast<std::size_t>(s)] == 0) ready.push(s);
  }
  if (static_cast<int>(order.size()) != alive) {
    for (int v = 0; v < static_cast<int>(nodes.size()); ++v)
      if (!nodes[static_cast<std::size_t>(v)].removed && position[static_cast<std::size_t>(v)] < 0)
        PIPELINE_FAIL(ConfigError, "{}: the graph has a cycle through node '{}'", origin,
                      nodes[static_cast<std::size_t>(v)].id);
  }

  Profile p;
  p.model = std::move(model);
  p.batch_size = batch;
  p.device = "pipedream profile";
  p.dtype = "float32";
  for (std::size_t i = 0; i < order.size(); ++i) {
    const RawNode& n = nodes[static_cast<std::size_t>(order[i])];
    LayerProfile l;
    l.name = n.id;
    l.kind = n.desc;
    l.forward_s = n.forward_ms / 1000.0;
    l.backward_s = n.backward_ms / 1000.0;
    l.output_bytes = static_cast<std::int64_t>(std::llround(n.activation));
    l.parameter_bytes = static_cast<std::int64_t>(std::llround(n.parameters));
    std::vector<int> in;
    for (int s : n.in) in.push_back(position[static_cast<std::size_t>(s)]);
    std::sort(in.begin(), in.end());
    in.erase(std::unique(in.begin(), in.end()), in.end());
    bool previous_only = in.size() == 1 && in[0] == static_cast<int>(i) - 1;
    if (in.empty() && i > 0) l.source = true;
    if (!previous_only) l.inputs = std::move(in);
    p.layers.push_back(std::move(l));
  }
  validate_profile(p, origin);
  return p;
}

Profile read_pipedream_graph(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PIPELINE_CHECK_AS(IoError, in.good(), "cannot open PipeDream graph '{}' for reading", path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string model;
  auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    auto prev = path.find_last_of('/', slash - 1);
    model = path.substr(prev == std::string::npos ? 0 : prev + 1,
                        slash - (prev == std::string::npos ? 0 : prev + 1));
  }
  return parse_pipedream_graph(ss.str(), path, model);
}

}  // namespace pipeline
