#include <pipeline/optim/lr_schedule.hpp>

#include <doctest/doctest.h>

namespace test_lr_schedule {

using namespace pipeline;

TEST_CASE("Constant and step schedules") {
  auto c = LrSchedule::constant(0.1f);
  CHECK(c.lr_at(0) == doctest::Approx(0.1));
  CHECK(c.lr_at(1'000'000) == doctest::Approx(0.1));

  auto s = LrSchedule::step(0.1f, 10, 0.5f);
  CHECK(s.lr_at(0) == doctest::Approx(0.1));
  CHECK(s.lr_at(9) == doctest::Approx(0.1));
  CHECK(s.lr_at(10) == doctest::Approx(0.05));
  CHECK(s.lr_at(25) == doctest::Approx(0.025));
}

TEST_CASE("Cosine schedule goes from lr to its minimum over T steps and stays there") {
  auto s = LrSchedule::cosine(1.f, 100, 0.1f);
  CHECK(s.lr_at(0) == doctest::Approx(1.0));
  CHECK(s.lr_at(50) == doctest::Approx(0.55));
  CHECK(s.lr_at(25) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4))));
  CHECK(s.lr_at(100) == doctest::Approx(0.1));
  CHECK(s.lr_at(1000) == doctest::Approx(0.1));
  for (int i = 1; i <= 100; ++i) CHECK(s.lr_at(i) <= s.lr_at(i - 1));
}

TEST_CASE("Warm-up is linear and shifts the schedule") {
  auto s = LrSchedule::step(0.2f, 5, 0.1f).with_warmup(4);
  CHECK(s.lr_at(0) == doctest::Approx(0.05));
  CHECK(s.lr_at(1) == doctest::Approx(0.1));
  CHECK(s.lr_at(3) == doctest::Approx(0.2));
  CHECK(s.lr_at(4) == doctest::Approx(0.2));
  CHECK(s.lr_at(8) == doctest::Approx(0.2));
  CHECK(s.lr_at(9) == doctest::Approx(0.02));
  CHECK_THROWS(s.lr_at(-1));
}

TEST_CASE("Schedules parse from flag strings") {
  CHECK(LrSchedule::parse("constant", 0.3f).lr_at(99) == doctest::Approx(0.3));
  auto st = LrSchedule::parse("step:1000:0.5", 0.1f);
  CHECK(st.kind() == LrSchedule::Kind::Step);
  CHECK(st.lr_at(2500) == doctest::Approx(0.025));

  auto cos = LrSchedule::parse("cosine", 1.f, 200);
  CHECK(cos.lr_at(100) == doctest::Approx(0.5));
  CHECK(cos.lr_at(200) == doctest::Approx(0.0));
  auto cos_min = LrSchedule::parse("cosine:10:0.2", 1.f);
  CHECK(cos_min.lr_at(10) == doctest::Approx(0.2));

  auto warm = LrSchedule::parse("warmup:10+cosine", 1.f, 110);
  CHECK(warm.warmup() == 10);
  CHECK(warm.lr_at(4) == doctest::Approx(0.5));
  CHECK(warm.lr_at(60) == doctest::Approx(0.5));  // cosine runs over the 100 steps after warm-up
  CHECK(warm.lr_at(110) == doctest::Approx(0.0));
  CHECK(warm.str().starts_with("warmup:10+cosine"));
}

TEST_CASE("Bad schedule strings give clear errors") {
  for (const char* bad :
       {"", "linear", "step", "step:0:0.5", "step:10", "step:10:x", "step:10:-1", "cosine:abc",
        "cosine:10:5", "cosine:1:2:3", "warmup:5", "warmup:-1+constant", "warmup:x+constant",
        "constant:1", "step:10:0.5junk"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(LrSchedule::parse(bad, 1.f, 100),
                         doctest::Contains("bad learning-rate schedule"), ConfigError);
  }
  CHECK_THROWS_WITH_AS(LrSchedule::parse("cosine", 1.f), doctest::Contains("total number of steps"),
                       ConfigError);
  CHECK_THROWS_AS(LrSchedule::constant(-1.f), ConfigError);
  CHECK_THROWS_AS(LrSchedule::cosine(1.f, 0), ConfigError);
}

}  // namespace test_lr_schedule
