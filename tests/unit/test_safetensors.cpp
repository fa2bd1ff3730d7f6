// safetensors reader and writer: every corruption listed in docs/reliability.md must be refused
// with a message naming the file and the problem, both from a byte buffer (the fuzzer's entry
// point) and from a file on disk; valid files round-trip through the writer bit for bit.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/weights/safetensors.h"

using namespace zimage;

namespace {

// A file image: 8-byte little-endian length, the header text, then `data_bytes` data bytes
// (value = index & 0xff).
std::string image(const std::string& header, size_t data_bytes, uint64_t length_override = 0,
                  bool override_length = false) {
  std::string out(8, '\0');
  const uint64_t n = override_length ? length_override : header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out += static_cast<char>(i & 0xff);
  return out;
}

Result<SafetensorsHeader> parse(const std::string& bytes, const std::string& name) {
  return parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                  name);
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zimage_st_XXXXXX").string();
    if (::mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(file(name), std::ios::binary) << bytes;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const std::string kF32x3 = R"("dtype":"F32","shape":[3])";

struct BadCase {
  const char* label;
  std::string bytes;
  const char* expect;  // substring of the message after "<file>: "
};

std::vector<BadCase> bad_cases() {
  const std::string ok_entry = R"({"w":{)" + kF32x3 + R"(,"data_offsets":[0,12]}})";
  std::vector<BadCase> c;
  c.push_back({"empty file", "", "file is empty"});
  c.push_back({"truncated length prefix", std::string("\x10\x00\x00", 3), "too short"});
  c.push_back({"huge header length", image("{}", 0, uint64_t{1} << 40, true), "exceeds the limit"});
  c.push_back({"length just over limit", image("{}", 0, kMaxSafetensorsHeaderBytes + 1, true),
               "exceeds the limit"});
  c.push_back({"length of all ones", image("{}", 0, ~uint64_t{0}, true), "exceeds the limit"});
  c.push_back({"header past EOF", image("{}", 0, 50, true), "exceeds the file size"});
  c.push_back({"zero header length", image("", 4), "does not start with '{'"});
  c.push_back({"JSON array", image("[1, 2]", 0), "does not start with '{'"});
  c.push_back({"leading space", image(" {}", 0), "does not start with '{'"});
  c.push_back({"not JSON", image("{this is not json}", 0), "invalid JSON"});
  c.push_back({"unterminated object", image("{\"w\":", 0), "invalid JSON"});
  c.push_back({"garbage after object", image("{} {}", 0), "invalid JSON"});
  c.push_back({"NUL padding", image(std::string("{}\0\0", 4), 0), "invalid JSON"});
  c.push_back({"invalid UTF-8 in key", image("{\"w\xff\":{}}", 0), "UTF-8"});
  c.push_back({"duplicate tensor",
               image(R"({"w":{)" + kF32x3 + R"(,"data_offsets":[0,12]},)" + R"("w":{)" + kF32x3 +
                         R"(,"data_offsets":[12,24]}})",
                     24),
               "duplicate key 'w'"});
  c.push_back(
      {"duplicate field",
       image(R"({"w":{"dtype":"F32","dtype":"F16","shape":[3],"data_offsets":[0,12]}})", 12),
       "duplicate key 'dtype' in object 'w'"});
  c.push_back({"unknown dtype",
               image(R"({"w":{"dtype":"Q4_K","shape":[3],"data_offsets":[0,12]}})", 12),
               "tensor 'w': unknown dtype 'Q4_K'"});
  c.push_back({"dtype not a string",
               image(R"({"w":{"dtype":4,"shape":[3],"data_offsets":[0,12]}})", 12),
               "tensor 'w': dtype is a integer"});
  c.push_back({"negative dim",
               image(R"({"w":{"dtype":"F32","shape":[-3],"data_offsets":[0,12]}})", 12),
               "tensor 'w': negative dimension -3"});
  c.push_back({"fractional dim",
               image(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
               "shape[0] is 1.5"});
  c.push_back({"shape not a list",
               image(R"({"w":{"dtype":"F32","shape":"3","data_offsets":[0,12]}})", 12),
               "shape is a string"});
  c.push_back(
      {"shape overflow",
       image(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,12]}})", 12),
       "too many elements (overflow)"});
  c.push_back(
      {"byte size overflow",
       image(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8),
       "too many bytes (overflow)"});
  c.push_back(
      {"dim beyond int64",
       image(R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]}})", 1),
       "is too large"});
  c.push_back({"offsets reversed",
               image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[12,0]}})", 12),
               "tensor 'w': data_offsets [12, 0] are reversed"});
  c.push_back({"offsets wrong arity",
               image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12,24]}})", 12),
               "expected [begin, end]"});
  c.push_back({"negative offset",
               image(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[-1,-1]}})", 0),
               "must be two non-negative integers"});
  c.push_back({"size mismatch",
               image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,10]}})", 10),
               "tensor 'w': data_offsets [0, 10] but shape [3] of F32 needs 12 bytes"});
  c.push_back({"hole between tensors",
               image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                     12),
               "hole of 4 bytes in the data section before tensor 'b'"});
  c.push_back({"data not starting at 0",
               image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               "hole of 4 bytes in the data section before tensor 'a'"});
  c.push_back({"overlapping tensors",
               image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                     12),
               "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a'"});
  c.push_back({"aliased tensors",
               image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                     R"("b":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})",
                     12),
               "overlaps tensor"});
  c.push_back(
      {"trailing bytes", image(ok_entry, 16), "data section is 16 bytes but the tensors cover 12"});
  c.push_back({"data past end", image(ok_entry, 8), "extend past the data section of 8 bytes"});
  c.push_back({"missing dtype", image(R"({"w":{"shape":[3],"data_offsets":[0,12]}})", 12),
               "tensor 'w': missing field 'dtype'"});
  c.push_back({"missing shape", image(R"({"w":{"dtype":"F32","data_offsets":[0,12]}})", 12),
               "tensor 'w': missing field 'shape'"});
  c.push_back({"missing offsets", image(R"({"w":{"dtype":"F32","shape":[3]}})", 12),
               "tensor 'w': missing field 'data_offsets'"});
  c.push_back({"extra field",
               image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12],"offset":0}})", 12),
               "tensor 'w': unexpected field 'offset'"});
  c.push_back(
      {"entry not an object", image(R"({"w":[1,2,3]})", 0), "tensor 'w': entry is a array"});
  c.push_back({"metadata value not a string", image(R"({"__metadata__":{"format":1}})", 0),
               "'__metadata__' value of key 'format' is a integer"});
  c.push_back({"metadata not an object", image(R"({"__metadata__":["pt"]})", 0),
               "'__metadata__' is a array"});
  c.push_back({"deep nesting",
               image("{\"__metadata__\":" + std::string(100, '[') + std::string(100, ']') + "}", 0),
               "nested deeper than 64"});
  return c;
}

