// WeightStore: one component's tensors from a single safetensors file or an index + shards, with
// the index cross-checked against the shards (see weights.h).
#include "io/weights/weights.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "io/fs/json_util.h"
#include "io/gguf/gguf.h"
#include "io/gguf/gguf_weights.h"
#include "io/weights/safetensors.h"

namespace zimage {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string in_quotes(const std::string& s) {
  std::string out(1, '\'');
  out += json_util::printable(s);
  out += '\'';
  return out;
}

// "'a', 'b', 'c' and 4 more"
std::string name_list(const std::vector<std::string>& names, size_t max_shown = 5) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max_shown; ++i) {
    if (i) out += ", ";
    out += in_quotes(names[i]);
  }
  if (names.size() > max_shown) out += " and " + std::to_string(names.size() - max_shown) + " more";
  return out;
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

Status check_shard_name(const std::string& shard, const std::string& tensor,
                        const std::string& file) {
  const bool bad = shard.empty() || shard == "." || shard.find('/') != std::string::npos ||
                   shard.find('\\') != std::string::npos || shard.find("..") != std::string::npos ||
                   shard.find('\0') != std::string::npos;
  if (bad) {
    return FormatError(file + ": tensor " + in_quotes(tensor) + ": shard name " + in_quotes(shard) +
                       " is not a plain file name in the component folder");
  }
  return Status::Ok();
}

}  // namespace

Result<std::map<std::string, std::string>> parse_weight_index(std::string_view text,
                                                              const std::string& file) {
  ZI_ASSIGN_OR_RETURN(nlohmann::json root, json_util::parse_strict(text, file));
  if (!root.is_object()) {
    return FormatError(file + ": index is a JSON " + std::string(json_util::type_name(root)) +
                       ", expected an object");
  }
  auto meta = root.find("metadata");
  if (meta != root.end() && !meta->is_null() && !meta->is_object()) {
    return FormatError(file + ": 'metadata' is a " + std::string(json_util::type_name(*meta)) +
                       ", expected an object");
  }
  auto wm = root.find("weight_map");
  if (wm == root.end()) return FormatError(file + ": required key 'weight_map' is missing");
  if (!wm->is_object()) {
    return FormatError(file + ": 'weight_map' is a " + std::string(json_util::type_name(*wm)) +
                       ", expected an object mapping tensor names to shard files");
  }
  if (wm->empty()) return FormatError(file + ": 'weight_map' is empty");
  std::map<std::string, std::string> out;
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string()) {
      return FormatError(file + ": weight_map entry " + in_quotes(name) + " is a " +
                         json_util::type_name(shard) + ", expected a shard file name");
    }
    const std::string s = shard.get<std::string>();
    ZI_TRY(check_shard_name(s, name, file));
    out.emplace(name, s);
  }
  return out;
}

std::vector<std::pair<const void*, uint64_t>> WeightStore::mappings() const {
  std::vector<std::pair<const void*, uint64_t>> out;
  for (const auto& f : files_)
    if (f && f->mapping() != nullptr) out.emplace_back(f->mapping(), f->file_size());
  return out;
}

Status WeightStore::add_file(WeightStore& store, const std::shared_ptr<SafetensorsFile>& file,
                             const std::string& file_name) {
  for (const SafetensorsTensorInfo& t : file->tensors()) {
    auto [it, inserted] = store.entries_.emplace(t.name, Entry{file, file_name, t.name});
    if (!inserted) {
      return FormatError(store.path_ + ": tensor " + in_quotes(t.name) + " is in both " +
                         it->second.file_name + " and " + file_name);
    }
  }
  store.files_.push_back(file);
  return Status::Ok();
}

