// The corrupt safetensors catalogue (reliability.md §4.2): one test per defect, each built at test
// time with write_safetensors_raw and asserting the status code, the rule number and (where there
// is one) the tensor named in the error. Ends with a mutation test: thousands of random byte flips
// and truncations of a valid header, each of which must give a clean load or a clean refusal.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "core/rng.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"

namespace ds {
namespace {

using test::TempDir;

// One header entry: "name":{"dtype":..,"shape":[..],"data_offsets":[b,e]} with shape and offsets
// given as raw JSON text so that malformed numbers can be written.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[" + shape +
         "],\"data_offsets\":[" + offsets + "]}";
}

class Catalogue : public ::testing::Test {
 protected:
  // Writes a file with the given header text (length field = its size unless given) and data,
  // opens it and returns the status.
  Status open_raw(const std::string& header, size_t data_bytes) {
    return open_raw_n(header.size(), header, data_bytes);
  }
  Status open_raw_n(uint64_t length_field, const std::string& header, size_t data_bytes) {
    std::vector<uint8_t> data(data_bytes, 0x5A);
    path_ = dir_.file("case.safetensors");
    // Unlink first: rewriting a truncated file makes ext4 flush it on close (auto_da_alloc),
    // which turns thousands of tiny files into seconds of I/O wait.
    ::unlink(path_.c_str());
    Status w = write_safetensors_raw(path_, length_field, header, data);
    if (!w.ok()) return w;
    return SafetensorsFile::open(path_).status();
  }
  Status open_bytes(const std::vector<uint8_t>& bytes) {
    path_ = dir_.file("case.safetensors");
    ::unlink(path_.c_str());
    std::ofstream(path_, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return SafetensorsFile::open(path_).status();
  }

  // The error is kCorrupt (unless told otherwise), names the file and contains every fragment.
  void expect_error(const Status& s, std::initializer_list<std::string> fragments,
                    StatusCode code = StatusCode::kCorrupt) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(path_), std::string::npos) << s.message();
    for (const std::string& f : fragments)
      EXPECT_NE(s.message().find(f), std::string::npos)
          << "missing '" << f << "' in " << s.message();
  }

  TempDir dir_;
  std::string path_;
};

// A valid two-tensor header and its data size, for cases that break one thing.
const std::string kA = entry("a", "F32", "2,3", "0,24");
const std::string kB = entry("b", "BF16", "4", "24,32");

// ---- framing ----------------------------------------------------------------------------------

TEST_F(Catalogue, Catalogue_WF1_FileShorterThan8Bytes) {
  expect_error(open_bytes({1, 2, 3, 4, 5}), {"rule 1:", "5 bytes"});
  expect_error(open_bytes({}), {"rule 1:", "0 bytes"});
}

TEST_F(Catalogue, Catalogue_WF1_HeaderLengthZero) {
  expect_error(open_raw_n(0, "", 0), {"rule 5:", "empty"});
  expect_error(open_raw_n(0, "", 16), {"rule 5:", "empty"});
}

TEST_F(Catalogue, Catalogue_WF1_HeaderLengthOne) {
  expect_error(open_raw("{", 0), {"rule 5:"});
  expect_error(open_raw_n(1, "{}", 0), {"rule 5:"});  // N = 1 cuts "{}" to "{"
}

TEST_F(Catalogue, Catalogue_WF1_HeaderLengthCapPlusOne) {
  expect_error(open_raw_n(kSafetensorsMaxHeaderBytes + 1, "{}", 0),
               {"rule 2:", "100000001", "exceeds the limit"});
}

TEST_F(Catalogue, Catalogue_WF1_HeaderPastEndOfFile) {
  expect_error(open_raw_n(100, "{}", 50), {"rule 2:", "runs past the end"});
  expect_error(open_raw_n(3, "{}", 0), {"rule 2:"});  // one byte short
}

TEST_F(Catalogue, Catalogue_WF1_HeaderLengthNearU64Max) {
  for (uint64_t n : {UINT64_MAX, UINT64_MAX - 7, UINT64_MAX - 8, uint64_t(1) << 63})
    expect_error(open_raw_n(n, "{}", 64), {"rule 2:"});
}

// ---- header text ------------------------------------------------------------------------------

TEST_F(Catalogue, Catalogue_WF2_HeaderNotUtf8) {
  expect_error(open_raw("{" + entry("a\xC0\xAF", "U8", "1", "0,1") + "}", 1), {"rule 4:", "UTF-8"});
  // A surrogate encoded in UTF-8 (CESU style) is not UTF-8 either.
  expect_error(open_raw("{" + entry("a\xED\xA0\x80", "U8", "1", "0,1") + "}", 1), {"rule 4:"});
}

