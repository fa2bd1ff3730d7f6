// Tests of the Qwen3 tokenizer against Hugging Face: a 2,600-string corpus with ids made by
// `tokenizers`/`transformers` (tools/make_tokenizer_corpus.py), the golden cases' token ids, the
// parts (regex translation, BPE tie order, UTF-8 handling) on their own, and the CLI end to end.
// Why so much: one differing id changes the text embedding, and nothing downstream would notice.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <gtest/gtest.h>
#include <pcre2.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/npy.h"
#include "pipeline/tokenizer/tokenizer.h"
#include "pipeline/tokenizer/tokenizer_internal.h"

using namespace zimage;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return {};
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

std::string model_dir() {
  return test::golden_dir("v_turbo") + "/model";
}

const Tokenizer& qwen() {
  static const Tokenizer* t = [] {
    auto r = Tokenizer::load(model_dir());
    if (!r.ok()) {
      ADD_FAILURE() << r.status().to_string();
      std::abort();
    }
    return new Tokenizer(std::move(r).value());
  }();
  return *t;
}

std::vector<json> corpus() {
  static const std::vector<json> rows = [] {
    const std::string text =
        gunzip_file(std::string(ZIMAGE_TEST_DATA_DIR) + "/tokenizer/corpus.jsonl.gz");
    std::vector<json> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) out.push_back(json::parse(line));
    }
    return out;
  }();
  return rows;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  s += ']';
  return s;
}

std::string escaped(const std::string& s) {
  return json(s).dump();
}