Result<WeightStore> WeightStore::open_sharded(const std::string& dir, const std::string& index) {
  const std::string index_path = join_path(dir, index);
  ZI_ASSIGN_OR_RETURN(std::string text, json_util::read_text(index_path));
  ZI_ASSIGN_OR_RETURN(auto weight_map, parse_weight_index(text, index_path));

  // shard -> tensors the index puts there
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [name, shard] : weight_map) by_shard[shard].push_back(name);

  WeightStore store;
  store.path_ = dir;
  for (const auto& [shard, expected] : by_shard) {
    const std::string shard_path = join_path(dir, shard);
    auto opened = SafetensorsFile::open(shard_path);
    if (!opened.ok()) {
      if (opened.status().code() == ErrorCode::kNotFound) {
        return NotFound(index_path + ": shard " + in_quotes(shard) + " (holding " +
                        name_list(expected, 3) + ") does not exist");
      }
      return opened.status();
    }
    std::shared_ptr<SafetensorsFile> file = std::move(opened).value();
    std::vector<std::string> missing;
    for (const std::string& name : expected) {
      if (!file->contains(name)) missing.push_back(name);
    }
    if (!missing.empty()) {
      return FormatError(shard_path + ": " + std::to_string(missing.size()) + " tensor(s) that " +
                         index + " assigns to this shard are missing: " + name_list(missing));
    }
    std::vector<std::string> unlisted;
    for (const SafetensorsTensorInfo& t : file->tensors()) {
      auto it = weight_map.find(t.name);
      if (it == weight_map.end()) {
        unlisted.push_back(t.name);
      } else if (it->second != shard) {
        return FormatError(shard_path + ": holds tensor " + in_quotes(t.name) + " but " + index +
                           " assigns it to " + in_quotes(it->second));
      }
    }
    if (!unlisted.empty()) {
      std::sort(unlisted.begin(), unlisted.end());
      return FormatError(shard_path + ": " + std::to_string(unlisted.size()) +
                         " tensor(s) not listed in " + index + ": " + name_list(unlisted));
    }
    ZI_TRY(add_file(store, file, shard));
  }
  return store;
}

Result<WeightStore> WeightStore::open(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return NotFound(path + ": no such file or folder");
    return IoError(path + ": cannot stat: " + std::strerror(errno));
  }
  if (S_ISREG(st.st_mode)) {
    if (file_has_gguf_magic(path)) return open_gguf_weights(path);
    ZI_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
    WeightStore store;
    store.path_ = path;
    const size_t slash = path.find_last_of('/');
    ZI_TRY(add_file(store, file, slash == std::string::npos ? path : path.substr(slash + 1)));
    return store;
  }
  if (!S_ISDIR(st.st_mode)) return IoError(path + ": neither a file nor a folder");

  std::vector<std::string> indexes, singles, ggufs;
  std::error_code ec;
  std::filesystem::directory_iterator it(path, ec);
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (ends_with(name, ".safetensors.index.json")) indexes.push_back(name);
    if (ends_with(name, ".safetensors")) singles.push_back(name);
    if (ends_with(name, ".gguf")) ggufs.push_back(name);
  }
  if (ec) return IoError(path + ": cannot list the folder: " + ec.message());
  std::sort(indexes.begin(), indexes.end());
  std::sort(singles.begin(), singles.end());

  if (indexes.size() > 1) {
    return FormatError(path + ": several weight index files (" + name_list(indexes) +
                       "); expected one");
  }
  if (indexes.size() == 1) return open_sharded(path, indexes[0]);
  if (singles.empty() && ggufs.size() == 1) return open_gguf_weights(join_path(path, ggufs[0]));
  if (singles.empty()) {
    return NotFound(path + ": no *.safetensors file and no *.safetensors.index.json" +
                    (ggufs.size() > 1 ? " (and several .gguf files)" : std::string()));
  }
  if (singles.size() > 1) {
    return FormatError(path + ": " + std::to_string(singles.size()) + " .safetensors files (" +
                       name_list(singles) + ") but no *.safetensors.index.json to combine them");
  }
  ZI_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(join_path(path, singles[0])));
  WeightStore store;
  store.path_ = path;
  ZI_TRY(add_file(store, file, singles[0]));
  return store;
}

bool WeightStore::contains(const std::string& name) const {
  return entries_.count(name) != 0;
}

Result<Tensor> WeightStore::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  {
    std::lock_guard<std::mutex> lock(used_->mu);
    used_->names.insert(name);
  }
  const Entry& e = it->second;
  if (!e.computed) return e.file->tensor(e.original_name);
  if (!e.computed->make)
    return InternalError(path_ + ": tensor " + in_quotes(name) + " has no maker");
  ZI_ASSIGN_OR_RETURN(Tensor t, e.computed->make());
  if (t.device() != Device::kCPU || t.dtype() != e.computed->info.dtype ||
      t.shape() != e.computed->info.shape) {
    return InternalError(path_ + ": tensor " + in_quotes(name) + " was made as " +
                         dtype_name(t.dtype()) + " " + shape_string(t.shape()) + ", declared " +
                         dtype_name(e.computed->info.dtype) + " " +
                         shape_string(e.computed->info.shape));
  }
  return t;
}