void expect_bad(const Result<SafetensorsHeader>& r, const std::string& file, const BadCase& c) {
  ASSERT_FALSE(r.ok()) << c.label;
  EXPECT_EQ(r.status().code(), ErrorCode::kFormat) << c.label;
  const std::string& m = r.status().message();
  EXPECT_EQ(m.rfind(file + ": ", 0), 0u) << c.label << ": " << m;
  EXPECT_NE(m.find(c.expect), std::string::npos)
      << c.label << ": expected \"" << c.expect << "\" in: " << m;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

}  // namespace

TEST(Safetensors, CorruptHeadersFromBufferAreNamedErrors) {
  const auto cases = bad_cases();
  ASSERT_GE(cases.size(), 20u);
  for (const BadCase& c : cases)
    expect_bad(parse(c.bytes, "bad.safetensors"), "bad.safetensors", c);
}

TEST(Safetensors, CorruptFilesOnDiskAreNamedErrors) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  int i = 0;
  for (const BadCase& c : bad_cases()) {
    const std::string name = "case" + std::to_string(i++) + ".safetensors";
    dir.write(name, c.bytes);
    auto r = SafetensorsFile::open(dir.file(name));
    ASSERT_FALSE(r.ok()) << c.label;
    EXPECT_EQ(r.status().code(), ErrorCode::kFormat) << c.label;
    EXPECT_EQ(r.status().message().rfind(dir.file(name) + ": ", 0), 0u) << r.status().message();
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().message();
  }
}

