// The BPE model and the added-token matcher of the tokenizer.
// Why this exact algorithm: HF `tokenizers` merges one pair at a time from a priority queue ordered
// by (merge rank, position), re-queuing the pairs a merge creates. Applying merges in that order is
// what decides ties (e.g. "aaa"), so it is reproduced here rather than GPT-2's "merge all
// occurrences of the best pair" loop. Added tokens are found leftmost-longest, as HF's
// Aho-Corasick.
#include <algorithm>
#include <functional>
#include <string>

#include "pipeline/tokenizer/tokenizer_internal.h"

namespace zimage::tok {
namespace {

constexpr size_t kCacheMaxWordBytes = 256;  // HF caches words up to 256 characters
constexpr size_t kCacheMaxEntries = 1 << 16;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

Result<Bpe> Bpe::build(StringMap<int32_t> vocab,
                       const std::vector<std::pair<std::string, std::string>>& merges,
                       const BpeOptions& options) {
  Bpe b;
  b.vocab_ = std::move(vocab);
  b.opt_ = options;
  for (const auto& [token, id] : b.vocab_) {
    if (id < 0) {
      return FormatError("tokenizer model.vocab: token \"" + token + "\" has negative id " +
                         std::to_string(id));
    }
    b.max_id_ = std::max(b.max_id_, id);
  }
  if (b.max_id_ >= (1 << 28)) {
    return FormatError("tokenizer model.vocab: id " + std::to_string(b.max_id_) + " is too large");
  }
  b.id_to_token_.assign(static_cast<size_t>(b.max_id_ + 1), nullptr);
  for (const auto& [token, id] : b.vocab_) b.id_to_token_[static_cast<size_t>(id)] = &token;

  const auto& to_unicode = byte_to_unicode();
  for (int byte = 0; byte < 256; ++byte) {
    std::string ch;
    if (options.byte_level) {
      append_utf8(ch, to_unicode[static_cast<size_t>(byte)]);
    } else {
      ch.assign(1, static_cast<char>(byte));
    }
    const auto it = b.vocab_.find(ch);
    b.byte_ids_[static_cast<size_t>(byte)] = it == b.vocab_.end() ? -1 : it->second;
  }

  b.merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto ia = b.vocab_.find(left);
    const auto ib = b.vocab_.find(right);
    joined.assign(left).append(right);
    const auto in = b.vocab_.find(joined);
    const char* missing = ia == b.vocab_.end()   ? left.c_str()
                          : ib == b.vocab_.end() ? right.c_str()
                          : in == b.vocab_.end() ? joined.c_str()
                                                 : nullptr;
    if (missing != nullptr) {
      return FormatError("tokenizer model.merges[" + std::to_string(rank) + "] (\"" + left +
                         "\" \"" + right + "\"): token \"" + missing + "\" is not in the vocab");
    }
    // A repeated pair keeps its last rank, as HF's map built from the list does.
    b.merges_[pair_key(ia->second, ib->second)] = Merge{static_cast<int32_t>(rank), in->second};
  }
  b.cache_ = std::make_shared<Cache>();
  return b;
}

const Bpe::Merge* Bpe::find_merge(int32_t a, int32_t b) const {
  const auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  return id_to_token_[static_cast<size_t>(id)];
}

void Bpe::initial_symbols(std::string_view word, std::vector<int32_t>& ids) const {
  // One symbol per character of the (byte-level) word; unknown characters become unk or vanish.
  bool last_was_unk = false;
  auto push_unknown = [&] {
    if (opt_.unk_id < 0) return;
    if (!(opt_.fuse_unk && last_was_unk)) ids.push_back(opt_.unk_id);
    last_was_unk = true;
  };
  if (opt_.byte_level) {
    for (const char ch : word) {
      const int32_t id = byte_ids_[static_cast<unsigned char>(ch)];
      if (id < 0) {
        push_unknown();
      } else {
        ids.push_back(id);
        last_was_unk = false;
      }
    }
    return;
  }
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    next_code_point(word, i);
    const auto it = vocab_.find(word.substr(start, i - start));
    if (it == vocab_.end()) {
      push_unknown();
    } else {
      ids.push_back(it->second);
      last_was_unk = false;
    }
  }
}

