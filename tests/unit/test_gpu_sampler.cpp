// zimage bench's clock and power sampler (bench/gpu_sampler.h) where there is no GPU or no NVML:
// inert, saying why, and start/stop still safe to call in any order. On a GPU machine the bench
// rows carry its readings (docs/BENCHMARKS.md).
#if defined(ZIMAGE_WITH_BENCH)
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "bench/common.h"
#include "bench/gpu_sampler.h"

namespace zimage::bench {
namespace {

TEST(GpuSampler, InertWithoutADeviceAndSaysWhy) {
  auto none = GpuSampler::open("");
  ASSERT_NE(none, nullptr);
  EXPECT_FALSE(none->active());
  EXPECT_EQ(none->why(), "no GPU");
  none->start();
  EXPECT_EQ(none->stop().samples, 0);
  EXPECT_EQ(none->stop().samples, 0);  // twice: still fine

  // A bus id no machine has: NVML missing (a CPU machine), or present without that device.
  auto bogus = GpuSampler::open("0000:fe:1f.7");
  ASSERT_NE(bogus, nullptr);
  EXPECT_FALSE(bogus->active());
  EXPECT_NE(bogus->why().find("NVML"), std::string::npos) << bogus->why();
  bogus->start(1);
  const GpuSampler::Reading r = bogus->stop();
  EXPECT_EQ(r.samples, 0);
  EXPECT_EQ(r.sm_mhz_median, 0);
}

// The energy counter's window: joules per timed run and the window's mean power, printed
// beside the clock; without a counter the note keeps the sampled power.
TEST(GpuSampler, EnergyGivesJoulesPerRunAndMeanPower) {
  Stats st;
  st.runs = 4;
  st.gpu.samples = st.gpu.power_samples = 10;
  st.gpu.sm_mhz_median = 1500;
  st.gpu.power_w_mean = 612;
  st.gpu.power_limit_w = 700;
  EXPECT_EQ(st.joules_per_run(), 0);
  EXPECT_EQ(st.clock_note(), " (SM 1500 MHz, 612 W of 700)");
  st.gpu.energy_j = 260;
  st.gpu.energy_seconds = 0.4;
  EXPECT_DOUBLE_EQ(st.joules_per_run(), 65.0);
  EXPECT_DOUBLE_EQ(st.mean_power_w(), 650.0);
  EXPECT_EQ(st.clock_note(), " (SM 1500 MHz, 650 W of 700, 65.0 J a run)");
  const auto j = st.to_json();
  EXPECT_DOUBLE_EQ(j.at("joules_per_run").get<double>(), 65.0);
  EXPECT_DOUBLE_EQ(j.at("energy_power_w").get<double>(), 650.0);
  EXPECT_FALSE(j.at("energy_from_steps").get<bool>());
  st.runs = 0;  // no runs timed: no energy per run
  EXPECT_EQ(st.joules_per_run(), 0);
}

// The counter moves in steps: the power between its first and last step in the window, and a
// run's energy from it, where the steps span kMinStepSeconds; the window's difference otherwise.
TEST(GpuSampler, EnergyFromTheCountersStepsWhereTheySpanEnough) {
  using Step = GpuSampler::EnergyStep;
  double w = -1, sec = -1;
  EXPECT_FALSE(GpuSampler::power_between_steps({}, &w, &sec));
  EXPECT_FALSE(GpuSampler::power_between_steps({{0.05, 1000.0}}, &w, &sec));
  EXPECT_FALSE(GpuSampler::power_between_steps({{0.05, 1000.0}, {0.05, 1010.0}}, &w, &sec));
  EXPECT_FALSE(GpuSampler::power_between_steps({{0.05, 1000.0}, {0.15, 990.0}}, &w, &sec));
  EXPECT_EQ(w, -1);  // nothing written when false
  // Steps at 0.08, 0.18, 0.28, 0.38 s: 700 W between the first and the last.
  const std::vector<Step> steps = {{0.08, 5000.0}, {0.18, 5070.0}, {0.28, 5140.0}, {0.38, 5210.0}};
  ASSERT_TRUE(GpuSampler::power_between_steps(steps, &w, &sec));
  EXPECT_DOUBLE_EQ(w, 700.0);
  EXPECT_NEAR(sec, 0.30, 1e-12);

  Stats st;
  st.runs = 5;
  st.gpu.samples = 20;
  st.gpu.sm_mhz_median = 1530;
  st.gpu.power_limit_w = 700;
  // A 0.45 s window whose end reads fell a step apart: 385 J by the difference (855 W).
  st.gpu.energy_j = 385;
  st.gpu.energy_seconds = 0.45;
  st.gpu.energy_steps = 4;
  st.gpu.step_power_w = w;
  st.gpu.step_seconds = sec;
  EXPECT_TRUE(st.steps_used());
  EXPECT_DOUBLE_EQ(st.mean_power_w(), 700.0);
  EXPECT_NEAR(st.joules_per_run(), 700.0 * 0.45 / 5, 1e-9);  // 63 J, not 77
  EXPECT_EQ(st.clock_note(), " (SM 1530 MHz, 700 W of 700, 63.0 J a run)");
  EXPECT_TRUE(st.to_json().at("energy_from_steps").get<bool>());
  // Steps spanning less than kMinStepSeconds: the window's difference.
  st.gpu.step_seconds = 0.05;
  EXPECT_FALSE(st.steps_used());
  EXPECT_NEAR(st.joules_per_run(), 77.0, 1e-9);
  EXPECT_NEAR(st.mean_power_w(), 385.0 / 0.45, 1e-9);
}

}  // namespace
}  // namespace zimage::bench
#endif
