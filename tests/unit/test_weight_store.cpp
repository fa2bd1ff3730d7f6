// WeightStore: the golden folders (sharded v_batch, single-file v_turbo) open and agree with their
// index files; every inconsistency between an index and its shards is an error naming the file and
// the tensors; used-name tracking and prefix stripping behave as the model loaders expect.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/fs/json_util.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"
#include "model/common/load_util.h"

using namespace zimage;

namespace {

std::string golden_model(const std::string& name) {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/" + name + "/model";
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zimage_ws_XXXXXX").string();
    if (::mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void write_text(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
  }
  // A shard with one small F32 tensor [2] per name.
  void write_shard(const std::string& name, const std::vector<std::string>& tensors) const {
    std::vector<std::pair<std::string, Tensor>> ts;
    for (const std::string& t : tensors) ts.emplace_back(t, Tensor::host(DType::kF32, {2}));
    ASSERT_TRUE(write_safetensors(file(name), ts).ok());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void expect_error(const Result<WeightStore>& r, ErrorCode code,
                  const std::vector<std::string>& parts) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().message();
  for (const std::string& p : parts) {
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "expected \"" << p << "\" in: " << r.status().message();
  }
}

}  // namespace

TEST(WeightStore, OpensShardedGoldenComponentsAndMatchesIndexMetadata) {
  for (const char* comp : {"transformer", "text_encoder", "vae"}) {
    const std::string dir = golden_model("v_batch") + "/" + comp;
    auto store = WeightStore::open(dir);
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    const std::string index = std::string(comp) == "text_encoder"
                                  ? "model.safetensors.index.json"
                                  : "diffusion_pytorch_model.safetensors.index.json";
    auto idx = json_util::read_file(dir + "/" + index);
    ASSERT_TRUE(idx.ok());
    EXPECT_EQ(store->size(), (*idx)["weight_map"].size()) << comp;
    EXPECT_EQ(store->total_bytes(), (*idx)["metadata"]["total_size"].get<size_t>()) << comp;
    EXPECT_EQ(store->files().size(), 2u) << comp;
    EXPECT_GT(store->file_bytes(), store->total_bytes());
    auto names = store->names();
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    for (const auto& [name, shard] : (*idx)["weight_map"].items()) {
      auto info = store->info(name);
      ASSERT_TRUE(info.ok()) << name;
      EXPECT_EQ(std::filesystem::path(info->file).filename().string(), shard.get<std::string>());
      auto t = store->get(name);
      ASSERT_TRUE(t.ok()) << name;
      EXPECT_EQ(t->dtype(), DType::kBF16);
    }
    EXPECT_TRUE(store->unused_names().empty());
  }
  auto te = WeightStore::open(golden_model("v_batch") + "/text_encoder");
  ASSERT_TRUE(te.ok());
  EXPECT_EQ(te->total_params(), 4880576);  // the index's total_parameters
}

TEST(WeightStore, SingleFileGoldenFolderAndDirectFileAgree) {
  const std::string dir = golden_model("v_turbo") + "/transformer";
  auto by_dir = WeightStore::open(dir);
  auto by_file = WeightStore::open(dir + "/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(by_dir.ok()) << by_dir.status().to_string();
  ASSERT_TRUE(by_file.ok()) << by_file.status().to_string();
  EXPECT_EQ(by_dir->names(), by_file->names());
  EXPECT_EQ(by_dir->total_params(), by_file->total_params());
  EXPECT_GT(by_dir->size(), 10u);
  EXPECT_EQ(by_dir->dtype_counts().at(DType::kBF16), by_dir->size());
  // Same model saved sharded (v_batch) has the same tensor names.
  auto sharded = WeightStore::open(golden_model("v_batch") + "/transformer");
  ASSERT_TRUE(sharded.ok());
  EXPECT_EQ(sharded->names(), by_dir->names());
}

TEST(WeightStore, TracksUnusedNamesAcrossCopiesAndChecksShapes) {
  auto store = WeightStore::open(golden_model("v_turbo") + "/vae");
  ASSERT_TRUE(store.ok());
  const size_t n = store->size();
  WeightStore copy = *store;
  auto names = store->names();
  ASSERT_GE(names.size(), 3u);
  auto t0 = copy.get(names[0]);
  ASSERT_TRUE(t0.ok());
  EXPECT_EQ(store->unused_names().size(), n - 1);  // the copy's get() counts for the original
  auto ok = store->get(names[1], store->info(names[1])->shape);
  EXPECT_TRUE(ok.ok());
  auto bad = store->get(names[2], Shape{1, 2, 3});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kFormat);
  EXPECT_NE(bad.status().message().find("tensor '" + names[2] + "' has shape"), std::string::npos);
  EXPECT_NE(bad.status().message().find("expected [1, 2, 3]"), std::string::npos);
  auto missing = store->get("no.such.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("vae: no tensor named 'no.such.weight'"),
            std::string::npos);
  const auto unused = store->unused_names();
  EXPECT_EQ(unused.size(), n - 3);
  EXPECT_EQ(std::count(unused.begin(), unused.end(), names[0]), 0);
}

TEST(WeightStore, StripPrefix) {
  TempDir dir;
  dir.write_shard("model.safetensors", {"model.a", "model.b", "c"});
  auto store = WeightStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  ASSERT_TRUE(store->get("model.a").ok());
  ASSERT_TRUE(store->strip_prefix("model.").ok());
  EXPECT_EQ(store->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(store->get("b").ok());  // still reads the original tensor
  EXPECT_EQ(store->unused_names(), std::vector<std::string>{"c"});

  TempDir dir2;
  dir2.write_shard("model.safetensors", {"model.a", "a"});
  auto clash = WeightStore::open(dir2.path());
  ASSERT_TRUE(clash.ok());
  Status s = clash->strip_prefix("model.");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("makes two tensors named 'a'"), std::string::npos);
  EXPECT_EQ(clash->names(), (std::vector<std::string>{"a", "model.a"}));  // unchanged
}

TEST(WeightStore, ShardedFolderErrorsNameTheProblem) {
  const std::string kIndex = "w.safetensors.index.json";
  auto index = [](const std::string& weight_map) {
    return R"({"metadata": {"total_size": 16}, "weight_map": )" + weight_map + "}";
  };
  {  // a listed shard does not exist
    TempDir d;
    d.write_shard("s1.safetensors", {"a"});
    d.write_text(kIndex, index(R"({"a": "s1.safetensors", "b": "s2.safetensors"})"));
    expect_error(WeightStore::open(d.path()), ErrorCode::kNotFound,
                 {kIndex, "shard 's2.safetensors'", "'b'", "does not exist"});
  }
  {  // the index lists a tensor the shard lacks
    TempDir d;
    d.write_shard("s1.safetensors", {"a"});
    d.write_text(kIndex, index(R"({"a": "s1.safetensors", "ghost": "s1.safetensors"})"));
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat,
                 {"s1.safetensors", "are missing", "'ghost'"});
  }
  {  // the shard has a tensor the index does not list
    TempDir d;
    d.write_shard("s1.safetensors", {"a", "extra"});
    d.write_text(kIndex, index(R"({"a": "s1.safetensors"})"));
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat,
                 {"s1.safetensors", "not listed in " + kIndex, "'extra'"});
  }
  {  // a tensor sits in a different shard than the index says
    TempDir d;
    d.write_shard("s1.safetensors", {"a", "b"});
    d.write_shard("s2.safetensors", {"b"});
    d.write_text(kIndex, index(R"({"a": "s1.safetensors", "b": "s2.safetensors"})"));
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat,
                 {"s1.safetensors", "holds tensor 'b'", "assigns it to 's2.safetensors'"});
  }
  for (const char* evil : {"../s1.safetensors", "/etc/passwd", "sub/s1.safetensors", "..",
                           "a\\\\b.safetensors", ""}) {  // shard names leaving the folder
    TempDir d;
    d.write_shard("s1.safetensors", {"a"});
    d.write_text(kIndex, index(std::string(R"({"a": ")") + evil + "\"}"));
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat,
                 {kIndex, "tensor 'a'", "is not a plain file name"});
  }
  {  // the index is not valid JSON / not the right shape
    TempDir d;
    d.write_shard("s1.safetensors", {"a"});
    d.write_text(kIndex, "{\"weight_map\": {\"a\": \"s1.safetensors\"");
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat, {kIndex, "invalid JSON"});
    d.write_text(kIndex, R"({"weight_map": ["s1.safetensors"]})");
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat, {"'weight_map' is a array"});
    d.write_text(kIndex, R"({"weight_map": {"a": 3}})");
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat, {"entry 'a' is a integer"});
    d.write_text(kIndex, R"({"metadata": {}})");
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat, {"'weight_map' is missing"});
    d.write_text(kIndex, R"({"weight_map": {"a": "s1.safetensors", "a": "s1.safetensors"}})");
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat, {"duplicate key 'a'"});
  }
  {  // a corrupt shard is reported with its own path
    TempDir d;
    d.write_text("s1.safetensors", std::string("\x02\0\0\0\0\0\0\0[]", 10));
    d.write_text(kIndex, index(R"({"a": "s1.safetensors"})"));
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat,
                 {d.file("s1.safetensors"), "does not start with '{'"});
  }
}

