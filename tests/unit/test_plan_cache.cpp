// The on-disk plan cache (io/fs/plan_cache.h): hints survive a new process (a new PlanCache on the
// same folder), a file of another GPU / library version or a corrupt one is ignored and then
// replaced, forget() drops a wrong hint, ZIMAGE_PLAN_CACHE=off disables the cache.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "io/fs/plan_cache.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

TEST(PlanCache, HintsSurviveANewInstance) {
  const fs::path d = fresh_dir("zimage_plan_cache");
  {
    auto c = PlanCache::open(d.string(), "H200 sm_90 cudnn 91000");
    ASSERT_NE(c, nullptr);
    EXPECT_FALSE(c->get("conv,1,2").has_value());
    c->put("conv,1,2", 3);
    c->put("conv,4,5", 0);
    EXPECT_EQ(c->get("conv,1,2"), 3);
  }
  auto c = PlanCache::open(d.string(), "H200 sm_90 cudnn 91000");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->size(), 2u);
  EXPECT_EQ(c->get("conv,1,2"), 3);
  EXPECT_EQ(c->get("conv,4,5"), 0);
  c->forget("conv,1,2");
  EXPECT_FALSE(c->get("conv,1,2").has_value());
  auto again = PlanCache::open(d.string(), "H200 sm_90 cudnn 91000");
  EXPECT_EQ(again->size(), 1u);
  fs::remove_all(d);
}

TEST(PlanCache, AnotherIdentityIsNotSeen) {
  const fs::path d = fresh_dir("zimage_plan_cache_id");
  PlanCache::open(d.string(), "GPU A")->put("k", 7);
  auto b = PlanCache::open(d.string(), "GPU B");
  EXPECT_FALSE(b->get("k").has_value());
  // Two identities never share a file, so B's writes leave A's hints alone.
  b->put("k", 1);
  EXPECT_NE(b->path(), PlanCache::open(d.string(), "GPU A")->path());
  EXPECT_EQ(PlanCache::open(d.string(), "GPU A")->get("k"), 7);
  // A file whose recorded identity differs (copied over, hash collision) is ignored too.
  const std::string a_path = PlanCache::open(d.string(), "GPU A")->path();
  fs::copy_file(b->path(), a_path, fs::copy_options::overwrite_existing);
  EXPECT_FALSE(PlanCache::open(d.string(), "GPU A")->get("k").has_value());
  fs::remove_all(d);
}

TEST(PlanCache, CorruptFilesAreIgnoredAndReplaced) {
  const fs::path d = fresh_dir("zimage_plan_cache_bad");
  const std::string path = PlanCache::open(d.string(), "X")->path();
  fs::create_directories(d);
  for (const char* text : {"", "{", "[1,2]", "{\"identity\": 3, \"entries\": {}}",
                           "{\"identity\": \"X\", \"entries\": []}", "\x01\x02\xff garbage"}) {
    std::ofstream(path, std::ios::binary) << text;
    auto c = PlanCache::open(d.string(), "X");
    ASSERT_NE(c, nullptr) << text;
    EXPECT_EQ(c->size(), 0u) << text;
    c->put("k", 5);  // rewritten whole
    EXPECT_EQ(PlanCache::open(d.string(), "X")->get("k"), 5) << text;
  }
  // Entries of the wrong type are skipped, the others kept.
  std::ofstream(path) << R"({"identity": "X", "entries": {"a": 1, "b": "two", "c": 2.5}})";
  auto c = PlanCache::open(d.string(), "X");
  EXPECT_EQ(c->get("a"), 1);
  EXPECT_FALSE(c->get("b").has_value());
  EXPECT_FALSE(c->get("c").has_value());
  // A folder where the file should be: ignored, and put() fails quietly.
  fs::remove(path);
  fs::create_directories(path);
  auto f = PlanCache::open(d.string(), "X");
  ASSERT_NE(f, nullptr);
  f->put("k", 1);
  EXPECT_EQ(f->get("k"), 1);  // still served from memory
  fs::remove_all(d);
}

TEST(PlanCache, OffSwitch) {
  setenv("ZIMAGE_PLAN_CACHE", "off", 1);
  EXPECT_EQ(PlanCache::open(fresh_dir("zimage_plan_cache_off").string(), "X"), nullptr);
  unsetenv("ZIMAGE_PLAN_CACHE");
  EXPECT_NE(PlanCache::open(fresh_dir("zimage_plan_cache_off").string(), "X"), nullptr);
}

}  // namespace
}  // namespace zimage