size_t first_diff(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

// ---- against Hugging Face -----------------------------------------------------------------------

TEST(TokenizerCorpus, EncodeMatchesHuggingFace) {
  const auto rows = corpus();
  size_t texts = 0, ids = 0, mismatches = 0, long_prompts = 0;
  for (const json& row : rows) {
    if (!row.contains("text")) continue;
    ++texts;
    const std::string text = row["text"].get<std::string>();
    const auto expect = row["ids"].get<std::vector<int32_t>>();
    ids += expect.size();
    auto got = qwen().encode(text);
    ASSERT_TRUE(got.ok()) << got.status().to_string() << " for " << escaped(text);
    if (*got != expect && ++mismatches <= 8) {
      const size_t at = first_diff(*got, expect);
      ADD_FAILURE() << "encode mismatch for " << escaped(text) << "\n  first difference at id "
                    << at << "\n  expected " << show(expect) << "\n  got      " << show(*got);
    }
  }
  std::printf("[tokenizer] %zu corpus texts, %zu ids, %zu encode mismatches\n", texts, ids,
              mismatches);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GE(texts, 2000u);
  (void)long_prompts;
}

TEST(TokenizerCorpus, ChatTemplateAndTruncationMatchHuggingFace) {
  size_t texts = 0, truncated = 0, mismatches = 0;
  for (const json& row : corpus()) {
    if (!row.contains("text")) continue;
    ++texts;
    const std::string text = row["text"].get<std::string>();
    const auto expect = row["chat_ids"].get<std::vector<int32_t>>();
    truncated += expect.size() == 512;
    auto got = encode_prompt(qwen(), text, 512);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    if (*got != expect && ++mismatches <= 8) {
      ADD_FAILURE() << "chat ids mismatch for " << escaped(text) << " at id "
                    << first_diff(*got, expect) << "\n  expected " << show(expect)
                    << "\n  got      " << show(*got);
    }
  }
  std::printf("[tokenizer] %zu chat-templated texts (%zu truncated to 512), %zu mismatches\n",
              texts, truncated, mismatches);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GE(truncated, 5u);  // the corpus has prompts longer than 512 tokens
}

TEST(TokenizerCorpus, DecodeMatchesHuggingFace) {
  size_t cases = 0, mismatches = 0;
  for (const json& row : corpus()) {
    if (!row.contains("decode_ids")) continue;
    ++cases;
    const auto ids = row["decode_ids"].get<std::vector<int32_t>>();
    const std::string expect = row["decoded"].get<std::string>();
    const std::string got = qwen().decode(ids);
    if (got != expect && ++mismatches <= 8) {
      ADD_FAILURE() << "decode mismatch for " << show(ids) << "\n  expected " << escaped(expect)
                    << "\n  got      " << escaped(got);
    }
  }
  std::printf("[tokenizer] %zu decode cases, %zu mismatches\n", cases, mismatches);
  EXPECT_GE(cases, 100u);
  EXPECT_EQ(mismatches, 0u);
}

TEST(TokenizerCorpus, DecodeOfEncodeIsTheNormalizedText) {
  size_t texts = 0, mismatches = 0;
  for (const json& row : corpus()) {
    if (!row.contains("text")) continue;
    ++texts;
    const std::string text = row["text"].get<std::string>();
    std::string nfc;
    ASSERT_TRUE(tok::normalize(tok::NormForm::kNFC, text, nfc).ok());
    const std::string got = qwen().decode(row["ids"].get<std::vector<int32_t>>());
    if (got != nfc && ++mismatches <= 5) {
      ADD_FAILURE() << "round trip of " << escaped(text) << " gave " << escaped(got);
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << texts;
}

// Every unpacked golden case: the templated text and ids diffusers recorded for each prompt and
// for the negative prompt (truncated at the case's max_sequence_length, 512 by default).
TEST(TokenizerGolden, TokenIdsOfGoldenCases) {
  size_t cases = 0, checked = 0;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(ZIMAGE_GOLDEN_DIR)) {
    if (fs::is_regular_file(e.path() / "debug" / "token_ids.json")) dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (const fs::path& dir : dirs) {
    const std::string name = dir.filename().string();
    std::ifstream fc(dir / "case.json"), ft(dir / "debug" / "token_ids.json");
    ASSERT_TRUE(fc && ft) << "missing golden files in " << dir;
    const json c = json::parse(fc), t = json::parse(ft);
    auto tk = Tokenizer::load((dir / "model").string());
    ASSERT_TRUE(tk.ok()) << tk.status().to_string();
    const int max_len = c.value("max_sequence_length", 512);
    const auto prompts = c["prompts"].get<std::vector<std::string>>();
    ASSERT_EQ(prompts.size(), t["ids"].size()) << name;
    ++cases;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(zimage_chat_template(prompts[i]), t["templated"][i].get<std::string>()) << name;
      auto ids = encode_prompt(*tk, prompts[i], max_len);
      ASSERT_TRUE(ids.ok());
      EXPECT_EQ(show(*ids), show(t["ids"][i].get<std::vector<int32_t>>())) << name << " " << i;
      ++checked;
    }
    if (t.contains("negative_ids")) {
      const std::string neg = c["neg"].is_null() ? std::string() : c["neg"].get<std::string>();
      EXPECT_EQ(zimage_chat_template(neg), t["negative_templated"].get<std::string>()) << name;
      auto ids = encode_prompt(*tk, neg, max_len);
      ASSERT_TRUE(ids.ok());
      EXPECT_EQ(show(*ids), show(t["negative_ids"].get<std::vector<int32_t>>())) << name;
      ++checked;
    }
  }
  std::printf("[tokenizer] %zu golden cases, %zu prompts checked\n", cases, checked);
  EXPECT_GE(cases, 3u);
  EXPECT_GE(checked, 5u);
}

// ---- API and loading ----------------------------------------------------------------------------

TEST(Tokenizer, QwenConstants) {
  const Tokenizer& t = qwen();
  EXPECT_EQ(t.pad_id(), 151643);
  EXPECT_EQ(t.vocab_size(), 151669u);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(t.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_to_id("</think>"), 151668);
  EXPECT_EQ(t.token_to_id("\xC4\xA0"), 220);  // "Ġ" = byte-level space
  EXPECT_FALSE(t.token_to_id("no such token").has_value());
  EXPECT_EQ(t.id_to_token(151645).value_or(""), "<|im_end|>");
  EXPECT_FALSE(t.id_to_token(999999).has_value());
  EXPECT_EQ(zimage_chat_template("a red fox in snow"),
            "<|im_start|>user\na red fox in snow<|im_end|>\n<|im_start|>assistant\n");
  auto empty = t.encode("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  auto neg = encode_prompt(t, "");  // the empty negative prompt
  ASSERT_TRUE(neg.ok());
  EXPECT_EQ(show(*neg), "[151644,872,198,151645,198,151644,77091,198]");
  auto cut = encode_prompt(t, "a b c d e f", 4);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(show(*cut), "[151644,872,198,64]");
  EXPECT_EQ(encode_prompt(t, "x", 0).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Tokenizer, LoadsFromEveryKindOfPath) {
  const std::string model = model_dir();
  for (const std::string& p : {model, model + "/tokenizer", model + "/tokenizer/tokenizer.json"}) {
    auto t = Tokenizer::load(p);
    ASSERT_TRUE(t.ok()) << p << ": " << t.status().to_string();
    auto ids = t->encode("Hello world");
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(show(*ids), "[9707,1879]") << p;
  }
  // From the repository's gzip copy, through load_from_json.
  const std::string text =
      gunzip_file(std::string(ZIMAGE_TEST_DATA_DIR) + "/qwen3-tokenizer/tokenizer.json.gz");
  ASSERT_GT(text.size(), 1000000u);
  auto t = Tokenizer::load_from_json(text, "tokenizer.json.gz");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->vocab_size(), 151669u);
  EXPECT_EQ(t->pad_id(), 151643);
}

// merges written as legacy "a b" strings (older tokenizer.json files) give the same ids.
TEST(Tokenizer, LegacyMergeStringsGiveTheSameIds) {
  json j = json::parse(
      gunzip_file(std::string(ZIMAGE_TEST_DATA_DIR) + "/qwen3-tokenizer/tokenizer.json.gz"));
  json legacy = json::array();
  legacy.push_back("#version: 0.2");  // a comment line, as in merges.txt
  for (const json& m : j["model"]["merges"]) {
    legacy.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  j["model"]["merges"] = legacy;
  auto t = Tokenizer::load_from_json(j.dump(), "legacy-merges.json");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  size_t checked = 0, mismatches = 0;
  for (const json& row : corpus()) {
    if (!row.contains("text")) continue;
    if (t->encode(row["text"].get<std::string>()).value() !=
        row["ids"].get<std::vector<int32_t>>()) {
      ++mismatches;
    }
    if (++checked == 600) break;
  }
  EXPECT_EQ(mismatches, 0u) << "of " << checked;
}

TEST(Tokenizer, LoadErrorsNameWhatIsWrong) {
  auto missing = Tokenizer::load("/nonexistent/zimage-model");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/zimage-model"), std::string::npos);

  const fs::path dir = fs::temp_directory_path() / "zimage_tok_test_empty";
  fs::create_directories(dir);
  auto no_json = Tokenizer::load(dir.string());
  EXPECT_EQ(no_json.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(no_json.status().message().find("tokenizer.json"), std::string::npos);
  fs::remove_all(dir);

  auto bad = Tokenizer::load_from_json("{not json", "x.json");
  EXPECT_EQ(bad.status().code(), ErrorCode::kFormat);
  EXPECT_NE(bad.status().message().find("x.json"), std::string::npos);

  const char* wordpiece = R"({"model": {"type": "WordPiece", "vocab": {}}})";
  auto wp = Tokenizer::load_from_json(wordpiece, "wp.json");
  EXPECT_EQ(wp.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(wp.status().message().find("WordPiece"), std::string::npos);

  const char* bad_merge = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1},
                              "merges": ["a b"]}})";
  auto bm = Tokenizer::load_from_json(bad_merge, "bm.json");
  EXPECT_EQ(bm.status().code(), ErrorCode::kFormat);
  EXPECT_NE(bm.status().message().find("merges[0]"), std::string::npos) << bm.status().message();
  EXPECT_NE(bm.status().message().find("\"ab\""), std::string::npos) << bm.status().message();

  const char* wrong_type = R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})";
  auto wt = Tokenizer::load_from_json(wrong_type, "wt.json");
  EXPECT_EQ(wt.status().code(), ErrorCode::kFormat);
  EXPECT_NE(wt.status().message().find("wt.json"), std::string::npos);

  for (const auto& [text, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model": {"type": "BPE", "vocab": {"a": {"id": 0}}, "merges": []}})",
            "model.vocab[\"a\"] is not an integer id"},
           {R"({"model": {"type": "BPE", "vocab": {"a": -4}, "merges": []}})",
            "-4 is not a valid id"},
           {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]}})",
            "model.merges[0] is neither"},
           {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a", 7]}})",
            "model.merges[0] \"a\" is not two tokens"},
           {R"({"model": {"type": "BPE", "vocab": [], "merges": []}})", "model.vocab is missing"},
           {R"({"model": {"type": "BPE", "vocab": {}}})", "model.merges is missing"}}) {
    auto r = Tokenizer::load_from_json(text, "t.json");
    EXPECT_EQ(r.status().code(), ErrorCode::kFormat) << text;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("t.json"), std::string::npos);
  }

  const char* bad_regex = R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"},
                              "behavior": "Isolated"}, "model": {"vocab": {}, "merges": []}})";
  auto br = Tokenizer::load_from_json(bad_regex, "br.json");
  EXPECT_EQ(br.status().code(), ErrorCode::kFormat);
  EXPECT_NE(br.status().message().find("(a"), std::string::npos);
}

