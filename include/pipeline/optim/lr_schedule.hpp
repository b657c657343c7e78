// Learning-rate schedules: the learning rate as a function of the optimizer step (0-based).
//
//   constant          lr
//   step              lr · gamma^floor(step / every)
//   cosine            min_lr + (lr − min_lr) · (1 + cos(π · min(step, T) / T)) / 2
// each optionally preceded by a linear warm-up of W steps: lr_at(s) = base(0) · (s + 1) / W for
// s < W (so the first step is not wasted at zero), then base(s − W): the schedule proper starts
// after the warm-up.
//
// Flags use parse(): "constant", "step:<every>:<gamma>", "cosine", "cosine:<T>",
// "cosine:<T>:<min_lr>", optionally prefixed by "warmup:<W>+" (e.g. "warmup:200+cosine").
// A "cosine" without T runs over the training's remaining steps (total_steps − W).
#pragma once

#include <pipeline/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace pipeline {

class LrSchedule {
 public:
  enum class Kind { Constant, Step, Cosine };

  LrSchedule() = default;

  static LrSchedule constant(float lr) {
    LrSchedule s;
    s.m_lr = check_lr(lr);
    return s;
  }
  static LrSchedule step(float lr, std::int64_t every, float gamma) {
    PIPELINE_CHECK_AS(ConfigError, every > 0, "step schedule: the interval must be > 0, got {}",
                      every);
    PIPELINE_CHECK_AS(ConfigError, gamma > 0.f && std::isfinite(gamma),
                      "step schedule: gamma must be a positive number, got {}", gamma);
    LrSchedule s;
    s.m_kind = Kind::Step;
    s.m_lr = check_lr(lr);
    s.m_every = every;
    s.m_gamma = gamma;
    return s;
  }
  static LrSchedule cosine(float lr, std::int64_t total_steps, float min_lr = 0.f) {
    PIPELINE_CHECK_AS(ConfigError, total_steps > 0,
                      "cosine schedule: the number of steps must be > 0, got {}", total_steps);
    PIPELINE_CHECK_AS(ConfigError, min_lr >= 0.f && min_lr <= lr,
                      "cosine schedule: the minimum {} must lie in [0, lr = {}]", min_lr, lr);
    LrSchedule s;
    s.m_kind = Kind::Cosine;
    s.m_lr = check_lr(lr);
    s.m_total = total_steps;
    s.m_min_lr = min_lr;
    return s;
  }

  // The same schedule after a linear warm-up of `steps` steps.
  LrSchedule with_warmup(std::int64_t steps) const {
    PIPELINE_CHECK_AS(ConfigError, steps >= 0, "warm-up length must be >= 0, got {}", steps);
    LrSchedule s = *this;
    s.m_warmup = steps;
    return s;
  }

  float lr_at(std::int64_t step) const {
    PIPELINE_CHECK(step >= 0, "learning rate asked for step {}; steps count from 0", step);
    if (step < m_warmup)
      return base_at(0) *
             static_cast<float>(static_cast<double>(step + 1) / static_cast<double>(m_warmup));
    return base_at(step - m_warmup);
  }

  Kind kind() const { return m_kind; }
  float base_lr() const { return m_lr; }
  std::int64_t warmup() const { return m_warmup; }

  std::string str() const {
    std::string w = m_warmup > 0 ? fmt::format("warmup:{}+", m_warmup) : std::string();
    switch (m_kind) {
      case Kind::Constant:
        return fmt::format("{}constant (lr {})", w, m_lr);
      case Kind::Step:
        return fmt::format("{}step:{}:{} (lr {})", w, m_every, m_gamma, m_lr);
      case Kind::Cosine:
        return fmt::format("{}cosine:{}:{} (lr {})", w, m_total, m_min_lr, m_lr);
    }
    return "?";
  }

