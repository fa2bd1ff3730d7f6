// multipart/form-data (RFC 7578) bodies: the boundary from the Content-Type, then the parts with
// their field names, file names and contents. Written here because the transport (Boost.Beast)
// has no form parser and cpp-httplib's is not usable apart from its server; it reads a body the
// transport already bounded, with its own limits on parts and part headers, and never reads past
// the body it is given.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serve/http/message.h"
#include "zimage/status.h"

namespace zimage::serve::http {

struct MultipartLimits {
  size_t max_parts = 64;
  size_t max_part_header_bytes = 8192;  // the header block of one part
};

// The boundary parameter of a multipart/form-data Content-Type ("" when absent or invalid:
// 1..70 characters, RFC 2046 §5.1.1).
std::string multipart_boundary(std::string_view content_type);

// Splits `body` into its parts. Errors name "body" and say what is malformed.
Result<std::vector<std::pair<std::string, FormFile>>> parse_multipart(
    std::string_view body, std::string_view boundary, const MultipartLimits& limits = {});

}  // namespace zimage::serve::http
