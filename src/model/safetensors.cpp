// The safetensors reader: framing, header parsing, arithmetic and layout checks in the order of
// reliability.md §3 (each check relies only on bytes an earlier one validated), then chunked pread
// and fstat-guarded mapping for the data. Header parsing goes through parse_json_strict (strict
// UTF-8, duplicate keys refused, depth/value/string caps set before anything is allocated).
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/checked_math.h"
#include "core/json.h"

namespace ds {
namespace {

// Largest single pread; Linux transfers at most 0x7ffff000 bytes per call anyway.
constexpr size_t kReadChunkBytes = size_t(256) << 20;

// A tensor name or key as it may appear in an error message: printable ASCII, bounded length, so
// that a 1 MiB or binary name cannot flood the log.
std::string printable_name(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    char c = s[i];
    out += (c >= 0x20 && c < 0x7F) ? c : '?';
  }
  if (s.size() > kMax) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string errno_text(int err) {
  return std::string(std::strerror(err));
}

Status file_error(const std::string& path, int rule, const std::string& msg) {
  return corrupt(path + ": rule " + std::to_string(rule) + ": " + msg);
}

Status tensor_error(const std::string& path, std::string_view name, int rule,
                    const std::string& msg) {
  return corrupt(path + ": tensor '" + printable_name(name) + "': rule " + std::to_string(rule) +
                 ": " + msg);
}

// Reads exactly dst.size() bytes at `pos`, retrying on EINTR and partial reads. A zero return
// before the end means the file is shorter than validated (it shrank).
Status pread_exact(int fd, const std::string& path, uint64_t pos, std::span<uint8_t> dst) {
  size_t done = 0;
  while (done < dst.size()) {
    size_t want = std::min(dst.size() - done, kReadChunkBytes);
    ssize_t got = ::pread(fd, dst.data() + done, want, off_t(pos + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return io_error(path + ": read at byte " + std::to_string(pos + done) +
                      " failed: " + errno_text(errno));
    }
    if (got == 0) {
      return io_error(path + ": short read at byte " + std::to_string(pos + done) +
                      ": the file shrank after it was validated (rule 17)");
    }
    done += size_t(got);
  }
  return ok_status();
}

// Maps a parse_json_strict failure to the rule it breaks (the messages are defined in
// core/json.cpp; anything unrecognised is a syntax error, rule 5).
int json_error_rule(const std::string& msg) {
  if (msg.find("not valid UTF-8") != std::string::npos) return 4;
  if (msg.find("duplicate key") != std::string::npos) return 6;
  if (msg.find("than the limit") != std::string::npos) return 7;
  return 5;
}

// A shape or offset value: a JSON integer without sign, fraction or exponent that fits in u64
// (rule 9). nlohmann classifies such literals, and only those, as number_unsigned.
bool is_plain_u64(const Json& v) {
  return v.is_number_unsigned();
}

std::string json_kind(const Json& v) {
  if (v.is_number_unsigned()) return "a non-negative integer";
  if (v.is_number_integer()) return "a negative integer";
  if (v.is_number_float()) return "a number with a fraction or exponent (or too large for u64)";
  return std::string("a JSON ") + v.type_name();
}

// Rules 9-11 and the zero-element part of rule 14 for one tensor entry.
Status parse_entry(const std::string& path, const std::string& name, const Json& entry,
                   TensorInfo* out) {
  if (!entry.is_object()) {
    return tensor_error(path, name, 9,
                        "entry must be an object with dtype, shape and "
                        "data_offsets, got " +
                            json_kind(entry));
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      return tensor_error(path, name, 9, "unknown key '" + printable_name(key) + "'");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key))
      return tensor_error(path, name, 9, std::string("missing key '") + key + "'");
  }

  const Json& dtype = entry["dtype"];
  if (!dtype.is_string())
    return tensor_error(path, name, 9, "dtype must be a string, got " + json_kind(dtype));
  const std::string& dtype_str = dtype.get_ref<const std::string&>();
  auto dt = dtype_from_name(dtype_str);
  if (!dt) return tensor_error(path, name, 9, "unknown dtype '" + printable_name(dtype_str) + "'");

