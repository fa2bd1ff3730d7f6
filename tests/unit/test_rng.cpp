// TorchCpuGenerator against PyTorch: every golden case's init_noise.npy (drawn by diffusers with
// torch.Generator('cpu').manual_seed(seed)), the torch reference file written by
// tools/make_noise_cases.py (many sizes, seeds, consecutive draws), and internal properties of
// the stream (MT19937 seeding, determinism, moments, the small-draw cache).
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/npy.h"
#include "core/thread_pool.h"
#include "pipeline/rng.h"

using namespace zimage;
using nlohmann::json;

namespace {

constexpr double kNoiseTol = 1e-5;  // absolute: x86 torch uses vectorised log/sin/cos

std::vector<std::string> golden_cases() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ZIMAGE_GOLDEN_DIR, ec)) {
    if (e.is_directory() && std::filesystem::exists(e.path() / "case.json")) {
      names.push_back(e.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

json read_json_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return json();
  return json::parse(f, nullptr, /*allow_exceptions=*/false);
}

// Reads a whole gzip file; empty string when absent or unreadable.
std::string read_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return {};
  std::string out;
  char buf[1 << 16];
  int got = 0;
  while ((got = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(got));
  const bool ok = got == 0;
  gzclose(f);
  return ok ? out : std::string();
}

std::string reference_path() {
  return std::string(ZIMAGE_TEST_DATA_DIR) + "/noise/noise_cases.json.gz";
}

std::vector<float> draw(TorchCpuGenerator& g, size_t n) {
  std::vector<float> v(n);
  g.fill_randn(v.data(), n);
  return v;
}

}  // namespace

TEST(Rng, MatchesGoldenInitNoise) {
  const auto cases = golden_cases();
  ASSERT_FALSE(cases.empty()) << "no golden cases under " << ZIMAGE_GOLDEN_DIR;
  for (const auto& name : cases) {
    const std::string dir = test::golden_dir(name);
    const json c = read_json_file(dir + "/case.json");
    ASSERT_TRUE(c.is_object() && c.contains("seed")) << dir << "/case.json";
    auto expected = test::load_npy(dir + "/init_noise.npy");
    ASSERT_TRUE(expected.ok()) << expected.status().to_string();
    const uint64_t seed = c["seed"].get<uint64_t>();
    TorchCpuGenerator gen(seed);
    auto got = gen.randn(expected->shape());
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const double err = test::max_abs_diff(*got, *expected);
    std::printf("  %-12s seed %llu shape %s: max |diff| = %.3g\n", name.c_str(),
                static_cast<unsigned long long>(seed), shape_string(expected->shape()).c_str(),
                err);
    EXPECT_GE(err, 0.0) << name;
    EXPECT_LE(err, kNoiseTol) << name;
  }
}

TEST(Rng, MatchesTorchReferenceFile) {
  const std::string path = reference_path();
  const std::string text = read_gzip(path);
  if (text.empty()) {
    GTEST_SKIP()
        << path << " is absent: run tools/make_noise_cases.py where torch exists "
        << "(OUT=dir python3 tools/make_noise_cases.py) and copy noise_cases.json.gz there";
  }
  const json doc = json::parse(text, nullptr, false);
  ASSERT_TRUE(doc.is_object() && doc.contains("noise")) << path << " is not the expected JSON";
  double max_err_big = 0.0;    // n >= 16 (vectorised path)
  double max_err_small = 0.0;  // n < 16 (double path)
  size_t values = 0;
  size_t draws = 0;
  for (const auto& c : doc["noise"]) {
    const std::string name = c["name"].get<std::string>();
    TorchCpuGenerator gen(c["seed"].get<uint64_t>());
    for (const auto& d : c["draws"]) {
      Shape shape = d["shape"].get<Shape>();
      auto t = gen.randn(shape);
      ASSERT_TRUE(t.ok()) << name << ": " << t.status().to_string();
      const size_t n = static_cast<size_t>(t->numel());
      ASSERT_EQ(n, d["n"].get<size_t>()) << name;
      const float* x = t->data_as<float>();
      const auto& vals = d["values"];
      const bool sampled = d.contains("index");
      double err = 0.0;
      for (size_t k = 0; k < vals.size(); ++k) {
        const size_t idx = sampled ? d["index"][k].get<size_t>() : k;
        ASSERT_LT(idx, n) << name;
        err = std::max(err, std::fabs(static_cast<double>(x[idx]) - vals[k].get<double>()));
      }
      if (!sampled) {
        ASSERT_EQ(vals.size(), n) << name;
      }
      double sum = 0.0;
      for (size_t k = 0; k < n; ++k) sum += x[k];
      EXPECT_NEAR(sum, d["sum"].get<double>(), kNoiseTol * static_cast<double>(n) + 1e-9)
          << name << " (sum over all " << n << " values)";
      EXPECT_LE(err, kNoiseTol) << name << " draw of " << shape_string(shape);
      (n >= 16 ? max_err_big : max_err_small) =
          std::max(n >= 16 ? max_err_big : max_err_small, err);
      values += vals.size();
      ++draws;
    }
  }
  std::printf("  torch %s (%s): %zu draws, %zu values; max |diff| n>=16: %.3g, n<16: %.3g\n",
              doc.value("torch_version", "?").c_str(), doc.value("cpu_capability", "?").c_str(),
              draws, values, max_err_big, max_err_small);
  EXPECT_GT(draws, 100u);
}

TEST(Rng, Mt19937SeedingAndLow32Bits) {
  // MT19937 reference: init_genrand(5489) -> first outputs 3499211612, 581869302.
  TorchCpuGenerator a(5489);
  EXPECT_EQ(a.next_u32(), 3499211612u);
  EXPECT_EQ(a.next_u32(), 581869302u);
  // PyTorch seeds the engine with the low 32 bits only.
  TorchCpuGenerator b(42);
  TorchCpuGenerator c((uint64_t{7} << 32) | 42);
  EXPECT_EQ(c.seed(), (uint64_t{7} << 32) | 42);
  EXPECT_EQ(draw(b, 100), draw(c, 100));
}

TEST(Rng, DeterministicAndSeedSensitive) {
  TorchCpuGenerator a(1), b(1), c(2);
  const auto xa = draw(a, 4096), xb = draw(b, 4096), xc = draw(c, 4096);
  EXPECT_EQ(xa, xb);
  size_t same = 0;
  for (size_t i = 0; i < xa.size(); ++i) same += xa[i] == xc[i];
  EXPECT_LT(same, 4u) << "seeds 1 and 2 give nearly the same stream";
}

TEST(Rng, MomentsOfLargeDraw) {
  TorchCpuGenerator g(2024);
  const size_t n = size_t{1} << 20;
  const auto x = draw(g, n);
  double s1 = 0, s2 = 0, s4 = 0;
  size_t within1 = 0;
  for (float v : x) {
    ASSERT_TRUE(std::isfinite(v));
    s1 += v;
    s2 += static_cast<double>(v) * v;
    s4 += static_cast<double>(v) * v * v * v;
    within1 += std::fabs(v) < 1.0f;
  }
  const double mean = s1 / n, var = s2 / n - mean * mean, kurt = s4 / n;
  std::printf("  n=%zu mean %.5f var %.5f E[x^4] %.4f P(|x|<1) %.5f\n", n, mean, var, kurt,
              static_cast<double>(within1) / n);
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(static_cast<double>(n)));  // 5 sigma
  EXPECT_NEAR(var, 1.0, 0.01);
  EXPECT_NEAR(kurt, 3.0, 0.05);
  EXPECT_NEAR(static_cast<double>(within1) / n, 0.682689, 0.003);
}

