// Seeds and float fields agree at every JSON entry point: the server's OpenAI and A1111 parsers
// (serve/request_parse.h), the worker's job decoding (broker::decode_job) and what `zimage
// submit` encodes (broker::request_json), all under the library's rules (zimage/request_check.h).
// "seed": -0 is 0 (nlohmann reads -0 as the signed integer 0); integral floats are integers up to
// 2^53; a non-finite or out-of-range guidance is never queued (JSON would carry it as null).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "zimage/request_check.h"
#include "broker/job_codec.h"
#include "serve/request_parse.h"

namespace zimage {
namespace {

constexpr uint64_t kRandom = 987654321;

struct Parsed {
  bool ok = false;
  uint64_t seed = 0;
  bool random = false;
  std::string error;
};

// The body through every entry point that takes JSON: POST /v1/images/generations and
// /v1/jobs, /sdapi/v1/txt2img, and the worker's job decoding. They must agree.
std::vector<Parsed> parse_everywhere(const std::string& fields) {
  serve::ParseLimits lim;
  const std::string body = R"({"prompt": "a fox", )" + fields + "}";
  std::vector<Parsed> out;
  for (int k = 0; k < 3; ++k) {
    auto r = k == 0   ? serve::parse_openai(body, lim, kRandom)
             : k == 1 ? serve::parse_a1111(body, lim, kRandom)
                      : broker::decode_job(body, lim, kRandom);
    Parsed p;
    p.ok = r.ok();
    if (r.ok()) {
      p.seed = r->runs.front().seed;
      p.random = r->random_seed;
    } else {
      p.error = r.status().message();
    }
    out.push_back(p);
  }
  return out;
}

TEST(EntryPointSeeds, MinusZeroIsZero) {
  for (const char* text : {"-0", "-0.0", "0", "0.0"}) {
    for (const Parsed& p : parse_everywhere(std::string(R"("seed": )") + text)) {
      ASSERT_TRUE(p.ok) << text << ": " << p.error;
      EXPECT_EQ(p.seed, 0u) << text;
      EXPECT_FALSE(p.random) << text;
    }
  }
}

TEST(EntryPointSeeds, IntegralFloatsUpTo2Pow53AreIntegers) {
  const std::pair<const char*, uint64_t> cases[] = {
      {"1.0", 1}, {"1e3", 1000}, {"42.000", 42}, {"9007199254740992.0", 9007199254740992ull}};
  for (const auto& [text, want] : cases)
    for (const Parsed& p : parse_everywhere(std::string(R"("seed": )") + text)) {
      ASSERT_TRUE(p.ok) << text << ": " << p.error;
      EXPECT_EQ(p.seed, want) << text;
    }
  // An integer is exact at any size; a float past 2^53 or with a fraction is refused by name.
  for (const Parsed& p : parse_everywhere(R"("seed": 18446744073709551615)")) {
    ASSERT_TRUE(p.ok) << p.error;
    EXPECT_EQ(p.seed, 18446744073709551615ull);
  }
  for (const char* text : {"1e19", "1.5", "-2", "-1.5", "18446744073709551616"})
    for (const Parsed& p : parse_everywhere(std::string(R"("seed": )") + text)) {
      EXPECT_FALSE(p.ok) << text;
      EXPECT_EQ(p.error.rfind("seed", 0), 0u) << text << ": " << p.error;
    }
  for (const char* text : {"-1", "-1.0", "null"})
    for (const Parsed& p : parse_everywhere(std::string(R"("seed": )") + text)) {
      ASSERT_TRUE(p.ok) << text << ": " << p.error;
      EXPECT_TRUE(p.random) << text;
      EXPECT_EQ(p.seed, kRandom) << text;
    }
}

TEST(EntryPointFloats, OneGuidanceRuleEverywhere) {
  for (const char* text : {"0", "7.5", "100"}) {
    serve::ParseLimits lim;
    const std::string v(text);
    EXPECT_TRUE(serve::parse_openai(R"({"prompt": "a", "guidance_scale": )" + v + "}", lim, 1).ok())
        << text;
    EXPECT_TRUE(serve::parse_a1111(R"({"prompt": "a", "cfg_scale": )" + v + "}", lim, 1).ok())
        << text;
  }
  for (const char* text : {"-0.5", "100.5", "1e39"}) {
    serve::ParseLimits lim;
    const std::string v(text);
    auto o = serve::parse_openai(R"({"prompt": "a", "guidance_scale": )" + v + "}", lim, 1);
    ASSERT_FALSE(o.ok()) << text;
    EXPECT_EQ(o.status().message().rfind("guidance_scale: ", 0), 0u) << o.status().message();
    auto a = serve::parse_a1111(R"({"prompt": "a", "cfg_scale": )" + v + "}", lim, 1);
    ASSERT_FALSE(a.ok()) << text;
    EXPECT_EQ(a.status().message().rfind("cfg_scale: ", 0), 0u) << a.status().message();
  }
  // The library's check: the same range, on the engine's field name.
  GenerateRequest req;
  req.prompts = {"a"};
  req.width = req.height = 64;
  req.guidance = 150.0f;
  Status st = check_request(req, RequestLimits{});
  EXPECT_EQ(st.message(), "guidance: 150 is outside 0..100");
  req.guidance = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(check_request(req, RequestLimits{}).message().rfind("guidance: must be a finite", 0),
            0u);
  EXPECT_EQ(check_number("x", 1e39, 0, 100).message(), "x: 1e+39 is outside 0..100");
  EXPECT_TRUE(check_number("x", -0.0, 0, 100).ok());
}

// `zimage submit` encodes a GenerateRequest: a guidance JSON cannot carry (NaN, infinity, a
// float past FLT_MAX) or the worker would refuse is refused here, never queued as null (which
// the worker reads as "absent" and runs with 0).
TEST(EntryPointFloats, RequestJsonNeverQueuesNullGuidance) {
  GenerateRequest req;
  req.prompts = {"a fox"};
  req.width = req.height = 64;
  for (float g :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), static_cast<float>(1e39), 150.0f, -1.0f}) {
    req.guidance = g;
    auto body = broker::request_json(req);
    ASSERT_FALSE(body.ok()) << g << " queued as " << *body;
    EXPECT_EQ(body.status().message().rfind("guidance_scale: ", 0), 0u) << body.status().message();
  }
  req.guidance = 3.5f;
  auto body = broker::request_json(req);
  ASSERT_TRUE(body.ok()) << body.status().message();
  auto job = broker::decode_job(*body, serve::ParseLimits{}, 1);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->runs.front().guidance, 3.5f);
}

}  // namespace
}  // namespace zimage
