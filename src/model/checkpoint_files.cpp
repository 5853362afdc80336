// Checkpoint directory: picks the shard files (index, model.safetensors or the single
// *.safetensors), confines every shard to the canonical directory (textual checks first, then
// realpath, since filtering ".." in the text alone misses symlinks), opens and validates every
// shard header, and cross-checks the shard map against the headers (reliability.md rule 19).
#include "model/checkpoint_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>

#include "core/json.h"

namespace ds {
namespace {

std::string printable(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    char c = s[i];
    out += (c >= 0x20 && c < 0x7F) ? c : '?';
  }
  if (s.size() > kMax) out += "...";
  return out;
}

Status index_error(const std::string& index_path, const std::string& msg) {
  return corrupt(index_path + ": rule 19: " + msg);
}

// realpath() into a std::string; errno is preserved on failure.
bool canonicalize(const std::string& path, std::string* out) {
  char* real = ::realpath(path.c_str(), nullptr);
  if (!real) return false;
  *out = real;
  std::free(real);
  return true;
}

// A shard name from the index must be a plain file name (rule 19, textual part).
Status check_plain_name(const std::string& index_path, const std::string& tensor,
                        const std::string& shard) {
  auto bad = [&](const std::string& why) {
    return index_error(index_path, "tensor '" + printable(tensor) + "' maps to shard '" +
                                       printable(shard) + "', which " + why);
  };
  if (shard.empty()) return bad("is empty");
  if (shard[0] == '/') return bad("is an absolute path");
  if (shard == "." || shard.find("..") != std::string::npos) return bad("contains '..'");
  if (shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos)
    return bad("contains a path separator");
  if (shard.find('\0') != std::string::npos) return bad("contains a NUL byte");
  return ok_status();
}

// For a canonical directory laid out as a Hugging Face hub cache snapshot,
// <cache>/models--<org>--<name>/snapshots/<revision>, whose files are symlinks to
// ../../blobs/<hash>: the repository's blobs directory "<cache>/models--<org>--<name>/blobs/".
// Otherwise "". Only that one sibling directory of the same repository is ever added.
std::string hf_cache_blobs_dir(const std::string& dir) {
  const size_t rev = dir.rfind('/');
  if (rev == std::string::npos || rev == 0 || rev + 1 == dir.size()) return "";
  const size_t snaps = dir.rfind('/', rev - 1);
  if (snaps == std::string::npos || dir.compare(snaps, rev - snaps, "/snapshots") != 0) return "";
  const std::string repo = dir.substr(0, snaps);
  const size_t base = repo.rfind('/');
  if (base == std::string::npos || repo.compare(base + 1, 8, "models--") != 0) return "";
  return repo + "/blobs/";
}

// Resolves `name` inside the canonical directory `dir` and requires the result to stay inside it
// (rule 19, canonical part: catches symlinks that point elsewhere). The one exception is a Hugging
// Face hub cache snapshot, whose files may resolve into the same repository's blobs directory.
Result<std::string> resolve_inside(const std::string& dir, const std::string& name,
                                   const std::string& referrer) {
  std::string joined = dir == "/" ? "/" + name : dir + "/" + name;
  std::string real;
  if (!canonicalize(joined, &real)) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) return not_found(joined + ": does not exist" + referrer);
    return io_error(joined + ": cannot resolve: " + std::strerror(err));
  }
  auto inside = [&](const std::string& prefix) {
    return !prefix.empty() && real.compare(0, prefix.size(), prefix) == 0 &&
           real.size() > prefix.size();
  };
  if (!inside(dir == "/" ? "/" : dir + "/") && !inside(hf_cache_blobs_dir(dir))) {
    return corrupt(joined + ": rule 19: resolves to '" + printable(real) +
                   "', outside the checkpoint directory (symlink escape)" + referrer);
  }
  return real;
}

