// zimage tokenize [--tokenizer DIR] [--chat-template]: token ids for JSON-string lines on stdin
// (default: the built-in model's tokenizer, the published Qwen3 one).
// Why: lets scripts compare our tokenizer with Hugging Face's line by line, and shows what the
// text encoder will see for a prompt. Input: one JSON string per line. Output: one JSON array of
// ids per line. --chat-template applies the Z-Image wrapping and 512-token truncation first.
// A line that is not a JSON string (or not UTF-8) stops the run with its line number, exit 1.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "builtin/builtin_model.h"
#include "commands.h"
#include "pipeline/tokenizer/tokenizer.h"

namespace zimage::cli {
namespace {

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "zimage tokenize: %s\n", message.c_str());
  throw CLI::RuntimeError(1);
}

struct TokenizeOptions {
  std::string tokenizer;
  bool chat_template = false;
  int max_len = 512;
};

void run_tokenize(const TokenizeOptions& o) {
  std::string dir = o.tokenizer;
  if (dir.empty()) {
    auto builtin = builtin_model_dir();
    if (!builtin.ok()) fail(builtin.status().to_string());
    dir = *builtin + "/tokenizer";
  }
  auto tok = Tokenizer::load(dir);
  if (!tok.ok()) fail(tok.status().to_string());
  std::string line, out;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_string()) {
      fail("stdin line " + std::to_string(line_no) + ": expected a JSON string, e.g. \"a cat\"");
    }
    const std::string& text = j.get_ref<const std::string&>();
    auto ids = o.chat_template ? encode_prompt(*tok, text, o.max_len) : tok->encode(text);
    if (!ids.ok()) fail("stdin line " + std::to_string(line_no) + ": " + ids.status().to_string());
    out.clear();
    out += '[';
    for (size_t i = 0; i < ids->size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string((*ids)[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);  // a caller may feed one line and wait for its answer
  }
  if (std::cin.bad()) fail("reading stdin failed after line " + std::to_string(line_no));
}

}  // namespace

void register_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Token ids of JSON-string lines on stdin, one JSON array per line (Qwen3 tokenizer)");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Model folder, its tokenizer/ folder, or a tokenizer.json file (default: the "
                  "built-in model's Qwen3 tokenizer)");
  cmd->add_flag("--chat-template", o->chat_template,
                "Wrap each prompt in the Z-Image chat template and keep the first 512 ids");
  cmd->callback([o] { run_tokenize(*o); });
}

}  // namespace zimage::cli