TEST(Safetensors, SizeMismatchMessageIsExact) {
  auto r = parse(image(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,10]}})", 10),
                 "model.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(
      r.status().message(),
      "model.safetensors: tensor 'x': data_offsets [0, 10] but shape [3] of F32 needs 12 bytes");
}

TEST(Safetensors, ErrorMessagesEscapeHostileNames) {
  // A terminal escape inside a (valid JSON) tensor name, and a raw invalid UTF-8 byte.
  auto esc =
      parse(image(R"({"a\u001b[2Jb":{"dtype":"F32","shape":[3],"data_offsets":[0,10]}})", 10),
            "x.safetensors");
  ASSERT_FALSE(esc.ok());
  EXPECT_EQ(esc.status().message().find('\x1b'), std::string::npos);
  EXPECT_NE(esc.status().message().find("tensor 'a\\x1b[2Jb'"), std::string::npos)
      << esc.status().message();
  auto bad_utf8 = parse(image("{\"w\xff\":{}}", 0), "x.safetensors");
  ASSERT_FALSE(bad_utf8.ok());
  EXPECT_EQ(bad_utf8.status().message().find('\xff'), std::string::npos);
  // Valid UTF-8 is kept as is.
  auto utf8 = parse(image(R"({"wü":{"dtype":"F32","shape":[3],"data_offsets":[0,10]}})", 10), "x");
  ASSERT_FALSE(utf8.ok());
  EXPECT_NE(utf8.status().message().find("tensor 'wü'"), std::string::npos);
}

TEST(Safetensors, AcceptsValidEdgeCases) {
  // Whitespace padding, null metadata, zero-size tensors sharing an offset, a scalar, no tensors.
  auto r =
      parse(image(R"({"__metadata__":null,"e":{"dtype":"BF16","shape":[0,5],"data_offsets":[0,0]},)"
                  R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                  R"("z":{"dtype":"U8","shape":[2,0],"data_offsets":[4,4]}}    )",
                  4),
            "ok.safetensors");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tensors.size(), 3u);
  EXPECT_EQ(r->tensors[0].name, "e");  // data order, then name
  EXPECT_EQ(r->tensors[1].name, "s");
  EXPECT_EQ(r->tensors[1].shape, Shape{});
  EXPECT_EQ(r->tensors[2].begin, 4u);
  EXPECT_TRUE(r->metadata.empty());
  EXPECT_TRUE(parse(image("{}", 0), "empty.safetensors").ok());
  auto big =
      parse(image(R"({"w":{"dtype":"F8_E4M3","shape":[2,3],"data_offsets":[0,6]}})", 6), "x");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->tensors[0].dtype, DType::kF8E4M3);
  EXPECT_EQ(big->data_start, 8 + big->header_bytes);
  EXPECT_EQ(big->data_bytes, 6u);
}

TEST(Safetensors, OpenMissingFileAndDirectory) {
  TempDir dir;
  auto missing = SafetensorsFile::open(dir.file("nope.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.safetensors: no such file"), std::string::npos);
  auto d = SafetensorsFile::open(dir.path());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("not a regular file"), std::string::npos);
}

