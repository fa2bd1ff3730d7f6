// FlowMatchEulerScheduler against the numbers diffusers produces: the Turbo table of the model
// spec (§6.1), torch.linspace / schedule values computed by torch itself (tests/data/noise/
// noise_cases.json.gz, from tools/make_noise_cases.py), and every golden case's recorded Euler
// steps (latents_after_step<k> = latents_before + dt·v, v from dit_out_step<k> with the
// pipeline's CFG, truncation and renormalisation rules).
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
#include "pipeline/scheduler.h"

using namespace zimage;
using nlohmann::json;

namespace {

SchedulerConfig turbo_config() {
  SchedulerConfig c;
  c.shift = 3.0f;
  return c;
}

FlowMatchEulerScheduler make(const SchedulerConfig& c, int n, int64_t seq = 0) {
  auto s = FlowMatchEulerScheduler::create(c, n, seq);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(s).value();
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Distance in units in the last place between two finite floats of the same sign.
int64_t ulps(float a, float b) {
  return std::llabs(static_cast<int64_t>(bits(a)) - static_cast<int64_t>(bits(b)));
}

json read_json_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return json();
  return json::parse(f, nullptr, false);
}

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

// The few scheduler_config.json keys the sigma schedule depends on.
SchedulerConfig parse_scheduler_config(const json& j) {
  SchedulerConfig c;
  c.num_train_timesteps = j.value("num_train_timesteps", 1000);
  c.shift = j.value("shift", 1.0f);
  c.use_dynamic_shifting = j.value("use_dynamic_shifting", false);
  c.base_shift = j.value("base_shift", 0.5f);
  c.max_shift = j.value("max_shift", 1.15f);
  c.base_image_seq_len = j.value("base_image_seq_len", 256);
  c.max_image_seq_len = j.value("max_image_seq_len", 4096);
  return c;
}

}  // namespace

TEST(Scheduler, TurboTableN8) {
  const auto s = make(turbo_config(), 8);
  ASSERT_EQ(s.num_steps(), 8);
  ASSERT_EQ(s.sigmas().size(), 9u);
  // Spec §6.1: σ = 3s/(1+2s), s = 1 - i/8, as exact rationals; dt and t_model from them.
  const double sigma[9] = {1.0, 21.0 / 22, 0.9, 5.0 / 6, 0.75, 9.0 / 14, 0.5, 0.3, 0.0};
  const double table_t[8] = {1000.0000, 954.5454, 900.0000, 833.3333,
                             750.0000,  642.8571, 500.0000, 300.0000};
  const double table_dt[8] = {-0.0454546, -0.0545455, -0.0666667, -0.0833333,
                              -0.1071429, -0.1428571, -0.2000000, -0.3000000};
  double max_err = 0.0;
  for (int i = 0; i < 8; ++i) {
    const double e1 = std::fabs(s.sigmas()[i] - sigma[i]);
    const double e2 = std::fabs(s.model_time(i) - (1.0 - sigma[i]));
    const double e3 = std::fabs(s.dt(i) - (sigma[i + 1] - sigma[i]));
    EXPECT_LE(e1, 1e-7) << i;
    EXPECT_LE(e2, 1e-7) << i;
    EXPECT_LE(e3, 1e-7) << i;
    EXPECT_NEAR(s.timesteps()[i], table_t[i], 1e-4) << i;  // table printed to 4 decimals
    EXPECT_NEAR(s.dt(i), table_dt[i], 1e-7) << i;
    max_err = std::max({max_err, e1, e2, e3});
  }
  EXPECT_EQ(s.sigmas()[8], 0.0f);
  EXPECT_EQ(s.sigmas()[0], 1.0f);
  EXPECT_EQ(s.model_time(0), 0.0f);
  EXPECT_EQ(s.timesteps()[6], 500.0f);
  std::printf("  Turbo N=8: max |err| vs exact rationals %.3g\n", max_err);
}

