// The tokenizer's pre-tokenizer: the Split regex (Oniguruma syntax in tokenizer.json, run here with
// PCRE2) and the ByteLevel step, with Hugging Face's split behaviours.
// Why this shape: HF runs the pattern with Oniguruma (Unicode 16 tables, Ruby syntax). PCRE2 agrees
// on the regex language used by BPE tokenizers but not on Unicode data (\p{L} of PCRE2 10.42 is
// Unicode 14, its \s is not White_Space), so the classes that decide where words break are spelled
// out from our own tables before PCRE2 sees the pattern.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "pipeline/tokenizer/tokenizer_internal.h"

namespace zimage::tok {
namespace {

void append_code_point_escape(std::string& out, char32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\x{%X}", static_cast<unsigned>(c));
  out += buf;
}

// Appends the union of `ranges` (sorted and merged) as class items "\x{lo}-\x{hi}".
void append_class_items(std::string& out, std::vector<CodeRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodeRange& a, const CodeRange& b) { return a.lo < b.lo; });
  std::vector<CodeRange> merged;
  for (const CodeRange& r : ranges) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  for (const CodeRange& r : merged) {
    append_code_point_escape(out, r.lo);
    if (r.hi != r.lo) {
      out += '-';
      append_code_point_escape(out, r.hi);
    }
  }
}

// What an escape stands for when we spell it out ourselves (length 0: PCRE2 may keep it as is):
// PCRE2 class items (`native`, e.g. "\\p{L}") plus explicit code point ranges.
struct ClassEscape {
  std::string native;
  std::vector<CodeRange> ranges;
  bool negated = false;
  size_t length = 0;  // characters of the escape in the pattern
};

ClassEscape parse_class_escape(std::string_view p, size_t i, bool native_base) {
  ClassEscape e;
  if (i + 1 >= p.size() || p[i] != '\\') return e;
  const char k = p[i + 1];
  auto add = [&e](std::span<const CodeRange> t) { e.ranges.assign(t.begin(), t.end()); };
  if (k == 's' || k == 'S') {
    add(unicode_white_space());
    e.negated = k == 'S';
    e.length = 2;
  } else if (k == 'h' || k == 'H') {  // Ruby/Oniguruma: \h is a hex digit (PCRE2: horizontal space)
    e.ranges = {{'0', '9'}, {'A', 'F'}, {'a', 'f'}};
    e.negated = k == 'H';
    e.length = 2;
  } else if ((k == 'p' || k == 'P') && i + 2 < p.size() && p[i + 2] == '{') {
    const size_t close = p.find('}', i + 3);
    if (close == std::string_view::npos) return e;
    std::string_view name = p.substr(i + 3, close - i - 3);
    bool neg = k == 'P';
    if (!name.empty() && name[0] == '^') {
      neg = !neg;
      name.remove_prefix(1);
    }
    // With a compatible PCRE2, its own (fast) property plus what Unicode added since; otherwise
    // the whole table.
    if (name == "L" || name == "Letter") {
      if (native_base) e.native = "\\p{L}";
      add(native_base ? unicode_letters_since_base() : unicode_letters());
    } else if (name == "N" || name == "Number") {
      if (native_base) e.native = "\\p{N}";
      add(native_base ? unicode_numbers_since_base() : unicode_numbers());
    } else {
      return e;  // other properties: PCRE2's own tables
    }
    e.negated = neg;
    e.length = close + 1 - i;
  }
  return e;
}

}  // namespace

bool pcre2_unicode_is_compatible() {
  // PCRE2's \p{L} / \p{N} must be a subset of our tables' (true from the base version up to the
  // tables' version; letters and numbers have not changed category in between).
  char version[32] = {};
  if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version) <= 0) return false;
  const std::string v = version;
  return v == "14.0.0" || v == "15.0.0" || v == "15.1.0" || v == "16.0.0";
}

