// Model-free pieces of the server: request parsing (defaults, dialect names, seeds), the field
// renaming of engine errors, base64, the SSE event sequence, job retention, and metrics text.
#include <gtest/gtest.h>

#include "serve/api_error.h"
#include "serve/image_encode.h"
#include "serve/job_table.h"
#include "serve/metrics.h"
#include "serve/request_parse.h"
#include "serve/sse.h"
#include "zimage/zimage.h"

namespace zimage::serve {
namespace {

ParseLimits limits() {
  ParseLimits l;
  l.default_width = 64;
  l.default_height = 64;
  return l;
}

TEST(ServeParse, OpenAiDefaultsAndFields) {
  auto s = parse_openai(R"({"prompt": "fox"})", limits(), 42);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->runs.size(), 1u);
  EXPECT_EQ(s->runs[0].width, 64);
  EXPECT_EQ(s->runs[0].steps, 8);
  EXPECT_EQ(s->runs[0].seed, 42u);
  EXPECT_TRUE(s->random_seed);
  EXPECT_FALSE(s->runs[0].negative_prompt.has_value());
  auto t = parse_openai(R"({"prompt": "fox", "n": 3, "size": "128x96", "seed": 18446744073709551615,
                            "num_inference_steps": 4.0, "guidance_scale": 3, "negative_prompt": "",
                            "output_format": "webp", "output_compression": 70,
                            "response_format": "url", "model": "dall-e-3", "quality": "hd"})",
                        limits(), 1);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const GenerateRequest& r = t->runs[0];
  EXPECT_EQ(r.images_per_prompt, 3);
  EXPECT_EQ(r.width, 128);
  EXPECT_EQ(r.height, 96);
  EXPECT_EQ(r.seed, 18446744073709551615ull);
  EXPECT_FALSE(t->random_seed);
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.guidance, 3.0f);
  EXPECT_EQ(r.negative_prompt, std::optional<std::string>(""));
  EXPECT_EQ(t->output_format, OutputFormat::kWebp);
  EXPECT_EQ(t->quality, 70);
  EXPECT_EQ(t->response_format, ResponseFormat::kUrl);
}

TEST(ServeParse, UnknownFieldsAreNamedWhenTheNameIsPlain) {
  auto a = parse_openai(R"({"prompt": "p", "steps": 4})", limits(), 0);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(api_error(a.status()).param, "steps");
  // Found by fuzz_serve_request: a key with odd bytes must still give a clean "param".
  auto b = parse_openai(R"({"prompt": "p", "73709551615,n": 1.0})", limits(), 0);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(api_error(b.status()).param, "body");
  EXPECT_NE(b.status().message().find("73709551615,n"), std::string::npos);
  auto c = parse_openai("{\"prompt\": \"p\", \"a: \\u001b[31m\": 1}", limits(), 0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(api_error(c.status()).param, "body");
  EXPECT_EQ(c.status().message().find('\x1b'), std::string::npos);  // made printable
}

TEST(ServeParse, A1111IterationsAndUnknownFieldsIgnored) {
  auto s = parse_a1111(R"({"prompt": "p", "batch_size": 2, "n_iter": 3, "seed": 10,
                            "sampler_name": "Euler a", "restore_faces": false})",
                       limits(), 0);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->runs.size(), 3u);
  EXPECT_EQ(s->runs[2].seed, 14u);
  EXPECT_EQ(s->images(), 6);
  EXPECT_EQ(s->total_steps(), 24);
}

