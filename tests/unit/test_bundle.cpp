// The bundle format and its per-user cache (src/io/fs/bundle.h, bundle_cache.h), which carry the CLI's
// built-in model: a folder survives packing and unpacking byte for byte; damaged bundles and
// damaged unpacked copies are errors that name the file, never crashes; the cache is unpacked
// once, replaced when damaged, shared by concurrent users, and falls back to a temporary folder
// that is removed when the cache cannot be written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_run.h"
#include "io/fs/bundle.h"
#include "io/fs/bundle_cache.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;
using test::read_file_bytes;

class BundleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("zimage_bundle_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "src" / "a" / "b");
    write(root_ / "src" / "top.json", "{\"x\": 1}");
    write(root_ / "src" / "empty", "");
    std::string big;
    for (int i = 0; i < 300000; ++i)
      big += std::to_string((static_cast<unsigned>(i) * 7919u) % 1000u) + ",";
    write(root_ / "src" / "a" / "b" / "big.bin", big);  // several zlib chunks
    auto packed = pack_folder((root_ / "src").string());
    ASSERT_TRUE(packed.ok()) << packed.status().to_string();
    bytes_ = *packed;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(root_, fs::perms::owner_all, ec);
    fs::remove_all(root_, ec);
  }
  static void write(const fs::path& p, const std::string& s) {
    std::ofstream(p, std::ios::binary) << s;
  }
  Bundle bundle() const {
    auto b = Bundle::parse(bytes_);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    return std::move(b).value();
  }
  void expect_same_tree(const fs::path& dir) const {
    for (const char* f : {"top.json", "empty", "a/b/big.bin"})
      EXPECT_EQ(read_file_bytes((dir / f).string()), read_file_bytes((root_ / "src" / f).string()))
          << f;
  }
  std::vector<std::string> entries(const fs::path& dir) const {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
    return names;
  }

  fs::path root_;
  std::string bytes_;
};

TEST_F(BundleTest, RoundTripsAFolder) {
  const Bundle b = bundle();
  ASSERT_EQ(b.files().size(), 3u);
  EXPECT_EQ(b.files()[0].path, "a/b/big.bin");  // sorted
  EXPECT_EQ(b.files()[1].path, "empty");
  EXPECT_LT(bytes_.size(), b.unpacked_bytes());  // compressed
  fs::create_directories(root_ / "out");
  ASSERT_TRUE(b.unpack((root_ / "out").string()).ok());
  expect_same_tree(root_ / "out");
  EXPECT_TRUE(b.verify((root_ / "out").string()).ok());
  auto again = pack_folder((root_ / "src").string());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, bytes_) << "packing is not deterministic";
}

TEST_F(BundleTest, DamagedBundlesAreErrors) {
  EXPECT_FALSE(Bundle::parse("").ok());
  EXPECT_FALSE(Bundle::parse("ZIBUNDL2" + bytes_.substr(8)).ok());
  for (size_t cut : {size_t{12}, size_t{20}, bytes_.size() - 1}) {
    auto b = Bundle::parse(std::string_view(bytes_).substr(0, cut));
    EXPECT_FALSE(b.ok()) << "cut at " << cut;
  }
  EXPECT_FALSE(Bundle::parse(bytes_ + "x").ok());  // trailing bytes
  std::string bad_path = bytes_;
  const size_t at = bad_path.find("a/b/big.bin");
  ASSERT_NE(at, std::string::npos);
  bad_path.replace(at, 4, "../.");
  auto p = Bundle::parse(bad_path);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("unsafe path"), std::string::npos);

  std::string damaged = bytes_;         // a flipped byte inside the last file's stream
  damaged[damaged.size() - 3] ^= 0x5a;  // top.json is last: its adler32
  auto d = Bundle::parse(damaged);
  ASSERT_TRUE(d.ok());  // the manifest is intact
  fs::create_directories(root_ / "out");
  const Status st = d->unpack((root_ / "out").string());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("top.json"), std::string::npos) << st.to_string();
}

TEST_F(BundleTest, VerifyNamesTheChangedFile) {
  const Bundle b = bundle();
  const fs::path out = root_ / "out";
  fs::create_directories(out);
  ASSERT_TRUE(b.unpack(out.string()).ok());
  write(out / "top.json", "{\"x\": 2}");  // same size, other bytes
  Status st = b.verify(out.string());
  EXPECT_EQ(st.code(), ErrorCode::kFormat);
  EXPECT_NE(st.message().find("top.json"), std::string::npos) << st.to_string();
  write(out / "top.json", "{\"x\": 1}");
  fs::resize_file(out / "a" / "b" / "big.bin", 100);
  st = b.verify(out.string());
  EXPECT_NE(st.message().find("big.bin: 100 bytes"), std::string::npos) << st.to_string();
  fs::remove(out / "a" / "b" / "big.bin");
  EXPECT_EQ(b.verify(out.string()).code(), ErrorCode::kNotFound);
}