TEST(WeightStore, FolderLayoutErrors) {
  {
    TempDir d;
    expect_error(WeightStore::open(d.path()), ErrorCode::kNotFound, {"no *.safetensors file"});
    d.write_shard("a.safetensors", {"x"});
    d.write_shard("b.safetensors", {"y"});
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat,
                 {"2 .safetensors files", "'a.safetensors'", "no *.safetensors.index.json"});
    d.write_text("one.safetensors.index.json", R"({"weight_map": {"x": "a.safetensors"}})");
    d.write_text("two.safetensors.index.json", R"({"weight_map": {"y": "b.safetensors"}})");
    expect_error(WeightStore::open(d.path()), ErrorCode::kFormat, {"several weight index files"});
  }
  expect_error(WeightStore::open("/nonexistent/zimage/folder"), ErrorCode::kNotFound,
               {"/nonexistent/zimage/folder: no such file or folder"});
}

// Computed tensors (GGUF / scaled FP8 dequantisation, LoRA merges, fused-tensor parts): made on
// get(), checked against what they declared, counted in the totals; transform() wraps the current
// value; rename/remove/absorb keep names unique.
TEST(WeightStore, ComputedTransformedRenamedAndAbsorbedTensors) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  dir.write_shard("a.safetensors", {"base", "other"});
  auto opened = WeightStore::open(dir.file("a.safetensors"));
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  WeightStore ws = std::move(opened).value();

  ComputedWeight cw;
  cw.info = WeightInfo{DType::kF32, {3}, "made.gguf"};
  cw.stored_bytes = 5;
  cw.make = []() -> Result<Tensor> {
    Tensor t = Tensor::host(DType::kF32, {3});
    for (int i = 0; i < 3; ++i) t.data_as<float>()[i] = 1.5f * static_cast<float>(i);
    return t;
  };
  ASSERT_TRUE(ws.add_computed("made", cw).ok());
  EXPECT_EQ(ws.add_computed("base", cw).code(), ErrorCode::kFormat);  // names stay unique
  auto made = ws.get("made", {3});
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  EXPECT_EQ(made->data_as<float>()[2], 3.0f);
  EXPECT_EQ(ws.info("made")->file, "made.gguf");
  EXPECT_EQ(ws.total_bytes(), 2 * 8 + 5u);
  EXPECT_EQ(ws.total_params(), 2 * 2 + 3);

  // A maker whose result differs from its declaration is an internal error, not a wrong tensor.
  ComputedWeight liar = cw;
  liar.info.shape = {4};
  ASSERT_TRUE(ws.add_computed("liar", liar).ok());
  EXPECT_EQ(ws.get("liar").status().code(), ErrorCode::kInternal);
  ASSERT_TRUE(ws.remove("liar").ok());
  EXPECT_EQ(ws.remove("liar").code(), ErrorCode::kNotFound);

  // transform: base (zeros written by write_shard? contents unspecified) -> base * 0 + 7.
  ASSERT_TRUE(ws.transform("base", DType::kF32, [](const Tensor& b) -> Result<Tensor> {
                  Tensor t = Tensor::host(DType::kF32, b.shape());
                  for (int64_t i = 0; i < b.numel(); ++i) t.data_as<float>()[i] = 7.0f;
                  return t;
                }).ok());
  ASSERT_TRUE(ws.transform("made", DType::kF32, [](const Tensor& b) -> Result<Tensor> {
                  Tensor t = Tensor::host(DType::kF32, b.shape());
                  for (int64_t i = 0; i < b.numel(); ++i)
                    t.data_as<float>()[i] = b.data_as<float>()[i] + 1.0f;
                  return t;
                }).ok());
  EXPECT_EQ(ws.get("base")->data_as<float>()[1], 7.0f);
  EXPECT_EQ(ws.get("made")->data_as<float>()[2], 4.0f);  // transform of a computed tensor

  ASSERT_TRUE(ws.rename("made", "renamed").ok());
  EXPECT_FALSE(ws.contains("made"));
  EXPECT_EQ(ws.rename("renamed", "base").code(), ErrorCode::kFormat);
  EXPECT_EQ(ws.get("renamed")->data_as<float>()[0], 1.0f);

  WeightStore extra = WeightStore::empty("extra");
  ASSERT_TRUE(extra.add_computed("third", cw).ok());
  WeightStore clash = WeightStore::empty("clash");
  ASSERT_TRUE(clash.add_computed("other", cw).ok());
  EXPECT_EQ(ws.absorb(std::move(clash)).code(), ErrorCode::kFormat);
  ASSERT_TRUE(ws.absorb(std::move(extra)).ok());
  EXPECT_TRUE(ws.contains("third"));
  const std::vector<std::string> unused = ws.unused_names();
  EXPECT_EQ(unused, (std::vector<std::string>{"other", "third"}));
}