TEST(Scheduler, TorchLinspaceRuleProperties) {
  // For all N: first element exactly start, last exactly end, strictly decreasing, each within
  // two float ulps of the exact value start + i*(end-start)/(N-1). (Bit-exactness against torch
  // itself is MatchesTorchReferenceFile.)
  int64_t worst = 0;
  for (int n = 1; n <= 200; ++n) {
    const float end = static_cast<float>(1.0 / n);
    const auto v = torch_linspace_f32(1.0f, end, n);
    ASSERT_EQ(v.size(), static_cast<size_t>(n));
    EXPECT_EQ(v.front(), 1.0f);
    EXPECT_EQ(v.back(), n == 1 ? 1.0f : end);
    for (int i = 0; i < n; ++i) {
      if (i > 0) {
        EXPECT_LT(v[i], v[i - 1]) << n << " " << i;
      }
      const double exact = n == 1 ? 1.0 : 1.0 + i * ((static_cast<double>(end) - 1.0) / (n - 1));
      const int64_t u = ulps(v[i], static_cast<float>(exact));
      worst = std::max(worst, u);
      EXPECT_LE(u, 2) << "N=" << n << " i=" << i;  // step is rounded, then scaled by i
    }
  }
  EXPECT_TRUE(torch_linspace_f32(1.0f, 0.5f, 0).empty());
  std::printf("  linspace N=1..200: worst distance from exact %lld ulp\n",
              static_cast<long long>(worst));
}

TEST(Scheduler, MatchesTorchReferenceFile) {
  const std::string path = std::string(ZIMAGE_TEST_DATA_DIR) + "/noise/noise_cases.json.gz";
  const std::string text = read_gzip(path);
  if (text.empty()) {
    GTEST_SKIP() << path << " is absent: run tools/make_noise_cases.py where torch exists";
  }
  const json doc = json::parse(text, nullptr, false);
  ASSERT_TRUE(doc.is_object() && doc.contains("linspace") && doc.contains("schedules")) << path;
  size_t checked = 0;
  for (const auto& l : doc["linspace"]) {
    const int n = l["n"].get<int>();
    const auto v = torch_linspace_f32(1.0f, static_cast<float>(l["end"].get<double>()), n);
    ASSERT_EQ(v.size(), l["values"].size());
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_EQ(v[i], static_cast<float>(l["values"][i].get<double>()))
          << "torch.linspace(1, 1/" << n << ", " << n << ")[" << i << "]";
      ++checked;
    }
  }
  int64_t worst = 0;
  for (const auto& r : doc["schedules"]) {
    const int n = r["n"].get<int>();
    SchedulerConfig c;
    c.shift = r["shift"].get<float>();
    c.use_dynamic_shifting = r["dynamic"].get<bool>();
    const int64_t seq = r.value("image_seq_len", int64_t{0});
    const auto s = make(c, n, seq);
    const bool dyn = c.use_dynamic_shifting;
    if (dyn) {
      EXPECT_EQ(s.mu(), r["mu"].get<double>()) << "seq " << seq;
    }
    const std::string what = "N=" + std::to_string(n) + " shift " + std::to_string(c.shift) +
                             (dyn ? " dynamic seq " + std::to_string(seq) : "");
    ASSERT_EQ(s.sigmas().size(), r["sigmas"].size()) << what;
    for (size_t i = 0; i < s.sigmas().size(); ++i) {
      const float want = static_cast<float>(r["sigmas"][i].get<double>());
      worst = std::max(worst, ulps(s.sigmas()[i], want));
      EXPECT_EQ(s.sigmas()[i], want) << what << " sigma " << i;
      ++checked;
    }
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(s.timesteps()[i], static_cast<float>(r["timesteps"][i].get<double>()))
          << what << " T " << i;
      EXPECT_EQ(s.model_time(i), static_cast<float>(r["t_model"][i].get<double>()))
          << what << " t_model " << i;
      checked += 2;
    }
  }
  std::printf("  %zu values compared with torch %s, bitwise; worst sigma distance %lld ulp\n",
              checked, doc.value("torch_version", "?").c_str(), static_cast<long long>(worst));
}

TEST(Scheduler, DynamicShiftFollowsFluxMu) {
  SchedulerConfig c;
  c.use_dynamic_shifting = true;
  EXPECT_DOUBLE_EQ(calculate_shift(256, 256, 4096, 0.5, 1.15), 0.5);
  EXPECT_NEAR(calculate_shift(4096, 256, 4096, 0.5, 1.15), 1.15, 1e-12);
  for (int64_t seq : {256, 1024, 4096}) {
    const auto s = make(c, 8, seq);
    const double mu = calculate_shift(seq, 256, 4096, 0.5, 1.15);  // 1.15f read back as 1.15
    EXPECT_DOUBLE_EQ(s.mu(), mu);
    for (int i = 0; i < 8; ++i) {
      const double b = 1.0 - i / 8.0;
      const double want = std::exp(mu) / (std::exp(mu) + 1.0 / b - 1.0);
      EXPECT_NEAR(s.sigmas()[i], want, 3e-7) << "seq " << seq << " i " << i;
    }
  }
}

