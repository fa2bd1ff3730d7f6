// zimage bench's clock and power sampler (bench/gpu_sampler.h) where there is no GPU or no NVML:
// inert, saying why, and start/stop still safe to call in any order. On a GPU machine the bench
// rows carry its readings (docs/BENCHMARKS.md).
#if defined(ZIMAGE_WITH_BENCH)
#include <dlfcn.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace zimage::bench
#endif
