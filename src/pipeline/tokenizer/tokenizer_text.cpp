// UTF-8 and Unicode helpers of the tokenizer: strict validation, Rust-style lossy decoding,
// White_Space, and normalization (NFC & co.) through utf8proc.
// Why here: `tokenizers` takes Rust strings (always valid UTF-8) and decodes bytes with
// String::from_utf8_lossy; doing both the same way is what makes encode/decode match byte for byte.
#include <utf8proc.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "pipeline/tokenizer/tokenizer_internal.h"

namespace zimage::tok {
namespace {

constexpr CodeRange kWhiteSpace[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};

// Length (1-4) of the well-formed sequence at p[0..n), or 0 with *bad set to the length of the
// maximal ill-formed subpart there (Unicode §3.9, "U+FFFD substitution of maximal subparts").
int sequence_length(const unsigned char* p, size_t n, size_t* bad) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return 1;
  int len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    *bad = 1;
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= n) {
      *bad = static_cast<size_t>(k);
      return 0;
    }
    const unsigned char lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
    if (p[k] < lo_k || p[k] > hi_k) {
      *bad = static_cast<size_t>(k);
      return 0;
    }
  }
  return len;
}

}  // namespace

std::span<const CodeRange> unicode_white_space() {
  return kWhiteSpace;
}

bool is_white_space(char32_t c) {
  for (const CodeRange& r : kWhiteSpace) {
    if (c < r.lo) return false;
    if (c <= r.hi) return true;
  }
  return false;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols (circled / squared / negative letters) count as Alphabetic.
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189)) {
    return true;
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

Status validate_utf8(std::string_view s, std::string_view what) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {  // fast path for ASCII runs
      ++i;
      continue;
    }
    size_t bad = 0;
    const int len = sequence_length(p + i, s.size() - i, &bad);
    if (len == 0) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", p[i]);
      return InvalidArgument(std::string(what) + ": invalid UTF-8 at byte " + std::to_string(i) +
                             " (byte " + hex + ")");
    }
    i += static_cast<size_t>(len);
  }
  return Status::Ok();
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char b0 = p[i];
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    const char32_t c = (char32_t(b0 & 0x1F) << 6) | (p[i + 1] & 0x3F);
    i += 2;
    return c;
  }
  if (b0 < 0xF0) {
    const char32_t c =
        (char32_t(b0 & 0x0F) << 12) | (char32_t(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
    i += 3;
    return c;
  }
  const char32_t c = (char32_t(b0 & 0x07) << 18) | (char32_t(p[i + 1] & 0x3F) << 12) |
                     (char32_t(p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
  i += 4;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    size_t bad = 0;
    const int len = sequence_length(p + i, bytes.size() - i, &bad);
    if (len > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    }
  }
  return out;
}

Status normalize(NormForm form, std::string_view in, std::string& out) {
  bool ascii = true;
  for (const char ch : in) {
    if (static_cast<unsigned char>(ch) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) {  // every normal form leaves ASCII alone
    out.assign(in);
    return Status::Ok();
  }
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::kNFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormForm::kNFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormForm::kNFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormForm::kNFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* raw = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(in.data()),
                                          static_cast<utf8proc_ssize_t>(in.size()), &raw,
                                          static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(raw, &std::free);
  if (n < 0) {
    return InvalidArgument(std::string("tokenizer normalizer: utf8proc failed: ") +
                           utf8proc_errmsg(n));
  }
  out.assign(reinterpret_cast<const char*>(raw), static_cast<size_t>(n));
  return Status::Ok();
}

}  // namespace zimage::tok