  const Json& shape = entry["shape"];
  if (!shape.is_array())
    return tensor_error(path, name, 9, "shape must be an array, got " + json_kind(shape));
  if (shape.size() > kSafetensorsMaxRank) {
    return tensor_error(path, name, 7,
                        "rank " + std::to_string(shape.size()) + " exceeds the limit of " +
                            std::to_string(kSafetensorsMaxRank));
  }
  std::vector<uint64_t> dims;
  dims.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!is_plain_u64(shape[i])) {
      return tensor_error(path, name, 9,
                          "shape[" + std::to_string(i) +
                              "] must be a non-negative "
                              "integer, got " +
                              json_kind(shape[i]));
    }
    dims.push_back(shape[i].get<uint64_t>());
  }

  const Json& offs = entry["data_offsets"];
  if (!offs.is_array())
    return tensor_error(path, name, 9, "data_offsets must be an array, got " + json_kind(offs));
  if (offs.size() != 2) {
    return tensor_error(
        path, name, 9,
        "data_offsets must have exactly 2 elements, got " + std::to_string(offs.size()));
  }
  for (size_t i = 0; i < 2; ++i) {
    if (!is_plain_u64(offs[i])) {
      return tensor_error(path, name, 9,
                          "data_offsets[" + std::to_string(i) +
                              "] must be a "
                              "non-negative integer, got " +
                              json_kind(offs[i]));
    }
  }
  uint64_t begin = offs[0].get<uint64_t>();
  uint64_t end = offs[1].get<uint64_t>();

  std::string type = describe_tensor_type(*dt, dims);
  auto numel = checked_product(dims);
  if (!numel) return tensor_error(path, name, 10, "element count of " + type + " overflows u64");
  auto nbytes = checked_mul(*numel, dtype_size(*dt));
  if (!nbytes) return tensor_error(path, name, 10, "byte size of " + type + " overflows u64");

  if (end < begin) {
    return tensor_error(
        path, name, 11,
        "data_offsets end " + std::to_string(end) + " is before begin " + std::to_string(begin));
  }
  if (end - begin != *nbytes) {
    return tensor_error(path, name, 11,
                        "data_offsets span " + std::to_string(end - begin) + " bytes but " + type +
                            " needs " + std::to_string(*nbytes));
  }
  if (*numel == 0) {
    return tensor_error(
        path, name, 14,
        "zero-element tensor " + type + " refused (it could share an offset with another)");
  }

  out->name = name;
  out->dtype = *dt;
  out->shape = std::move(dims);
  out->numel = *numel;
  out->data_offset = begin;
  out->nbytes = *nbytes;
  return ok_status();
}

// Number of keys of the top-level object (colons at depth 1 outside strings), counted on the raw
// text so that a header with millions of entries is refused before the parser allocates a DOM
// node for each (rule 7). Malformed text is left to the parser; this only has to be exact for
// well-formed JSON.
size_t count_top_level_keys(std::string_view text) {
  size_t keys = 0;
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '{':
      case '[':
        ++depth;
        break;
      case '}':
      case ']':
        --depth;
        break;
      case ':':
        keys += depth == 1;
        break;
      default:
        break;
    }
  }
  return keys;
}

}  // namespace

