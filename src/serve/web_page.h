// The web page served at "/" (src/serve/web/index.html), embedded at build time by
// cmake/embed_file.cmake: the binary needs no files next to it.
#pragma once

#include <string_view>

namespace zimage::serve {

std::string_view web_page();

}  // namespace zimage::serve
