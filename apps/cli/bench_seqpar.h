// zimage bench --devices LIST --parallel sequence (bench_seqpar.cpp).
#pragma once

#include <string>
#include <vector>

#include "bench_common.h"

namespace zimage::cli::bench {

// The DiT forward time per rank count over `devices` at each o.sizes entry: a Markdown table on
// stdout, the rows in R["sequence_parallel"].
void run_seqpar_bench(const Options& o, const std::string& dir,
                      const std::vector<std::string>& devices, const std::string& comm, json& R);

}  // namespace zimage::cli::bench
