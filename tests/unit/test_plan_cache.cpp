// The on-disk plan cache (io/fs/plan_cache.h): hints survive a new process (a new PlanCache on the
// same folder), a file of another GPU / library version or a corrupt one is ignored and then
// replaced, forget() drops a wrong hint, processes filling the cache at once keep each other's
// entries, ZIMAGE_PLAN_CACHE=off disables the cache; compiled plans (blobs) round-trip per key
// and identity, and any damage to a blob file reads as no blob; keys() lists hints by prefix.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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
    c->put("conv,6,7", -2);  // conv_graph.cpp's hint: only runtime-compiled engines take it
    EXPECT_EQ(c->get("conv,1,2"), 3);
  }
  auto c = PlanCache::open(d.string(), "H200 sm_90 cudnn 91000");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->size(), 3u);
  EXPECT_EQ(c->get("conv,1,2"), 3);
  EXPECT_EQ(c->get("conv,4,5"), 0);
  EXPECT_EQ(c->get("conv,6,7"), -2) << "a negative hint survives as it is";
  c->forget("conv,6,7");
  c->forget("conv,1,2");
  EXPECT_FALSE(c->get("conv,1,2").has_value());
  auto again = PlanCache::open(d.string(), "H200 sm_90 cudnn 91000");
  EXPECT_EQ(again->size(), 1u);
  fs::remove_all(d);
}

TEST(PlanCache, KeysByPrefixInOrder) {
  const fs::path d = fresh_dir("zimage_plan_cache_keys");
  auto c = PlanCache::open(d.string(), "H200 sm_90 cudnn 91000");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->keys("conv,").empty());
  c->put("conv,2,1", 1);
  c->put("gemm,1", 0);
  c->put("conv,1,9", 2);
  c->put("conv", 5);     // not "conv," itself
  c->put("convx,1", 5);  // another prefix
  EXPECT_EQ(c->keys("conv,"), (std::vector<std::string>{"conv,1,9", "conv,2,1"}));
  EXPECT_EQ(c->keys("gemm,"), (std::vector<std::string>{"gemm,1"}));
  EXPECT_EQ(c->keys("").size(), 5u);
  c->forget("conv,1,9");
  EXPECT_EQ(c->keys("conv,"), (std::vector<std::string>{"conv,2,1"}));
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

