// Tokenizer: loading tokenizer.json, encode (added tokens -> normalizer -> pre-tokenizer -> BPE),
// decode, and the Z-Image prompt wrapping.
// Why: see tokenizer.h. Every field of tokenizer.json that changes ids is read; a value we do not
// implement is an Unsupported error naming the field, never a silently different tokenization.
#include "pipeline/tokenizer/tokenizer.h"

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/fs/file_io.h"
#include "io/fs/json_util.h"
#include "pipeline/tokenizer/tokenizer_internal.h"

namespace zimage {

using json = nlohmann::json;
using tok::AddedToken;
using tok::TokenizerData;

namespace {

bool get_bool(const json& j, const char* key, bool dflt) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? dflt : it->get<bool>();
}

std::string type_of(const json& j) {
  const auto it = j.find("type");
  return it == j.end() || !it->is_string() ? std::string() : it->get<std::string>();
}

Status parse_normalizer(const json& j, const std::string& origin, std::vector<tok::NormForm>& out) {
  if (j.is_null()) return Status::Ok();
  const std::string t = type_of(j);
  if (t == "NFC") {
    out.push_back(tok::NormForm::kNFC);
  } else if (t == "NFD") {
    out.push_back(tok::NormForm::kNFD);
  } else if (t == "NFKC") {
    out.push_back(tok::NormForm::kNFKC);
  } else if (t == "NFKD") {
    out.push_back(tok::NormForm::kNFKD);
  } else if (t == "Sequence") {
    for (const json& n : j.at("normalizers")) ZI_TRY(parse_normalizer(n, origin, out));
  } else {
    return Unsupported(origin + ": normalizer type \"" + t + "\" is not supported");
  }
  return Status::Ok();
}

// Escapes a literal Split pattern ({"String": ...}) into a regex.
std::string escape_literal(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// GPT-2's pattern, used by ByteLevel when use_regex is on.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status parse_pre_tokenizer(const json& j, const std::string& origin,
                           std::vector<tok::PreTokStep>& out, bool& byte_level) {
  if (j.is_null()) return Status::Ok();
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const json& p : j.at("pretokenizers")) {
      ZI_TRY(parse_pre_tokenizer(p, origin, out, byte_level));
    }
    return Status::Ok();
  }
  tok::PreTokStep step;
  if (t == "Split") {
    const json& pat = j.at("pattern");
    std::string regex;
    if (pat.contains("Regex")) {
      regex = pat.at("Regex").get<std::string>();
    } else if (pat.contains("String")) {
      regex = escape_literal(pat.at("String").get<std::string>());
    } else {
      return FormatError(origin + ": pre_tokenizer Split.pattern has neither Regex nor String");
    }
    ZI_ASSIGN_OR_RETURN(step.regex, tok::SplitRegex::compile(regex));
    const std::string b = j.at("behavior").get<std::string>();
    using B = tok::SplitBehavior;
    if (b == "Isolated") {
      step.behavior = B::kIsolated;
    } else if (b == "Removed") {
      step.behavior = B::kRemoved;
    } else if (b == "MergedWithPrevious") {
      step.behavior = B::kMergedWithPrevious;
    } else if (b == "MergedWithNext") {
      step.behavior = B::kMergedWithNext;
    } else if (b == "Contiguous") {
      step.behavior = B::kContiguous;
    } else {
      return Unsupported(origin + ": pre_tokenizer Split.behavior \"" + b + "\" is not supported");
    }
    step.invert = get_bool(j, "invert", false);
  } else if (t == "ByteLevel") {
    step.kind = tok::PreTokStep::Kind::kByteLevel;
    step.add_prefix_space = get_bool(j, "add_prefix_space", true);
    step.use_regex = get_bool(j, "use_regex", true);
    if (step.use_regex) {
      ZI_ASSIGN_OR_RETURN(step.regex, tok::SplitRegex::compile(kGpt2Pattern));
    }
    byte_level = true;
  } else {
    return Unsupported(origin + ": pre_tokenizer type \"" + t + "\" is not supported");
  }
  out.push_back(std::move(step));
  return Status::Ok();
}