TEST(Rng, SmallDrawPathMoments) {
  // n < 16 uses the scalar double Box-Muller; 20000 single draws.
  TorchCpuGenerator g(99);
  const size_t n = 20000;
  double s1 = 0, s2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = draw(g, 1)[0];
    s1 += v;
    s2 += v * v;
  }
  const double mean = s1 / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(var, 1.0, 0.05);
}

TEST(Rng, BlockStructureAcrossConsecutiveDraws) {
  // Draws that are multiples of 16 consume uniforms block by block: 32 + 32 == 64.
  TorchCpuGenerator a(5), b(5);
  auto first = draw(a, 32), second = draw(a, 32);
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_EQ(first, draw(b, 64));
  // A ragged draw redraws its last 16 slots: 17 consumes 33 uniforms, then the stream goes on.
  TorchCpuGenerator c(6), d(6);
  (void)draw(c, 17);
  for (int i = 0; i < 33; ++i) (void)d.next_u32();
  EXPECT_EQ(draw(c, 48), draw(d, 48));
  // The first 16 values of a 17-draw are the 16-draw, except slot 1 (overwritten by the tail).
  TorchCpuGenerator e(6), f(6);
  const auto x17 = draw(e, 17), x16 = draw(f, 16);
  EXPECT_EQ(x17[0], x16[0]);
  EXPECT_NE(x17[1], x16[1]);
}

