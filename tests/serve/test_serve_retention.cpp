// What finished jobs keep (serve/job.h, job_table.h): a job that ends (succeeded, failed or
// cancelled) lets go of its decoded input images (init image, mask, control image), and the
// finished-job byte budget counts everything a job still keeps (Job::kept_bytes), not only its
// encoded images.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "serve/job_table.h"
#include "serve/scheduler.h"
#include "serve/serve_test_util.h"

namespace zimage::serve::test {
namespace {

using nlohmann::json;

// A spec as /v1/images/edits makes it: an init image, a mask and a control image of w x h.
JobSpec image_spec(int w, int h) {
  JobSpec spec;
  GenerateRequest r;
  r.prompts = {"a cat"};
  r.width = 32;
  r.height = 32;
  r.steps = 2;
  r.init_image = pattern_image(w, h, 1);
  r.mask = pattern_image(w, h, 2);
  r.control_image = pattern_image(w, h, 3);
  spec.runs = {r, r};  // two runs (A1111 n_iter): each holds its copy
  return spec;
}

bool holds_pixels(const JobSpec& spec) {
  for (const GenerateRequest& r : spec.runs)
    for (const std::optional<Image>* im : {&r.init_image, &r.mask, &r.control_image})
      if (*im && !(*im)->rgb.empty()) return true;
  return false;
}

// Succeeded, failed or cancelled (queued, by the scheduler): the decoded inputs are gone, the
// fields the routes report (which inputs were given, their sizes) stay.
TEST(ServeRetention, FinishedJobsReleaseTheirInputPixels) {
  const size_t decoded = 2 * 3 * size_t{256} * 256 * 3;  // two runs of three 256² RGB images
  auto succeeded = std::make_shared<Job>(random_job_id(), image_spec(256, 256));
  auto failed = std::make_shared<Job>(random_job_id(), image_spec(256, 256));
  auto cancelled = std::make_shared<Job>(random_job_id(), image_spec(256, 256));
  EXPECT_TRUE(holds_pixels(succeeded->spec()));
  EXPECT_GE(succeeded->kept_bytes(), decoded);
  succeeded->mark_started();
  succeeded->finish_succeeded({EncodedImage{std::vector<uint8_t>(1000, 7), 1}}, {});
  failed->mark_started();
  failed->finish_failed(ApiError{500, "server_error", "generation failed: x", ""}, {});
  Scheduler scheduler(4, nullptr);
  ASSERT_EQ(scheduler.submit(cancelled), Admission::kAccepted);
  scheduler.cancel(cancelled, "cancelled by request");
  for (const auto& job : {succeeded, failed, cancelled}) {
    ASSERT_TRUE(is_final(job->snapshot().state));
    EXPECT_FALSE(holds_pixels(job->spec())) << state_name(job->snapshot().state);
    EXPECT_LT(job->kept_bytes(), size_t{16} << 10) << state_name(job->snapshot().state);
    const GenerateRequest& r = job->spec().runs.front();
    ASSERT_TRUE(r.init_image && r.mask && r.control_image);
    EXPECT_EQ(r.init_image->width, 256);
    EXPECT_EQ(r.mask->height, 256);
  }
  EXPECT_GE(succeeded->kept_bytes(), 1000u);  // its encoded image
}

// The byte budget counts everything a finished job keeps, not only its encoded images: three
// finished jobs keeping 400 KiB of prompt each under a 1 MiB budget leave two.
TEST(ServeRetention, ByteBudgetCountsWhatFinishedJobsKeep) {
  RetentionLimits lim;
  lim.max_bytes = size_t{1} << 20;
  JobTable table(lim);
  JobSpec spec;
  GenerateRequest r;
  r.prompts = {std::string(400 << 10, 'p')};
  spec.runs = {r};
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto job = table.create(spec);
    ids.push_back(job->id());
    job->finish_cancelled("test");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // distinct finish times
  }
  EXPECT_GT(table.finished_bytes(), lim.max_bytes);
  table.prune();
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(table.find(ids.front()), nullptr);
  EXPECT_NE(table.find(ids.back()), nullptr);
  EXPECT_LE(table.finished_bytes(), lim.max_bytes);
}

// Over HTTP: after an edits job (a 512² image and mask made into a 32² image) its spec keeps no
// decoded pixels, and the job table accounts only the encoded image and the texts.
TEST(ServeRetention, EditsJobKeepsNoDecodedPixels) {
  TestServer server;
  const std::string image = png_bytes(pattern_image(512, 512, 5));
  const std::string mask = png_bytes(pattern_image(512, 512, 9));
  const Reply r = post_form(server.port(), "/v1/images/edits",
                            {{"image", image, "in.png", "image/png"},
                             {"mask", mask, "mask.png", "image/png"},
                             {"prompt", "a cat", "", ""},
                             {"size", "32x32", "", ""},
                             {"num_inference_steps", "2", "", ""},
                             {"seed", "3", "", ""}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id = r.json().value("id", "");
  std::shared_ptr<Job> job = server.server().context().jobs.find(id);
  ASSERT_NE(job, nullptr) << id;
  ASSERT_TRUE(is_final(job->snapshot().state));
  const GenerateRequest& req = job->spec().runs.front();
  ASSERT_TRUE(req.init_image && req.mask);
  EXPECT_TRUE(req.init_image->rgb.empty());
  EXPECT_TRUE(req.mask->rgb.empty());
  EXPECT_EQ(req.init_image->width, 512);
  EXPECT_LT(job->kept_bytes(), job->image_bytes() + (size_t{16} << 10));
  EXPECT_LT(server.server().context().jobs.finished_bytes(), size_t{1} << 20);
}
}  // namespace
}  // namespace zimage::serve::test
