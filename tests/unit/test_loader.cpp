#include <pipeline/data/loader.hpp>
#include <pipeline/data/synthetic.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>

namespace test_loader {

using namespace pipeline;

TEST_CASE("Shuffling is deterministic by seed and epoch, and a permutation") {
  SyntheticDataset d({3}, 4, 103, 1);
  DataLoader a(d, {.batch_size = 10, .seed = 5});
  DataLoader b(d, {.batch_size = 10, .seed = 5});
  DataLoader c(d, {.batch_size = 10, .seed = 6});
  auto e0 = a.epoch_indices(0);
  CHECK(e0 == b.epoch_indices(0));
  CHECK(e0 != a.epoch_indices(1));
  CHECK(e0 != c.epoch_indices(0));
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 103; ++i) CHECK(sorted[static_cast<std::size_t>(i)] == i);

  DataLoader plain(d, {.batch_size = 10, .shuffle = false});
  auto in_order = plain.epoch_indices(3);
  CHECK(std::is_sorted(in_order.begin(), in_order.end()));
}

TEST_CASE("Batching, drop_last and epoch iteration") {
  SyntheticDataset d({2, 3}, 5, 23, 2);
  DataLoader keep(d, {.batch_size = 5, .seed = 1});
  DataLoader drop(d, {.batch_size = 5, .drop_last = true, .seed = 1});
  CHECK(keep.num_batches() == 5);
  CHECK(drop.num_batches() == 4);
  std::int64_t seen = 0, batches = 0;
  const auto order = keep.epoch_indices(0);
  for (Batch b : keep.epoch(0)) {
    CHECK(b.inputs.shape().dims()[1] == 2);
    // Each batch holds exactly the samples of its slice of the order.
    std::vector<std::int64_t> expected(order.begin() + seen, order.begin() + seen + b.size());
    Batch direct = d.get(expected);
    CHECK(direct.inputs.to_vector() == b.inputs.to_vector());
    seen += b.size();
    ++batches;
  }
  CHECK(batches == 5);
  CHECK(seen == 23);
  std::int64_t last = 0;
  for (Batch b : drop.epoch(0)) last = b.size();
  CHECK(last == 5);
  CHECK_THROWS(keep.batch(0, 5));
}

TEST_CASE("Shards cover every index exactly once") {
  SyntheticDataset d({1}, 2, 120, 3);
  for (int world : {1, 2, 3, 4, 5}) {
    std::map<std::int64_t, int> count;
    std::int64_t per = -1;
    for (int r = 0; r < world; ++r) {
      DataLoader l(d, {.batch_size = 7, .seed = 9, .rank = r, .world = world});
      auto idx = l.epoch_indices(2);
      if (per < 0) per = static_cast<std::int64_t>(idx.size());
      CHECK(static_cast<std::int64_t>(idx.size()) == per);
      for (auto i : idx) ++count[i];
    }
    CHECK(count.size() == 120);
    for (auto& [i, c] : count) CHECK(c == 1);
  }
}

TEST_CASE("Uneven shards are padded to equal length, or cut with drop_last") {
  SyntheticDataset d({1}, 2, 10, 3);
  std::map<std::int64_t, int> count;
  for (int r = 0; r < 4; ++r) {
    DataLoader l(d, {.batch_size = 2, .seed = 1, .rank = r, .world = 4});
    auto idx = l.epoch_indices(0);
    CHECK(idx.size() == 3);
    CHECK(l.num_batches() == 2);
    for (auto i : idx) ++count[i];
  }
  CHECK(count.size() == 10);  // all covered, two of them twice
  std::set<std::int64_t> dropped_seen;
  for (int r = 0; r < 4; ++r) {
    DataLoader l(d, {.batch_size = 2, .drop_last = true, .seed = 1, .rank = r, .world = 4});
    auto idx = l.epoch_indices(0);
    CHECK(idx.size() == 2);
    for (auto i : idx) CHECK(dropped_seen.insert(i).second);
  }
  CHECK(dropped_seen.size() == 8);
  CHECK_THROWS_AS(DataLoader(d, {.rank = 4, .world = 4}), ConfigError);
  CHECK_THROWS_AS(DataLoader(d, {.batch_size = 0}), ConfigError);
  // With drop_last a shard smaller than one batch would have epochs of no batch at all.
  CHECK_THROWS_WITH_AS(DataLoader(d, {.batch_size = 11, .drop_last = true}),
                       doctest::Contains("use a batch size of at most 10"), ConfigError);
  CHECK_THROWS_WITH_AS(DataLoader(d, {.batch_size = 3, .drop_last = true, .rank = 1, .world = 4}),
                       doctest::Contains("a batch of 3 is more than the 2 samples"), ConfigError);
  CHECK(DataLoader(d, {.batch_size = 10, .drop_last = true}).num_batches() == 1);
  CHECK(DataLoader(d, {.batch_size = 11}).num_batches() == 1);  // kept: one short batch
}

TEST_CASE("Microbatches are views of the batch") {
  SyntheticDataset d({2, 2}, 3, 10, 4);
  DataLoader l(d, {.batch_size = 10, .shuffle = false});
  Batch b = l.batch(0, 0);
  auto micro = split_microbatches(b, 3);
  REQUIRE(micro.size() == 3);
  CHECK(micro[0].size() == 4);
  CHECK(micro[1].size() == 3);
  CHECK(micro[2].size() == 3);
  CHECK(micro[1].inputs.shape() == Shape{3, 2, 2});
  CHECK(micro[1].inputs.same_storage(b.inputs));
  CHECK(micro[1].inputs.data<float>() == b.inputs.data<float>() + 4 * 4);
  CHECK(micro[2].labels.data<std::int32_t>()[0] == b.labels.data<std::int32_t>()[7]);
  micro[0].inputs.values()[0] = 42.f;  // writes land in the batch
  CHECK(b.inputs.values()[0] == 42.f);
  CHECK_THROWS_AS(split_microbatches(b, 11), ConfigError);
  CHECK_THROWS_AS(split_microbatches(b, 0), ConfigError);
}

TEST_CASE("Synthetic data is deterministic per index and learnable") {
  SyntheticDataset d({1, 8, 8}, 4, 1000, 11);
  std::vector<std::int64_t> idx{5, 999, 5};
  Batch b = d.get(idx);
  CHECK(b.inputs.shape() == Shape{3, 1, 8, 8});
  auto v = b.inputs.to_vector();
  CHECK(std::equal(v.begin(), v.begin() + 64, v.begin() + 128));
  CHECK(!std::equal(v.begin(), v.begin() + 64, v.begin() + 64));
  SyntheticDataset same({1, 8, 8}, 4, 1000, 11);
  CHECK(same.get(idx).inputs.to_vector() == v);
  // Labels are a function of the inputs and every class occurs.
  std::vector<std::int64_t> all(1000);
  for (std::int64_t i = 0; i < 1000; ++i) all[static_cast<std::size_t>(i)] = i;
  Batch whole = d.get(all);
  std::vector<int> counts(4, 0);
  for (std::int64_t i = 0; i < 1000; ++i) {
    const int y = whole.labels.data<std::int32_t>()[i];
    CHECK(y == d.label_of(whole.inputs.data<float>() + i * 64));
    ++counts[static_cast<std::size_t>(y)];
  }
  for (int c : counts) CHECK(c > 100);
  CHECK_THROWS_AS(SyntheticDataset({4}, 0, 10), ConfigError);
}

}  // namespace test_loader