TEST(Safetensors, RoundTripAllDtypesThroughWriter) {
  TempDir dir;
  Tensor f32 = Tensor::host(DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) f32.data_as<float>()[i] = 0.5f * i - 1.0f;
  Tensor bf16 = Tensor::host(DType::kBF16, {4});
  for (int i = 0; i < 4; ++i) bf16.data_as<uint16_t>()[i] = f32_to_bf16(3.25f * i);
  Tensor fp8 = Tensor::host(DType::kF8E4M3, {3, 1});
  for (int i = 0; i < 3; ++i) fp8.data_as<uint8_t>()[i] = f32_to_f8e4m3(-448.0f + 100 * i);
  Tensor i64 = Tensor::host(DType::kI64, {2});
  i64.data_as<int64_t>()[0] = -7;
  i64.data_as<int64_t>()[1] = int64_t{1} << 40;
  Tensor empty = Tensor::host(DType::kF16, {0, 4});
  Tensor scalar = Tensor::host(DType::kF64, {});
  *scalar.data_as<double>() = 2.5;
  Tensor u8 = Tensor::host(DType::kU8, {5});  // odd size: later tensors must still be aligned
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"a.f32", f32}, {"b.bf16", bf16},   {"c.fp8", fp8},      {"d.u8", u8},
      {"e.i64", i64}, {"f.empty", empty}, {"g.scalar", scalar}};
  const std::string path = dir.file("rt.safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}, {"note", "ü"}}).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));

  auto opened = SafetensorsFile::open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto file = *opened;
  EXPECT_EQ(file->header().header_bytes % 8, 0u);
  EXPECT_EQ(file->metadata().at("note"), "ü");
  EXPECT_EQ(file->tensors().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    auto got = file->tensor(name);
    ASSERT_TRUE(got.ok()) << name;
    EXPECT_EQ(got->dtype(), t.dtype()) << name;
    EXPECT_EQ(got->shape(), t.shape()) << name;
    EXPECT_EQ(bytes_of(*got), bytes_of(t)) << name;
  }
  auto missing = file->tensor("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("rt.safetensors: no tensor named 'nope'"),
            std::string::npos);
}

TEST(Safetensors, ViewsAreZeroCopyAndKeepTheMappingAlive) {
  TempDir dir;
  Tensor t = Tensor::host(DType::kF32, {1024});
  for (int i = 0; i < 1024; ++i) t.data_as<float>()[i] = static_cast<float>(i);
  const std::string path = dir.file("big.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"w", t}}).ok());
  Tensor view;
  {
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.ok());
    auto v = (*file)->tensor("w");
    auto v2 = (*file)->tensor("w");
    ASSERT_TRUE(v.ok() && v2.ok());
    EXPECT_EQ(v->data(), v2->data());  // both point into the mapping: no copies
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data()) % 64,
              (8 + (*file)->header().header_bytes) % 64);
    view = *v;
  }  // the file object is gone; the view's storage still holds the mapping
  std::filesystem::remove(path);
  EXPECT_EQ(view.data_as<float>()[1023], 1023.0f);
}

