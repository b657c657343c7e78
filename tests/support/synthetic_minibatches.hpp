// Minibatches of a synthetic classification set for the runtime tests: minibatch j is samples
// [j·batch, (j + 1)·batch) of a SyntheticDataset, as a function (for references) or as the
// executor's MinibatchFeed; and the momentum SGD the tests train with.
#pragma once

#include <pipeline/data/synthetic.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/stage_executor.hpp>

#include <memory>
#include <numeric>
#include <vector>

namespace pipeline::testing {

class SyntheticMinibatches {
 public:
  SyntheticMinibatches(Shape sample, int classes, std::int64_t batch, std::int64_t samples,
                       std::uint64_t seed)
      : m_data(std::make_shared<SyntheticDataset>(std::move(sample), classes, samples, seed)),
        m_batch(batch) {}

  Batch operator()(std::int64_t j) const {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(m_batch));
    std::iota(idx.begin(), idx.end(), j * m_batch);
    return m_data->get(idx);
  }

  const SyntheticDataset& dataset() const { return *m_data; }

  // Samples [begin, end) of minibatch j.
  Batch part(std::int64_t j, std::int64_t begin, std::int64_t end) const {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(end - begin));
    std::iota(idx.begin(), idx.end(), j * m_batch + begin);
    return m_data->get(idx);
  }

  // As the example trainers' feeds: each microbatch loaded alone (MinibatchFeed::load_samples).
  MinibatchFeed feed() const {
    MinibatchFeed f = whole_minibatch_feed();
    const SyntheticMinibatches self = *this;
    f.load_samples = [self](std::int64_t j, std::int64_t begin, std::int64_t end) {
      return self.part(j, begin, end);
    };
    return f;
  }
  // A feed that loads only whole minibatches (no load_samples).
  MinibatchFeed whole_minibatch_feed() const {
    const SyntheticMinibatches self = *this;
    const std::int64_t batch = m_batch;
    return {[self](std::int64_t j) { return self(j); }, [batch](std::int64_t) { return batch; }};
  }

 private:
  std::shared_ptr<const SyntheticDataset> m_data;
  std::int64_t m_batch;
};

inline std::unique_ptr<Optimizer> momentum_sgd() {
  return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f, .weight_decay = 1e-3f});
}

}  // namespace pipeline::testing
