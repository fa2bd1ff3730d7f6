// Which saved convolution plans a new process preloads first (ConvGraphs::preload_order): the
// first image's decode sizes before other sizes', the compute dtype only, in the cache's order.
// Pure key handling: runs without a GPU, in builds with the CUDA backend.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#if ZIMAGE_WITH_CUDA
#include "backend/cuda/libs/conv_graph.h"
#include "core/dtype.h"

namespace zimage::cuda {
namespace {

// A cache key as ConvGraphs writes it: conv,n,h,w,cin,cout,kh,kw,stride,pad_h,pad_w,dtype,bias
// [,residual].
std::string key(int n, int hw, int cin, DType dt, bool residual = false) {
  return "conv," + std::to_string(n) + "," + std::to_string(hw) + "," + std::to_string(hw) + "," +
         std::to_string(cin) + ",128,3,3,1,1,1," + std::to_string(static_cast<int>(dt)) + ",1" +
         (residual ? ",1" : "");
}

TEST(ConvPlanOrder, TheFirstImagesSizesComeFirst) {
  const DType bf = DType::kBF16;
  // A cache filled at 2048² first (as `zimage bench` does), then at 1024².
  std::vector<std::string> keys;
  for (int hw : {256, 512, 1024, 2048}) keys.push_back(key(1, hw, 512, bf));
  for (int hw : {128, 256, 512, 1024}) keys.push_back(key(1, hw, 256, bf, true));
  keys.push_back(key(1, 128, 512, DType::kF32));  // another dtype: left out
  keys.push_back("conv,1,128,128");               // malformed: left out
  keys.push_back("gemm 4160x3840x3840 bf16");     // not a convolution: left out
  const std::vector<std::array<int64_t, 3>> first{
      {1, 128, 128}, {1, 256, 256}, {1, 512, 512}, {1, 1024, 1024}};
  const std::vector<std::string> order = ConvGraphs::preload_order(keys, bf, first);
  const std::vector<std::string> want{key(1, 256, 512, bf),        key(1, 512, 512, bf),
                                      key(1, 1024, 512, bf),       key(1, 128, 256, bf, true),
                                      key(1, 256, 256, bf, true),  key(1, 512, 256, bf, true),
                                      key(1, 1024, 256, bf, true), key(1, 2048, 512, bf)};
  EXPECT_EQ(order, want);
  // No preference: the cache's order, the same dtype only.
  const std::vector<std::string> plain = ConvGraphs::preload_order(keys, bf, {});
  ASSERT_EQ(plain.size(), 8u);
  EXPECT_EQ(plain.front(), key(1, 256, 512, bf));
  EXPECT_EQ(plain[3], key(1, 2048, 512, bf));
  // Height and width in their order (a 1024 x 512 image's decode).
  const std::string tall =
      "conv,1,128,64,512,128,3,3,1,1,1," + std::to_string(static_cast<int>(bf)) + ",1";
  const std::string wide =
      "conv,1,64,128,512,128,3,3,1,1,1," + std::to_string(static_cast<int>(bf)) + ",1";
  EXPECT_EQ(ConvGraphs::preload_order({wide, tall}, bf, {{1, 128, 64}}),
            (std::vector<std::string>{tall, wide}));
  // The batch is part of the size.
  const std::vector<std::string> batch2 =
      ConvGraphs::preload_order({key(1, 128, 512, bf), key(2, 128, 512, bf)}, bf, {{2, 128, 128}});
  EXPECT_EQ(batch2.front(), key(2, 128, 512, bf));
}

}  // namespace
}  // namespace zimage::cuda

#else

TEST(ConvPlanOrder, TheFirstImagesSizesComeFirst) {
  GTEST_SKIP() << "built without the CUDA backend";
}

#endif