TEST(ServeParse, EngineErrorsUseTheClientsFieldNames) {
  EXPECT_EQ(rename_fields(FieldError("guidance", "bad"), Dialect::kOpenAi).message(),
            "guidance_scale: bad");
  EXPECT_EQ(rename_fields(FieldError("guidance", "bad"), Dialect::kA1111).message(),
            "cfg_scale: bad");
  EXPECT_EQ(rename_fields(FieldError("width", "63 is odd"), Dialect::kOpenAi).message(),
            "size: width 63 is odd");
  EXPECT_EQ(rename_fields(FieldError("prompts[0]", "too long"), Dialect::kOpenAi).message(),
            "prompt: too long");
  EXPECT_EQ(rename_fields(FieldError("images_per_prompt", "99"), Dialect::kA1111).message(),
            "batch_size: 99");
  const ApiError e = api_error(InvalidArgument("size: width 63 is odd"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "size");
  EXPECT_EQ(api_error(InvalidArgument("no field here")).param, "");
  EXPECT_EQ(api_error(InternalError("x")).status, 500);
}

TEST(ServeParse, OnlyAStatusFieldIsRenamed) {
  // The field comes from Status::field(), not from the message's text.
  EXPECT_EQ(rename_fields(InvalidArgument("width: 63 is odd"), Dialect::kOpenAi).message(),
            "width: 63 is odd");
  const Status renamed = rename_fields(FieldError("steps", "0"), Dialect::kOpenAi);
  EXPECT_EQ(renamed.message(), "num_inference_steps: 0");
  EXPECT_EQ(renamed.field(), "num_inference_steps");
  EXPECT_EQ(renamed.code(), ErrorCode::kInvalidArgument);
  // A context before the field: the message stays as it is.
  EXPECT_EQ(
      rename_fields(FieldError("steps", "0").with_context("run 1"), Dialect::kOpenAi).message(),
      "run 1: steps: 0");
  // Any code: an engine that cannot encode an init image says so about the client's "image".
  EXPECT_EQ(rename_fields(OutOfMemory("init_image: vae").with_field("init_image"), Dialect::kOpenAi)
                .to_string(),
            "out of memory: image: vae");
  EXPECT_EQ(rename_fields(FieldError("negative_prompt", "bad"), Dialect::kA1111).message(),
            "negative_prompt: bad");
}

TEST(ServeParse, Base64) {
  EXPECT_EQ(base64_encode({}), "");
  EXPECT_EQ(base64_encode({'f'}), "Zg==");
  EXPECT_EQ(base64_encode({'f', 'o'}), "Zm8=");
  EXPECT_EQ(base64_encode({'f', 'o', 'o'}), "Zm9v");
  EXPECT_EQ(base64_encode({'f', 'o', 'o', 'b', 'a', 'r'}), "Zm9vYmFy");
  EXPECT_EQ(base64_encode({0xFF, 0xFE, 0x00}), "//4A");
}

TEST(ServeParse, SseSequenceCoalescedStepsAreAllSent) {
  JobSpec spec = *parse_openai(R"({"prompt": "s", "num_inference_steps": 4})", limits(), 1);
  auto job = std::make_shared<Job>(random_job_id(), spec);
  SseStream s(job, "");
  EXPECT_NE(s.next(job->snapshot(), 0).find("event: queued"), std::string::npos);
  job->mark_started();
  job->set_step(1);
  job->set_step(3);  // the watcher slept through step 2
  const std::string mid = s.next(job->snapshot(), -1);
  EXPECT_NE(mid.find("event: started"), std::string::npos);
  EXPECT_NE(mid.find(R"({"step":1,"total":4})"), std::string::npos);
  EXPECT_NE(mid.find(R"({"step":2,"total":4})"), std::string::npos);
  EXPECT_NE(mid.find(R"({"step":3,"total":4})"), std::string::npos);
  job->finish_succeeded({EncodedImage{{1, 2, 3}, 1}}, {});
  const std::string end = s.next(job->snapshot(), -1);
  EXPECT_NE(end.find(R"({"step":4,"total":4})"), std::string::npos);
  EXPECT_NE(end.find("event: done"), std::string::npos);
  EXPECT_TRUE(s.finished());
}

TEST(ServeParse, JobTableKeepsABoundedNumberOfFinishedJobs) {
  RetentionLimits lim;
  lim.max_finished = 5;
  JobTable table(lim);
  JobSpec spec = *parse_openai(R"({"prompt": "t"})", limits(), 1);
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) {
    auto job = table.create(spec);
    ids.push_back(job->id());
    EXPECT_TRUE(well_formed_job_id(job->id()));
    job->finish_cancelled("test");
  }
  table.prune();
  EXPECT_EQ(table.size(), 5u);
  EXPECT_NE(table.find(ids.back()), nullptr);
  EXPECT_EQ(table.find(ids.front()), nullptr);
  EXPECT_FALSE(well_formed_job_id("../../etc/passwd"));
  EXPECT_FALSE(well_formed_job_id(std::string(32, 'G')));
}

TEST(ServeParse, MetricsText) {
  Metrics m;
  m.observe_phase("vae", 0.02);
  m.observe_phase("vae", 3);
  m.count_http(200);
  const std::string t = m.render();
  EXPECT_NE(t.find("zimage_phase_seconds_bucket{phase=\"vae\",le=\"0.025\"} 1"), std::string::npos);
  EXPECT_NE(t.find("zimage_phase_seconds_bucket{phase=\"vae\",le=\"5\"} 2"), std::string::npos);
  EXPECT_NE(t.find("zimage_phase_seconds_count{phase=\"vae\"} 2"), std::string::npos);
  EXPECT_NE(t.find("# TYPE zimage_phase_seconds histogram"), std::string::npos);
}

// ControlNet fields: A1111's ControlNet extension unit (image + weight) and the edits form's
// control_image part with control_scale; bad units are named.
TEST(ServeParse, ControlNetFields) {
  Image img;
  img.width = 32;
  img.height = 32;
  img.rgb.assign(32 * 32 * 3, 100);
  auto png = png_encode(img);
  ASSERT_TRUE(png.ok());
  const std::string b64 = base64_encode(*png);
  auto a = parse_a1111(R"({"prompt": "p", "alwayson_scripts": {"controlnet": {"args": [
                             {"enabled": false, "image": "x"},
                             {"image": ")" +
                           b64 + R"(", "weight": 0.5, "model": "any"}]}}})",
                       limits(), 0);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(a->runs[0].control_image.has_value());
  EXPECT_EQ(a->runs[0].control_image->width, 32);
  EXPECT_EQ(a->runs[0].control_image->rgb, img.rgb);
  EXPECT_EQ(a->runs[0].control_scale, 0.5f);
  auto none = parse_a1111(R"({"prompt": "p"})", limits(), 0);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->runs[0].control_image.has_value());
  auto two = parse_a1111(R"({"prompt": "p", "alwayson_scripts": {"controlnet": {"args": [
                              {"image": ")" +
                             b64 + R"("}, {"image": ")" + b64 + R"("}]}}})",
                         limits(), 0);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("one enabled unit"), std::string::npos);
  auto no_image = parse_a1111(
      R"({"prompt": "p", "alwayson_scripts": {"controlnet": {"args": [{"weight": 1}]}}})", limits(),
      0);
  ASSERT_FALSE(no_image.ok());
  EXPECT_NE(no_image.status().message().find("base64 image is required"), std::string::npos);

  const std::string bytes(png->begin(), png->end());
  std::vector<FormPart> form(4);
  form[0].name = "image";
  form[0].content = bytes;
  form[1].name = "control_image";
  form[1].content = bytes;
  form[2].name = "prompt";
  form[2].content = "p";
  form[3].name = "control_scale";
  form[3].content = "0.25";
  auto e = parse_openai_edit(form, limits(), 0);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(e->runs[0].control_image.has_value());
  EXPECT_EQ(e->runs[0].control_scale, 0.25f);
}

}  // namespace
}  // namespace zimage::serve