TEST(Rng, SmallDrawCacheCarriesOver) {
  // One value from a fresh generator is r*cos(theta); the next single draw returns the cached
  // r*sin(theta) without touching the engine, even across a vectorised draw in between.
  TorchCpuGenerator g(8);
  const float c0 = draw(g, 1)[0];
  const auto big = draw(g, 20);  // n >= 16: uniforms only, cache untouched
  const float s0 = draw(g, 1)[0];

  TorchCpuGenerator raw(8);
  auto u53 = [&raw] {
    const uint64_t hi = raw.next_u32(), lo = raw.next_u32();
    return static_cast<double>(((hi << 32) | lo) & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
  };
  const double u1 = u53(), u2 = u53();
  const double r = std::sqrt(-2.0 * std::log1p(-u2));
  const double th = 2.0 * 3.14159265358979323846 * u1;
  EXPECT_EQ(c0, static_cast<float>(r * std::cos(th)));
  EXPECT_EQ(s0, static_cast<float>(r * std::sin(th)));
  // The vectorised draw started right after the 4 outputs used by the pair.
  TorchCpuGenerator h(8);
  for (int i = 0; i < 4; ++i) (void)h.next_u32();
  EXPECT_EQ(big, draw(h, 20));
}

TEST(Rng, ShapesAndErrors) {
  TorchCpuGenerator g(3);
  auto bad = g.randn({2, -1, 4});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("[2, -1, 4]"), std::string::npos) << bad.status().message();
  auto huge = g.randn({int64_t{1} << 40, int64_t{1} << 40});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), ErrorCode::kInvalidArgument);
  // Empty tensors draw nothing: the stream continues as if they never happened.
  auto empty = g.randn({2, 0, 3});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->numel(), 0);
  TorchCpuGenerator fresh(3);
  auto a = g.randn({1, 16, 2, 2});
  auto b = fresh.randn({1, 16, 2, 2});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->shape(), (Shape{1, 16, 2, 2}));
  EXPECT_EQ(test::max_abs_diff(*a, *b), 0.0);
}

// The pipeline spreads the Box-Muller blocks over a pool (chunks of 2048 blocks, from 4096
// blocks up): the same bits as one thread, for a 1024² latent, a batch of two, counts whose last
// chunk is short (38400 blocks; 4375 blocks and a ragged tail of one value), draws the pool runs
// inline (1683 blocks, 64 blocks); and the stream after each continues the same way.
TEST(Rng, PoolGivesTheSameBits) {
  ThreadPool pool(4);
  for (const Shape& shape : {Shape{1, 16, 128, 128}, Shape{2, 16, 64, 96}, Shape{3, 16, 128, 100},
                             Shape{1, 70001}, Shape{3, 16, 33, 17}, Shape{1, 16, 8, 8}}) {
    TorchCpuGenerator one(1234), many(1234);
    for (int draw = 0; draw < 2; ++draw) {
      auto a = one.randn(shape);
      auto b = many.randn(shape, &pool);
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_EQ(a->nbytes(), b->nbytes());
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->nbytes()), 0)
          << shape_string(shape) << " draw " << draw;
    }
  }
}
