// Reads .npy files (NumPy format 1.0/2.0, little-endian f4/f8/i4/i8/u1, C order) for parity tests.
#pragma once

#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace zimage::test {

// Loads a .npy file into a host tensor (f64 is converted to f32, other dtypes kept).
Result<Tensor> load_npy(const std::string& path);

// Writes a float32 host tensor as .npy (for debugging dumps).
Status save_npy(const std::string& path, const Tensor& t);

// Max |a - b| over all elements; both converted to f32. Infinite for a NaN or unequal sizes
// (never a passing value).
double max_abs_diff(const Tensor& a, const Tensor& b);

// Directory of an unpacked golden case ("v_turbo" -> <build>/golden/v_turbo).
std::string golden_dir(const std::string& name);

}  // namespace zimage::test
