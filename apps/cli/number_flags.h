// A CLI11 check for the floating-point flags of every command. Why: CLI11 converts "nan", "inf"
// and, for a float flag, 1e39 (infinity once narrowed) without complaint, and CLI::Range lets NaN
// through (every comparison with NaN is false), so `--guidance nan` reached the request as NaN,
// and `zimage submit` queued it as JSON null. With this check such a value is a usage error
// naming the flag ("--guidance: nan is not a finite number", exit 2) before anything runs; the
// fields' ranges are the library's (zimage/request_check.h), checked after.
#pragma once

#include <CLI/CLI.hpp>

namespace zimage::cli {

// `as_float`: the flag is a float (values past FLT_MAX are refused too). Text that is not a
// number is left to CLI11's own conversion error. No description: --help is unchanged.
CLI::Validator finite_number(bool as_float);

}  // namespace zimage::cli