std::string describe_tensor_type(DType dtype, std::span<const uint64_t> shape) {
  std::string s(dtype_name(dtype));
  s += '[';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;

  // ---- 3.1 Framing ----
  // O_NONBLOCK: a FIFO planted under a shard's name must not block open(); regular files
  // ignore the flag, and anything that is not a regular file is refused below.
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f.fd_ < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) return not_found(path + ": no such file");
    return io_error(path + ": cannot open: " + errno_text(err));
  }
  struct stat st;
  if (::fstat(f.fd_, &st) != 0) return io_error(path + ": fstat failed: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return io_error(path + ": not a regular file");
  f.file_size_ = uint64_t(st.st_size);
  if (f.file_size_ < 8) {
    return file_error(path, 1,
                      "file is " + std::to_string(f.file_size_) +
                          " bytes, shorter than the 8-byte header length");
  }

  uint8_t prefix[8];
  DS_RETURN_IF_ERROR(pread_exact(f.fd_, path, 0, prefix));
  uint64_t n;
  std::memcpy(&n, prefix, 8);  // little-endian host (static_assert in core/dtype.h)
  if (n > kSafetensorsMaxHeaderBytes) {
    return file_error(path, 2,
                      "header length " + std::to_string(n) + " exceeds the limit of " +
                          std::to_string(kSafetensorsMaxHeaderBytes));
  }
  auto header_end = checked_add(8, n);
  if (!header_end || *header_end > f.file_size_) {
    return file_error(path, 2,
                      "header length " + std::to_string(n) + " runs past the end of the " +
                          std::to_string(f.file_size_) + "-byte file");
  }
  f.header_bytes_ = n;

  // Rule 3: an owned buffer filled with pread, never the mapping.
  std::string header(size_t(n), '\0');
  DS_RETURN_IF_ERROR(
      pread_exact(f.fd_, path, 8,
                  std::span<uint8_t>(reinterpret_cast<uint8_t*>(header.data()), header.size())));

  // ---- 3.2 Header parsing ----
  if (!is_valid_utf8(header)) return file_error(path, 4, "header is not valid UTF-8");
  if (header.empty()) return file_error(path, 5, "header is empty (length 0)");
  if (header[0] != '{') return file_error(path, 5, "header does not start with '{'");
  // A raw NUL is never valid JSON (inside strings it must be escaped), and nlohmann's lexer takes
  // it for the end of input, which would let arbitrary bytes hide after "{...}\0".
  if (auto nul = header.find('\0'); nul != std::string::npos)
    return file_error(path, 5, "header has a NUL byte at offset " + std::to_string(nul));

  // +1: "__metadata__" is not a tensor.
  if (size_t keys = count_top_level_keys(header); keys > kSafetensorsMaxTensors + 1) {
    return file_error(path, 7,
                      std::to_string(keys) + " top-level entries exceed the limit of " +
                          std::to_string(kSafetensorsMaxTensors) + " tensors");
  }
  JsonLimits limits;
  limits.max_depth = 3;  // object -> tensor entry -> array
  // Every valid entry has at most 6 + rank values; the metadata is bounded by the same budget.
  limits.max_values = 2 * (kSafetensorsMaxTensors * (6 + kSafetensorsMaxRank) + 1);
  limits.max_string_bytes = kSafetensorsMaxStringBytes;
  auto parsed = parse_json_strict(header, limits, "header");
  if (!parsed.ok()) {
    const std::string& msg = parsed.status().message();
    return file_error(path, json_error_rule(msg), msg);
  }
  const Json& root = *parsed;
  if (!root.is_object()) return file_error(path, 5, "header is not a JSON object");

  size_t num_entries = root.size() - (root.contains(std::string(kSafetensorsMetadataKey)) ? 1 : 0);
  if (num_entries > kSafetensorsMaxTensors) {
    return file_error(path, 7,
                      std::to_string(num_entries) + " tensor entries exceed the limit of " +
                          std::to_string(kSafetensorsMaxTensors));
  }

  f.tensors_.reserve(num_entries);
  for (const auto& [key, value] : root.items()) {
    if (key == kSafetensorsMetadataKey) {
      // Rule 8: string -> string only. A tensor entry named "__metadata__" lands here too.
      if (!value.is_object()) {
        return file_error(path, 8,
                          "'__metadata__' must be an object of strings, got " + json_kind(value) +
                              " (the name is reserved; no tensor may use it)");
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return file_error(path, 8,
                            "'__metadata__' value for '" + printable_name(mkey) +
                                "' must be a string, got " + json_kind(mvalue) +
                                " (the name is reserved; no tensor may use it)");
        }
        f.metadata_.emplace(mkey, mvalue.get_ref<const std::string&>());
      }
      continue;
    }
    if (key.empty()) return file_error(path, 7, "empty tensor name");
    if (key.size() > kSafetensorsMaxNameBytes) {
      return tensor_error(path, key, 7,
                          "name is " + std::to_string(key.size()) + " bytes, over the limit of " +
                              std::to_string(kSafetensorsMaxNameBytes));
    }
    TensorInfo info;
    DS_RETURN_IF_ERROR(parse_entry(path, key, value, &info));
    f.tensors_.push_back(std::move(info));
  }

  // ---- 3.4 Layout: sorted by begin, the tensors tile [0, data_bytes) exactly ----
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.data_offset != b.data_offset) return a.data_offset < b.data_offset;
    return a.name < b.name;
  });
  uint64_t expected = 0;
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    const TensorInfo& t = f.tensors_[i];
    uint64_t begin = t.data_offset, end = t.data_offset + t.nbytes;  // end validated by rule 11
    if (i == 0 && begin != 0) {
      return tensor_error(
          path, t.name, 12,
          "the first tensor in the data section starts at " + std::to_string(begin) + ", not 0");
    }
    if (i > 0) {
      const TensorInfo& prev = f.tensors_[i - 1];
      if (begin == prev.data_offset) {
        return tensor_error(path, t.name, 14,
                            "shares data offset " + std::to_string(begin) + " with tensor '" +
                                printable_name(prev.name) + "'");
      }
      if (begin < expected) {
        return tensor_error(path, t.name, 12,
                            "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") overlap tensor '" + printable_name(prev.name) + "' ending at " +
                                std::to_string(expected));
      }
      if (begin > expected) {
        return tensor_error(path, t.name, 12,
                            "gap of " + std::to_string(begin - expected) +
                                " bytes before it (previous tensor '" + printable_name(prev.name) +
                                "' ends at " + std::to_string(expected) + ")");
      }
    }
    expected = end;
  }
  uint64_t data_bytes = f.file_size_ - *header_end;
  if (expected != data_bytes) {
    std::string what = expected < data_bytes
                           ? "the file has " + std::to_string(data_bytes - expected) +
                                 " bytes after the last tensor (appended or unaccounted data)"
                           : "the tensors need " + std::to_string(expected - data_bytes) +
                                 " bytes more than the file has (truncated?)";
    return file_error(path, 13,
                      "tensors end at data byte " + std::to_string(expected) +
                          " but the data section is " + std::to_string(data_bytes) +
                          " bytes: " + what);
  }

  f.by_name_.resize(f.tensors_.size());
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.by_name_[i] = uint32_t(i);
  std::sort(f.by_name_.begin(), f.by_name_.end(),
            [&f](uint32_t a, uint32_t b) { return f.tensors_[a].name < f.tensors_[b].name; });
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept {
  *this = std::move(other);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    close_all();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    file_size_ = other.file_size_;
    header_bytes_ = other.header_bytes_;
    tensors_ = std::move(other.tensors_);
    by_name_ = std::move(other.by_name_);
    metadata_ = std::move(other.metadata_);
    map_addr_ = std::exchange(other.map_addr_, nullptr);
    map_len_ = std::exchange(other.map_len_, 0);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  close_all();
}

