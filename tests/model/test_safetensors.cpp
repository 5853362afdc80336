// Safetensors reader/writer: random valid files written and read back bit-exactly (several dtypes
// and ranks, a tensor spanning many writer chunks, an unaligned header length), plus the reader's
// API contracts (range checks, a file that shrinks after validation, the writer's refusals).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "core/rng.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"

namespace ds {
namespace {

using test::TempDir;

std::vector<uint8_t> random_bytes(Rng& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng.next_u64());
  return v;
}

uint64_t seed_from_time() {
  return uint64_t(::time(nullptr)) ^ (uint64_t(::getpid()) << 32);
}

struct Expected {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

constexpr DType kAllDtypes[] = {DType::kF64,    DType::kF32,    DType::kF16, DType::kBF16,
                                DType::kF8E4M3, DType::kF8E8M0, DType::kI8,  DType::kU8,
                                DType::kI16,    DType::kU16,    DType::kI32, DType::kU32,
                                DType::kI64,    DType::kU64,    DType::kBool};

void check_file_matches(const std::string& path, const std::vector<Expected>& want,
                        const std::map<std::string, std::string>& meta) {
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), want.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    // The writer lays tensors out in the order added, and tensors() is sorted by offset.
    const TensorInfo& t = f->tensors()[i];
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_EQ(t.dtype, want[i].dtype);
    EXPECT_EQ(t.shape, want[i].shape);
    EXPECT_EQ(t.data_offset, offset);
    EXPECT_EQ(t.nbytes, want[i].bytes.size());
    offset += t.nbytes;
    ASSERT_EQ(f->find(want[i].name), &t);

    std::vector<uint8_t> got(t.nbytes);
    ASSERT_TRUE(f->read(t, 0, got).ok());
    EXPECT_EQ(got, want[i].bytes) << t.name;
    auto mapped = f->map_tensor(t);
    ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
    EXPECT_TRUE(
        std::equal(mapped->begin(), mapped->end(), want[i].bytes.begin(), want[i].bytes.end()));
  }
  EXPECT_EQ(f->data_bytes(), offset);
  EXPECT_EQ(f->find("no.such.tensor"), nullptr);
}

TEST(Safetensors, WF4_RoundTripRandomFiles) {
  TempDir dir;
  uint64_t seed = seed_from_time();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int file = 0; file < 25; ++file) {
    SafetensorsWriter writer(/*chunk_bytes=*/1 + rng.below(300));
    std::vector<Expected> want;
    int num = 1 + int(rng.below(8));
    for (int i = 0; i < num; ++i) {
      Expected e;
      e.name = "layers." + std::to_string(i) + ".w" + std::to_string(rng.below(1000));
      e.dtype = kAllDtypes[rng.below(std::size(kAllDtypes))];
      size_t rank = rng.below(5);  // 0 (scalar) to 4
      uint64_t numel = 1;
      for (size_t d = 0; d < rank; ++d) {
        e.shape.push_back(1 + rng.below(7));
        numel *= e.shape.back();
      }
      e.bytes = random_bytes(rng, numel * dtype_size(e.dtype));
      ASSERT_TRUE(writer.add(e.name, e.dtype, e.shape, e.bytes).ok());
      want.push_back(std::move(e));
    }
    std::map<std::string, std::string> meta;
    if (rng.below(2)) {
      meta["format"] = "pt";
      meta["note \"quoted\"\n"] = "π ≈ 3.14159";
      for (const auto& [k, v] : meta) ASSERT_TRUE(writer.set_metadata(k, v).ok());
    }
    std::string path = dir.file("f" + std::to_string(file) + ".safetensors");
    ASSERT_TRUE(writer.write(path).ok());
    // The reference writer's alignment: the data section starts at a multiple of 8.
    auto f = SafetensorsFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(f->header_bytes() % 8, 0u);
    check_file_matches(path, want, meta);
  }
}