Result<std::string> read_small_file(const std::string& path, uint64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return not_found(path + ": no such file");
    return io_error(path + ": cannot open: " + std::strerror(err));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return io_error(path + ": fstat failed: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return io_error(path + ": not a regular file");
  if (uint64_t(st.st_size) > max_bytes) {
    return corrupt(path + ": " + std::to_string(st.st_size) + " bytes, over the limit of " +
                   std::to_string(max_bytes));
  }
  std::string text(size_t(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::pread(fd, text.data() + done, text.size() - done, off_t(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(path + ": read failed: " + std::strerror(errno));
    }
    if (n == 0) return io_error(path + ": short read: the file shrank while it was read");
    done += size_t(n);
  }
  return text;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// Without an index: model.safetensors, else the only *.safetensors in the directory.
Result<std::string> pick_single_file(const std::string& dir) {
  if (path_exists(dir + "/model.safetensors")) return std::string("model.safetensors");
  DIR* d = ::opendir(dir.c_str());
  if (!d) return io_error(dir + ": cannot list directory: " + std::strerror(errno));
  std::vector<std::string> found;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (ends_with(name, ".safetensors")) found.push_back(std::move(name));
  }
  ::closedir(d);
  if (found.empty()) {
    return not_found(dir + ": no " + std::string(kShardIndexFileName) +
                     ", model.safetensors or other *.safetensors file");
  }
  if (found.size() > 1) {
    return invalid_argument(dir + ": " + std::to_string(found.size()) +
                            " *.safetensors files but no " + std::string(kShardIndexFileName) +
                            " saying which belong to the checkpoint");
  }
  return found[0];
}

}  // namespace

Result<CheckpointFiles> CheckpointFiles::open(const std::string& dir) {
  CheckpointFiles ck;
  if (!canonicalize(dir, &ck.dir_)) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) return not_found(dir + ": no such directory");
    return io_error(dir + ": cannot resolve: " + std::strerror(err));
  }
  struct stat st;
  if (::stat(ck.dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return invalid_argument(dir + ": not a directory");

  const std::string index_path = ck.dir_ + "/" + std::string(kShardIndexFileName);
  // weight_map as tensor -> shard name; empty when there is no index.
  std::map<std::string, std::string, std::less<>> weight_map;
  std::vector<std::string> shard_names;  // sorted, distinct
  bool have_index = path_exists(index_path);

  if (have_index) {
    DS_ASSIGN_OR_RETURN(std::string real_index,
                        resolve_inside(ck.dir_, std::string(kShardIndexFileName), ""));
    DS_ASSIGN_OR_RETURN(std::string text, read_small_file(real_index, kShardIndexMaxBytes));
    // nlohmann's lexer stops at a NUL byte, so "{...}\0garbage" would parse; a raw NUL is never
    // valid JSON.
    if (text.find('\0') != std::string::npos)
      return index_error(index_path, "the index contains a NUL byte");
    JsonLimits limits;
    limits.max_depth = 4;  // object -> weight_map/metadata -> (values); one spare level
    limits.max_values = 16'000'000;
    limits.max_string_bytes = 64 * 1024;
    auto parsed = parse_json_strict(text, limits, "index");
    if (!parsed.ok()) return index_error(index_path, parsed.status().message());
    const Json& root = *parsed;
    if (!root.is_object()) return index_error(index_path, "the index is not a JSON object");
    auto wm = root.find("weight_map");
    if (wm == root.end()) return index_error(index_path, "missing 'weight_map'");
    if (!wm->is_object()) return index_error(index_path, "'weight_map' is not an object");
    std::set<std::string> distinct;
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string()) {
        return index_error(
            index_path, "weight_map value for tensor '" + printable(tensor) + "' is not a string");
      }
      const std::string& shard_name = shard.get_ref<const std::string&>();
      DS_RETURN_IF_ERROR(check_plain_name(index_path, tensor, shard_name));
      distinct.insert(shard_name);
      weight_map.emplace(tensor, shard_name);
    }
    shard_names.assign(distinct.begin(), distinct.end());
  } else {
    DS_ASSIGN_OR_RETURN(std::string only, pick_single_file(ck.dir_));
    shard_names.push_back(std::move(only));
  }

  // Open and validate every shard header (no tensor data is read).
  const std::string referrer =
      have_index ? " (named in " + std::string(kShardIndexFileName) + ")" : "";
  for (const std::string& name : shard_names) {
    DS_ASSIGN_OR_RETURN(std::string real, resolve_inside(ck.dir_, name, referrer));
    DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(real));
    ck.shards_.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
  }

  // Every tensor in exactly one shard.
  for (size_t s = 0; s < ck.shards_.size(); ++s) {
    for (const TensorInfo& t : ck.shards_[s]->tensors()) {
      auto [it, inserted] = ck.index_.emplace(t.name, Location{uint32_t(s), &t});
      if (!inserted) {
        return corrupt(ck.dir_ + ": rule 19: tensor '" + printable(t.name) +
                       "' is present in two shards, '" + shard_names[it->second.shard] + "' and '" +
                       shard_names[s] + "'");
      }
    }
  }

  if (have_index) {
    // Each header tensor is in the map, mapped to the shard that holds it ...
    for (const auto& [name, loc] : ck.index_) {
      auto it = weight_map.find(name);
      if (it == weight_map.end()) {
        return index_error(index_path, "tensor '" + printable(name) + "' in shard '" +
                                           shard_names[loc.shard] + "' is missing from weight_map");
      }
      if (it->second != shard_names[loc.shard]) {
        return index_error(index_path, "weight_map puts tensor '" + printable(name) + "' in '" +
                                           printable(it->second) + "' but it is in '" +
                                           shard_names[loc.shard] + "'");
      }
    }
    // ... and each map entry names a tensor its shard holds.
    for (const auto& [name, shard] : weight_map) {
      if (!ck.index_.contains(name)) {
        return index_error(index_path, "weight_map entry for tensor '" + printable(name) +
                                           "' names shard '" + printable(shard) +
                                           "', which has no such tensor");
      }
    }
  }
  return ck;
}