Result<std::string> onig_to_pcre2(std::string_view p, bool native_base) {
  std::string out;
  out.reserve(p.size() * 8);
  bool in_class = false;
  size_t class_open = 0;  // index just after "[" or "[^" of the open class
  std::vector<CodeRange> class_ranges;
  auto unsupported = [&p](size_t at, const char* what) {
    return Unsupported("tokenizer regex \"" + std::string(p) + "\": " + what + " at offset " +
                       std::to_string(at) + " is not supported");
  };
  for (size_t i = 0; i < p.size();) {
    const char ch = p[i];
    if (ch == '\\') {
      if (i + 1 >= p.size()) return unsupported(i, "a trailing backslash");
      const ClassEscape e = parse_class_escape(p, i, native_base);
      if (e.length > 0) {
        if (in_class) {
          if (e.negated) return unsupported(i, "a negated class escape inside [...]");
          out += e.native;
          class_ranges.insert(class_ranges.end(), e.ranges.begin(), e.ranges.end());
        } else {
          out += e.negated ? "[^" : "[";
          out += e.native;
          append_class_items(out, e.ranges);
          out += ']';
        }
        i += e.length;
        continue;
      }
      if (p[i + 1] == 'u' && i + 6 <= p.size()) {  // Ruby \uHHHH -> PCRE2 \x{HHHH}
        out += "\\x{";
        out.append(p.substr(i + 2, 4));
        out += '}';
        i += 6;
        continue;
      }
      out.append(p.substr(i, 2));  // every other escape means the same in PCRE2
      i += 2;
      continue;
    }
    if (in_class) {
      if (ch == ']' && i > class_open) {
        append_class_items(out, class_ranges);
        class_ranges.clear();
        out += ']';
        in_class = false;
      } else if (ch == '[') {
        return unsupported(i, "a nested character class or POSIX bracket");
      } else if (ch == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        return unsupported(i, "class intersection (&&)");
      } else {
        out += ch;
      }
      ++i;
      continue;
    }
    if (ch == '[') {
      in_class = true;
      out += '[';
      ++i;
      if (i < p.size() && p[i] == '^') {
        out += '^';
        ++i;
      }
      class_open = i;
      continue;
    }
    out += ch;
    ++i;
  }
  if (in_class) return unsupported(p.size(), "an unterminated character class");
  return out;
}

struct SplitRegex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

Result<SplitRegex> SplitRegex::compile(std::string_view onig_pattern) {
  ZI_ASSIGN_OR_RETURN(const std::string pattern,
                      onig_to_pcre2(onig_pattern, pcre2_unicode_is_compatible()));
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // MULTILINE: in Ruby syntax (Oniguruma's default) ^ and $ match at line breaks.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return FormatError("tokenizer regex \"" + std::string(onig_pattern) +
                       "\" does not compile: " + reinterpret_cast<const char*>(msg) + " (offset " +
                       std::to_string(err_offset) + " of the PCRE2 translation)");
  }
  auto c = std::make_shared<Code>();
  c->code = code;
  c->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  SplitRegex r;
  r.code_ = std::move(c);
  return r;
}