TEST(Scheduler, EulerStepAndCfgArithmetic) {
  const auto s = make(turbo_config(), 8);
  std::vector<float> x = {1.0f, -2.0f, 0.5f}, v = {0.25f, 1.0f, -4.0f};
  ASSERT_TRUE(s.step(7, v.data(), x.data(), x.size()).ok());
  const float dt = s.dt(7);  // 0 - 0.3
  EXPECT_EQ(dt, -0.3f);
  EXPECT_EQ(x[0], 1.0f + dt * 0.25f);
  EXPECT_EQ(x[1], -2.0f + dt * 1.0f);
  EXPECT_EQ(x[2], 0.5f + dt * -4.0f);

  const float pos[3] = {1.0f, -1.0f, 0.0f}, neg[3] = {0.5f, -1.5f, 2.0f};
  float out[3];
  cfg_combine(pos, neg, 4.0f, out, 3);
  EXPECT_EQ(out[0], 3.0f);   // 1 + 4*0.5
  EXPECT_EQ(out[1], 1.0f);   // -1 + 4*0.5
  EXPECT_EQ(out[2], -8.0f);  // 0 + 4*(-2)

  const float p2[2] = {3.0f, 4.0f};  // |p| = 5
  float pred[2] = {6.0f, 8.0f};      // |pred| = 10 > 1*5 -> scaled to 5
  cfg_renormalize(p2, pred, 2, 1.0);
  EXPECT_NEAR(pred[0], 3.0f, 1e-6);
  EXPECT_NEAR(pred[1], 4.0f, 1e-6);
  float pred2[2] = {6.0f, 8.0f};
  cfg_renormalize(p2, pred2, 2, 3.0);  // 10 <= 15: unchanged
  EXPECT_EQ(pred2[0], 6.0f);
  cfg_renormalize(p2, pred2, 2, 0.0);  // off
  EXPECT_EQ(pred2[1], 8.0f);
}

TEST(Scheduler, CfgTruncationRule) {
  const auto s = make(turbo_config(), 8);
  // t_model: 0, .045, .1, .167, .25, .357, .5, .7
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(s.guidance_at(i, 4.0f, 1.0), 4.0f) << i;  // default never triggers
    EXPECT_EQ(s.guidance_at(i, 0.0f, 1.0), 0.0f) << i;  // CFG off
    EXPECT_EQ(s.guidance_at(i, 4.0f, 1.5), 4.0f) << i;  // > 1: rule disabled
  }
  EXPECT_EQ(s.guidance_at(6, 4.0f, 0.5), 4.0f);  // 0.5 is not > 0.5
  EXPECT_EQ(s.guidance_at(7, 4.0f, 0.5), 0.0f);
  EXPECT_EQ(s.guidance_at(0, 4.0f, 0.0), 4.0f);  // t_norm 0 is not > 0
  EXPECT_EQ(s.guidance_at(1, 4.0f, 0.0), 0.0f);
}

