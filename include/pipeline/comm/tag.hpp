// Tag: what a point-to-point message is, so that a receive can never match another message.
//
// A tag names the kind of message, the stage that sends it and the microbatch it belongs to:
//  - Activation(s, u): the output of stage s for microbatch u, sent to a rank of stage s + 1;
//  - Gradient(s, u): the gradient of stage s's input for microbatch u, sent to a rank of s - 1;
//  - Labels, Version (the weight version travelling with an activation under vertical sync),
//    EvalActivation/EvalLabels (forward-only evaluation, so that an evaluation pass can never be
//    mistaken for training traffic), Metrics and Control (the runtime's own bookkeeping).
// The stage is always the *sending* stage. Together with the peer rank this separates every
// message the runtime exchanges, also when both neighbours of a stage live on the same rank (a
// rank receiving Activation(s - 1, u) and Gradient(s + 1, u) from one peer gets two tags).
//
// Transports with a bounded tag space (MPI: MPI_TAG_UB, at least 32767) encode a tag with
// TagCodec: kind in the low 3 bits, then the stage, then the microbatch modulo
// microbatch_window(). The wrap is safe because MPI matches messages with equal (source, tag) in
// the order they were sent, and the schedules bound the number of microbatches in flight between
// two ranks (at most the number of stages for 1F1B, the microbatches of one minibatch for flush
// schedules) far below the window (at least kMinMicrobatchWindow). The in-process transport
// matches on the whole Tag and never wraps.
#pragma once

#include <pipeline/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

namespace pipeline {

enum class TagKind : std::uint8_t {
  Activation,
  Gradient,
  Labels,
  Version,
  EvalActivation,
  EvalLabels,
  Metrics,
  Control,
};

inline constexpr int kNumTagKinds = 8;
inline constexpr int kTagKindBits = 3;
static_assert((1 << kTagKindBits) >= kNumTagKinds);

inline std::string_view tag_kind_name(TagKind k) {
  switch (k) {
    case TagKind::Activation:
      return "activation";
    case TagKind::Gradient:
      return "gradient";
    case TagKind::Labels:
      return "labels";
    case TagKind::Version:
      return "weight version";
    case TagKind::EvalActivation:
      return "evaluation activation";
    case TagKind::EvalLabels:
      return "evaluation labels";
    case TagKind::Metrics:
      return "metrics";
    case TagKind::Control:
      return "control";
  }
  return "?";
}

struct Tag {
  TagKind kind = TagKind::Control;
  std::int32_t stage = 0;       // the sending stage
  std::int32_t microbatch = 0;  // global microbatch number (or round number for Control)

  static Tag activation(int from_stage, int mb) { return {TagKind::Activation, from_stage, mb}; }
  static Tag gradient(int from_stage, int mb) { return {TagKind::Gradient, from_stage, mb}; }
  static Tag labels(int from_stage, int mb) { return {TagKind::Labels, from_stage, mb}; }
  static Tag version(int from_stage, int mb) { return {TagKind::Version, from_stage, mb}; }
  static Tag control(int from_stage, int n) { return {TagKind::Control, from_stage, n}; }

  friend bool operator==(const Tag&, const Tag&) = default;

  // "activation of stage 1, microbatch 5"; "control of stage 1, message 2" (a control message,
  // such as a checkpoint record or the stop agreement's, is numbered by its sender, not by a
  // microbatch).
  std::string str() const {
    return fmt::format("{} of stage {}, {} {}", tag_kind_name(kind), stage,
                       kind == TagKind::Control ? "message" : "microbatch", microbatch);
  }
};

// The smallest microbatch window a codec accepts: far above any in-flight bound of the schedules.
inline constexpr std::int64_t kMinMicrobatchWindow = 256;

// Packs a Tag into a non-negative int no larger than the transport's tag upper bound.
class TagCodec {
 public:
  TagCodec() : TagCodec(32767, 1) {}

  // tag_ub: the largest tag value the transport accepts (MPI_TAG_UB). max_stages: the number of
  // stages the codec must tell apart; rounded up to a power of two.
  TagCodec(std::int64_t tag_ub, int max_stages) : m_tag_ub(tag_ub) {
    PIPELINE_CHECK_AS(ConfigError, max_stages >= 1, "TagCodec: max_stages {} must be >= 1",
                      max_stages);
    PIPELINE_CHECK_AS(ConfigError, tag_ub >= 32767,
                      "TagCodec: tag upper bound {} is below the MPI minimum 32767", tag_ub);
    m_stage_bits = std::bit_width(static_cast<std::uint32_t>(max_stages - 1));
    int value_bits = std::bit_width(static_cast<std::uint64_t>(tag_ub + 1)) - 1;  // 2^b - 1 <= ub
    int mb_bits = value_bits - kTagKindBits - m_stage_bits;
    PIPELINE_CHECK_AS(ConfigError,
                      mb_bits >= 0 && (std::int64_t{1} << mb_bits) >= kMinMicrobatchWindow,
                      "tags cannot encode {} stages with a microbatch window of at least {} under "
                      "the transport's tag upper bound {}: use fewer stages per communicator",
                      max_stages, kMinMicrobatchWindow, tag_ub);
    m_mb_bits = std::min(mb_bits, 30);
  }

  // Largest stage number + 1 that encode() accepts.
  int max_stages() const { return 1 << m_stage_bits; }
  // Microbatch numbers are encoded modulo this power of two.
  std::int64_t microbatch_window() const { return std::int64_t{1} << m_mb_bits; }
  std::int64_t tag_ub() const { return m_tag_ub; }

  int encode(const Tag& t) const {
    PIPELINE_CHECK(t.stage >= 0 && t.stage < max_stages(),
                   "tag {}: stage out of range [0, {}) of this communicator's tag codec", t.str(),
                   max_stages());
    PIPELINE_CHECK(t.microbatch >= 0, "tag {}: negative microbatch", t.str());
    std::int64_t mb = t.microbatch & (microbatch_window() - 1);
    std::int64_t v =
        (((mb << m_stage_bits) | t.stage) << kTagKindBits) | static_cast<std::int64_t>(t.kind);
    return static_cast<int>(v);
  }

  // The tag with its microbatch reduced modulo microbatch_window().
  Tag decode(int value) const {
    Tag t;
    t.kind = static_cast<TagKind>(value & ((1 << kTagKindBits) - 1));
    t.stage = (value >> kTagKindBits) & ((1 << m_stage_bits) - 1);
    t.microbatch = value >> (kTagKindBits + m_stage_bits);
    return t;
  }

 private:
  std::int64_t m_tag_ub = 32767;
  int m_stage_bits = 0;
  int m_mb_bits = 0;
};

}  // namespace pipeline