  // Parses a flag value (grammar above) for base learning rate lr; total_steps (> 0) is needed
  // only by a "cosine" without an explicit length.
  static LrSchedule parse(std::string_view spec, float lr, std::int64_t total_steps = 0) {
    const std::string original(spec);
    auto bad = [&](std::string_view why) -> LrSchedule {
      PIPELINE_FAIL(ConfigError,
                    "bad learning-rate schedule '{}': {}; use constant, step:<every>:<gamma>, "
                    "cosine[:<steps>[:<min_lr>]], optionally prefixed by warmup:<steps>+",
                    original, why);
    };
    std::int64_t warmup = 0;
    if (spec.starts_with("warmup:")) {
      auto plus = spec.find('+');
      if (plus == std::string_view::npos) return bad("a warm-up needs a schedule after '+'");
      auto w = parse_number<std::int64_t>(spec.substr(7, plus - 7));
      if (!w || *w < 0) return bad("the warm-up length is not a non-negative integer");
      warmup = *w;
      spec = spec.substr(plus + 1);
    }
    std::vector<std::string_view> parts;
    for (std::size_t pos = 0;;) {
      auto colon = spec.find(':', pos);
      parts.push_back(spec.substr(pos, colon - pos));
      if (colon == std::string_view::npos) break;
      pos = colon + 1;
    }
    LrSchedule s;
    if (parts[0] == "constant") {
      if (parts.size() != 1) return bad("constant takes no arguments");
      s = constant(lr);
    } else if (parts[0] == "step") {
      if (parts.size() != 3) return bad("step needs an interval and a factor, e.g. step:1000:0.5");
      auto every = parse_number<std::int64_t>(parts[1]);
      auto gamma = parse_number<float>(parts[2]);
      if (!every || *every <= 0) return bad("the step interval is not a positive integer");
      if (!gamma || !(*gamma > 0.f)) return bad("the step factor is not a positive number");
      s = step(lr, *every, *gamma);
    } else if (parts[0] == "cosine") {
      if (parts.size() > 3) return bad("cosine takes at most a length and a minimum");
      std::int64_t total = total_steps - warmup;
      float min_lr = 0.f;
      if (parts.size() >= 2) {
        auto t = parse_number<std::int64_t>(parts[1]);
        if (!t || *t <= 0) return bad("the cosine length is not a positive integer");
        total = *t;
      } else if (total <= 0) {
        return bad(
            fmt::format("cosine without a length needs the total number of steps ({}) to "
                        "exceed the warm-up ({})",
                        total_steps, warmup));
      }
      if (parts.size() == 3) {
        auto m = parse_number<float>(parts[2]);
        if (!m || *m < 0.f || *m > lr)
          return bad(fmt::format("the minimum must lie in [0, {}]", lr));
        min_lr = *m;
      }
      s = cosine(lr, total, min_lr);
    } else {
      return bad(fmt::format("unknown schedule '{}'", parts[0]));
    }
    return s.with_warmup(warmup);
  }

 private:
  static float check_lr(float lr) {
    PIPELINE_CHECK_AS(ConfigError, lr >= 0.f && std::isfinite(lr),
                      "the learning rate must be a non-negative number, got {}", lr);
    return lr;
  }

  template <typename T>
  static std::optional<T> parse_number(std::string_view s) {
    T v{};
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
    return v;
  }

  float base_at(std::int64_t s) const {
    switch (m_kind) {
      case Kind::Constant:
        return m_lr;
      case Kind::Step:
        return static_cast<float>(
            m_lr * std::pow(static_cast<double>(m_gamma), static_cast<double>(s / m_every)));
      case Kind::Cosine: {
        const double t = static_cast<double>(std::min(s, m_total)) / static_cast<double>(m_total);
        return static_cast<float>(m_min_lr +
                                  (m_lr - m_min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t)));
      }
    }
    return m_lr;
  }

  Kind m_kind = Kind::Constant;
  float m_lr = 0.f;
  std::int64_t m_every = 1;
  float m_gamma = 1.f;
  std::int64_t m_total = 1;
  float m_min_lr = 0.f;
  std::int64_t m_warmup = 0;
};

}  // namespace pipeline
