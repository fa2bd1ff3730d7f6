// Tokenizer throughput: tokens/s and MB/s on the HF test corpus (2,600 varied strings, many
// scripts) and on a long English text, warm (word cache filled) and cold (fresh tokenizer), plus
// load time and the latency of one typical prompt through encode_prompt.
// Why: the tokenizer runs once per prompt, so it must never be a visible share of a request; these
// numbers show how far from that it is and catch regressions (e.g. a slow regex class).
#include <benchmark/benchmark.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pipeline/tokenizer/tokenizer.h"

namespace {

using zimage::Tokenizer;

std::string gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return {};
  std::string out;
  std::vector<char> buf(1 << 16);
  int n = 0;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) {
    out.append(buf.data(), static_cast<size_t>(n));
  }
  gzclose(f);
  return out;
}

const std::string& tokenizer_json() {
  static const std::string s =
      gunzip_file(std::string(ZIMAGE_TEST_DATA_DIR) + "/qwen3-tokenizer/tokenizer.json.gz");
  return s;
}

Tokenizer load_fresh() {
  auto t = Tokenizer::load_from_json(tokenizer_json(), "qwen3 tokenizer.json");
  if (!t.ok()) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", t.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(t).value();
}

const Tokenizer& shared_tokenizer() {
  static const Tokenizer t = load_fresh();
  return t;
}

const std::vector<std::string>& corpus_texts() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    std::istringstream in(
        gunzip_file(std::string(ZIMAGE_TEST_DATA_DIR) + "/tokenizer/corpus.jsonl.gz"));
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("text")) out.push_back(j["text"].get<std::string>());
    }
    return out;
  }();
  return texts;
}

// ~1 MB of English prose-like text from a fixed vocabulary (seeded, so runs compare).
const std::string& long_english() {
  static const std::string text = [] {
    const char* words[] = {
        "the",       "quick",      "brown",   "fox",        "jumps",     "over",     "lazy",
        "dog",       "lighthouse", "stands",  "on",         "a",         "cliff",    "above",
        "stormy",    "sea",        "while",   "seagulls",   "circle",    "overhead", "and",
        "fishermen", "haul",       "their",   "nets",       "ashore",    "painting", "shows",
        "warm",      "golden",     "light",   "spilling",   "across",    "wet",      "rocks",
        "it's",      "we'll",      "they're", "photograph", "cinematic", "detailed", "ultra",
        "realistic", "1920s",      "3",       "portrait",   "of",        "an",       "old",
        "woman",     "smiling",    "softly",  "in",         "the",       "morning",  "garden"};
    std::mt19937 rng(7);
    std::string s;
    while (s.size() < (1u << 20)) {
      const int n = 6 + static_cast<int>(rng() % 14);
      for (int i = 0; i < n; ++i) {
        std::string w = words[rng() % (sizeof(words) / sizeof(words[0]))];
        if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
        s += w;
        s += i + 1 < n ? (rng() % 9 == 0 ? ", " : " ") : ". ";
      }
      if (rng() % 5 == 0) s += "\n\n";
    }
    return s;
  }();
  return text;
}

void set_counters(benchmark::State& state, size_t tokens, size_t bytes) {
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["MB/s"] =
      benchmark::Counter(static_cast<double>(bytes) / 1e6, benchmark::Counter::kIsRate);
}

void BM_EncodeCorpusWarm(benchmark::State& state) {
  const Tokenizer& t = shared_tokenizer();
  const auto& texts = corpus_texts();
  size_t tokens = 0, bytes = 0;
  for (auto _ : state) {
    for (const std::string& s : texts) {
      auto ids = t.encode(s);
      benchmark::DoNotOptimize(ids);
      tokens += ids->size();
      bytes += s.size();
    }
  }
  set_counters(state, tokens, bytes);
}
BENCHMARK(BM_EncodeCorpusWarm)->Unit(benchmark::kMillisecond);

void BM_EncodeLongEnglishWarm(benchmark::State& state) {
  const Tokenizer& t = shared_tokenizer();
  const std::string& text = long_english();
  size_t tokens = 0, bytes = 0;
  for (auto _ : state) {
    auto ids = t.encode(text);
    benchmark::DoNotOptimize(ids);
    tokens += ids->size();
    bytes += text.size();
  }
  set_counters(state, tokens, bytes);
}
BENCHMARK(BM_EncodeLongEnglishWarm)->Unit(benchmark::kMillisecond);

// A fresh tokenizer per iteration (load not timed): every word goes through BPE merging.
void encode_cold(benchmark::State& state, const std::vector<std::string>& texts) {
  size_t tokens = 0, bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const Tokenizer t = load_fresh();
    state.ResumeTiming();
    for (const std::string& s : texts) {
      auto ids = t.encode(s);
      benchmark::DoNotOptimize(ids);
      tokens += ids->size();
      bytes += s.size();
    }
  }
  set_counters(state, tokens, bytes);
}
void BM_EncodeCorpusCold(benchmark::State& state) {
  encode_cold(state, corpus_texts());
}
BENCHMARK(BM_EncodeCorpusCold)->Unit(benchmark::kMillisecond)->Iterations(3);
void BM_EncodeLongEnglishCold(benchmark::State& state) {
  encode_cold(state, {long_english()});
}
BENCHMARK(BM_EncodeLongEnglishCold)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_EncodePrompt(benchmark::State& state) {
  const Tokenizer& t = shared_tokenizer();
  const std::string prompt =
      "Portrait of an old fisherman, weathered face, 85mm lens, f/1.8, natural light, "
      "冰雪女王，坐在冰冻的王座上，精致细节，奇幻艺术";
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = zimage::encode_prompt(t, prompt);
    benchmark::DoNotOptimize(ids);
    tokens += ids->size();
  }
  set_counters(state, tokens, prompt.size() * state.iterations());
}
BENCHMARK(BM_EncodePrompt)->Unit(benchmark::kMicrosecond);

void BM_DecodeCorpus(benchmark::State& state) {
  const Tokenizer& t = shared_tokenizer();
  std::vector<std::vector<int32_t>> all;
  for (const std::string& s : corpus_texts()) all.push_back(t.encode(s).value());
  size_t tokens = 0, bytes = 0;
  for (auto _ : state) {
    for (const auto& ids : all) {
      const std::string s = t.decode(ids);
      benchmark::DoNotOptimize(s.data());
      tokens += ids.size();
      bytes += s.size();
    }
  }
  set_counters(state, tokens, bytes);
}
BENCHMARK(BM_DecodeCorpus)->Unit(benchmark::kMillisecond);

void BM_Load(benchmark::State& state) {
  tokenizer_json();  // read and gunzip once, outside the timing
  for (auto _ : state) {
    const Tokenizer t = load_fresh();
    benchmark::DoNotOptimize(t.vocab_size());
  }
}
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