TEST(Tokenizer, InvalidUtf8IsAnErrorNamingTheByte) {
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"ab\x80", 2},            // lone continuation byte
      {"\xC0\x80", 0},          // overlong NUL
      {"x\xED\xA0\x80", 1},     // UTF-16 surrogate U+D800
      {"\xF4\x90\x80\x80", 0},  // past U+10FFFF
      {"hello \xE4\xB8", 6},    // truncated 3-byte sequence
      {"\xF5", 0},              // never valid
      {"\xFF\xFE", 0},
  };
  for (const auto& [s, at] : bad) {
    auto r = qwen().encode(s);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("invalid UTF-8 at byte " + std::to_string(at)),
              std::string::npos)
        << r.status().message();
    EXPECT_FALSE(encode_prompt(qwen(), s).ok());
  }
  // NUL and the largest code point are valid.
  EXPECT_TRUE(qwen().encode(std::string("a\0b", 3)).ok());
  EXPECT_TRUE(qwen().encode("\xF4\x8F\xBF\xBF").ok());
}

// Random bytes and random code points: encode answers ok or InvalidArgument (never crashes), valid
// UTF-8 always encodes, and decode of any ids gives valid UTF-8 (run under ASan in the asan
// preset).
TEST(Tokenizer, RandomInputsAreHandled) {
  std::mt19937 rng(1234);
  size_t invalid = 0, valid = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    if (i % 2 == 0) {  // raw bytes, biased towards UTF-8 lead/continuation bytes
      for (int k = 0; k < n; ++k) s += static_cast<char>(rng() % 3 ? 0x80 + rng() % 0x80 : rng());
    } else {  // valid code points of every plane (no surrogates)
      for (int k = 0; k < n; ++k) {
        char32_t c = static_cast<char32_t>(rng() % 0x110000);
        if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD;
        tok::append_utf8(s, c);
      }
    }
    auto r = qwen().encode(s);
    if (r.ok()) {
      ++valid;
      EXPECT_TRUE(tok::validate_utf8(qwen().decode(*r), "decoded").ok());
    } else {
      ++invalid;
      EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().to_string();
      EXPECT_EQ(i % 2, 0) << "valid UTF-8 was rejected: " << r.status().to_string();
    }
  }
  EXPECT_GT(invalid, 1000u);
  EXPECT_GT(valid, 1400u);
  std::vector<int32_t> ids;
  for (int i = 0; i < 5000; ++i) ids.push_back(static_cast<int32_t>(rng() % 160000) - 100);
  EXPECT_TRUE(tok::validate_utf8(qwen().decode(ids), "decoded").ok());
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  std::vector<std::string> texts;
  for (const json& row : corpus()) {
    if (row.contains("text")) texts.push_back(row["text"].get<std::string>());
    if (texts.size() == 400) break;
  }
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : texts) want.push_back(qwen().encode(t).value());
  const Tokenizer copy = qwen();  // copies share the model and its word cache
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 3; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t j = (i * 7 + static_cast<size_t>(k) * 13) % texts.size();
          auto r = (k % 2 ? copy : qwen()).encode(texts[j]);
          if (!r.ok() || *r != want[j]) ++bad[static_cast<size_t>(k)];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(bad[static_cast<size_t>(k)], 0) << "thread " << k;
}

