# Turns one file into a C++ source defining zimage::serve::web_page() over its bytes, so the web
# page ships inside the binary with no build step and no runtime file. Usage:
#   cmake -DIN=page.html -DOUT=page.cpp -P embed_file.cmake
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR size "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT}.tmp
"// Generated from ${IN} by cmake/embed_file.cmake: do not edit.\n"
"#include <string_view>\n"
"namespace zimage::serve {\n"
"namespace {\n"
"const unsigned char kData[] = {\n${bytes}0};\n"
"}  // namespace\n"
"std::string_view web_page() {\n"
"  return {reinterpret_cast<const char*>(kData), ${size}};\n"
"}\n"
"}  // namespace zimage::serve\n")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
