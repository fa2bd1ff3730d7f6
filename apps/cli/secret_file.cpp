// See secret_file.h.
#include "secret_file.h"

#include "io/fs/file_io.h"

namespace zimage::cli {

Result<std::string> read_secret_file(const std::string& flag, const std::string& path) {
  const std::string where = flag + " " + path;
  if (path.empty()) return InvalidArgument(flag + ": no file given");
  auto text = read_input_file(path, 64 * 1024);
  if (!text.ok()) {  // the reader's message names the file and why (missing, a folder, size, ...)
    const std::string& m = text.status().message();
    const std::string why = m.rfind(path + ": ", 0) == 0 ? m.substr(path.size() + 2) : m;
    return InvalidArgument(where + ": cannot read the file: " + why);
  }
  std::string s = std::move(text).value();
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
  if (s.empty()) return InvalidArgument(where + ": the file is empty");
  for (char c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return InvalidArgument(where +
                             ": the file holds a control character or more than one line; put "
                             "the secret alone on one line");
  return s;
}

Status apply_broker_password_file(const std::string& path, broker::RedisUrl* url) {
  if (path.empty()) return Status::Ok();
  if (!url->password.empty())
    return InvalidArgument(
        "--broker-password-file: the --broker URL holds a password already; give one or the "
        "other");
  ZI_ASSIGN_OR_RETURN(url->password, read_secret_file("--broker-password-file", path));
  return Status::Ok();
}

}  // namespace zimage::cli