// ---- the parts ----------------------------------------------------------------------------------

TEST(TokenizerParts, Utf8LossyReplacesMaximalSubparts) {
  // As Rust's String::from_utf8_lossy (what HF's ByteLevel decoder uses).
  EXPECT_EQ(tok::utf8_lossy("ok"), "ok");
  EXPECT_EQ(tok::utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");          // truncated: one
  EXPECT_EQ(tok::utf8_lossy("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // E0 80: two
  EXPECT_EQ(tok::utf8_lossy("a\xED\xA0\x80z"), "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDz");
  EXPECT_EQ(tok::utf8_lossy("\xF0\x9F\x98\xFF\xC3\xA9"), "\xEF\xBF\xBD\xEF\xBF\xBD\xC3\xA9");
}

TEST(TokenizerParts, RegexTranslationSpellsOutUnicodeClasses) {
  const std::string pat = R"(\s+(?!\S)|[^\r\n\p{L}\p{N}]?\p{L}+)";
  auto full = tok::onig_to_pcre2(pat, /*native_base=*/false);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->find("\\p{"), std::string::npos) << *full;  // no PCRE2 property left
  EXPECT_EQ(full->find("\\s"), std::string::npos);
  EXPECT_NE(full->find("\\x{3000}"), std::string::npos);  // ideographic space in \s
  EXPECT_NE(full->find("\\x{85}"), std::string::npos);    // NEL is White_Space in Oniguruma
  EXPECT_NE(full->find("[^\\r\\n\\x{30}-\\x{39}\\x{41}-\\x{5A}"), std::string::npos);
  auto fast = tok::onig_to_pcre2(pat, /*native_base=*/true);
  ASSERT_TRUE(fast.ok());
  EXPECT_NE(fast->find("[^\\r\\n\\p{L}\\p{N}\\x{1C89}-\\x{1C8A}"), std::string::npos) << *fast;
  for (const bool nb : {false, true}) {
    EXPECT_EQ(tok::onig_to_pcre2(R"([^\S])", nb).status().code(), ErrorCode::kUnsupported);
    EXPECT_EQ(tok::onig_to_pcre2(R"([a&&b])", nb).status().code(), ErrorCode::kUnsupported);
    EXPECT_EQ(tok::onig_to_pcre2(R"([[:alpha:]])", nb).status().code(), ErrorCode::kUnsupported);
    EXPECT_EQ(tok::onig_to_pcre2(R"([ab)", nb).status().code(), ErrorCode::kUnsupported);
    auto hex = tok::onig_to_pcre2(R"(\h+\u00e9\p{Lu})", nb);
    ASSERT_TRUE(hex.ok());
    EXPECT_EQ(*hex, R"([\x{30}-\x{39}\x{41}-\x{46}\x{61}-\x{66}]+\x{00e9}\p{Lu})");
  }
}

// Every code point: the translated \p{L}, \p{N} and \s (both the whole-table form and the fast
// PCRE2-property form, when this PCRE2 allows it) match exactly the code points of the tables.
TEST(TokenizerParts, TranslatedClassesMatchTheTablesForEveryCodePoint) {
  auto in = [](std::span<const tok::CodeRange> t, char32_t c) {
    for (const auto& r : t) {
      if (c >= r.lo && c <= r.hi) return true;
    }
    return false;
  };
  std::vector<bool> modes = {false};
  if (tok::pcre2_unicode_is_compatible()) modes.push_back(true);
  std::printf("[tokenizer] PCRE2 Unicode compatible with the fast form: %s\n",
              modes.size() == 2 ? "yes" : "no");
  for (const bool nb : modes) {
    for (const auto& [onig, table] :
         std::vector<std::pair<std::string, std::span<const tok::CodeRange>>>{
             {R"(\p{L})", tok::unicode_letters()},
             {R"(\p{N})", tok::unicode_numbers()},
             {R"(\s)", tok::unicode_white_space()}}) {
      auto pat = tok::onig_to_pcre2(onig, nb);
      ASSERT_TRUE(pat.ok());
      int err = 0;
      PCRE2_SIZE off = 0;
      pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat->data()), pat->size(),
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, nullptr);
      ASSERT_NE(code, nullptr) << *pat;
      pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
      pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
      size_t wrong = 0, members = 0;
      char32_t first_wrong = 0;
      for (char32_t c = 0; c < 0x110000; ++c) {
        if (c >= 0xD800 && c <= 0xDFFF) continue;
        std::string u;
        tok::append_utf8(u, c);
        const bool hit = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(u.data()), u.size(), 0,
                                     PCRE2_NO_UTF_CHECK, md, nullptr) > 0;
        const bool want = in(table, c);
        members += want;
        if (hit != want && wrong++ == 0) first_wrong = c;
      }
      pcre2_match_data_free(md);
      pcre2_code_free(code);
      EXPECT_EQ(wrong, 0u) << onig << (nb ? " (fast form)" : " (table form)") << ": first U+"
                           << std::hex << static_cast<uint32_t>(first_wrong);
      EXPECT_GT(members, onig == R"(\s)" ? 20u : 1000u);
    }
  }
}