TEST_F(BundleTest, PackRefusesLinks) {
  fs::create_symlink("/etc/passwd", root_ / "src" / "link");
  auto packed = pack_folder((root_ / "src").string());
  ASSERT_FALSE(packed.ok());
  EXPECT_NE(packed.status().message().find("link"), std::string::npos);
}

TEST_F(BundleTest, CacheIsUnpackedOnceAndReplacedWhenDamaged) {
  const Bundle b = bundle();
  const std::string cache = (root_ / "cache").string();
  std::string path;
  {
    auto f = unpack_cached(b, cache, "t-1");
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_FALSE(f->temporary());
    path = f->path();
    EXPECT_EQ(path, cache + "/zimage/t-1");
  }
  expect_same_tree(path);  // kept after the object is gone
  const auto mtime = fs::last_write_time(fs::path(path) / "top.json");
  {
    auto f = unpack_cached(b, cache, "t-1");
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->path(), path);
  }
  EXPECT_EQ(fs::last_write_time(fs::path(path) / "top.json"), mtime);  // not unpacked again
  write(fs::path(path) / "top.json", "{\"x\": 3}");
  {
    auto f = unpack_cached(b, cache, "t-1");
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->path(), path);
  }
  expect_same_tree(path);
  EXPECT_EQ(entries(root_ / "cache" / "zimage").size(), 1u);  // no temporary siblings left

  // What a killed process leaves behind is removed once it is an hour old, not before.
  const fs::path old_tmp = root_ / "cache" / "zimage" / ".t-1.tmp-AAAAAA";
  const fs::path new_tmp = root_ / "cache" / "zimage" / ".t-1.stale-BBBBBB";
  fs::create_directories(old_tmp / "sub");
  fs::create_directories(new_tmp);
  fs::last_write_time(old_tmp, fs::file_time_type::clock::now() - std::chrono::hours(2));
  ASSERT_TRUE(unpack_cached(b, cache, "t-1").ok());
  EXPECT_FALSE(fs::exists(old_tmp));
  EXPECT_TRUE(fs::exists(new_tmp));
}

TEST_F(BundleTest, UnwritableCacheUsesATemporaryFolderRemovedAfterUse) {
  const Bundle b = bundle();
  write(root_ / "blocker", "a file where the cache folder should be");
  std::string path;
  {
    auto f = unpack_cached(b, (root_ / "blocker").string(), "t-1");
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_TRUE(f->temporary());
    EXPECT_NE(f->note().find("blocker"), std::string::npos) << f->note();
    path = f->path();
    expect_same_tree(path);
  }
  EXPECT_FALSE(fs::exists(path)) << "temporary folder left behind";
  auto none = unpack_cached(b, "", "t-1");  // no cache at all
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->temporary());
  EXPECT_FALSE(unpack_cached(b, (root_ / "cache").string(), "../x").ok());
}

TEST_F(BundleTest, ConcurrentUsersShareOneFolder) {
  const Bundle b = bundle();
  const std::string cache = (root_ / "cache").string();
  std::vector<std::string> paths(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < paths.size(); ++i) {
    threads.emplace_back([&, i] {
      auto f = unpack_cached(b, cache, "t-1");
      paths[i] = f.ok() && !f->temporary() ? f->path() : "failed";
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& p : paths) EXPECT_EQ(p, cache + "/zimage/t-1");
  expect_same_tree(cache + "/zimage/t-1");
  EXPECT_EQ(entries(root_ / "cache" / "zimage").size(), 1u);
}

TEST(BundleCacheDir, FollowsXdgThenHome) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
  ::setenv("XDG_CACHE_HOME", "/x/cache", 1);
  ::setenv("HOME", "/h", 1);
  EXPECT_EQ(user_cache_dir(), "/x/cache");
  ::setenv("XDG_CACHE_HOME", "relative/cache", 1);  // ignored, as the XDG spec says
  EXPECT_EQ(user_cache_dir(), "/h/.cache");
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  EXPECT_EQ(user_cache_dir(), "");
  if (xdg) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  if (home) ::setenv("HOME", saved_home.c_str(), 1);
}

}  // namespace
}  // namespace zimage