// load::conv_weight's OIHW -> OHWI reordering, on the CPU backend (f32), at sizes that take one
// thread and several (the output channels split once a weight has 2^20 elements or more), from
// bf16 and f32 files: every element where the layout says. (A bf16 GPU keeps bf16 weights as
// stored through the same reordering; the GPU goldens cover that branch.)
TEST(WeightStore, ConvWeightsReorderedToOhwiOnAnyNumberOfThreads) {
  TempDir dir;
  struct Case {
    int64_t cout, cin, k;
    DType dt;
  };
  const std::vector<Case> cases{{8, 4, 3, DType::kBF16},
                                {512, 512, 3, DType::kBF16},    // 2.4 M elements: 2 threads
                                {512, 1024, 3, DType::kF32},    // 4.7 M: up to 4
                                {1024, 256, 1, DType::kBF16}};  // 1x1
  std::vector<std::pair<std::string, Tensor>> ts;
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    Tensor t = Tensor::host(k.dt, {k.cout, k.cin, k.k, k.k});
    for (int64_t i = 0; i < t.numel(); ++i) {
      // Exactly representable values that vary along every axis.
      const float v = static_cast<float>((i * 7 + static_cast<int64_t>(c)) % 251) - 125.f;
      if (k.dt == DType::kBF16)
        t.data_as<uint16_t>()[i] = f32_to_bf16(v);
      else
        t.data_as<float>()[i] = static_cast<float>(i % 1000003);
    }
    ts.emplace_back("w" + std::to_string(c), std::move(t));
  }
  ASSERT_TRUE(write_safetensors(dir.file("convs.safetensors"), ts).ok());
  auto store = WeightStore::open(dir.file("convs.safetensors"));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  {
    auto be = make_cpu_backend(2);
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      SCOPED_TRACE("case " + std::to_string(c));
      auto w = load::conv_weight(*store, *be, "w" + std::to_string(c), k.cout, k.cin, k.k);
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      ASSERT_EQ(w->shape(), (Shape{k.cout, k.k, k.k, k.cin}));
      const Tensor& src = ts[c].second;
      int64_t wrong = 0;
      for (int64_t o = 0; o < k.cout; ++o)
        for (int64_t i = 0; i < k.cin; ++i)
          for (int64_t p = 0; p < k.k * k.k; ++p) {
            const int64_t from = (o * k.cin + i) * k.k * k.k + p;
            const int64_t to = (o * k.k * k.k + p) * k.cin + i;
            const float want = src.dtype() == DType::kBF16
                                   ? bf16_to_f32(src.data_as<uint16_t>()[from])
                                   : src.data_as<float>()[from];
            const float got = w->dtype() == DType::kBF16 ? bf16_to_f32(w->data_as<uint16_t>()[to])
                                                         : w->data_as<float>()[to];
            // f32 values above 256 round when the act dtype is bf16: compare what the upload
            // makes of them.
            const float expect = w->dtype() == DType::kBF16 ? bf16_to_f32(f32_to_bf16(want)) : want;
            wrong += got != expect;
          }
      EXPECT_EQ(wrong, 0);
    }
  }
}