TEST(TokenizerParts, QwenSplitPieces) {
  const std::string pat =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  auto re = tok::SplitRegex::compile(pat);
  ASSERT_TRUE(re.ok()) << re.status().to_string();
  auto pieces = [&](const std::string& s) {
    std::vector<std::pair<size_t, size_t>> m;
    EXPECT_TRUE(re->find_all(s, m).ok());
    std::vector<std::string> out;
    for (auto [a, b] : m) out.push_back(s.substr(a, b - a));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("I'LL 2024!!\r\n"), (V{"I", "'LL", " ", "2", "0", "2", "4", "!!\r\n"}));
  EXPECT_EQ(pieces("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(pieces("'\xC5\xBFx"), (V{"'\xC5\xBF", "x"}));  // 'ſ folds to 's
  // NEL (U+0085) is \s; U+001C is not.
  EXPECT_EQ(pieces("a\xC2\x85\xC2\x85"
                   "b"),
            (V{"a", "\xC2\x85",
               "\xC2\x85"
               "b"}));
  EXPECT_EQ(pieces("a\x1C\x1C"
                   "b"),
            (V{"a", "\x1C\x1C", "b"}));
  // A Unicode 16 letter (Garay U+10D50) is \p{L} although PCRE2 10.42 has Unicode 14.
  EXPECT_EQ(pieces("a\xF0\x90\xB5\x90"), (V{"a\xF0\x90\xB5\x90"}));
}

TEST(TokenizerParts, BpeMergesByRankThenPosition) {
  // Byte-level off: characters are tokens. "a a" (rank 0) merges left first in "aaa".
  tok::StringMap<int32_t> vocab = {{"a", 0},   {"b", 1},  {"aa", 2},   {"ab", 3},
                                   {"aab", 4}, {"ba", 5}, {"<unk>", 6}};
  std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "a"}, {"a", "b"}, {"aa", "b"}, {"b", "a"}};
  tok::BpeOptions opt;
  opt.byte_level = false;
  auto bpe = tok::Bpe::build(vocab, merges, opt);
  ASSERT_TRUE(bpe.ok()) << bpe.status().to_string();
  auto enc = [&](const tok::Bpe& b, const std::string& w) {
    std::vector<int32_t> ids;
    b.encode_word(w, ids);
    return show(ids);
  };
  EXPECT_EQ(enc(*bpe, "aaa"), "[2,0]");
  EXPECT_EQ(enc(*bpe, "aab"), "[4]");     // aa (rank 0) then aa+b (rank 2)
  EXPECT_EQ(enc(*bpe, "abab"), "[3,3]");  // ab (rank 1) before ba (rank 3)
  EXPECT_EQ(enc(*bpe, "bab"), "[1,3]");   // a+b (rank 1) wins over b+a (rank 3)
  EXPECT_EQ(enc(*bpe, "axb"), "[3]");     // unknown x is dropped (no unk): a, b then merge
  EXPECT_EQ(enc(*bpe, "aaa"), "[2,0]");   // again, from the word cache
  opt.unk_id = 6;
  opt.fuse_unk = true;
  auto unk = tok::Bpe::build(vocab, merges, opt);
  ASSERT_TRUE(unk.ok());
  EXPECT_EQ(enc(*unk, "axyb"), "[0,6,1]");
  opt.fuse_unk = false;
  auto unk2 = tok::Bpe::build(vocab, merges, opt);
  ASSERT_TRUE(unk2.ok());
  EXPECT_EQ(enc(*unk2, "axyb"), "[0,6,6,1]");
}

