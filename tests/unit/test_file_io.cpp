// Files zimage reads and writes (io/fs/file_io.h), as the hardening run found them broken:
// - a failed write must not destroy anything: not the device node it was writing to (/dev/full
//   reports "no space" like a full disk), not the user's existing file; the error names the real
//   errno; a batch is written all or nothing;
// - a FIFO, a directory or a device where a file should be must give a clear error at once,
//   never a hang (an alarm kills the test process instead of letting it hang);
// - a truncated tokenizer.json says where the JSON ends, a directory says it is one.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "io/fs/file_io.h"
#include "io/fs/json_util.h"
#include "io/image/png.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"
#include "pipeline/tokenizer/tokenizer.h"
#include "zimage/zimage.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

class FileIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zimage_file_io_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string slurp(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  static void spit(const std::string& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
  }
  // Names in the folder: no temporary file may be left behind.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

// Incompressible pixels, so the PNG is about w*h*3 bytes.
Image noise_image(int w, int h) {
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  std::mt19937 gen(7);
  for (auto& b : img.rgb) b = static_cast<uint8_t>(gen());
  return img;
}

// Lowers the file-size limit for the scope (writes past it fail with EFBIG, as on a full disk);
// SIGXFSZ is ignored so the write returns the error instead of killing the process.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  sighandler_t old_handler_;
};

TEST_F(FileIo, NoSpaceOnADeviceIsReportedAndTheDeviceStays) {
  struct stat before {};
  ASSERT_EQ(stat("/dev/full", &before), 0) << "/dev/full is missing on this machine";
  ASSERT_TRUE(S_ISCHR(before.st_mode));
  const Status st = png_save("/dev/full", noise_image(16, 16));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kIo);
  EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.to_string();
  struct stat after {};
  ASSERT_EQ(stat("/dev/full", &after), 0) << "the device node was removed";
  EXPECT_TRUE(S_ISCHR(after.st_mode));
  EXPECT_EQ(after.st_rdev, before.st_rdev);
  // /dev/null is written in place (never replaced by a regular file).
  ASSERT_TRUE(png_save("/dev/null", noise_image(8, 8)).ok());
  struct stat null_st {};
  ASSERT_EQ(stat("/dev/null", &null_st), 0);
  EXPECT_TRUE(S_ISCHR(null_st.st_mode));
}

TEST_F(FileIo, FailedWriteKeepsTheExistingFileAndNamesTheError) {
  const std::string out = path("picture.png");
  spit(out, "the user's file");
  {
    FileSizeLimit limit(4096);
    const Status st = png_save(out, noise_image(128, 128));  // ~49 KB > 4 KiB
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), ErrorCode::kIo);
    EXPECT_NE(st.message().find("File too large"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find(out), std::string::npos) << st.to_string();
  }
  EXPECT_EQ(slurp(out), "the user's file");
  EXPECT_EQ(listing(), std::vector<std::string>{"picture.png"}) << "a temporary file was left";
}