TEST(Safetensors, WF4_MultiChunkTensorStreams) {
  TempDir dir;
  Rng rng(seed_from_time());
  constexpr size_t kChunk = 4096;
  // BF16[37, 301]: 22274 bytes, 6 chunks with a short last one.
  std::vector<uint64_t> shape = {37, 301};
  std::vector<uint8_t> bytes = random_bytes(rng, 37 * 301 * 2);
  std::vector<uint8_t> small = random_bytes(rng, 3 * 4);

  SafetensorsWriter writer(kChunk);
  std::vector<std::pair<uint64_t, size_t>> calls;
  ASSERT_TRUE(writer
                  .add("big", DType::kBF16, shape,
                       [&](uint64_t offset, std::span<uint8_t> chunk) {
                         calls.emplace_back(offset, chunk.size());
                         std::memcpy(chunk.data(), bytes.data() + offset, chunk.size());
                       })
                  .ok());
  ASSERT_TRUE(writer.add("small", DType::kF32, {3}, small).ok());
  EXPECT_EQ(writer.data_bytes(), bytes.size() + small.size());
  std::string path = dir.file("big.safetensors");
  ASSERT_TRUE(writer.write(path).ok());

  // The callback saw consecutive chunks of at most kChunk bytes covering the tensor once.
  ASSERT_EQ(calls.size(), (bytes.size() + kChunk - 1) / kChunk);
  uint64_t next = 0;
  for (auto [offset, size] : calls) {
    EXPECT_EQ(offset, next);
    EXPECT_LE(size, kChunk);
    next += size;
  }
  EXPECT_EQ(next, bytes.size());

  check_file_matches(path,
                     {{"big", DType::kBF16, shape, bytes}, {"small", DType::kF32, {3}, small}}, {});
  // Partial reads at odd offsets.
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok());
  const TensorInfo* t = f->find("big");
  ASSERT_NE(t, nullptr);
  for (uint64_t off : {uint64_t(0), uint64_t(1), uint64_t(4095), uint64_t(10001)}) {
    std::vector<uint8_t> part(777);
    ASSERT_TRUE(f->read(*t, off, part).ok());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), bytes.begin() + long(off)));
  }
}

TEST(Safetensors, WF3_UnalignedHeaderLengthLoads) {
  TempDir dir;
  Rng rng(seed_from_time());
  std::vector<uint8_t> a = random_bytes(rng, 5 * 4), b = random_bytes(rng, 3 * 8);
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.add("a", DType::kF32, {5}, a).ok());
  ASSERT_TRUE(writer.add("b", DType::kF64, {3}, b).ok());
  std::string header = writer.header_json();
  for (size_t pad = 0; pad < 8; ++pad) {
    std::string h = header + std::string(pad, ' ');
    std::vector<uint8_t> data = a;
    data.insert(data.end(), b.begin(), b.end());
    std::string path = dir.file("u" + std::to_string(pad) + ".safetensors");
    ASSERT_TRUE(write_safetensors_raw(path, h, data).ok());
    auto f = SafetensorsFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(f->header_bytes(), h.size());
    check_file_matches(path, {{"a", DType::kF32, {5}, a}, {"b", DType::kF64, {3}, b}}, {});
    // Typed values come out of the (possibly unaligned) mapping with memcpy.
    auto m = f->map_tensor(*f->find("b"));
    ASSERT_TRUE(m.ok());
    double first, want;
    std::memcpy(&first, m->data(), 8);
    std::memcpy(&want, b.data(), 8);
    EXPECT_EQ(std::memcmp(&first, &want, 8), 0);
  }
}