TEST(TokenizerParts, AddedTokenFlags) {
  // A tiny byte-level tokenizer whose added tokens use lstrip / rstrip / single_word.
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    tok::append_utf8(ch, tok::byte_to_unicode()[static_cast<size_t>(b)]);
    vocab[ch] = id++;
  }
  json j = {
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
      {"added_tokens",
       {{{"id", 256}, {"content", "<L>"}, {"lstrip", true}, {"normalized", false}},
        {{"id", 257}, {"content", "<R>"}, {"rstrip", true}, {"normalized", false}},
        {{"id", 258}, {"content", "cat"}, {"single_word", true}, {"normalized", false}}}}};
  auto t = Tokenizer::load_from_json(j.dump(), "flags.json");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  auto enc = [&](const std::string& s) { return show(t->encode(s).value()); };
  // Byte b has id b here.
  EXPECT_EQ(enc("a  <L>b"), "[97,256,98]");  // spaces before <L> are swallowed
  EXPECT_EQ(enc("a<R>  b"), "[97,257,98]");  // spaces after <R> are swallowed
  EXPECT_EQ(enc("a cat b"), "[97,32,258,32,98]");
  EXPECT_EQ(enc("cats"), "[99,97,116,115]");  // not a single word: plain bytes
  EXPECT_EQ(t->decode({97, 256, 98}), "a<L>b");
}

