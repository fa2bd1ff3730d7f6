// The Qwen3 text tokenizer: byte-level BPE read from a Hugging Face `tokenizer.json`.
// Why: the text encoder only sees ids, so ids must be exactly the ones Hugging Face `tokenizers`
// gives for the same text (diffusers' Z-Image pipeline tokenizes with it). This class replays the
// same steps: added tokens are split out first, the rest is normalized (NFC), split by the
// pre-tokenizer regex, mapped to byte-level characters and merged by BPE rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace zimage {

namespace tok {
struct TokenizerData;  // the loaded model (tokenizer_internal.h)
}

class Tokenizer {
 public:
  // path: a model folder (uses <path>/tokenizer/), a tokenizer folder, or a tokenizer.json file.
  static Result<Tokenizer> load(const std::string& path);
  // Loads from the text of a tokenizer.json; `origin` names it in error messages.
  static Result<Tokenizer> load_from_json(std::string_view json_text, const std::string& origin);

  // Ids of `text` (UTF-8) as `tokenizer.encode(text, add_special_tokens=False)`: no chat template,
  // no BOS. Invalid UTF-8 is an InvalidArgument error naming the byte offset.
  Result<std::vector<int32_t>> encode(std::string_view text) const;
  // Text of `ids` as `tokenizer.decode(ids)` (special tokens kept; unknown ids skipped; bytes that
  // do not form UTF-8 become U+FFFD).
  std::string decode(const std::vector<int32_t>& ids) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string of `id` (added token content or byte-level vocab string), if any.
  std::optional<std::string> id_to_token(int32_t id) const;
  int32_t pad_id() const;     // <|endoftext|> 151643 for Qwen3 (-1 if the tokenizer has none)
  size_t vocab_size() const;  // 1 + the largest id (vocab and added tokens): 151669 for Qwen3

 private:
  explicit Tokenizer(std::shared_ptr<const tok::TokenizerData> d) : d_(std::move(d)) {}
  std::shared_ptr<const tok::TokenizerData> d_;  // immutable after load: copies share it
};

// "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n" (spec §3.1).
std::string zimage_chat_template(std::string_view prompt);

// Chat template, encode, keep the first max_len ids (right truncation), as the diffusers pipeline.
Result<std::vector<int32_t>> encode_prompt(const Tokenizer& tok, std::string_view prompt,
                                           int max_len = 512);

}  // namespace zimage
