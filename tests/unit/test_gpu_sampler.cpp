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
  st.runs = 0;  // no runs timed: no energy per run
  EXPECT_EQ(st.joules_per_run(), 0);
}

}  // namespace
}  // namespace zimage::bench
#endif