// ---- the CLI ------------------------------------------------------------------------------------

namespace {

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CliRun run_cli_tokenize(const std::string& args, const std::string& stdin_text) {
  const fs::path dir = fs::temp_directory_path() / ("zimage_tok_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "in.jsonl", std::ios::binary) << stdin_text;
  const std::string cmd = std::string("'") + ZIMAGE_CLI_PATH + "' tokenize " + args + " < '" +
                          (dir / "in.jsonl").string() + "' > '" + (dir / "out").string() +
                          "' 2> '" + (dir / "err").string() + "'";
  CliRun r;
  const int status = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  fs::remove_all(dir);
  return r;
}

}  // namespace

TEST(TokenizerCli, TokenizesJsonLines) {
  const std::string input = "\"Hello world\"\n\"\"\n\"冰雪女王 <|im_end|>\\n\\ttab\"\n";
  std::string want;
  for (const std::string& s :
       {std::string("Hello world"), std::string(), std::string("冰雪女王 <|im_end|>\n\ttab")}) {
    want += show(qwen().encode(s).value()) + "\n";
  }
  for (const std::string& dir : {model_dir(), model_dir() + "/tokenizer"}) {
    const CliRun r = run_cli_tokenize("--tokenizer '" + dir + "'", input);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want);
    EXPECT_EQ(r.out.substr(0, 12), "[9707,1879]\n");
  }
  std::string want_chat;
  for (const std::string& s :
       {std::string("Hello world"), std::string(), std::string("冰雪女王 <|im_end|>\n\ttab")}) {
    want_chat += show(encode_prompt(qwen(), s).value()) + "\n";
  }
  const CliRun chat = run_cli_tokenize("--tokenizer '" + model_dir() + "' --chat-template", input);
  EXPECT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_EQ(chat.out, want_chat);
  EXPECT_EQ(chat.out.substr(0, 34), "[151644,872,198,9707,1879,151645,1");
}

TEST(TokenizerCli, BadLineNamesItsNumberAndFails) {
  const CliRun r =
      run_cli_tokenize("--tokenizer '" + model_dir() + "'", "\"ok\"\nnot json\n\"x\"\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "[562]\n");  // the good line before the bad one was answered
  EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;

  const CliRun num = run_cli_tokenize("--tokenizer '" + model_dir() + "'", "\"a\"\n\"b\"\n42\n");
  EXPECT_NE(num.exit_code, 0);
  EXPECT_NE(num.err.find("line 3"), std::string::npos) << num.err;

  const CliRun missing = run_cli_tokenize("--tokenizer /nonexistent/dir", "\"a\"\n");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent/dir"), std::string::npos) << missing.err;
}
