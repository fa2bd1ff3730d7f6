// See number_flags.h.
#include "number_flags.h"

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <string>

namespace zimage::cli {

CLI::Validator finite_number(bool as_float) {
  return CLI::Validator(
      [as_float](std::string& input) -> std::string {
        if (input.empty()) return std::string();
        char* end = nullptr;
        const long double v = std::strtold(input.c_str(), &end);
        if (end != input.c_str() + input.size()) return std::string();  // CLI11 says "not a number"
        const long double max = as_float ? FLT_MAX : DBL_MAX;
        if (!std::isfinite(v)) return input + " is not a finite number";
        if (std::fabs(v) > max)
          return input + " is not a finite number (too large for " +
                 (as_float ? "a float" : "a double") + ")";
        return std::string();
      },
      "", "FINITE");
}

}  // namespace zimage::cli