TEST_F(Catalogue, Catalogue_WF2_HeaderNotStartingWithBrace) {
  expect_error(open_raw(" {" + kA + "}", 24), {"rule 5:", "start with '{'"});
}

TEST_F(Catalogue, Catalogue_WF2_TopLevelNotAnObject) {
  expect_error(open_raw("[" + std::string("1,2") + "]", 0), {"rule 5:"});
  expect_error(open_raw("\"{}\"", 0), {"rule 5:"});
}

TEST_F(Catalogue, Catalogue_WF2_BytesAfterTheObject) {
  expect_error(open_raw("{" + kA + "}x", 24), {"rule 5:"});
  // nlohmann's lexer treats NUL as the end of input; the reader must not.
  expect_error(open_raw("{" + kA + "}" + std::string(3, '\0'), 24), {"rule 5:", "NUL"});
  expect_error(open_raw("{" + kA + "}" + std::string(1, '\0') + "{garbage", 24),
               {"rule 5:", "NUL"});
  expect_error(open_raw("{" + kA + "}{}", 24), {"rule 5:"});
  // Only JSON whitespace (space, tab, CR, LF) may follow.
  EXPECT_TRUE(open_raw("{" + kA + "} \t\r\n", 24).ok());
}

TEST_F(Catalogue, Catalogue_WF2_DuplicateKey) {
  expect_error(open_raw("{" + kA + "," + entry("a", "F32", "2,3", "24,48") + "}", 48),
               {"rule 6:", "duplicate key"});
  expect_error(open_raw("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"U8\",\"shape\":[24],"
                        "\"data_offsets\":[0,24]}}",
                        24),
               {"rule 6:", "duplicate key"});
}

TEST_F(Catalogue, Catalogue_WF9_DepthFour) {
  expect_error(open_raw("{" + entry("a", "U8", "[1]", "0,1") + "}", 1), {"rule 7:", "deeper"});
}

TEST_F(Catalogue, Catalogue_WF9_OneMiBName) {
  std::string name(1 << 20, 'n');
  expect_error(open_raw("{" + entry(name, "U8", "1", "0,1") + "}", 1), {"rule 7:"});
  // A name just over the 1 KiB cap gets past the JSON limits and is refused by the name check.
  std::string long_name(kSafetensorsMaxNameBytes + 1, 'm');
  expect_error(open_raw("{" + entry(long_name, "U8", "1", "0,1") + "}", 1),
               {"rule 7:", "1025 bytes"});
  expect_error(open_raw("{" + entry("", "U8", "1", "0,1") + "}", 1), {"rule 7:", "empty"});
}

TEST_F(Catalogue, Catalogue_WF9_TooManyEntries) {
  std::string h = "{";
  for (size_t i = 0; i <= kSafetensorsMaxTensors; ++i) {
    if (i) h += ',';
    h += "\"t" + std::to_string(i) + "\":0";
  }
  h += '}';
  // Refused after parsing, by the tensor count.
  expect_error(open_raw(h, 0), {"rule 7:", "262145 tensor entries"});
  // One more key: refused before parsing, by the raw key count.
  h.back() = ',';
  h += "\"__metadata__\":{},\"x\":0}";
  expect_error(open_raw(h, 0), {"rule 7:", "262147 top-level entries"});
}

TEST_F(Catalogue, Catalogue_WF9_TenMillionEntries) {
  // 10 M distinct 4-byte keys fit under the 100 MB header cap ("abcd":0, is 9 bytes).
  constexpr size_t kEntries = 10'000'000;
  std::string h;
  h.reserve(kEntries * 9 + 2);
  h += '{';
  char key[] = "\"aaaa\":0,";
  static const char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  for (size_t i = 0; i < kEntries; ++i) {
    size_t v = i;
    for (int k = 4; k >= 1; --k, v /= 62) key[k] = kAlnum[v % 62];
    h.append(key, sizeof(key) - 1);
  }
  h.back() = '}';
  ASSERT_LE(h.size(), kSafetensorsMaxHeaderBytes);
  expect_error(open_raw(h, 0), {"rule 7:", "10000000 top-level entries"});
}

TEST_F(Catalogue, Catalogue_WF9_RankNine) {
  expect_error(open_raw("{" + entry("r9", "U8", "1,1,1,1,1,1,1,1,1", "0,1") + "}", 1),
               {"tensor 'r9'", "rule 7:", "rank 9"});
  EXPECT_TRUE(open_raw("{" + entry("r8", "U8", "1,1,1,1,1,1,1,1", "0,1") + "}", 1).ok());
}