TEST(Safetensors, MisalignedDataIsCopiedToAlignedMemory) {
  // A hand-written header of odd length puts the F32 data at an odd file offset.
  TempDir dir;
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  if ((8 + header.size()) % 4 == 0) header += " ";
  std::string bytes = image(header, 0);
  const float vals[2] = {1.5f, -2.0f};
  bytes.append(reinterpret_cast<const char*>(vals), 8);
  dir.write("odd.safetensors", bytes);
  auto file = SafetensorsFile::open(dir.file("odd.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto t = (*file)->tensor("w");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % 4, 0u);
  EXPECT_EQ(t->data_as<float>()[0], 1.5f);
  EXPECT_EQ(t->data_as<float>()[1], -2.0f);
}

TEST(Safetensors, StreamingWriterMatchesOneShotWriter) {
  TempDir dir;
  Tensor a = Tensor::host(DType::kBF16, {3, 5});
  Tensor b = Tensor::host(DType::kF32, {7});
  for (int i = 0; i < 15; ++i) a.data_as<uint16_t>()[i] = static_cast<uint16_t>(i * 977);
  for (int i = 0; i < 7; ++i) b.data_as<float>()[i] = i * 0.25f;
  ASSERT_TRUE(write_safetensors(dir.file("one.safetensors"), {{"a", a}, {"b", b}}).ok());

  auto w = SafetensorsWriter::create(dir.file("stream.safetensors"),
                                     {{"a", DType::kBF16, {3, 5}}, {"b", DType::kF32, {7}}});
  ASSERT_TRUE(w.ok());
  // Chunks that do not line up with tensor boundaries.
  std::string all(static_cast<const char*>(a.data()), a.nbytes());
  all.append(static_cast<const char*>(b.data()), b.nbytes());
  for (size_t off = 0; off < all.size(); off += 7) {
    ASSERT_TRUE((*w)->write(all.data() + off, std::min<size_t>(7, all.size() - off)).ok());
  }
  EXPECT_EQ((*w)->remaining(), 0u);
  ASSERT_TRUE((*w)->finish().ok());
  std::ifstream f1(dir.file("one.safetensors"), std::ios::binary);
  std::ifstream f2(dir.file("stream.safetensors"), std::ios::binary);
  const std::string s1((std::istreambuf_iterator<char>(f1)), {});
  const std::string s2((std::istreambuf_iterator<char>(f2)), {});
  EXPECT_FALSE(s1.empty());
  EXPECT_EQ(s1, s2);
}

TEST(Safetensors, WriterRejectsMisuse) {
  TempDir dir;
  // Too few bytes: finish fails and nothing appears at the path.
  {
    auto w = SafetensorsWriter::create(dir.file("short.safetensors"), {{"a", DType::kF32, {4}}});
    ASSERT_TRUE(w.ok());
    const float x[2] = {1, 2};
    ASSERT_TRUE((*w)->write(x, 8).ok());
    Status s = (*w)->finish();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("8 of 16 data bytes unwritten"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("short.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("short.safetensors.partial")));
  // Too many bytes.
  {
    auto w = SafetensorsWriter::create(dir.file("long.safetensors"), {{"a", DType::kU8, {2}}});
    ASSERT_TRUE(w.ok());
    EXPECT_FALSE((*w)->write("abc", 3).ok());
  }
  // Duplicate names, reserved name, invalid UTF-8, negative dims, device tensors.
  auto dup = SafetensorsWriter::create(dir.file("d.safetensors"),
                                       {{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("tensor 'a' is listed twice"), std::string::npos);
  EXPECT_FALSE(
      SafetensorsWriter::create(dir.file("m.safetensors"), {{"__metadata__", DType::kU8, {1}}})
          .ok());
  auto utf = SafetensorsWriter::create(dir.file("u.safetensors"), {{"bad\xff", DType::kU8, {1}}});
  ASSERT_FALSE(utf.ok());
  EXPECT_NE(utf.status().message().find("UTF-8"), std::string::npos);
  EXPECT_FALSE(
      SafetensorsWriter::create(dir.file("n.safetensors"), {{"a", DType::kU8, {-1}}}).ok());
  EXPECT_FALSE(write_safetensors(dir.file("x.safetensors"), {{"a", Tensor()}}).ok());
  EXPECT_FALSE(write_safetensors(dir.path() + "/no/such/dir/x.safetensors",
                                 {{"a", Tensor::host(DType::kU8, {1})}})
                   .ok());
}

TEST(Safetensors, ReadsUpstreamWrittenGoldenFile) {
  // Written by the Python safetensors library (the golden v_turbo text encoder).
  const std::string path =
      std::string(ZIMAGE_GOLDEN_DIR) + "/v_turbo/model/text_encoder/model.safetensors";
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const SafetensorsTensorInfo* emb = (*file)->find("embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kBF16);
  EXPECT_EQ(emb->shape, (Shape{151936, 32}));
  uint64_t sum = 0;
  for (const auto& t : (*file)->tensors()) sum += t.nbytes();
  EXPECT_EQ(sum, (*file)->header().data_bytes);
  EXPECT_EQ((*file)->header().data_start + (*file)->header().data_bytes, (*file)->file_size());
}