// model.vocab and model.merges hold ~300k JSON values. Taking them out while parsing, instead of
// through nlohmann's DOM (a std::map per object), makes loading about twice as fast.
struct ModelTables {
  tok::StringMap<int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool have_vocab = false, have_merges = false;
  std::string error;  // the first malformed entry
};

// Parses tokenizer.json; model.vocab and model.merges go to `t` and stay empty in the result.
json parse_collecting_tables(std::string_view text, ModelTables& t) {
  using E = json::parse_event_t;
  std::vector<std::string> keys(4);  // the key at each depth of the current position
  size_t merge_index = 0;
  auto fail = [&t](std::string m) {
    if (t.error.empty()) t.error = std::move(m);
    return false;
  };
  auto add_merge = [&](std::string a, std::string b) {
    t.merges.emplace_back(std::move(a), std::move(b));
    return false;  // not kept in the DOM
  };
  json::parser_callback_t cb = [&](int depth, E ev, json& parsed) -> bool {
    const size_t d = static_cast<size_t>(depth);
    if (ev == E::key) {
      if (d >= keys.size()) keys.resize(d + 1);
      keys[d] = std::move(parsed.get_ref<std::string&>());  // the parser keeps its own copy
      return !(d == 3 && t.have_vocab && keys[1] == "model" && keys[2] == "vocab");
    }
    if (d < 2 || keys[1] != "model") return true;
    if (d == 2) {
      if (ev == E::object_start && keys[2] == "vocab") t.have_vocab = true;
      if (ev == E::array_start && keys[2] == "merges") t.have_merges = true;
      return true;
    }
    if (d != 3) return true;
    if (keys[2] == "vocab" && t.have_vocab) {
      const std::string where = "model.vocab[\"" + keys[3] + "\"]";
      if (ev == E::value) {
        if (!parsed.is_number_integer()) return fail(where + " is not an integer id");
        const int64_t id = parsed.get<int64_t>();
        if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
          return fail(where + " = " + std::to_string(id) + " is not a valid id");
        }
        t.vocab[keys[3]] = static_cast<int32_t>(id);  // a repeated token keeps its last id
        return false;
      }
      return fail(where + " is not an integer id");  // an object or array
    }
    if (keys[2] == "merges" && t.have_merges) {
      if (ev != E::value && ev != E::array_end && ev != E::object_end) return true;
      const std::string where = "model.merges[" + std::to_string(merge_index++) + "]";
      if (ev == E::value && parsed.is_string()) {  // legacy "a b"; "#version" lines are comments
        const std::string& s = parsed.get_ref<const std::string&>();
        if (s.rfind("#version", 0) == 0) return false;
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return fail(where + " \"" + s + "\" is not two tokens separated by one space");
        }
        return add_merge(s.substr(0, sp), s.substr(sp + 1));
      }
      if (ev == E::array_end && parsed.size() == 2 && parsed[0].is_string() &&
          parsed[1].is_string()) {
        return add_merge(std::move(parsed[0].get_ref<std::string&>()),
                         std::move(parsed[1].get_ref<std::string&>()));
      }
      return fail(where + " is neither \"a b\" nor [a, b]");
    }
    return true;
  };
  return json::parse(text, cb, /*allow_exceptions=*/false);
}