TEST(Scheduler, Img2ImgStartIndex) {
  EXPECT_EQ(img2img_start_index(8, 0.6).value(), 3);  // spec §9: 5 steps from σ = 0.8333
  EXPECT_EQ(img2img_start_index(8, 1.0).value(), 0);
  EXPECT_EQ(img2img_start_index(5, 0.6).value(), 2);
  // Python truncates: 5 * 0.6000000000000001 = 3.0000000000000004, int(1.9999999999999996) = 1.
  EXPECT_EQ(img2img_start_index(5, 0.6000000000000001).value(), 1);
  EXPECT_EQ(img2img_start_index(8, 0.05).value(), 7);  // below 1/N: still one step
  EXPECT_EQ(img2img_start_index(8, 0.125).value(), 7);
  EXPECT_EQ(img2img_start_index(1, 1.0).value(), 0);
  for (double bad : {0.0, 1e-20, -0.1, 1.01, std::nan("")}) {
    auto r = img2img_start_index(8, bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("strength"), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(img2img_start_index(0, 0.5).ok());
}

TEST(Scheduler, RejectsBadConfigs) {
  EXPECT_EQ(FlowMatchEulerScheduler::create(turbo_config(), 0).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_FALSE(FlowMatchEulerScheduler::create(turbo_config(), 100000).ok());
  SchedulerConfig k = turbo_config();
  k.use_karras_sigmas = true;
  EXPECT_EQ(FlowMatchEulerScheduler::create(k, 8).status().code(), ErrorCode::kUnsupported);
  SchedulerConfig z = turbo_config();
  z.shift = 0.0f;
  auto r = FlowMatchEulerScheduler::create(z, 8);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("shift"), std::string::npos);
  SchedulerConfig t = turbo_config();
  t.shift_terminal_set = true;
  EXPECT_FALSE(FlowMatchEulerScheduler::create(t, 8).ok());
  const auto s = make(turbo_config(), 2);
  float x = 0, v = 0;
  EXPECT_FALSE(s.step(2, &v, &x, 1).ok());
  EXPECT_FALSE(s.step(-1, &v, &x, 1).ok());
  EXPECT_FALSE(s.step(0, nullptr, &x, 1).ok());
}

// Every golden case: recompute each recorded Euler step from the recorded DiT output.
TEST(Scheduler, ReproducesGoldenEulerSteps) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ZIMAGE_GOLDEN_DIR, ec)) {
    if (std::filesystem::exists(e.path() / "debug" / "dit_out_step0.npy")) {
      names.push_back(e.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  ASSERT_FALSE(names.empty()) << "no golden cases under " << ZIMAGE_GOLDEN_DIR;
  for (const auto& name : names) {
    const std::string dir = test::golden_dir(name);
    const json c = read_json_file(dir + "/case.json");
    const json sc = read_json_file(dir + "/model/scheduler/scheduler_config.json");
    ASSERT_TRUE(c.is_object() && sc.is_object()) << dir;
    const int steps = c["steps"].get<int>();
    const float g = c["guidance"].get<float>();
    const double trunc = c.contains("cfg_truncation") ? c["cfg_truncation"].get<double>() : 1.0;
    const double norm =
        c.contains("cfg_normalization") ? c["cfg_normalization"].get<double>() : 0.0;

    auto x0 = test::load_npy(dir + "/init_noise.npy");
    ASSERT_TRUE(x0.ok()) << x0.status().to_string();
    const Tensor init = *x0;
    const int64_t batch = init.dim(0);
    const size_t per = static_cast<size_t>(init.numel() / batch);
    const int64_t seq = (init.dim(2) / 2) * (init.dim(3) / 2);
    const auto s = make(parse_scheduler_config(sc), steps, seq);

    std::vector<float> before(init.data_as<float>(), init.data_as<float>() + init.numel());
    std::vector<float> chained = before;
    double max_step_err = 0.0, max_chain_err = 0.0;
    for (int k = 0; k < steps; ++k) {
      const std::string ks = std::to_string(k);
      auto out = test::load_npy(dir + "/debug/dit_out_step" + ks + ".npy");
      auto after = test::load_npy(dir + "/debug/latents_after_step" + ks + ".npy");
      ASSERT_TRUE(out.ok() && after.ok()) << name << " step " << k;
      const float gk = s.guidance_at(k, g, trunc);
      const int64_t rows = out->dim(0);
      ASSERT_EQ(rows, gk > 0.0f ? 2 * batch : batch)
          << name << " step " << k << ": DiT rows disagree with the cfg_truncation rule";
      ASSERT_EQ(static_cast<size_t>(out->numel()), static_cast<size_t>(rows) * per);
      const float* o = out->data_as<float>();
      std::vector<float> v(static_cast<size_t>(batch) * per);
      for (int64_t b = 0; b < batch; ++b) {
        float* vb = v.data() + b * per;
        const float* pos = o + b * per;
        if (gk > 0.0f) {
          cfg_combine(pos, o + (batch + b) * per, gk, vb, per);
          cfg_renormalize(pos, vb, per, norm);
        } else {
          std::copy(pos, pos + per, vb);
        }
        for (size_t i = 0; i < per; ++i) vb[i] = -vb[i];
      }
      ASSERT_TRUE(s.step(k, v.data(), before.data(), before.size()).ok());
      ASSERT_TRUE(s.step(k, v.data(), chained.data(), chained.size()).ok());
      const float* want = after->data_as<float>();
      ASSERT_EQ(static_cast<size_t>(after->numel()), before.size());
      double e_step = 0.0, e_chain = 0.0;
      for (size_t i = 0; i < before.size(); ++i) {
        e_step = std::max(e_step, std::fabs(static_cast<double>(before[i]) - want[i]));
        e_chain = std::max(e_chain, std::fabs(static_cast<double>(chained[i]) - want[i]));
      }
      EXPECT_LE(e_step, 1e-6) << name << " step " << k;
      max_step_err = std::max(max_step_err, e_step);
      max_chain_err = std::max(max_chain_err, e_chain);
      before.assign(want, want + after->numel());  // next step starts from the reference
    }
    EXPECT_LE(max_chain_err, 1e-5) << name;
    std::printf("  %-12s N=%d g=%.2f: max |diff| per step %.3g, chained %.3g\n", name.c_str(),
                steps, g, max_step_err, max_chain_err);
  }
}