// Two (here four) first runs at once, each with an empty cache, each learning its own entries:
// the file ends with all of them, not only the last writer's, and is valid throughout.
TEST(PlanCache, ConcurrentFirstRunsKeepEachOthersEntries) {
  const fs::path d = fresh_dir("zimage_plan_cache_conc");
  constexpr int kProcs = 4, kKeys = 30;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto c = PlanCache::open(d.string(), "GPU");
      for (int k = 0; k < kKeys; ++k) {
        c->put("p" + std::to_string(p) + "k" + std::to_string(k), p * 100 + k);
        // Another process's view of the file is always whole.
        if (!PlanCache::open(d.string(), "GPU")) _exit(2);
      }
      _exit(c->size() >= kKeys ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto c = PlanCache::open(d.string(), "GPU");
  EXPECT_EQ(c->size(), static_cast<size_t>(kProcs * kKeys));
  for (int p = 0; p < kProcs; ++p)
    for (int k = 0; k < kKeys; ++k)
      EXPECT_EQ(c->get("p" + std::to_string(p) + "k" + std::to_string(k)), p * 100 + k);
  fs::remove_all(d);
}

// A merge never brings back what this process forgot (a hint found wrong), a process learns the
// entries another wrote after it loaded, and a hint it only loaded never overwrites a newer one
// on disk: process A finds plan 3 wrong and learns plan 5; B, which loaded plan 3, then writes
// something else, and plan 5 stays.
TEST(PlanCache, MergesKeepTheNewestWordOnEachHint) {
  const fs::path d = fresh_dir("zimage_plan_cache_merge");
  PlanCache::open(d.string(), "GPU")->put("conv", 3);
  auto a = PlanCache::open(d.string(), "GPU");
  auto b = PlanCache::open(d.string(), "GPU");
  EXPECT_EQ(a->get("conv"), 3);
  EXPECT_EQ(b->get("conv"), 3);
  a->forget("conv");
  a->put("conv", 5);
  b->put("other", 1);  // b only loaded "conv": the file's newer 5 wins
  EXPECT_EQ(b->get("conv"), 5);
  EXPECT_EQ(PlanCache::open(d.string(), "GPU")->get("conv"), 5);
  EXPECT_EQ(PlanCache::open(d.string(), "GPU")->get("other"), 1);
  // A hint forgotten by one process is not written back by another that only loaded it.
  a->put("stale", 4);
  auto c = PlanCache::open(d.string(), "GPU");
  EXPECT_EQ(c->get("stale"), 4);
  a->forget("stale");
  c->put("more", 2);
  EXPECT_FALSE(PlanCache::open(d.string(), "GPU")->get("stale").has_value());
  EXPECT_FALSE(c->get("stale").has_value());
  // The process that forgot a value keeps it out when it writes again; a different value
  // another process learnt since is a new word, and kept.
  b->put("stale", 4);
  a->put("last", 3);
  EXPECT_FALSE(PlanCache::open(d.string(), "GPU")->get("stale").has_value());
  b->put("stale", 6);
  a->put("later", 7);
  EXPECT_EQ(PlanCache::open(d.string(), "GPU")->get("stale"), 6);
  EXPECT_EQ(a->get("stale"), 6);
  fs::remove_all(d);
}

// A cache left by an older library version (the identity names cuDNN's and cuBLASLt's versions)
// is stale: not used, and the new version's file is a separate one, so going back and forth
// between two installs never mixes their plans.
TEST(PlanCache, StaleVersionIsIgnoredAndTheOldFileLeftAlone) {
  const fs::path d = fresh_dir("zimage_plan_cache_stale");
  PlanCache::open(d.string(), "H200 sm_90 cudnn 91000 cublasLt 130000")->put("conv", 3);
  auto now = PlanCache::open(d.string(), "H200 sm_90 cudnn 91400 cublasLt 130000");
  EXPECT_EQ(now->size(), 0u);
  now->put("conv", 5);
  EXPECT_EQ(PlanCache::open(d.string(), "H200 sm_90 cudnn 91000 cublasLt 130000")->get("conv"), 3);
  EXPECT_EQ(PlanCache::open(d.string(), "H200 sm_90 cudnn 91400 cublasLt 130000")->get("conv"), 5);
  fs::remove_all(d);
}

TEST(PlanCache, OffSwitch) {
  setenv("ZIMAGE_PLAN_CACHE", "off", 1);
  EXPECT_EQ(PlanCache::open(fresh_dir("zimage_plan_cache_off").string(), "X"), nullptr);
  unsetenv("ZIMAGE_PLAN_CACHE");
  EXPECT_NE(PlanCache::open(fresh_dir("zimage_plan_cache_off").string(), "X"), nullptr);
}

// Compiled plans: a blob survives a new instance under its key and identity only; every kind of
// damage to its file (truncated, a flipped byte, another key's file put in its place, a bad
// header) reads as no blob, forget_blob removes it, and a new put replaces a damaged file.
TEST(PlanCache, BlobsRoundTripAndDamageReadsAsNone) {
  const fs::path d = fresh_dir("zimage_plan_cache_blob");
  std::vector<uint8_t> plan(70000);
  for (size_t i = 0; i < plan.size(); ++i) plan[i] = static_cast<uint8_t>(i * 131 + 7);
  const std::string id = "H200 sm_90 cudnn 91000";
  {
    auto c = PlanCache::open(d.string(), id);
    ASSERT_NE(c, nullptr);
    EXPECT_FALSE(c->get_blob("conv,1").has_value());
    c->put_blob("conv,1", plan);
    c->put_blob("conv,2", {1, 2, 3});
    c->put_blob("empty", {});
  }
  auto c = PlanCache::open(d.string(), id);
  ASSERT_EQ(c->get_blob("conv,1"), plan);
  EXPECT_EQ(c->get_blob("conv,2"), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(c->get_blob("empty"), std::vector<uint8_t>{});
  EXPECT_FALSE(PlanCache::open(d.string(), "another GPU")->get_blob("conv,1").has_value());

  // The blob files: one per key, in the folder beside the hint file.
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(d))
    if (e.path().extension() == ".plan") files.push_back(e.path());
  ASSERT_EQ(files.size(), 3u);
  fs::path one, two;
  for (const auto& f : files) {  // header line, key, payload, 8-byte checksum
    if (fs::file_size(f) > 60000) one = f;
    if (fs::file_size(f) == std::string("zimage-plan 1 6 3\n").size() + 6 + 3 + 8) two = f;
  }
  ASSERT_FALSE(one.empty());
  ASSERT_FALSE(two.empty());
  auto read = [](const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto write = [](const fs::path& f, const std::string& bytes) {
    std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
  };
  const std::string good = read(one);
  write(one, good.substr(0, good.size() - 100));  // truncated
  EXPECT_FALSE(c->get_blob("conv,1").has_value());
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x40;  // one byte of the payload
  write(one, flipped);
  EXPECT_FALSE(c->get_blob("conv,1").has_value());
  write(one, read(two));  // another key's file under this key's name
  EXPECT_FALSE(c->get_blob("conv,1").has_value());
  write(one, "zimage-plan 1 x y\n");  // a bad header
  EXPECT_FALSE(c->get_blob("conv,1").has_value());
  write(one, "");
  EXPECT_FALSE(c->get_blob("conv,1").has_value());
  c->put_blob("conv,1", plan);  // rewritten whole
  EXPECT_EQ(c->get_blob("conv,1"), plan);
  c->forget_blob("conv,1");
  EXPECT_FALSE(c->get_blob("conv,1").has_value());
  EXPECT_FALSE(fs::exists(one));
  fs::remove_all(d);
}

}  // namespace
}  // namespace zimage