Status parse_model(const json& m, const std::string& origin, bool byte_level, ModelTables& tables,
                   tok::Bpe& out) {
  const std::string t = type_of(m);
  if (!t.empty() && t != "BPE") {
    return Unsupported(origin + ": model type \"" + t + "\" is not supported (only BPE)");
  }
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() > 0.0) {
    return Unsupported(origin + ": model.dropout > 0 (random BPE) is not supported");
  }
  if (get_bool(m, "byte_fallback", false)) {
    return Unsupported(origin + ": model.byte_fallback is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && !m[key].get<std::string>().empty()) {
      return Unsupported(origin + ": model." + key + " is not supported");
    }
  }
  if (!tables.error.empty()) return FormatError(origin + ": " + tables.error);
  if (!tables.have_vocab) return FormatError(origin + ": model.vocab is missing or not an object");
  if (!tables.have_merges) return FormatError(origin + ": model.merges is missing or not an array");
  tok::StringMap<int32_t> vocab = std::move(tables.vocab);
  const auto& merges = tables.merges;
  tok::BpeOptions opt;
  opt.byte_level = byte_level;
  opt.ignore_merges = get_bool(m, "ignore_merges", false);
  opt.fuse_unk = get_bool(m, "fuse_unk", false);
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const std::string unk = m["unk_token"].get<std::string>();
    const auto it = vocab.find(unk);
    if (it == vocab.end()) {
      return FormatError(origin + ": model.unk_token \"" + unk + "\" is not in the vocab");
    }
    opt.unk_id = it->second;
  }
  ZI_ASSIGN_OR_RETURN(out, tok::Bpe::build(std::move(vocab), merges, opt));
  return Status::Ok();
}

Status apply_normalizers(const TokenizerData& d, std::string_view in, std::string& out) {
  out.assign(in);
  std::string tmp;
  for (const tok::NormForm f : d.normalizers) {
    ZI_TRY(tok::normalize(f, out, tmp));
    out.swap(tmp);
  }
  return Status::Ok();
}

// Adds the tokens as HF's AddedVocabulary::add_tokens does: an existing content keeps its id, a
// new one gets the next free id after the model vocab (the "id" field only causes a warning there).
Status parse_added_tokens(const json& arr, const std::string& origin, TokenizerData& d) {
  if (arr.is_null()) return Status::Ok();
  int32_t next_id = static_cast<int32_t>(d.bpe.size());
  for (const json& j : arr) {
    auto t = std::make_unique<AddedToken>();
    t->content = j.at("content").get<std::string>();
    if (t->content.empty()) continue;
    ZI_TRY(tok::validate_utf8(t->content, origin + ": added token content"));
    t->special = get_bool(j, "special", false);
    t->single_word = get_bool(j, "single_word", false);
    t->lstrip = get_bool(j, "lstrip", false);
    t->rstrip = get_bool(j, "rstrip", false);
    t->normalized = get_bool(j, "normalized", true);
    t->match = t->content;
    if (t->normalized) ZI_TRY(apply_normalizers(d, t->content, t->match));
    if (const auto it = d.added_by_content.find(t->content); it != d.added_by_content.end()) {
      t->id = it->second;
    } else if (const auto vid = d.bpe.token_to_id(t->content)) {
      t->id = *vid;
    } else {
      t->id = next_id++;
    }
    d.added_by_content[t->content] = t->id;
    d.added_by_id[t->id] = t.get();
    d.added.push_back(std::move(t));
  }
  for (const auto& [id, t] : d.added_by_id) {
    (t->normalized ? d.norm_matcher : d.raw_matcher).add(t);
  }
  return Status::Ok();
}

// tokenizer.json is ~11 MB for Qwen3; 512 MiB is far above any real tokenizer.
constexpr uint64_t kMaxTokenizerFileBytes = uint64_t{512} << 20;

Result<std::string> read_file(const std::filesystem::path& p) {
  return read_input_file(p.string(), kMaxTokenizerFileBytes);  // regular files only
}

// pad_token from tokenizer_config.json next to tokenizer.json (a string or {"content": ...}).
std::optional<std::string> config_pad_token(const std::filesystem::path& dir) {
  std::error_code ec;
  const auto cfg = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(std::filesystem::symlink_status(cfg, ec))) return std::nullopt;
  auto text = read_file(cfg);
  if (!text.ok()) return std::nullopt;
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("pad_token")) return std::nullopt;
  const json& p = j["pad_token"];
  if (p.is_string()) return p.get<std::string>();
  if (p.is_object() && p.contains("content") && p["content"].is_string()) {
    return p["content"].get<std::string>();
  }
  return std::nullopt;
}