void SafetensorsFile::close_all() {
  unmap();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void SafetensorsFile::unmap() {
  if (map_addr_) ::munmap(map_addr_, map_len_);
  map_addr_ = nullptr;
  map_len_ = 0;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it =
      std::lower_bound(by_name_.begin(), by_name_.end(), name,
                       [this](uint32_t i, std::string_view n) { return tensors_[i].name < n; });
  if (it == by_name_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

Status SafetensorsFile::check_tensor_range(const TensorInfo& tensor, uint64_t offset,
                                           uint64_t size) const {
  if (fd_ < 0) return failed_precondition(path_ + ": file is closed");
  auto tensor_end = checked_add(tensor.data_offset, tensor.nbytes);
  if (!tensor_end || *tensor_end > data_bytes()) {
    return invalid_argument(path_ + ": tensor '" + printable_name(tensor.name) +
                            "' does not belong to this file");
  }
  auto want_end = checked_add(offset, size);
  if (!want_end || *want_end > tensor.nbytes) {
    return out_of_range(path_ + ": tensor '" + printable_name(tensor.name) + "': bytes [" +
                        std::to_string(offset) + ", +" + std::to_string(size) +
                        ") are outside its " + std::to_string(tensor.nbytes) + " bytes");
  }
  return ok_status();
}

Status SafetensorsFile::read(const TensorInfo& tensor, uint64_t offset_in_tensor,
                             std::span<uint8_t> dst) const {
  DS_RETURN_IF_ERROR(check_tensor_range(tensor, offset_in_tensor, dst.size()));
  return pread_exact(fd_, path_, data_start() + tensor.data_offset + offset_in_tensor, dst);
}

Result<std::span<const uint8_t>> SafetensorsFile::map_tensor(const TensorInfo& tensor) {
  DS_RETURN_IF_ERROR(check_tensor_range(tensor, 0, tensor.nbytes));
  struct stat st;
  if (::fstat(fd_, &st) != 0) return io_error(path_ + ": fstat failed: " + errno_text(errno));
  if (uint64_t(st.st_size) != file_size_) {
    return io_error(path_ + ": rule 17: file size changed from " + std::to_string(file_size_) +
                    " to " + std::to_string(uint64_t(st.st_size)) +
                    " bytes after validation; refusing to map it");
  }
  if (!map_addr_) {
    void* addr = ::mmap(nullptr, size_t(file_size_), PROT_READ, MAP_SHARED, fd_, 0);
    if (addr == MAP_FAILED) return io_error(path_ + ": mmap failed: " + errno_text(errno));
    map_addr_ = addr;
    map_len_ = size_t(file_size_);
  }
  const auto* base = static_cast<const uint8_t*>(map_addr_);
  return std::span<const uint8_t>(base + data_start() + tensor.data_offset, size_t(tensor.nbytes));
}

}  // namespace ds
