// Per-request LoRA names (lora_request.h).
#include "serve/lora_request.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>

namespace zimage::serve {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kExt = ".safetensors";

bool ends_with(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

Status parse_scale(const json& v, const std::string& field, float* out) {
  if (!v.is_number()) return InvalidArgument(field + ": must be a number, got " + v.type_name());
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > kMaxLoraScale)
    return InvalidArgument(field + ": must be a finite number in -16..16");
  *out = static_cast<float>(d);
  return Status::Ok();
}

}  // namespace

Status check_lora_name(const std::string& name, const std::string& field) {
  if (name.empty()) return InvalidArgument(field + ": must not be empty");
  if (name.size() > 255) return InvalidArgument(field + ": longer than 255 bytes");
  for (unsigned char c : name)
    if (c < 0x20 || c == 0x7f || c == '\\' || c == ':')
      return InvalidArgument(field + ": control characters, '\\' and ':' are not allowed");
  if (name.front() == '/') return InvalidArgument(field + ": must be a name, not an absolute path");
  size_t start = 0;
  while (start <= name.size()) {
    const size_t slash = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, slash - start);
    if (part.empty() || part == "." || part == "..")
      return InvalidArgument(field + ": '" + name +
                             "' has an empty, '.' or '..' path component; give a file name "
                             "inside the LoRA folder");
    start = slash + 1;
  }
  if (!ends_with(name, kExt)) return InvalidArgument(field + ": must name a .safetensors file");
  return Status::Ok();
}

Status parse_lora_field(const json& obj, std::vector<LoraSpec>* out) {
  auto it = obj.find("loras");
  if (it == obj.end() || it->is_null()) return Status::Ok();
  json parsed;
  const json* v = &*it;
  if (v->is_string()) {  // a multipart form field: bounded before parsing (size and nesting)
    const std::string& text = v->get_ref<const std::string&>();
    const auto opens =
        std::count(text.begin(), text.end(), '[') + std::count(text.begin(), text.end(), '{');
    if (text.size() > 16384 || opens > static_cast<long>(kMaxLorasPerRequest) + 1)
      return InvalidArgument("loras: must be an array of at most 16 {name, scale} objects");
    parsed = json::parse(text, nullptr, false);
    if (parsed.is_discarded()) return InvalidArgument("loras: not valid JSON");
    v = &parsed;
  }
  if (!v->is_array()) return InvalidArgument("loras: must be an array of {name, scale} objects");
  if (v->size() > kMaxLorasPerRequest)
    return InvalidArgument("loras: " + std::to_string(v->size()) + " LoRAs, at most " +
                           std::to_string(kMaxLorasPerRequest));
  for (size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    const std::string f = "loras[" + std::to_string(i) + "]";
    if (!e.is_object()) return InvalidArgument(f + ": must be an object {name, scale}");
    for (auto k = e.begin(); k != e.end(); ++k)
      if (k.key() != "name" && k.key() != "scale")
        return InvalidArgument(f + ": unknown field (only name and scale)");
    auto n = e.find("name");
    if (n == e.end() || !n->is_string()) return InvalidArgument(f + ".name: must be a string");
    LoraSpec s;
    s.path = n->get<std::string>();
    ZI_TRY(check_lora_name(s.path, f + ".name"));
    auto sc = e.find("scale");
    if (sc != e.end() && !sc->is_null()) ZI_TRY(parse_scale(*sc, f + ".scale", &s.scale));
    out->push_back(std::move(s));
  }
  return Status::Ok();
}

Status take_prompt_loras(std::string* prompt, std::vector<LoraSpec>* out) {
  const std::string tag = "<lora:";
  size_t pos = 0;
  while ((pos = prompt->find(tag, pos)) != std::string::npos) {
    const size_t end = prompt->find('>', pos);
    if (end == std::string::npos) return InvalidArgument("prompt: a <lora:...> tag is not closed");
    const std::string body = prompt->substr(pos + tag.size(), end - pos - tag.size());
    LoraSpec s;
    const size_t colon = body.rfind(':');
    s.path = colon == std::string::npos ? body : body.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string num = body.substr(colon + 1);
      char* stop = nullptr;
      const double d = std::strtod(num.c_str(), &stop);
      if (num.empty() || stop != num.c_str() + num.size() || !std::isfinite(d) ||
          std::fabs(d) > kMaxLoraScale)
        return InvalidArgument("prompt: <lora:" + s.path + ":" + num +
                               ">: the strength must be a number in -16..16");
      s.scale = static_cast<float>(d);
    }
    if (!ends_with(s.path, kExt)) s.path += kExt;
    ZI_TRY(check_lora_name(s.path, "prompt"));
    if (out->size() >= kMaxLorasPerRequest)
      return InvalidArgument("prompt: more than " + std::to_string(kMaxLorasPerRequest) + " LoRAs");
    out->push_back(std::move(s));
    prompt->erase(pos, end + 1 - pos);
  }
  return Status::Ok();
}