std::vector<std::string> CheckpointFiles::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, loc] : index_) out.push_back(name);
  return out;
}

uint64_t CheckpointFiles::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, loc] : index_) total += loc.info->nbytes;  // bounded by file sizes
  return total;
}

Result<TensorRef> CheckpointFiles::find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    return not_found(dir_ + ": tensor '" + printable(name) + "' is not in the checkpoint");
  return TensorRef{shards_[it->second.shard].get(), it->second.info};
}

Status CheckpointFiles::read(std::string_view name, std::span<uint8_t> dst) const {
  DS_ASSIGN_OR_RETURN(TensorRef ref, find(name));
  if (dst.size() != ref.info->nbytes) {
    return invalid_argument("tensor '" + printable(name) + "': destination holds " +
                            std::to_string(dst.size()) + " bytes but the tensor has " +
                            std::to_string(ref.info->nbytes));
  }
  return ref.shard->read(*ref.info, 0, dst);
}

Result<std::span<const uint8_t>> CheckpointFiles::map(std::string_view name) {
  DS_ASSIGN_OR_RETURN(TensorRef ref, find(name));
  return ref.shard->map_tensor(*ref.info);
}

Result<TensorRef> CheckpointFiles::expect(std::string_view name, DType dtype,
                                          std::span<const uint64_t> shape) const {
  DS_ASSIGN_OR_RETURN(TensorRef ref, find(name));
  const TensorInfo& t = *ref.info;
  bool same_shape =
      t.shape.size() == shape.size() && std::equal(shape.begin(), shape.end(), t.shape.begin());
  if (t.dtype != dtype || !same_shape) {
    return corrupt(ref.shard->path() + ": tensor '" + printable(name) + "': expected " +
                   describe_tensor_type(dtype, shape) + " but the checkpoint has " +
                   describe_tensor_type(t.dtype, t.shape));
  }
  return ref;
}

}  // namespace ds
