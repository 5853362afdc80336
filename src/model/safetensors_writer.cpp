// The safetensors writer: validates each tensor as it is added (so it only ever produces files the
// reader accepts), builds the header text by hand (to keep the entries in the order added and to
// avoid nlohmann's throwing serializer), and streams the data through one reusable chunk buffer.
#include "model/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <utility>

#include "core/checked_math.h"
#include "core/json.h"
#include "model/safetensors.h"

namespace ds {
namespace {

// JSON string literal for UTF-8 text (validated by the caller): quotes, backslashes and control
// characters escaped; everything else verbatim.
std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 0xF];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

Status write_all(int fd, const std::string& path, const uint8_t* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, std::min<size_t>(size - done, size_t(1) << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(path + ": write failed: " + std::strerror(errno));
    }
    done += size_t(n);
  }
  return ok_status();
}

// Closes the descriptor and removes the temporary file unless released.
class TempFile {
 public:
  TempFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!released_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  Status close_and_rename(const std::string& final_path) {
    int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return io_error(path_ + ": close failed: " + std::strerror(errno));
    if (::rename(path_.c_str(), final_path.c_str()) != 0)
      return io_error(final_path + ": rename failed: " + std::strerror(errno));
    released_ = true;
    return ok_status();
  }

 private:
  std::string path_;
  int fd_;
  bool released_ = false;
};

Status write_raw_impl(const std::string& path, uint64_t length_field, std::string_view header,
                      std::span<const uint8_t> data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(path + ": cannot create: " + std::strerror(errno));
  uint8_t prefix[8];
  std::memcpy(prefix, &length_field, 8);  // little-endian host
  Status s = write_all(fd, path, prefix, 8);
  if (s.ok())
    s = write_all(fd, path, reinterpret_cast<const uint8_t*>(header.data()), header.size());
  if (s.ok()) s = write_all(fd, path, data.data(), data.size());
  if (::close(fd) != 0 && s.ok()) s = io_error(path + ": close failed: " + std::strerror(errno));
  return s;
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(size_t chunk_bytes)
    : chunk_bytes_(std::max<size_t>(chunk_bytes, 1)) {}

Status SafetensorsWriter::set_metadata(std::string key, std::string value) {
  if (!is_valid_utf8(key) || !is_valid_utf8(value))
    return invalid_argument("safetensors metadata key or value is not valid UTF-8");
  metadata_[std::move(key)] = std::move(value);
  return ok_status();
}

Status SafetensorsWriter::add(std::string name, DType dtype, std::vector<uint64_t> shape,
                              SafetensorsFillFn fill) {
  auto fail = [&name](const std::string& msg) {
    return invalid_argument("safetensors writer: tensor '" + name.substr(0, 120) + "': " + msg);
  };
  if (name.empty() || name.size() > kSafetensorsMaxNameBytes)
    return fail("name must be 1 to " + std::to_string(kSafetensorsMaxNameBytes) + " bytes");
  if (!is_valid_utf8(name)) return fail("name is not valid UTF-8");
  if (name == kSafetensorsMetadataKey) return fail("the name '__metadata__' is reserved");
  if (shape.size() > kSafetensorsMaxRank) return fail("rank above 8");
  if (entries_.size() >= kSafetensorsMaxTensors) return fail("too many tensors in one file");
  if (!fill) return fail("no fill callback");
  if (names_.contains(name)) return fail("added twice");
  auto numel = checked_product(shape);
  if (!numel || *numel == 0) return fail("element count is zero or overflows");
  auto nbytes = checked_mul(*numel, dtype_size(dtype));
  auto total = nbytes ? checked_add(data_bytes_, *nbytes) : std::nullopt;
  if (!total) return fail("byte size overflows");
  data_bytes_ = *total;
  names_.insert(name);
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), *nbytes, std::move(fill)});
  return ok_status();
}

Status SafetensorsWriter::add(std::string name, DType dtype, std::vector<uint64_t> shape,
                              std::span<const uint8_t> bytes) {
  auto numel = checked_product(shape);
  auto nbytes = numel ? checked_mul(*numel, dtype_size(dtype)) : std::nullopt;
  if (!nbytes || *nbytes != bytes.size()) {
    return invalid_argument("safetensors writer: tensor '" + name.substr(0, 120) + "': got " +
                            std::to_string(bytes.size()) + " bytes for " +
                            describe_tensor_type(dtype, shape));
  }
  auto copy = std::make_shared<std::vector<uint8_t>>(bytes.begin(), bytes.end());
  return add(std::move(name), dtype, std::move(shape),
             [copy](uint64_t offset, std::span<uint8_t> chunk) {
               std::memcpy(chunk.data(), copy->data() + offset, chunk.size());
             });
}

std::string SafetensorsWriter::header_json() const {
  std::string h = "{";
  bool first = true;
  if (!metadata_.empty()) {
    h += json_quote(kSafetensorsMetadataKey) + ":{";
    bool first_meta = true;
    for (const auto& [k, v] : metadata_) {
      if (!first_meta) h += ',';
      first_meta = false;
      h += json_quote(k) + ":" + json_quote(v);
    }
    h += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    if (!first) h += ',';
    first = false;
    h +=
        json_quote(e.name) + ":{\"dtype\":\"" + std::string(dtype_name(e.dtype)) + "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(e.shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + e.nbytes) +
         "]}";
    offset += e.nbytes;
  }
  h += '}';
  return h;
}

Status SafetensorsWriter::write(const std::string& path) const {
  try {
    std::string header = header_json();
    header.append((8 - header.size() % 8) % 8, ' ');  // the reference writer's alignment
    if (header.size() > kSafetensorsMaxHeaderBytes)
      return invalid_argument(path + ": header would exceed the 100,000,000-byte limit");

    std::string tmp_path = path + ".tmp";
    int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return io_error(tmp_path + ": cannot create: " + std::strerror(errno));
    TempFile tmp(tmp_path, fd);

    uint64_t n = header.size();
    uint8_t prefix[8];
    std::memcpy(prefix, &n, 8);
    DS_RETURN_IF_ERROR(write_all(tmp.fd(), tmp_path, prefix, 8));
    DS_RETURN_IF_ERROR(write_all(tmp.fd(), tmp_path,
                                 reinterpret_cast<const uint8_t*>(header.data()), header.size()));

    uint64_t largest = 0;
    for (const Entry& e : entries_) largest = std::max(largest, e.nbytes);
    std::vector<uint8_t> buffer(size_t(std::min<uint64_t>(largest, chunk_bytes_)));
    for (const Entry& e : entries_) {
      for (uint64_t off = 0; off < e.nbytes;) {
        size_t len = size_t(std::min<uint64_t>(e.nbytes - off, buffer.size()));
        std::span<uint8_t> chunk(buffer.data(), len);
        e.fill(off, chunk);
        DS_RETURN_IF_ERROR(write_all(tmp.fd(), tmp_path, chunk.data(), chunk.size()));
        off += len;
      }
    }
    return tmp.close_and_rename(path);
  } catch (const std::exception& ex) {
    return internal_error(path + ": writing safetensors failed: " + ex.what());
  } catch (...) {
    return internal_error(path + ": writing safetensors failed: unknown exception");
  }
}

Status write_safetensors_raw(const std::string& path, std::string_view header,
                             std::span<const uint8_t> data) {
  return write_raw_impl(path, header.size(), header, data);
}

Status write_safetensors_raw(const std::string& path, uint64_t header_length_field,
                             std::string_view header, std::span<const uint8_t> data) {
  return write_raw_impl(path, header_length_field, header, data);
}

}  // namespace ds
