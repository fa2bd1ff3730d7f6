// Internals of the tokenizer (pipeline/tokenizer/tokenizer.h), shared by its .cpp files and its tests.
// Why split out: the normalizer, the regex pre-tokenizer and the BPE model are each checked on
// their own in tests/unit/test_tokenizer.cpp, and each .cpp stays small.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace zimage::tok {

// ---- Unicode ------------------------------------------------------------------------------------
struct CodeRange {
  char32_t lo, hi;  // inclusive
};
// \p{L} and \p{N} of the Unicode version HF's regex engine uses (tokenizer_unicode.cpp, generated).
std::span<const CodeRange> unicode_letters();
std::span<const CodeRange> unicode_numbers();
// The L / N code points that were not L / N in unicode_base_version() (what PCRE2 10.42 knows).
std::span<const CodeRange> unicode_letters_since_base();
std::span<const CodeRange> unicode_numbers_since_base();
const char* unicode_tables_version();  // "16.0.0"
const char* unicode_base_version();    // "14.0.0"
// Unicode White_Space (what Oniguruma's \s matches): 25 code points.
std::span<const CodeRange> unicode_white_space();
bool is_white_space(char32_t c);
// Rust regex's Unicode \w (Alphabetic, marks, Nd, Pc, Join_Control), for single_word tokens.
bool is_word_char(char32_t c);

// Checks that `s` is well-formed UTF-8 (no overlongs, surrogates or values past U+10FFFF).
// The error names `what` and the byte offset of the first bad sequence.
Status validate_utf8(std::string_view s, std::string_view what);
// Decodes the code point at s[i] of VALID UTF-8 and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t c);
// Decodes bytes as Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// ---- normalizer ---------------------------------------------------------------------------------
enum class NormForm { kNFC, kNFD, kNFKC, kNFKD };
// Normalizes valid UTF-8 with utf8proc into `out` (pure ASCII is copied as is).
Status normalize(NormForm form, std::string_view in, std::string& out);

// ---- split regex --------------------------------------------------------------------------------
// Rewrites an Oniguruma pattern (as found in tokenizer.json) into PCRE2 syntax with the same
// meaning: \s, \S (White_Space) and \h become explicit classes; \p{L} and \p{N} become the whole
// tables above or, with native_base, PCRE2's own \p{L} / \p{N} plus the code points added since
// unicode_base_version() (5x faster, and exact when pcre2_unicode_is_compatible()).
Result<std::string> onig_to_pcre2(std::string_view pattern, bool native_base);
// Whether the linked PCRE2's Unicode version lets onig_to_pcre2 use native_base.
bool pcre2_unicode_is_compatible();

class SplitRegex {
 public:
  // Compiles an Oniguruma pattern (translated with onig_to_pcre2) with PCRE2 (UTF, UCP, JIT).
  static Result<SplitRegex> compile(std::string_view onig_pattern);
  // Appends [start, end) of each match in `s` (valid UTF-8), with the iteration rules of the
  // `onig` crate's find_iter (an empty match right after the previous match is skipped).
  Status find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

// ---- pre-tokenizer ------------------------------------------------------------------------------
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  SplitRegex regex;  // Split pattern, or the GPT-2 pattern for ByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = false;         // ByteLevel
};

// Pieces of text as [offset, offset+len) into an arena string (pieces may have a prefix space
// added, so they cannot all point into the input).
struct Pieces {
  std::string arena;
  std::vector<std::pair<uint32_t, uint32_t>> spans;
  std::string_view at(size_t i) const { return {arena.data() + spans[i].first, spans[i].second}; }
};

// Runs the steps over `text` (valid UTF-8) and appends the resulting words to `out`.
Status pre_tokenize(const std::vector<PreTokStep>& steps, std::string_view text, Pieces& out);

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the rest to U+0100 + n.
const std::array<char32_t, 256>& byte_to_unicode();
// The byte a byte-level character stands for, or -1.
int unicode_to_byte(char32_t c);

// ---- BPE ----------------------------------------------------------------------------------------
// Hash for unordered maps keyed by std::string that can be searched with a std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

struct BpeOptions {
  bool byte_level = true;      // words are raw bytes mapped with byte_to_unicode()
  bool ignore_merges = false;  // a word that is a vocab entry is taken whole
  int32_t unk_id = -1;         // id for characters missing from the vocab (-1: drop them)
  bool fuse_unk = false;       // consecutive unknown characters give one unk
};

class Bpe {
 public:
  // vocab: token string -> id. merges: pairs of token strings in rank order.
  static Result<Bpe> build(StringMap<int32_t> vocab,
                           const std::vector<std::pair<std::string, std::string>>& merges,
                           const BpeOptions& options);
  // Appends the ids of one pre-tokenized word (raw UTF-8 bytes; mapped to byte-level characters
  // here when byte_level). Characters missing from the vocab are dropped, as HF does without unk.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr if unknown
  int32_t max_id() const { return max_id_; }
  size_t size() const { return vocab_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  struct Cache {
    std::mutex mu;
    StringMap<std::vector<int32_t>> words;
  };
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids) const;
  void merge_symbols(std::vector<int32_t>& ids) const;
  const Merge* find_merge(int32_t a, int32_t b) const;

  StringMap<int32_t> vocab_;
  std::vector<const std::string*> id_to_token_;  // points into vocab_ keys
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // id of each byte's single-character token, or -1
  BpeOptions opt_;
  int32_t max_id_ = -1;
  std::shared_ptr<Cache> cache_;  // word -> ids; shared by copies, guarded by its mutex
};

// ---- the whole tokenizer ------------------------------------------------------------------------
struct AddedToken {
  std::string content;  // as written in tokenizer.json (token_to_id looks this up)
  std::string match;    // as matched and decoded: the normalized content for normalized tokens
  int32_t id = -1;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// Leftmost-longest matcher over a set of added tokens (HF's Aho-Corasick with LeftmostLongest).
class AddedMatcher {
 public:
  void add(const AddedToken* t);
  bool empty() const { return by_content_.empty(); }
  // Splits `s` into pieces: (token or nullptr, [start, end)). Covers all of `s`.
  void split(std::string_view s,
             std::vector<std::pair<const AddedToken*, std::pair<size_t, size_t>>>& out) const;

 private:
  std::unordered_map<std::string_view, const AddedToken*> by_content_;
  std::vector<size_t> lengths_;         // distinct content lengths, longest first
  std::array<bool, 256> first_byte_{};  // bytes that start some token
};

struct TokenizerData {
  bool has_normalizer = false;
  std::vector<NormForm> normalizers;  // applied in order
  std::vector<PreTokStep> pre_tok;
  Bpe bpe;
  bool byte_level_decoder = true;
  std::vector<std::unique_ptr<AddedToken>> added;  // owns the tokens the matchers point at
  AddedMatcher raw_matcher;                        // tokens with normalized = false
  AddedMatcher norm_matcher;                       // tokens with normalized = true
  std::unordered_map<int32_t, const AddedToken*> added_by_id;
  StringMap<int32_t> added_by_content;
  int32_t pad_id = -1;
  size_t vocab_size = 0;
};

}  // namespace zimage::tok