void Bpe::merge_symbols(std::vector<int32_t>& ids) const {
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  struct Sym {
    int32_t id, prev, next;
    bool alive;
  };
  struct Entry {
    int32_t rank, pos, new_id;
  };
  // Max-heap comparator whose top is the smallest (rank, pos).
  const auto later = [](const Entry& a, const Entry& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::vector<Sym> sym(static_cast<size_t>(n));
  std::vector<Entry> heap;
  heap.reserve(static_cast<size_t>(n) * 2);
  for (int32_t i = 0; i < n; ++i) {
    sym[static_cast<size_t>(i)] = {ids[static_cast<size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1,
                                   true};
    if (i + 1 < n) {
      if (const Merge* m =
              find_merge(ids[static_cast<size_t>(i)], ids[static_cast<size_t>(i + 1)])) {
        heap.push_back({m->rank, i, m->new_id});
      }
    }
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Entry top = heap.back();
    heap.pop_back();
    Sym& cur = sym[static_cast<size_t>(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    Sym& right = sym[static_cast<size_t>(cur.next)];
    const Merge* m = find_merge(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // a stale entry
    cur.id = top.new_id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0) sym[static_cast<size_t>(cur.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* mp = find_merge(sym[static_cast<size_t>(cur.prev)].id, cur.id)) {
        heap.push_back({mp->rank, cur.prev, mp->new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    if (cur.next >= 0) {
      if (const Merge* mn = find_merge(cur.id, sym[static_cast<size_t>(cur.next)].id)) {
        heap.push_back({mn->rank, top.pos, mn->new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
  }
  ids.clear();
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    ids.push_back(sym[static_cast<size_t>(i)].id);  // symbol 0 is never merged away
  }
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (opt_.ignore_merges) {
    std::string mapped;
    if (opt_.byte_level) {
      for (const char ch : word) append_utf8(mapped, byte_to_unicode()[static_cast<uint8_t>(ch)]);
    } else {
      mapped.assign(word);
    }
    const auto it = vocab_.find(mapped);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    const auto it = cache_->words.find(word);
    if (it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  initial_symbols(word, ids);
  merge_symbols(ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->words.size() >= kCacheMaxEntries) cache_->words.clear();
    cache_->words.emplace(std::string(word), std::move(ids));
  }
}

// ---- added tokens -------------------------------------------------------------------------------

void AddedMatcher::add(const AddedToken* t) {
  if (t->match.empty()) return;
  by_content_[t->match] = t;
  if (std::find(lengths_.begin(), lengths_.end(), t->match.size()) == lengths_.end()) {
    lengths_.push_back(t->match.size());
    std::sort(lengths_.begin(), lengths_.end(), std::greater<>());
  }
  first_byte_[static_cast<unsigned char>(t->match[0])] = true;
}

namespace {

// The last code point of s (valid UTF-8, non-empty).
char32_t last_code_point(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return next_code_point(s, i);
}

}  // namespace

void AddedMatcher::split(
    std::string_view s,
    std::vector<std::pair<const AddedToken*, std::pair<size_t, size_t>>>& out) const {
  size_t start_offset = 0;
  size_t i = 0;
  while (i < s.size()) {
    if (!first_byte_[static_cast<unsigned char>(s[i])]) {
      ++i;
      continue;
    }
    const AddedToken* tok = nullptr;
    for (const size_t len : lengths_) {  // longest first: leftmost-longest
      if (i + len > s.size()) continue;
      const auto it = by_content_.find(s.substr(i, len));
      if (it != by_content_.end()) {
        tok = it->second;
        break;
      }
    }
    if (tok == nullptr) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + tok->match.size();
    i = stop;  // the next search starts after this match, even if it is discarded below
    if (tok->single_word) {
      const bool start_ok = start == 0 || !is_word_char(last_code_point(s.substr(0, start)));
      size_t j = stop;
      const bool stop_ok = stop == s.size() || !is_word_char(next_code_point(s, j));
      if (!start_ok || !stop_ok) continue;
    }
    if (tok->lstrip) {  // swallow the white space before it (not what a previous match took)
      size_t a = start;
      while (a > start_offset) {
        size_t k = a - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t tmp = k;
        if (!is_white_space(next_code_point(s, tmp))) break;
        a = k;
      }
      start = a;
    }
    if (tok->rstrip) {  // and the white space after it
      while (stop < s.size()) {
        size_t k = stop;
        if (!is_white_space(next_code_point(s, k))) break;
        stop = k;
      }
      i = stop;
    }
    if (start_offset < start) out.push_back({nullptr, {start_offset, start}});
    out.push_back({tok, {start, stop}});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({nullptr, {start_offset, s.size()}});
}

}  // namespace zimage::tok
