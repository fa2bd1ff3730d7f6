// The single-file and FP8 test files, written at test time from a tiny golden model folder exactly
// as tools/make_single_file_cases.py writes them (its docstring lists them): ComfyUI names, an
// all-in-one checkpoint, FP8 casts and ComfyUI's scaled FP8 formats. Why here and not in git:
// the files are megabytes each; the repository keeps only the script's manifest (name, dtype,
// shape and CRC-32 of every tensor, tests/data/single_file/manifest.json) and its diffusers
// references, and the tests first check that these files match the manifest.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace zimage::test {

// tests/data/single_file (the manifest and the references).
std::string single_file_data_dir();

// Writes every file of the manifest into `out_dir` as <name>.safetensors from the diffusers
// folder `model_dir`; returns name -> path.
Result<std::map<std::string, std::string>> write_single_file_cases(const std::string& model_dir,
                                                                   const std::string& out_dir);

// Differences between the file at `path` and its manifest entry (tensor names, dtypes, shapes,
// CRC-32 of the bytes; the header metadata as JSON values). Empty = identical.
std::vector<std::string> compare_with_manifest(const std::string& path,
                                               const nlohmann::json& entry);

}  // namespace zimage::test
