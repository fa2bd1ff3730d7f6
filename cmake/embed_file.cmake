# Turns the web page into a C++ source defining zimage::serve::web_page() over its bytes, so the
# page ships inside the binary with no runtime file. The page's sources are separate files
# (src/serve/web/): each line `<!-- include NAME -->` of the HTML is replaced by the file NAME of
# the same folder inside <style> (.css) or <script> (.js). Usage:
#   cmake -DIN=index.html -DOUT=page.cpp -P embed_file.cmake
file(READ ${IN} page)
get_filename_component(dir ${IN} DIRECTORY)
string(REGEX MATCHALL "<!-- include [A-Za-z0-9_.-]+ -->" markers "${page}")
foreach(marker IN LISTS markers)
  string(REGEX REPLACE "<!-- include ([A-Za-z0-9_.-]+) -->" "\\1" name "${marker}")
  if(NOT EXISTS ${dir}/${name})
    message(FATAL_ERROR "${IN}: included file ${name} does not exist")
  endif()
  file(READ ${dir}/${name} content)
  if(name MATCHES "\\.css$")
    set(content "<style>\n${content}</style>")
  elseif(name MATCHES "\\.js$")
    set(content "<script>\n${content}</script>")
  else()
    message(FATAL_ERROR "${IN}: ${name}: only .css and .js files are included")
  endif()
  string(REPLACE "${marker}" "${content}" page "${page}")
endforeach()
file(WRITE ${OUT}.html "${page}")
file(READ ${OUT}.html hex HEX)
file(REMOVE ${OUT}.html)
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