// Everything load() and load_from_json() share; `pad_token` comes from tokenizer_config.json.
Result<std::shared_ptr<TokenizerData>> build_data(std::string_view json_text,
                                                  const std::string& origin,
                                                  const std::optional<std::string>& pad_token) {
  ModelTables tables;
  const json j = parse_collecting_tables(json_text, tables);
  if (j.is_discarded()) {
    // The fast parser says only "discarded"; the strict one says where and why (a truncated
    // file: "unexpected end of input" at its last byte).
    auto strict = json_util::parse_strict(json_text, origin);
    if (!strict.ok()) return strict.status();
    return FormatError(origin + ": invalid JSON");
  }
  if (!j.is_object())
    return FormatError(origin + ": not a JSON object (the top level is not {...})");
  auto d = std::make_shared<TokenizerData>();
  try {
    if (j.contains("normalizer")) ZI_TRY(parse_normalizer(j["normalizer"], origin, d->normalizers));
    bool byte_level = false;
    if (j.contains("pre_tokenizer")) {
      ZI_TRY(parse_pre_tokenizer(j["pre_tokenizer"], origin, d->pre_tok, byte_level));
    }
    if (!j.contains("model")) return FormatError(origin + ": no \"model\"");
    ZI_TRY(parse_model(j["model"], origin, byte_level, tables, d->bpe));
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      const std::string t = type_of(j["decoder"]);
      if (t != "ByteLevel") {
        return Unsupported(origin + ": decoder type \"" + t + "\" is not supported");
      }
      d->byte_level_decoder = true;
    } else {
      d->byte_level_decoder = false;  // HF joins the tokens with spaces
    }
    if (j.contains("post_processor") && !j["post_processor"].is_null() &&
        type_of(j["post_processor"]) != "ByteLevel") {
      return Unsupported(origin + ": post_processor type \"" + type_of(j["post_processor"]) +
                         "\" is not supported");
    }
    if (j.contains("added_tokens")) ZI_TRY(parse_added_tokens(j["added_tokens"], origin, *d));
  } catch (const std::exception& e) {  // a field of the wrong JSON type
    return FormatError(origin + ": malformed tokenizer.json: " + e.what());
  }
  int32_t max_id = d->bpe.max_id();
  for (const auto& [id, t] : d->added_by_id) max_id = std::max(max_id, id);
  d->vocab_size = static_cast<size_t>(max_id + 1);
  const std::string pad = pad_token.value_or("<|endoftext|>");
  if (const auto it = d->added_by_content.find(pad); it != d->added_by_content.end()) {
    d->pad_id = it->second;
  } else if (const auto id = d->bpe.token_to_id(pad)) {
    d->pad_id = *id;
  }
  return d;
}

}  // namespace