// ---- metadata -----------------------------------------------------------------------------------

TEST_F(Catalogue, Catalogue_WF7_MetadataWithNumberValue) {
  expect_error(open_raw("{\"__metadata__\":{\"format\":\"pt\",\"n\":1}," + kA + "}", 24),
               {"rule 8:", "'n'"});
  expect_error(open_raw("{\"__metadata__\":\"pt\"," + kA + "}", 24), {"rule 8:"});
  EXPECT_TRUE(open_raw("{\"__metadata__\":{\"format\":\"pt\"}," + kA + "}", 24).ok());
}

TEST_F(Catalogue, Catalogue_WF7_TensorNamedMetadata) {
  expect_error(open_raw("{" + entry("__metadata__", "F32", "2,3", "0,24") + "}", 24),
               {"rule 8:", "reserved"});
}

// ---- entry keys -------------------------------------------------------------------------------

TEST_F(Catalogue, Catalogue_WF2_MissingDtype) {
  expect_error(open_raw("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
               {"tensor 'a'", "rule 9:", "missing key 'dtype'"});
}

TEST_F(Catalogue, Catalogue_WF2_MissingShape) {
  expect_error(open_raw("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1),
               {"tensor 'a'", "rule 9:", "missing key 'shape'"});
}

TEST_F(Catalogue, Catalogue_WF2_MissingDataOffsets) {
  expect_error(open_raw("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1),
               {"tensor 'a'", "rule 9:", "missing key 'data_offsets'"});
}

TEST_F(Catalogue, Catalogue_WF2_UnknownKey) {
  expect_error(open_raw("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],"
                        "\"alias\":\"b\"}}",
                        1),
               {"tensor 'a'", "rule 9:", "unknown key 'alias'"});
}

TEST_F(Catalogue, Catalogue_WF2_EntryNotAnObject) {
  expect_error(open_raw("{\"a\":[1,2]}", 0), {"tensor 'a'", "rule 9:"});
  expect_error(open_raw("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
               {"tensor 'a'", "rule 9:", "dtype must be a string"});
  expect_error(open_raw("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1),
               {"tensor 'a'", "rule 9:", "shape must be an array"});
}

TEST_F(Catalogue, Catalogue_WF8_UnknownDtype) {
  for (const char* dt : {"F8_E5M2", "F4", "Q4_K", "bf16", ""})
    expect_error(open_raw("{" + entry("a", dt, "1", "0,1") + "}", 1),
                 {"tensor 'a'", "rule 9:", "unknown dtype"});
}

// ---- numbers ----------------------------------------------------------------------------------

TEST_F(Catalogue, Catalogue_WF3_NegativeDimension) {
  expect_error(open_raw("{" + entry("a", "U8", "-1", "0,1") + "}", 1),
               {"tensor 'a'", "rule 9:", "shape[0]", "negative"});
  expect_error(open_raw("{" + entry("a", "U8", "-0", "0,1") + "}", 1), {"rule 9:"});
}

TEST_F(Catalogue, Catalogue_WF3_FloatDimension) {
  expect_error(open_raw("{" + entry("a", "U8", "1.0", "0,1") + "}", 1),
               {"tensor 'a'", "rule 9:", "fraction"});
}

TEST_F(Catalogue, Catalogue_WF3_DimensionWithExponent) {
  expect_error(open_raw("{" + entry("a", "U8", "1e0", "0,1") + "}", 1),
               {"tensor 'a'", "rule 9:", "exponent"});
  expect_error(open_raw("{" + entry("a", "U8", "18446744073709551616", "0,1") + "}", 1),
               {"tensor 'a'", "rule 9:"});
  expect_error(open_raw("{" + entry("a", "U8", "\"1\"", "0,1") + "}", 1), {"rule 9:"});
}

TEST_F(Catalogue, Catalogue_WF3_DataOffsetsLengthOneOrThree) {
  expect_error(open_raw("{" + entry("a", "U8", "1", "0") + "}", 1),
               {"tensor 'a'", "rule 9:", "exactly 2"});
  expect_error(open_raw("{" + entry("a", "U8", "1", "0,1,2") + "}", 1),
               {"tensor 'a'", "rule 9:", "exactly 2"});
  expect_error(open_raw("{" + entry("a", "U8", "1", "-1,0") + "}", 1),
               {"tensor 'a'", "rule 9:", "data_offsets[0]"});
  expect_error(open_raw("{" + entry("a", "U8", "1", "0,1.5") + "}", 1),
               {"tensor 'a'", "rule 9:", "data_offsets[1]"});
}

// ---- arithmetic -------------------------------------------------------------------------------

TEST_F(Catalogue, Catalogue_WF4_ShapeProductOverflow) {
  expect_error(open_raw("{" + entry("a", "U8", "4294967296,4294967296", "0,1") + "}", 1),
               {"tensor 'a'", "rule 10:", "element count"});
  // A zero dimension after the overflow does not hide it: the product is checked left to right.
  expect_error(open_raw("{" + entry("a", "U8", "4294967296,4294967296,0", "0,1") + "}", 1),
               {"rule 10:"});
}

TEST_F(Catalogue, Catalogue_WF4_NbytesOverflow) {
  expect_error(open_raw("{" + entry("a", "F32", "4611686018427387904", "0,4") + "}", 4),
               {"tensor 'a'", "rule 10:", "byte size"});
}

TEST_F(Catalogue, Catalogue_WF3_EndBeforeBegin) {
  expect_error(open_raw("{" + entry("a", "U8", "1", "1,0") + "}", 1),
               {"tensor 'a'", "rule 11:", "before begin"});
}

TEST_F(Catalogue, Catalogue_WF4_SpanDiffersFromNbytes) {
  expect_error(
      open_raw("{" + entry("layers.0.attn.wq_a.weight", "BF16", "10,10", "0,100") + "}", 100),
      {"tensor 'layers.0.attn.wq_a.weight': rule 11: data_offsets span 100 bytes but BF16[10, 10] "
       "needs 200"});
  // A declared shape larger than its byte range would read out of bounds (mlx PR #3364).
  expect_error(open_raw("{" + entry("a", "F32", "1000000", "0,4") + "}", 4), {"rule 11:"});
}

// ---- layout -----------------------------------------------------------------------------------

TEST_F(Catalogue, Catalogue_WF3_FirstTensorNotAtZero) {
  expect_error(open_raw("{" + entry("a", "U8", "4", "4,8") + "}", 8),
               {"tensor 'a'", "rule 12:", "not 0"});
}

TEST_F(Catalogue, Catalogue_WF3_Gap) {
  expect_error(
      open_raw("{" + entry("a", "U8", "4", "0,4") + "," + entry("b", "U8", "4", "6,10") + "}", 10),
      {"tensor 'b'", "rule 12:", "gap of 2 bytes"});
}

TEST_F(Catalogue, Catalogue_WF3_Overlap) {
  expect_error(
      open_raw("{" + entry("a", "U8", "4", "0,4") + "," + entry("b", "U8", "4", "2,6") + "}", 6),
      {"tensor 'b'", "rule 12:", "overlap tensor 'a'"});
}

TEST_F(Catalogue, Catalogue_WF3_SharedOffsets) {
  expect_error(
      open_raw("{" + entry("a", "U8", "4", "0,4") + "," + entry("tied", "U8", "4", "0,4") + "}", 4),
      {"tensor 'tied'", "rule 14:", "shares data offset 0 with tensor 'a'"});
}

TEST_F(Catalogue, Catalogue_WF3_ZeroElementTensor) {
  expect_error(
      open_raw("{" + entry("a", "U8", "4", "0,4") + "," + entry("z", "F32", "0,7", "4,4") + "}", 4),
      {"tensor 'z'", "rule 14:", "zero-element"});
  // The known bypass: a zero-size tensor sharing an offset with a real one.
  expect_error(
      open_raw("{" + entry("a", "U8", "4", "0,4") + "," + entry("z", "U8", "0", "0,0") + "}", 4),
      {"tensor 'z'", "rule 14:"});
}

TEST_F(Catalogue, Catalogue_WF5_LastEndShortOfEof) {
  expect_error(open_raw("{" + kA + "," + kB + "}", 40), {"rule 13:", "8 bytes after"});
}

TEST_F(Catalogue, Catalogue_WF5_LastEndPastEof) {
  expect_error(open_raw("{" + kA + "," + kB + "}", 31), {"rule 13:", "1 bytes more"});
}

TEST_F(Catalogue, Catalogue_WF5_BytesAppendedOrTruncated) {
  Rng rng(7);
  SafetensorsWriter writer;
  std::vector<uint8_t> data(96);
  for (auto& b : data) b = uint8_t(rng.next_u64());
  ASSERT_TRUE(writer.add("w", DType::kBF16, {6, 8}, data).ok());
  path_ = dir_.file("case.safetensors");
  ASSERT_TRUE(writer.write(path_).ok());
  ASSERT_TRUE(SafetensorsFile::open(path_).ok());
  { std::ofstream(path_, std::ios::binary | std::ios::app).write("\0\0\0", 3); }
  expect_error(SafetensorsFile::open(path_).status(), {"rule 13:", "3 bytes after"});
  auto size = std::filesystem::file_size(path_);
  std::filesystem::resize_file(path_, size - 4);  // one byte short of the original
  expect_error(SafetensorsFile::open(path_).status(), {"rule 13:", "1 bytes more"});
}

TEST_F(Catalogue, Catalogue_WF3_UnalignedHeaderLoads) {
  std::string h = "{" + kA + "," + kB + "}";
  for (int pad = 0; pad < 8; ++pad) {
    Status s = open_raw(h + std::string(size_t(pad), ' '), 32);
    EXPECT_TRUE(s.ok()) << "pad " << pad << ": " << s.to_string();
  }
}

// ---- mutations --------------------------------------------------------------------------------

// Random single-byte changes and truncations of a valid file's header region (fixed seed). Every
// outcome must be a clean load or a clean kCorrupt/kIoError refusal; a file that loads must read
// back completely. Run under ASan + UBSan in CI, where any UB fails the test.
TEST_F(Catalogue, WF5_MutatedHeadersFailCleanly) {
  Rng rng(20261129);
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.set_metadata("format", "pt").ok());
  const std::vector<std::pair<DType, std::vector<uint64_t>>> specs = {
      {DType::kBF16, {4, 8}}, {DType::kF8E4M3, {16, 4}}, {DType::kF8E8M0, {1, 1}},
      {DType::kF32, {3}},     {DType::kI64, {2, 1, 2}},  {DType::kI8, {5, 2}}};
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [dt, shape] = specs[i];
    uint64_t n = dtype_size(dt);
    for (uint64_t d : shape) n *= d;
    std::vector<uint8_t> bytes(n);
    for (auto& b : bytes) b = uint8_t(rng.next_u64());
    ASSERT_TRUE(writer.add("layers." + std::to_string(i) + ".w", dt, shape, bytes).ok());
  }
  std::string good_path = dir_.file("good.safetensors");
  ASSERT_TRUE(writer.write(good_path).ok());
  std::vector<uint8_t> good(std::filesystem::file_size(good_path));
  std::ifstream(good_path, std::ios::binary)
      .read(reinterpret_cast<char*>(good.data()), std::streamsize(good.size()));
  uint64_t header_end;
  std::memcpy(&header_end, good.data(), 8);
  header_end += 8;

  // Bytes a mutation likes to write: JSON structure, digits, signs, exponents, UTF-8 lead bytes.
  static const char kInteresting[] = "{}[]\",:0123456789-+.eE \t\n\\u_\x00\x7F\x80\xC0\xFF";
  const std::string interesting(kInteresting, sizeof(kInteresting) - 1);
  int loaded = 0, refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bytes = good;
    int kind = int(rng.below(4));
    if (kind == 0) {
      // Truncate anywhere in the header region or the data.
      bytes.resize(size_t(rng.below(bytes.size())));
    } else {
      int flips = kind == 3 ? 1 + int(rng.below(4)) : 1;
      for (int f = 0; f < flips; ++f) {
        size_t pos = size_t(rng.below(header_end));
        if (kind == 1) {
          bytes[pos] ^= uint8_t(1u << rng.below(8));
        } else {
          bytes[pos] = uint8_t(interesting[rng.below(interesting.size())]);
        }
      }
    }
    Status s = open_bytes(bytes);
    if (s.ok()) {
      ++loaded;
      auto f = SafetensorsFile::open(path_);
      ASSERT_TRUE(f.ok());
      for (const TensorInfo& t : f->tensors()) {
        std::vector<uint8_t> buf(t.nbytes);
        ASSERT_TRUE(f->read(t, 0, buf).ok()) << "iteration " << iter;
        auto m = f->map_tensor(t);
        ASSERT_TRUE(m.ok()) << "iteration " << iter;
        ASSERT_TRUE(std::equal(m->begin(), m->end(), buf.begin())) << "iteration " << iter;
      }
    } else {
      ++refused;
      ASSERT_TRUE(s.code() == StatusCode::kCorrupt || s.code() == StatusCode::kIoError)
          << "iteration " << iter << ": " << s.to_string();
      ASSERT_NE(s.message().find("rule "), std::string::npos)
          << "iteration " << iter << ": " << s.message();
    }
  }
  EXPECT_GT(refused, 1500);
  EXPECT_GT(loaded, 0);  // e.g. flips inside metadata text or whitespace padding
}

}  // namespace
}  // namespace ds