Status SplitRegex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  if (!code_) return InternalError("tokenizer: split regex used before it was compiled");
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (md == nullptr) return OutOfMemory("tokenizer: cannot allocate PCRE2 match data");
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md_owner(
      md, &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= s.size()) {
    int rc = pcre2_match(code_->code, subject, s.size(), last_end, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // very long input: the interpreter uses the heap
      rc = pcre2_match(code_->code, subject, s.size(), last_end, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return InternalError(std::string("tokenizer regex match failed: ") +
                           reinterpret_cast<const char*>(msg) + " (text of " +
                           std::to_string(s.size()) + " bytes)");
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t ms = ov[0], me = ov[1];
    if (ms == me && have_last && last_match_end == me) {
      // The `onig` crate skips an empty match at the end of the previous one and moves one
      // character on (one byte past the end of the text stops the loop).
      if (last_end >= s.size()) break;
      size_t j = last_end;
      next_code_point(s, j);
      last_end = j;
      continue;
    }
    last_end = me;
    have_last = true;
    last_match_end = me;
    out.emplace_back(ms, me);
  }
  return Status::Ok();
}

// ---- byte-level ---------------------------------------------------------------------------------

namespace {

struct ByteTables {
  std::array<char32_t, 256> to_unicode{};
  std::array<int16_t, 0x144> to_byte{};  // indexed by code point; -1 where none
  ByteTables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_unicode[b] = printable ? char32_t(b) : char32_t(0x100 + n++);
      to_byte[to_unicode[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

// HF's segments of one piece: the matches and the gaps between them, flagged, then combined by the
// split behaviour. Appends the kept, non-empty [start, end) to `out`.
void split_piece(const std::vector<std::pair<size_t, size_t>>& matches, size_t n, bool invert,
                 SplitBehavior behavior, std::vector<std::pair<size_t, size_t>>& out) {
  if (behavior == SplitBehavior::kIsolated) {  // the common case: every gap and match is a piece
    size_t prev = 0;
    for (const auto& [s, e] : matches) {
      if (prev != s) out.emplace_back(prev, s);
      if (e > s) out.emplace_back(s, e);
      prev = e;
    }
    if (prev != n) out.emplace_back(prev, n);
    return;
  }
  struct Seg {
    size_t a, b;
    bool match;
  };
  std::vector<Seg> segs;
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    if (prev != s) segs.push_back({prev, s, invert});
    segs.push_back({s, e, !invert});
    prev = e;
  }
  if (prev != n) segs.push_back({prev, n, invert});

  std::vector<Seg> kept;  // (a, b, remove)
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Seg& s : segs) kept.push_back({s.a, s.b, false});
      break;
    case SplitBehavior::kRemoved:
      for (const Seg& s : segs) kept.push_back({s.a, s.b, s.match});
      break;
    case SplitBehavior::kContiguous:
      for (const Seg& s : segs) {
        if (s.match == previous_match && !kept.empty()) {
          kept.back().b = s.b;
        } else {
          kept.push_back({s.a, s.b, false});
        }
        previous_match = s.match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Seg& s : segs) {
        if (s.match && !previous_match && !kept.empty()) {
          kept.back().b = s.b;
        } else {
          kept.push_back({s.a, s.b, false});
        }
        previous_match = s.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = segs.size(); k-- > 0;) {
        const Seg& s = segs[k];
        if (s.match && !previous_match && !kept.empty()) {
          kept.back().a = s.a;
        } else {
          kept.push_back({s.a, s.b, false});
        }
        previous_match = s.match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (const Seg& s : kept) {
    if (!s.match && s.b > s.a) out.emplace_back(s.a, s.b);
  }
}

}  // namespace

const std::array<char32_t, 256>& byte_to_unicode() {
  return byte_tables().to_unicode;
}

int unicode_to_byte(char32_t c) {
  const auto& t = byte_tables().to_byte;
  return c < t.size() ? t[c] : -1;
}

Status pre_tokenize(const std::vector<PreTokStep>& steps, std::string_view text, Pieces& out) {
  Pieces cur;
  cur.arena.assign(text);
  if (!text.empty()) cur.spans.emplace_back(0u, static_cast<uint32_t>(text.size()));
  std::vector<std::pair<size_t, size_t>> matches, parts;
  for (const PreTokStep& step : steps) {
    std::vector<std::pair<uint32_t, uint32_t>> next;
    next.reserve(cur.spans.size() * 2);
    for (size_t i = 0; i < cur.spans.size(); ++i) {
      uint32_t off = cur.spans[i].first, len = cur.spans[i].second;
      const bool split = step.kind == PreTokStep::Kind::kSplit || step.use_regex;
      if (step.kind == PreTokStep::Kind::kByteLevel && step.add_prefix_space &&
          cur.arena[off] != ' ') {
        const std::string piece = cur.arena.substr(off, len);
        off = static_cast<uint32_t>(cur.arena.size());
        cur.arena += ' ';
        cur.arena += piece;
        ++len;
      }
      if (!split) {
        next.emplace_back(off, len);
        continue;
      }
      const std::string_view piece(cur.arena.data() + off, len);
      matches.clear();
      parts.clear();
      ZI_TRY(step.regex.find_all(piece, matches));
      const bool byte_level = step.kind == PreTokStep::Kind::kByteLevel;
      split_piece(matches, len, byte_level ? false : step.invert,
                  byte_level ? SplitBehavior::kIsolated : step.behavior, parts);
      for (const auto& [a, b] : parts) {
        next.emplace_back(off + static_cast<uint32_t>(a), static_cast<uint32_t>(b - a));
      }
    }
    cur.spans = std::move(next);
  }
  out = std::move(cur);
  return Status::Ok();
}

}  // namespace zimage::tok
