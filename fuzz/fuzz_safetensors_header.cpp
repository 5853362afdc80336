// Fuzz target: a .safetensors file (reliability.md §3.1-§3.5). The input bytes are written to a
// file in a scratch directory and opened with ds::SafetensorsFile::open; when the file is
// accepted, every tensor is read through read() and map_tensor(), the two must agree, and the
// validated layout must hold what the reader promises (sorted, exact tiling of the data section,
// nbytes = numel * dtype size, find() by name). Reads outside a tensor must be refused.
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "fuzz_util.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet_logging();
  static const std::string path = ds::fuzz::scratch_dir() + "/input.safetensors";
  ds::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));

  auto opened = ds::SafetensorsFile::open(path);
  ds::fuzz::note_result(opened.status());
  if (!opened.ok()) {
    DS_FUZZ_CHECK(!opened.status().message().empty(), "an error without a message");
    return 0;
  }
  ds::SafetensorsFile& file = *opened;
  DS_FUZZ_CHECK(file.file_size() == size, "file_size differs from the bytes written");
  DS_FUZZ_CHECK(file.data_start() <= size, "data section starts past the end of the file");

  uint64_t expected_offset = 0;
  for (const ds::TensorInfo& t : file.tensors()) {
    DS_FUZZ_CHECK(t.data_offset == expected_offset,
                  "tensors do not tile the data section: " + t.name);
    DS_FUZZ_CHECK(t.numel > 0, "zero-element tensor accepted: " + t.name);
    DS_FUZZ_CHECK(t.shape.size() <= ds::kSafetensorsMaxRank, "rank above the limit: " + t.name);
    DS_FUZZ_CHECK(!t.name.empty() && t.name.size() <= ds::kSafetensorsMaxNameBytes,
                  "name length out of bounds");
    uint64_t numel = 1;
    for (uint64_t d : t.shape) {
      DS_FUZZ_CHECK(d == 0 || numel <= UINT64_MAX / d, "shape product overflows: " + t.name);
      numel *= d;
    }
    DS_FUZZ_CHECK(numel == t.numel, "numel is not the shape product: " + t.name);
    DS_FUZZ_CHECK(
        t.nbytes / ds::dtype_size(t.dtype) == t.numel && t.nbytes % ds::dtype_size(t.dtype) == 0,
        "nbytes is not numel * dtype size: " + t.name);
    DS_FUZZ_CHECK(t.nbytes <= file.data_bytes() - t.data_offset, "tensor past the data section");
    expected_offset += t.nbytes;

    const ds::TensorInfo* found = file.find(t.name);
    DS_FUZZ_CHECK(found != nullptr && found->name == t.name, "find() misses " + t.name);

    std::vector<uint8_t> copy(t.nbytes);
    ds::Status st = file.read(t, 0, copy);
    DS_FUZZ_CHECK(st.ok(), "read() of a validated tensor failed: " + st.to_string());
    auto mapped = file.map_tensor(t);
    DS_FUZZ_CHECK(mapped.ok(),
                  "map_tensor() of a validated tensor failed: " + mapped.status().to_string());
    DS_FUZZ_CHECK(mapped->size() == t.nbytes, "mapped span has the wrong size: " + t.name);
    DS_FUZZ_CHECK(t.nbytes == 0 || std::memcmp(mapped->data(), copy.data(), t.nbytes) == 0,
                  "read() and map_tensor() disagree: " + t.name);
    // The bytes must be the file's bytes at data_start + data_offset.
    DS_FUZZ_CHECK(std::memcmp(copy.data(), data + file.data_start() + t.data_offset, t.nbytes) == 0,
                  "read() returned bytes from the wrong place: " + t.name);

    // A partial read inside the tensor works; one that runs past its end is refused.
    if (t.nbytes > 1) {
      std::vector<uint8_t> tail(t.nbytes - 1);
      DS_FUZZ_CHECK(file.read(t, 1, tail).ok(), "read() at offset 1 failed: " + t.name);
    }
    std::vector<uint8_t> past(1);
    DS_FUZZ_CHECK(!file.read(t, t.nbytes, past).ok(), "read() past the tensor end accepted");
    DS_FUZZ_CHECK(!file.read(t, UINT64_MAX, past).ok(), "read() at offset 2^64-1 accepted");
  }
  DS_FUZZ_CHECK(expected_offset == file.data_bytes(), "tensors do not cover the data section");
  DS_FUZZ_CHECK(file.find(ds::kSafetensorsMetadataKey) == nullptr, "a tensor named __metadata__");
  file.unmap();
  return 0;
}