Result<Tokenizer> Tokenizer::load_from_json(std::string_view json_text, const std::string& origin) {
  ZI_ASSIGN_OR_RETURN(auto d, build_data(json_text, origin, std::nullopt));
  return Tokenizer(std::move(d));
}

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(file, ec)) {
    // A model folder (tokenizer/tokenizer.json) or a tokenizer folder (tokenizer.json). Whatever
    // exists under those names is opened, so a folder or FIFO there is reported as what it is.
    if (fs::exists(fs::symlink_status(file / "tokenizer" / "tokenizer.json", ec))) {
      file = file / "tokenizer" / "tokenizer.json";
    } else if (fs::exists(fs::symlink_status(file / "tokenizer.json", ec))) {
      file = file / "tokenizer.json";
    } else {
      return NotFound(path + ": no tokenizer.json (looked in " + path + "/tokenizer/ and " + path +
                      "/)");
    }
  } else if (!fs::exists(fs::symlink_status(file, ec))) {
    return NotFound(path + ": no such tokenizer folder or tokenizer.json file");
  }
  ZI_ASSIGN_OR_RETURN(const std::string text, read_file(file));
  ZI_ASSIGN_OR_RETURN(auto d,
                      build_data(text, file.string(), config_pad_token(file.parent_path())));
  return Tokenizer(std::move(d));
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text) const {
  ZI_TRY(tok::validate_utf8(text, "tokenizer input"));
  if (text.size() >= (size_t{1} << 31)) {
    return InvalidArgument("tokenizer input: " + std::to_string(text.size()) +
                           " bytes is more than the 2 GiB limit");
  }
  const TokenizerData& d = *d_;
  std::vector<int32_t> ids;
  std::vector<std::pair<const AddedToken*, std::pair<size_t, size_t>>> raw_parts, norm_parts;
  if (d.raw_matcher.empty()) {
    if (!text.empty()) raw_parts.push_back({nullptr, {0, text.size()}});
  } else {
    d.raw_matcher.split(text, raw_parts);
  }
  std::string normalized;
  tok::Pieces words;
  for (const auto& [raw_tok, raw_span] : raw_parts) {
    if (raw_tok != nullptr) {
      ids.push_back(raw_tok->id);
      continue;
    }
    ZI_TRY(apply_normalizers(d, text.substr(raw_span.first, raw_span.second - raw_span.first),
                             normalized));
    norm_parts.clear();
    if (d.norm_matcher.empty()) {
      if (!normalized.empty()) norm_parts.push_back({nullptr, {0, normalized.size()}});
    } else {
      d.norm_matcher.split(normalized, norm_parts);
    }
    for (const auto& [norm_tok, span] : norm_parts) {
      if (norm_tok != nullptr) {
        ids.push_back(norm_tok->id);
        continue;
      }
      const std::string_view piece(normalized.data() + span.first, span.second - span.first);
      ZI_TRY(tok::pre_tokenize(d.pre_tok, piece, words));
      for (size_t w = 0; w < words.spans.size(); ++w) d.bpe.encode_word(words.at(w), ids);
    }
  }
  return ids;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const auto it = d_->added_by_id.find(id); it != d_->added_by_id.end()) {
    return it->second->match;
  }
  if (const std::string* s = d_->bpe.id_to_token(id)) return *s;
  return std::nullopt;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  bool first = true;
  for (const int32_t id : ids) {
    const std::optional<std::string> token = id_to_token(id);
    if (!token) continue;  // unknown ids are skipped, as HF does
    if (!d_->byte_level_decoder) {
      if (!first) bytes += ' ';
      bytes += *token;
      first = false;
      continue;
    }
    // ByteLevel decoder: a token whose characters all map back to bytes gives those bytes; any
    // other token (e.g. a special token with characters outside the map) gives its UTF-8 as is.
    std::string mapped;
    bool all_mapped = true;
    for (size_t i = 0; i < token->size();) {
      const int b = tok::unicode_to_byte(tok::next_code_point(*token, i));
      if (b < 0) {
        all_mapped = false;
        break;
      }
      mapped += static_cast<char>(b);
    }
    bytes += all_mapped ? mapped : *token;
  }
  return d_->byte_level_decoder ? tok::utf8_lossy(bytes) : bytes;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto it = d_->added_by_content.find(token); it != d_->added_by_content.end()) {
    return it->second;
  }
  return d_->bpe.token_to_id(token);
}

int32_t Tokenizer::pad_id() const {
  return d_->pad_id;
}
size_t Tokenizer::vocab_size() const {
  return d_->vocab_size;
}

std::string zimage_chat_template(std::string_view prompt) {
  std::string s = "<|im_start|>user\n";
  s.append(prompt);
  s += "<|im_end|>\n<|im_start|>assistant\n";
  return s;
}

Result<std::vector<int32_t>> encode_prompt(const Tokenizer& tok, std::string_view prompt,
                                           int max_len) {
  if (max_len <= 0) {
    return InvalidArgument("encode_prompt: max_len must be positive, got " +
                           std::to_string(max_len));
  }
  ZI_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.encode(zimage_chat_template(prompt)));
  if (ids.size() > static_cast<size_t>(max_len)) ids.resize(static_cast<size_t>(max_len));
  return ids;
}

}  // namespace zimage
