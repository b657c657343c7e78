// MinibatchFeeds over DataLoaders for the example programs' pipelined runs: where the first and
// last stages of a StageExecutor get their minibatches.
#pragma once

#include <pipeline/data/loader.hpp>
#include <pipeline/runtime/stage_executor.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>

namespace pipeline::examples {

// Training minibatch j of the run is batch j % B of the loader's epoch j / B (B batches per
// epoch), so a run may span epochs with the same order a single process visits. The executor
// asks for the minibatches in order, so only the current epoch's order is kept. The loader must
// outlive the feed.
inline MinibatchFeed training_feed(const DataLoader& loader) {
  struct Order {
    std::optional<DataLoader::Epoch> epoch;
    std::int64_t index = -1;
  };
  auto order = std::make_shared<Order>();
  const std::int64_t per_epoch = loader.num_batches();
  const std::int64_t batch = loader.options().batch_size;
  const auto epoch_of = [&loader, order, per_epoch](std::int64_t j) -> const DataLoader::Epoch& {
    const std::int64_t e = j / per_epoch;
    if (e != order->index) {
      order->epoch.emplace(loader.epoch(e));
      order->index = e;
    }
    return *order->epoch;
  };
  return {[epoch_of, per_epoch](std::int64_t j) {
            return *DataLoader::Epoch::Iterator(&epoch_of(j), j % per_epoch);
          },
          [batch](std::int64_t) { return batch; },
          [epoch_of, per_epoch](std::int64_t j, std::int64_t begin, std::int64_t end) {
            return epoch_of(j).part(j % per_epoch, begin, end);
          }};
}

// Evaluation batch u is batch u of an unshuffled loader (the last one may be short); evaluate
// loader.num_batches() of them. The loader must outlive the feed.
inline MinibatchFeed evaluation_feed(const DataLoader& loader) {
  const std::int64_t batch = loader.options().batch_size, samples = loader.dataset().size();
  return {[&loader](std::int64_t u) { return loader.batch(0, u); },
          [batch, samples](std::int64_t u) { return std::min(batch, samples - u * batch); }};
}

}  // namespace pipeline::examples