Result<Tensor> WeightStore::get(const std::string& name, const Shape& expected) const {
  ZI_ASSIGN_OR_RETURN(Tensor t, get(name));
  if (t.shape() != expected) {
    return FormatError(path_ + ": tensor " + in_quotes(name) + " has shape " +
                       shape_string(t.shape()) + ", expected " + shape_string(expected));
  }
  return t;
}

Result<WeightInfo> WeightStore::info(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  if (const WeightInfo* ci = computed_info(it->second)) return *ci;
  const SafetensorsTensorInfo* t = it->second.file->find(it->second.original_name);
  if (!t) return InternalError(path_ + ": tensor " + in_quotes(name) + " vanished from its file");
  return WeightInfo{t->dtype, t->shape, it->second.file->path()};
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

size_t WeightStore::size() const {
  return entries_.size();
}

size_t WeightStore::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, e] : entries_) {
    if (e.computed) {
      n += e.computed->stored_bytes;
    } else if (const SafetensorsTensorInfo* t = e.file->find(e.original_name)) {
      n += t->nbytes();
    }
  }
  return n;
}

int64_t WeightStore::total_params() const {
  int64_t n = 0;
  for (const auto& [name, e] : entries_) {
    if (const WeightInfo* ci = computed_info(e)) {
      n += shape_numel(ci->shape);
    } else if (const SafetensorsTensorInfo* t = e.file->find(e.original_name)) {
      n += shape_numel(t->shape);
    }
  }
  return n;
}

std::map<DType, size_t> WeightStore::dtype_counts() const {
  std::map<DType, size_t> out;
  for (const auto& [name, e] : entries_) {
    if (const WeightInfo* ci = computed_info(e)) {
      ++out[ci->dtype];
    } else if (const SafetensorsTensorInfo* t = e.file->find(e.original_name)) {
      ++out[t->dtype];
    }
  }
  return out;
}

std::vector<std::string> WeightStore::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  for (const auto& f : backing_) out.push_back(f.path);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

uint64_t WeightStore::file_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->file_size();
  for (const auto& f : backing_) n += f.bytes;
  return n;
}

std::vector<std::string> WeightStore::unused_names() const {
  std::lock_guard<std::mutex> lock(used_->mu);
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) {
    if (!used_->names.count(name)) out.push_back(name);
  }
  return out;
}

Status WeightStore::strip_prefix(const std::string& prefix) {
  if (prefix.empty()) return Status::Ok();
  std::map<std::string, Entry> renamed;
  for (const auto& [name, e] : entries_) {
    const bool has = name.compare(0, prefix.size(), prefix) == 0;
    const std::string new_name = has ? name.substr(prefix.size()) : name;
    if (!renamed.emplace(new_name, e).second) {
      return FormatError(path_ + ": stripping prefix " + in_quotes(prefix) + " makes two tensors " +
                         "named " + in_quotes(new_name));
    }
  }
  std::lock_guard<std::mutex> lock(used_->mu);
  std::set<std::string> used;
  for (const std::string& name : used_->names) {
    const bool has = name.compare(0, prefix.size(), prefix) == 0;
    used.insert(has ? name.substr(prefix.size()) : name);
  }
  used_->names = std::move(used);
  entries_ = std::move(renamed);
  return Status::Ok();
}

WeightStore WeightStore::empty(const std::string& path) {
  WeightStore store;
  store.path_ = path;
  return store;
}

Status WeightStore::add_computed(const std::string& name, ComputedWeight w) {
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    return FormatError(path_ + ": tensor " + in_quotes(name) + " is in both " +
                       it->second.file_name + " and " + w.info.file);
  }
  Entry e;
  e.file_name = w.info.file;
  e.original_name = name;
  e.computed = std::make_shared<const ComputedWeight>(std::move(w));
  entries_.emplace(name, std::move(e));
  return Status::Ok();
}