TEST(Safetensors, WF4_EmptyFileWithOnlyMetadataLoads) {
  TempDir dir;
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.set_metadata("format", "pt").ok());
  std::string path = dir.file("empty.safetensors");
  ASSERT_TRUE(writer.write(path).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

TEST(Safetensors, WF5_ReadOutsideTensorRefused) {
  TempDir dir;
  Rng rng(seed_from_time());
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.add("t", DType::kU8, {16}, random_bytes(rng, 16)).ok());
  std::string path = dir.file("t.safetensors");
  ASSERT_TRUE(writer.write(path).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok());
  const TensorInfo& t = f->tensors()[0];
  std::vector<uint8_t> buf(8);
  EXPECT_EQ(f->read(t, 9, buf).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f->read(t, UINT64_MAX - 2, buf).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(f->read(t, 8, buf).ok());
  TensorInfo foreign = t;
  foreign.data_offset = 1000;
  EXPECT_EQ(f->read(foreign, 0, buf).code(), StatusCode::kInvalidArgument);
  foreign.data_offset = UINT64_MAX;
  EXPECT_EQ(f->map_tensor(foreign).status().code(), StatusCode::kInvalidArgument);
}

TEST(Safetensors, WF5_FileShrinkingAfterOpenIsAnError) {
  TempDir dir;
  Rng rng(seed_from_time());
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.add("a", DType::kU8, {4000}, random_bytes(rng, 4000)).ok());
  ASSERT_TRUE(writer.add("b", DType::kU8, {4000}, random_bytes(rng, 4000)).ok());
  std::string path = dir.file("s.safetensors");
  ASSERT_TRUE(writer.write(path).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(::truncate(path.c_str(), off_t(f->file_size() - 100)), 0);
  std::vector<uint8_t> buf(4000);
  Status s = f->read(*f->find("b"), 0, buf);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("shrank"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  auto m = f->map_tensor(*f->find("a"));
  EXPECT_EQ(m.status().code(), StatusCode::kIoError);
  EXPECT_NE(m.status().message().find("rule 17"), std::string::npos) << m.status().message();
}

TEST(Safetensors, WF5_MissingFileIsNotFound) {
  TempDir dir;
  auto f = SafetensorsFile::open(dir.file("absent.safetensors"));
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  auto d = SafetensorsFile::open(dir.path());
  EXPECT_FALSE(d.ok());
  // A FIFO must be refused, not block the loader forever.
  ASSERT_EQ(::mkfifo(dir.file("fifo.safetensors").c_str(), 0600), 0);
  auto fifo = SafetensorsFile::open(dir.file("fifo.safetensors"));
  EXPECT_EQ(fifo.status().code(), StatusCode::kIoError);
  EXPECT_NE(fifo.status().message().find("not a regular file"), std::string::npos);
}

TEST(Safetensors, WF4_MoveKeepsFileUsable) {
  TempDir dir;
  Rng rng(seed_from_time());
  std::vector<uint8_t> bytes = random_bytes(rng, 64);
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.add("x", DType::kI64, {8}, bytes).ok());
  std::string path = dir.file("m.safetensors");
  ASSERT_TRUE(writer.write(path).ok());
  auto r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok());
  SafetensorsFile a = std::move(r).value();
  ASSERT_TRUE(a.map_tensor(*a.find("x")).ok());
  SafetensorsFile b = std::move(a);
  std::vector<uint8_t> got(64);
  ASSERT_TRUE(b.read(*b.find("x"), 0, got).ok());
  EXPECT_EQ(got, bytes);
  auto m = b.map_tensor(*b.find("x"));
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(std::equal(m->begin(), m->end(), bytes.begin()));
  b.unmap();
}

TEST(Safetensors, WF9_WriterRefusesWhatTheReaderWould) {
  SafetensorsWriter w;
  std::vector<uint8_t> four(4);
  EXPECT_TRUE(w.add("ok", DType::kF32, {1}, four).ok());
  EXPECT_EQ(w.add("ok", DType::kF32, {1}, four).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add("__metadata__", DType::kF32, {1}, four).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add("", DType::kF32, {1}, four).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add(std::string(1025, 'n'), DType::kF32, {1}, four).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add("bad\xC0\xAF", DType::kF32, {1}, four).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add("zero", DType::kF32, {0, 4}, std::span<const uint8_t>()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      w.add("rank9", DType::kU8, {1, 1, 1, 1, 1, 1, 1, 1, 1}, std::span(four).first(1)).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add("size", DType::kF32, {2}, four).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add("huge", DType::kF32, {uint64_t(1) << 62},
                  SafetensorsFillFn([](uint64_t, std::span<uint8_t>) {}))
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.set_metadata("k", "\xFF").code(), StatusCode::kInvalidArgument);
}

TEST(Safetensors, WF4_NamesNeedingJsonEscapesRoundTrip) {
  TempDir dir;
  Rng rng(seed_from_time());
  std::vector<Expected> want;
  SafetensorsWriter writer;
  for (std::string name : {std::string("quote\"back\\slash"), std::string("tab\there\x01"),
                           std::string("unicode.名前.ü")}) {
    Expected e{name, DType::kU8, {3}, random_bytes(rng, 3)};
    ASSERT_TRUE(writer.add(e.name, e.dtype, e.shape, e.bytes).ok());
    want.push_back(std::move(e));
  }
  std::string path = dir.file("esc.safetensors");
  ASSERT_TRUE(writer.write(path).ok());
  check_file_matches(path, want, {});
}

}  // namespace
}  // namespace ds