Status resolve_lora_names(std::vector<GenerateRequest>& runs, const std::string& lora_dir) {
  for (GenerateRequest& r : runs) {
    if (r.loras.empty()) continue;
    if (lora_dir.empty())
      return InvalidArgument("loras: this server takes no LoRAs (start it with --lora-dir)");
    std::error_code ec;
    const fs::path root = fs::canonical(lora_dir, ec);
    if (ec) return InvalidArgument("loras: the server's LoRA folder cannot be read");
    for (size_t i = 0; i < r.loras.size(); ++i) {
      const std::string f = "loras[" + std::to_string(i) + "].name";
      const std::string name = r.loras[i].path;
      ZI_TRY(check_lora_name(name, f));
      const fs::path file = fs::canonical(root / name, ec);
      if (ec) return InvalidArgument(f + ": no LoRA '" + name + "' (GET /v1/loras lists them)");
      // Symlinks followed: the file must still be inside the folder.
      const std::string rs = root.string() + "/", fsn = file.string();
      if (fsn.compare(0, rs.size(), rs) != 0)
        return InvalidArgument(f + ": '" + name + "' lies outside the LoRA folder");
      if (!fs::is_regular_file(file, ec))
        return InvalidArgument(f + ": '" + name + "' is not a file");
      r.loras[i].path = fsn;
    }
  }
  return Status::Ok();
}

Status check_request_loras(const Engine& engine, std::vector<GenerateRequest>& runs,
                           const std::string& lora_dir) {
  std::vector<std::vector<LoraSpec>> named;
  for (const GenerateRequest& r : runs) named.push_back(r.loras);
  ZI_TRY(resolve_lora_names(runs, lora_dir));
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].loras.empty()) continue;
    const Status st = engine.check_loras(runs[i].loras);
    if (st.ok()) continue;
    std::string msg = st.message();
    for (size_t k = 0; k < runs[i].loras.size(); ++k) {
      const std::string& path = runs[i].loras[k].path;
      for (size_t p = msg.find(path); p != std::string::npos; p = msg.find(path, p))
        msg.replace(p, path.size(), named[i][k].path);
    }
    const bool ours = st.code() == ErrorCode::kOutOfMemory || st.code() == ErrorCode::kInternal;
    return Status(ours ? st.code() : ErrorCode::kInvalidArgument, "loras: " + msg);
  }
  return Status::Ok();
}

json list_loras(const std::string& lora_dir, size_t max_files) {
  json out = json::array();
  if (lora_dir.empty()) return out;
  std::error_code ec;
  const fs::path root = fs::canonical(lora_dir, ec);
  if (ec) return out;
  const std::string inside = root.string() + "/";
  auto within = [&inside](const fs::path& p) {
    return p.string().compare(0, inside.size(), inside) == 0;
  };
  std::vector<std::pair<std::string, uintmax_t>> files;
  // Listed under the names a request gives (resolve_lora_names): the path below the folder as it
  // is spelled, links not resolved (a link is listed under its own name), and only when the file
  // it resolves to, links followed, is a regular file inside the folder. Links to folders are
  // followed when they lead to a folder inside this one that is not their own ancestor (no
  // cycles; names through a link out of the folder or up the tree still resolve when the file
  // they reach is inside, but are not walked).
  const auto opts = fs::directory_options::skip_permission_denied |
                    fs::directory_options::follow_directory_symlink;
  for (fs::recursive_directory_iterator it(root, opts, ec), end;
       !ec && it != end && files.size() < max_files; it.increment(ec)) {
    if (it.depth() > 4) {
      it.disable_recursion_pending();
      continue;
    }
    std::error_code e2;
    if (it->is_symlink(e2) && it->is_directory(e2)) {
      const fs::path target = fs::canonical(it->path(), e2);
      const fs::path parent = fs::canonical(it->path().parent_path(), e2);
      const std::string t = target.string() + "/", p = parent.string() + "/";
      if (e2 || !within(target) || p.compare(0, t.size(), t) == 0) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(e2) || !ends_with(it->path().filename().string(), kExt)) continue;
    const std::string rel = it->path().lexically_relative(root).generic_string();
    if (rel.empty() || !check_lora_name(rel, "name").ok()) continue;
    const fs::path real = fs::canonical(it->path(), e2);  // symlinks out: not listed
    if (e2 || !within(real)) continue;
    files.emplace_back(rel, it->file_size(e2));
  }
  std::sort(files.begin(), files.end());
  for (const auto& [name, size] : files) out.push_back({{"name", name}, {"bytes", size}});
  return out;
}

}  // namespace zimage::serve