Status WeightStore::transform(const std::string& name, DType dtype,
                              std::function<Result<Tensor>(const Tensor&)> fn) {
  ZI_ASSIGN_OR_RETURN(WeightInfo base_info, info(name));
  // The new maker reads the old entry through a copy of this store's view of it.
  Entry old = entries_.at(name);
  ComputedWeight w;
  w.info = WeightInfo{dtype, base_info.shape, base_info.file};
  w.stored_bytes = old.computed ? old.computed->stored_bytes
                                : (old.file && old.file->find(old.original_name)
                                       ? old.file->find(old.original_name)->nbytes()
                                       : 0);
  const std::string where = path_;
  w.make = [old, fn = std::move(fn), name, where]() -> Result<Tensor> {
    Tensor base;
    if (old.computed) {
      ZI_ASSIGN_OR_RETURN(base, old.computed->make());
    } else {
      ZI_ASSIGN_OR_RETURN(base, old.file->tensor(old.original_name));
    }
    return fn(base);
  };
  Entry e;
  e.file_name = old.file_name;
  e.original_name = name;
  e.computed = std::make_shared<const ComputedWeight>(std::move(w));
  entries_[name] = std::move(e);
  return Status::Ok();
}

Result<PackedWeight> WeightStore::packed(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  if (!it->second.computed || !it->second.computed->packed) {
    return Unsupported(path_ + ": tensor " + in_quotes(name) + " is not stored packed");
  }
  {
    std::lock_guard<std::mutex> lock(used_->mu);
    used_->names.insert(name);
  }
  return it->second.computed->packed();
}

bool WeightStore::is_packed(const std::string& name) const {
  auto it = entries_.find(name);
  return it != entries_.end() && it->second.computed && it->second.computed->packed;
}

bool WeightStore::is_scaled_fp8(const std::string& name) const {
  auto it = entries_.find(name);
  return it != entries_.end() && it->second.computed && it->second.computed->fp8;
}

Result<PackedWeight> WeightStore::peek_packed(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  if (!it->second.computed || !it->second.computed->packed)
    return Unsupported(path_ + ": tensor " + in_quotes(name) + " is not stored packed");
  return it->second.computed->packed();
}

Result<Fp8StoredWeight> WeightStore::peek_fp8(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  if (!it->second.computed || !it->second.computed->fp8)
    return Unsupported(path_ + ": tensor " + in_quotes(name) + " is not a scaled FP8 weight");
  return it->second.computed->fp8();
}

Result<Fp8StoredWeight> WeightStore::fp8(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  if (!it->second.computed || !it->second.computed->fp8)
    return Unsupported(path_ + ": tensor " + in_quotes(name) + " is not a scaled FP8 weight");
  {
    std::lock_guard<std::mutex> lock(used_->mu);
    used_->names.insert(name);
  }
  return it->second.computed->fp8();
}

Status WeightStore::set_fp8_source(const std::string& name,
                                   std::function<Result<Fp8StoredWeight>()> fn) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  if (!it->second.computed)
    return InternalError(path_ + ": tensor " + in_quotes(name) + " is not a computed tensor");
  auto w = std::make_shared<ComputedWeight>(*it->second.computed);
  w->fp8 = std::move(fn);
  it->second.computed = std::move(w);
  return Status::Ok();
}

Status WeightStore::remove(const std::string& name) {
  if (entries_.erase(name) == 0) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  return Status::Ok();
}

Status WeightStore::rename(const std::string& from, const std::string& to) {
  auto it = entries_.find(from);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor named " + in_quotes(from));
  if (from == to) return Status::Ok();
  if (entries_.count(to)) {
    return FormatError(path_ + ": cannot rename " + in_quotes(from) + " to " + in_quotes(to) +
                       ": that name exists");
  }
  Entry e = std::move(it->second);
  entries_.erase(it);
  entries_.emplace(to, std::move(e));
  return Status::Ok();
}

Status WeightStore::absorb(WeightStore other) {
  for (const auto& [name, e] : other.entries_) {
    auto it = entries_.find(name);
    if (it != entries_.end()) {
      return FormatError(path_ + ": tensor " + in_quotes(name) + " is in both " +
                         it->second.file_name + " and " + e.file_name);
    }
  }
  for (auto& [name, e] : other.entries_) entries_.emplace(name, std::move(e));
  for (auto& f : other.files_) files_.push_back(std::move(f));
  for (auto& f : other.backing_) backing_.push_back(std::move(f));
  return Status::Ok();
}

void WeightStore::add_backing_file(const std::string& path, uint64_t bytes,
                                   std::shared_ptr<const void> keep) {
  backing_.push_back(BackingFile{path, bytes, std::move(keep)});
}

}  // namespace zimage