TEST_F(FileIo, ReplacesAtomicallyKeepingModeAndSymlinks) {
  const std::string real = path("real.png");
  spit(real, "old");
  ASSERT_EQ(chmod(real.c_str(), 0640), 0);
  const std::string link = path("link.png");
  fs::create_symlink(real, link);
  ASSERT_TRUE(write_output_file(link, std::string_view("new contents")).ok());
  EXPECT_TRUE(fs::is_symlink(link)) << "the link itself was replaced";
  EXPECT_EQ(slurp(real), "new contents");
  struct stat st {};
  ASSERT_EQ(stat(real.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(listing(), (std::vector<std::string>{"link.png", "real.png"}));
}

TEST_F(FileIo, OutputThatIsAFolderIsAClearError) {
  fs::create_directories(path("sub"));
  const Status st = write_output_file(path("sub"), std::string_view("x"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("is a directory"), std::string::npos) << st.to_string();
  const Status chk = check_writable_path(path("sub"), "--output");
  EXPECT_EQ(chk.code(), ErrorCode::kInvalidArgument) << chk.to_string();
  const Status missing = check_writable_path(path("no/such/x.png"), "--output");
  EXPECT_EQ(missing.code(), ErrorCode::kInvalidArgument) << missing.to_string();
  EXPECT_NE(missing.message().find("does not exist"), std::string::npos) << missing.to_string();
  EXPECT_TRUE(check_writable_path(path("fine.png"), "--output").ok());
  EXPECT_EQ(listing(), std::vector<std::string>{"sub"}) << "the probe left a file";
}

TEST_F(FileIo, BatchIsWrittenAllOrNothing) {
  const std::string a = path("a.png"), b = path("b.png");
  spit(a, "old a");
  {
    FileSizeLimit limit(1000);
    const Status st = write_files_atomically(
        {a, b}, {std::vector<uint8_t>(10, 1), std::vector<uint8_t>(5000, 2)});
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("b.png"), std::string::npos) << st.to_string();
  }
  EXPECT_EQ(slurp(a), "old a") << "the first file was replaced although the batch failed";
  EXPECT_FALSE(fs::exists(b));
  EXPECT_EQ(listing(), std::vector<std::string>{"a.png"});
  ASSERT_TRUE(write_files_atomically({a, b}, {{1, 2}, {3}}).ok());
  EXPECT_EQ(slurp(a), std::string("\x01\x02", 2));
  EXPECT_EQ(slurp(b), std::string("\x03", 1));
}

TEST_F(FileIo, SafetensorsWriterReplacesOnlyOnFinish) {
  const std::string out = path("w.safetensors");
  spit(out, "previous");
  {
    auto w = SafetensorsWriter::create(out, {{"t", DType::kF32, {4}}});
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_TRUE((*w)->write("abcd", 4).ok());
    // dropped unfinished
  }
  EXPECT_EQ(slurp(out), "previous");
  EXPECT_EQ(listing(), std::vector<std::string>{"w.safetensors"});
}

// Every reader, given a FIFO with no writer: an error naming the FIFO, at once.
TEST_F(FileIo, FifoInputsFailAtOnce) {
  const std::string fifo = path("model.safetensors");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  alarm(30);  // a hang kills the test process (a failure), it does not hang the suite
  auto sf = SafetensorsFile::open(fifo);
  ASSERT_FALSE(sf.ok());
  EXPECT_NE(sf.status().message().find("FIFO"), std::string::npos) << sf.status().to_string();
  auto js = json_util::read_file(fifo, 1 << 20);
  ASSERT_FALSE(js.ok());
  EXPECT_NE(js.status().message().find("FIFO"), std::string::npos) << js.status().to_string();
  auto png = png_load(fifo);
  ASSERT_FALSE(png.ok());
  EXPECT_NE(png.status().message().find("FIFO"), std::string::npos) << png.status().to_string();
  auto tok = Tokenizer::load(fifo);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("FIFO"), std::string::npos) << tok.status().to_string();
  auto ws = WeightStore::open(fifo);
  ASSERT_FALSE(ws.ok());
  alarm(0);
}

TEST_F(FileIo, DirectoriesAndDevicesAreNamedForWhatTheyAre) {
  fs::create_directories(path("tok/tokenizer.json"));  // a folder where the file should be
  auto tok = Tokenizer::load(path("tok"));
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("is a directory"), std::string::npos)
      << tok.status().to_string();
  auto dev = read_input_file("/dev/zero", 100);
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().message().find("character device"), std::string::npos)
      << dev.status().to_string();
  auto missing = read_input_file(path("nothing"), 100);
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
}

TEST_F(FileIo, TruncatedTokenizerSaysWhereTheJsonEnds) {
  const std::string text = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [)";
  auto tok = Tokenizer::load_from_json(text, "tokenizer.json");
  ASSERT_FALSE(tok.ok());
  const std::string m = tok.status().message();
  EXPECT_EQ(m.find("not a JSON object"), std::string::npos) << m;
  EXPECT_NE(m.find("invalid JSON at byte"), std::string::npos) << m;
  EXPECT_NE(m.find("end of input"), std::string::npos) << m;
}

}  // namespace
}  // namespace zimage
