// DataLoader: the order in which a rank visits a dataset, epoch by epoch, in batches.
//
// Epoch e's order is a Fisher–Yates shuffle of [0, N) drawn from Rng(seed, "loader.epoch.<e>"),
// the same on every rank; without shuffling it is [0, N). With `world` shards the order is then
// made a multiple of `world` — cut down when drop_last, else padded by repeating its first
// indices, as torch's DistributedSampler does — and shard r takes positions r, r + world, ...
// so every shard has the same number of samples (equal step counts keep collectives matched)
// and, without padding, every index belongs to exactly one shard. Each shard's list is cut into
// batches of batch_size; the last, shorter one is dropped when drop_last.
#pragma once

#include <pipeline/core/rng.hpp>
#include <pipeline/data/dataset.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pipeline {

struct LoaderOptions {
  std::int64_t batch_size = 32;
  bool shuffle = true;
  bool drop_last = false;
  std::uint64_t seed = 0;
  int rank = 0;   // this shard
  int world = 1;  // number of shards
};

// The loader keeps a reference to the dataset, which must outlive it.
class DataLoader {
 public:
  DataLoader(const Dataset& dataset, LoaderOptions options)
      : m_dataset(&dataset), m_options(options) {
    PIPELINE_CHECK_AS(ConfigError, options.batch_size >= 1, "batch size {} must be >= 1",
                      options.batch_size);
    PIPELINE_CHECK_AS(
        ConfigError, options.world >= 1 && options.rank >= 0 && options.rank < options.world,
        "data shard {} of {} does not exist: need 0 <= rank < world", options.rank, options.world);
    PIPELINE_CHECK_AS(ConfigError, samples_per_shard() >= 1 || dataset.size() == 0,
                      "{} has {} samples, too few for {} shards with drop_last", dataset.name(),
                      dataset.size(), options.world);
    // With drop_last an epoch of a shard smaller than one batch has no batch at all.
    PIPELINE_CHECK_AS(
        ConfigError,
        !options.drop_last || dataset.size() == 0 || samples_per_shard() >= options.batch_size,
        "a batch of {} is more than the {} samples of {}{}, and the last short "
        "batch is dropped, so an epoch has no batch: use a batch size of at most {}",
        options.batch_size, samples_per_shard(), dataset.name(),
        options.world > 1 ? fmt::format(" that each of {} shards holds", options.world)
                          : std::string(),
        samples_per_shard());
  }

  const Dataset& dataset() const { return *m_dataset; }
  const LoaderOptions& options() const { return m_options; }

  std::int64_t samples_per_shard() const {
    const std::int64_t n = m_dataset->size(), w = m_options.world;
    return m_options.drop_last ? n / w : (n + w - 1) / w;
  }
  std::int64_t num_batches() const {
    const std::int64_t s = samples_per_shard(), b = m_options.batch_size;
    return m_options.drop_last ? s / b : (s + b - 1) / b;
  }

  // This shard's sample indices for an epoch, in visiting order.
  std::vector<std::int64_t> epoch_indices(std::int64_t epoch) const {
    const std::int64_t n = m_dataset->size(), w = m_options.world;
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), std::int64_t{0});
    if (m_options.shuffle) {
      Rng rng(m_options.seed, fmt::format("loader.epoch.{}", epoch));
      for (std::int64_t i = n - 1; i > 0; --i)
        std::swap(order[static_cast<std::size_t>(i)],
                  order[static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(i + 1)))]);
    }
    const std::int64_t total = samples_per_shard() * w;
    for (std::int64_t i = n; i < total; ++i)
      order.push_back(order[static_cast<std::size_t>(i % n)]);
    order.resize(static_cast<std::size_t>(total));
    std::vector<std::int64_t> mine;
    mine.reserve(static_cast<std::size_t>(samples_per_shard()));
    for (std::int64_t i = m_options.rank; i < total; i += w)
      mine.push_back(order[static_cast<std::size_t>(i)]);
    return mine;
  }

  // Batch b of an epoch (gathers a copy of the samples).
  Batch batch(std::int64_t epoch, std::int64_t b) const {
    return batch_from(epoch_indices(epoch), b);
  }

  // Iterates one epoch's batches: for (Batch b : loader.epoch(e)) ...
  class Epoch {
   public:
    class Iterator {
     public:
      using iterator_category = std::input_iterator_tag;
      using value_type = Batch;
      using difference_type = std::ptrdiff_t;
      Iterator(const Epoch* e, std::int64_t b) : m_epoch(e), m_b(b) {}
      Batch operator*() const { return m_epoch->m_loader->batch_from(m_epoch->m_indices, m_b); }
      Iterator& operator++() {
        ++m_b;
        return *this;
      }
      bool operator==(const Iterator& o) const { return m_b == o.m_b; }

     private:
      const Epoch* m_epoch;
      std::int64_t m_b;
    };
    Iterator begin() const { return {this, 0}; }
    Iterator end() const { return {this, m_loader->num_batches()}; }
    std::int64_t size() const { return m_loader->num_batches(); }
    const std::vector<std::int64_t>& indices() const { return m_indices; }
    // Samples [begin, end) of batch b alone: the samples of *Iterator(this, b) from begin on.
    Batch part(std::int64_t b, std::int64_t begin, std::int64_t end) const {
      return m_loader->batch_from(m_indices, b, begin, end);
    }

   private:
    friend class DataLoader;
    Epoch(const DataLoader* l, std::vector<std::int64_t> idx)
        : m_loader(l), m_indices(std::move(idx)) {}
    const DataLoader* m_loader;
    std::vector<std::int64_t> m_indices;
  };

  Epoch epoch(std::int64_t e) const { return Epoch(this, epoch_indices(e)); }

 private:
  // Batch b, or its samples [part_begin, part_end) where part_end >= 0.
  Batch batch_from(const std::vector<std::int64_t>& indices, std::int64_t b,
                   std::int64_t part_begin = 0, std::int64_t part_end = -1) const {
    PIPELINE_CHECK(b >= 0 && b < num_batches(), "batch {} out of range: the epoch has {} batches",
                   b, num_batches());
    std::int64_t begin = b * m_options.batch_size;
    std::int64_t end = std::min<std::int64_t>(begin + m_options.batch_size,
                                              static_cast<std::int64_t>(indices.size()));
    if (part_end >= 0) {
      PIPELINE_CHECK(0 <= part_begin && part_begin < part_end && part_end <= end - begin,
                     "samples [{}, {}) of batch {} out of range: it has {}", part_begin, part_end,
                     b, end - begin);
      end = begin + part_end;
      begin += part_begin;
    }
    return m_dataset->get(std::span<const std::int64_t>(indices.data() + begin,
                                                        static_cast<std::size_t>(end - begin)));
  }

  const Dataset* m_dataset;
  LoaderOptions m_options;
};

}  // namespace pipeline
