// The elementwise kernels (src/kernels/cuda/elementwise) against their CPU references on fresh
// random inputs at tiny-model and DeepSeek-V4-Flash shapes (1, 7, 64 and 4096 rows where a step
// can have that many), every output buffer poisoned (0xFF bytes: NaN / -1) before the launch and
// compared whole, so a skipped write or a write outside the outputs fails the test.
//
// Tolerance: none. Every kernel does the CPU reference's fp32 operations in the same order
// (explicitly rounded, no FMA contraction), so every check is bit-exact:
//  - embed, gather_rows, f32 -> bf16, round_bf16, add_broadcast, indexer_scale_weights: exact by
//    construction (copies, one conversion or one fp32 operation per value).
//  - simulate_fp8_kv, pack_kv_entries: the same amax, the same power-of-two scale and the same
//    e4m3 rounding; the entry bytes are compared with ds::cpu::pack_kv_entry's and also unpacked
//    with ds::cpu::unpack_kv_entry.
//  - indexer_prepare_query: same operations; cos/sin come from double sin/cos rounded to fp32 on
//    both sides, and could in principle differ where the device's double result and libm's
//    straddle an fp32 rounding boundary (probability ~2^-29 per angle). If that ever fails, the
//    message shows a handful of values at one token, not a pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/indexer.h"
#include "kernels/cpu/kv_entry.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/ops_test_util.h"

namespace ds {
namespace {

using test::Dev;

const float kNaN = std::bit_cast<float>(0x7FFFFFFFu);  // what the kernels write for a bad id / row

// Element-by-element bit comparison of two equally long vectors.
template <typename T>
::testing::AssertionResult bits_equal(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (first < 0) first = int64_t(i);
      ++differ;
    }
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  std::ostringstream s;
  s << differ << " of " << want.size() << " elements differ; first at " << first << ": got ";
  if constexpr (std::is_floating_point_v<T>) {
    s << std::setprecision(9) << got[size_t(first)] << " want " << want[size_t(first)];
  } else {
    s << int64_t(got[size_t(first)]) << " want " << int64_t(want[size_t(first)]);
  }
  return ::testing::AssertionFailure() << s.str();
}

// Random values with awkward cases mixed in: bf16 rounding ties (even and odd), values that round
// up to a new binade or to infinity, infinities, NaNs with payloads, subnormals, -0.
std::vector<float> random_with_specials(Rng& rng, size_t n) {
  std::vector<float> v = test::random_normal(rng, n, 3.0f);
  const uint32_t specials[] = {0x3F808000u, 0x3F818000u, 0xBF808000u, 0x3F7FFFFFu, 0x7F7FFFFFu,
                               0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFFC12345u, 0x00008000u,
                               0x00018001u, 0x80000000u, 0x00000000u, 0x477FFFFFu};
  for (size_t i = 0; i < n; i += 37) v[i] = std::bit_cast<float>(specials[(i / 37) % 14]);
  return v;
}

std::vector<uint8_t> to_bytes_poisoned(size_t n) {
  return std::vector<uint8_t>(n, test::kPoisonByte);
}

// ---- embed ----

void check_embed(int64_t n, int64_t vocab, int64_t dim, int64_t copies, bool bad_id,
                 uint64_t seed) {
  SCOPED_TRACE("tokens " + std::to_string(n) + " dim " + std::to_string(dim) + " copies " +
               std::to_string(copies));
  Rng rng(seed);
  std::vector<uint16_t> table(static_cast<size_t>(vocab * dim));
  for (auto& b : table) b = float_to_bf16(rng.normal() * 0.05f);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int32_t(rng.below(uint64_t(vocab)));
  if (n > 1) ids[1] = int32_t(vocab - 1);
  if (bad_id) ids[size_t(n - 1)] = int32_t(vocab);
  // ds::dsv4::CpuOps::embed: dequantize the row, then copy it.
  cpu::LinearWeight w;
  w.format = cpu::WeightFormat::kBF16;
  w.out_features = vocab;
  w.in_features = dim;
  w.data = table.data();
  std::vector<float> want(static_cast<size_t>(n * copies * dim));
  for (int64_t i = 0; i < n; ++i) {
    float* row = want.data() + i * copies * dim;
    if (ids[size_t(i)] >= vocab) {
      std::fill(row, row + copies * dim, kNaN);
      continue;
    }
    cpu::dequantize_weight_row(w, ids[size_t(i)], row);
    for (int64_t c = 1; c < copies; ++c) std::copy(row, row + dim, row + c * dim);
  }
  Dev<uint16_t> d_table(table);
  Dev<int32_t> d_ids(ids);
  Dev<float> d_out(want.size());
  DS_CUDA_ASSERT(d_out.buf.poison());
  cuda::EmbedParams p;
  p.table = d_table.get();
  p.ids = d_ids.get();
  p.out = d_out.get();
  p.num_tokens = n;
  p.vocab = vocab;
  p.dim = dim;
  p.copies = copies;
  cuda::launch_embed(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(d_out.host(), want));
}

TEST(EmbedCuda, TinyShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64}) check_embed(n, 1000, 256, 4, false, 1 + uint64_t(n));
  check_embed(7, 1000, 256, 1, true, 2);  // one copy (MTP input), an out-of-range id
  check_embed(7, 300, 250, 3, true, 3);   // dim not a multiple of 4: one value per thread
}

TEST(EmbedCuda, FlashShapes) {
  DS_REQUIRE_GPU();
  // A 5000-row table stands in for the 129280 rows (the kernel never looks at the vocab size
  // except to reject ids).
  for (int64_t n : {1, 7, 64, 4096}) check_embed(n, 5000, 4096, 4, false, 10 + uint64_t(n));
}

// ---- f32 -> bf16, round_bf16 ----

void check_f32_to_bf16(int64_t rows, int64_t cols, int64_t x_stride, int64_t y_stride,
                       uint64_t seed) {
  SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols) + " strides " +
               std::to_string(x_stride) + "/" + std::to_string(y_stride));
  Rng rng(seed);
  const std::vector<float> x = random_with_specials(rng, size_t(rows * x_stride));
  // Padding columns of y stay poisoned.
  std::vector<uint16_t> want(static_cast<size_t>(rows * y_stride), 0xFFFFu);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      want[size_t(r * y_stride + c)] = float_to_bf16(x[size_t(r * x_stride + c)]);
  Dev<float> d_x(x);
  Dev<uint16_t> d_y(want.size());
  DS_CUDA_ASSERT(d_y.buf.poison());
  cuda::F32ToBf16Params p;
  p.x = d_x.get();
  p.y = d_y.get();
  p.num_rows = rows;
  p.cols = cols;
  p.x_stride = x_stride;
  p.y_stride = y_stride;
  cuda::launch_f32_to_bf16(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(d_y.host(), want));
}

TEST(F32ToBf16Cuda, TinyShapes) {
  DS_REQUIRE_GPU();
  check_f32_to_bf16(1, 256, 256, 256, 20);
  check_f32_to_bf16(7, 256, 260, 264, 21);  // strided on both sides
  check_f32_to_bf16(7, 250, 253, 251, 22);  // odd sizes: one value per thread
  check_f32_to_bf16(3, 3, 3, 3, 23);
}

TEST(F32ToBf16Cuda, FlashShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64, 4096}) check_f32_to_bf16(n, 4096, 4096, 4096, 30 + uint64_t(n));
  check_f32_to_bf16(64, 1024, 1536, 1024, 35);  // a column slice of a wider row
  check_f32_to_bf16(70000, 8, 8, 8, 36);        // more rows than gridDim.y
}

void check_round_bf16(int64_t n, int64_t offset, uint64_t seed) {
  SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(offset));
  Rng rng(seed);
  const std::vector<float> x = random_with_specials(rng, size_t(n + offset + 5));
  std::vector<float> want = x;
  cpu::round_to_bf16(want.data() + offset, n);
  Dev<float> d_x(x);
  cuda::launch_round_bf16(d_x.get() + offset, n, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(d_x.host(), want));  // values outside [offset, offset + n) untouched
}

TEST(RoundBf16Cuda, Sizes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64, 4096 * 512 + 3}) {
    check_round_bf16(n, 0, 40 + uint64_t(n));
    check_round_bf16(n, 1, 50 + uint64_t(n));  // misaligned: one value per thread
  }
}

TEST(Bf16ToF32Cuda, ExactWidening) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 4096 * 64 + 5}) {
    Rng rng(90 + uint64_t(n));
    const std::vector<float> x = random_with_specials(rng, size_t(n));
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) bits[size_t(i)] = float_to_bf16(x[size_t(i)]);
    std::vector<float> want(static_cast<size_t>(n));
    cpu::bf16_to_float_array(bits.data(), n, want.data());
    Dev<uint16_t> d_x(bits);
    Dev<float> d_y(std::vector<float>(size_t(n), std::nanf("")));  // poisoned
    cuda::launch_bf16_to_f32(d_x.get(), n, d_y.get(), nullptr);
    DS_CUDA_ASSERT(cudaGetLastError());
    DS_CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_TRUE(bits_equal(d_y.host(), want)) << n;
  }
}

// ---- simulate_fp8_kv ----

// Rows whose blocks span many magnitudes (including amax below the 1e-4 floor).
std::vector<float> random_kv_rows(Rng& rng, int64_t rows, int64_t stride) {
  std::vector<float> x = test::random_normal(rng, size_t(rows * stride));
  const float scales[] = {1e-7f, 3e-4f, 0.02f, 1.0f, 7.0f, 300.0f};
  for (int64_t i = 0; i < rows * stride; i += 64) {
    const float s = scales[rng.below(6)];
    for (int64_t j = i; j < std::min(i + 64, rows * stride); ++j) x[size_t(j)] *= s;
  }
  return x;
}

void check_fp8_kv(int64_t rows, int64_t head_dim, int64_t rope_dim, int64_t stride, uint64_t seed) {
  SCOPED_TRACE("rows " + std::to_string(rows) + " head_dim " + std::to_string(head_dim) + " rope " +
               std::to_string(rope_dim) + " stride " + std::to_string(stride));
  Rng rng(seed);
  const std::vector<float> x = random_kv_rows(rng, rows, stride);
  std::vector<float> want = x;
  for (int64_t r = 0; r < rows; ++r)
    cpu::simulate_fp8_kv_nope(want.data() + r * stride, 1, head_dim, rope_dim);
  Dev<float> d_x(x);
  cuda::SimulateFp8KvParams p;
  p.kv = d_x.get();
  p.num_rows = rows;
  p.head_dim = head_dim;
  p.rope_dim = rope_dim;
  p.row_stride = stride;
  cuda::launch_simulate_fp8_kv(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(d_x.host(), want));  // the rope tail and row padding untouched
}

TEST(SimulateFp8KvCuda, TinyShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64}) check_fp8_kv(n, 128, 64, 128, 60 + uint64_t(n));
  check_fp8_kv(7, 160, 64, 160, 61);  // nope 96: a last partial block of 32
  check_fp8_kv(7, 128, 0, 132, 62);   // no rope tail, strided rows
}

TEST(SimulateFp8KvCuda, FlashShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64, 4096}) check_fp8_kv(n, 512, 64, 512, 70 + uint64_t(n));
  check_fp8_kv(7, 512, 64, 520, 71);
}

// ---- indexer ----

struct IndexerCase {
  int64_t tokens, heads, token_stride;
  bool fp4, round;
};

void check_prepare_query(const IndexerCase& c, uint64_t seed) {
  SCOPED_TRACE("tokens " + std::to_string(c.tokens) + " heads " + std::to_string(c.heads) +
               " stride " + std::to_string(c.token_stride) + (c.fp4 ? " fp4" : "") +
               (c.round ? " round" : ""));
  constexpr int64_t kHd = 128, kRope = 64;
  Rng rng(seed);
  const cpu::RopeConfig cfg =
      cpu::rope_config_for_layer(4, kRope, 10000.0, 160000.0, 16.0, 65536, 32.0, 1.0);
  std::vector<float> inv_freq(kRope / 2);
  cpu::rope_inv_freq(cfg, inv_freq.data());
  const size_t size = size_t(c.tokens * c.token_stride);
  // wq_b's output is bf16-valued in reference mode, arbitrary fp32 otherwise.
  const std::vector<float> q =
      c.round ? test::random_bf16_valued(rng, size, 2.0f) : test::random_normal(rng, size, 2.0f);
  std::vector<int64_t> pos(static_cast<size_t>(c.tokens));
  for (auto& v : pos) v = int64_t(rng.below(1u << 20));
  pos[0] = 0;
  if (c.tokens > 1) pos[1] = (1 << 20) - 1;
  std::vector<float> want = q;
  for (int64_t t = 0; t < c.tokens; ++t) {
    cpu::indexer_prepare_query(want.data() + t * c.token_stride, c.heads, kHd, kRope,
                               inv_freq.data(), pos[size_t(t)], c.fp4, c.round);
  }
  Dev<float> d_q(q), d_f(inv_freq);
  Dev<int64_t> d_pos(pos);
  cuda::IndexerPrepareQueryParams p;
  p.q = d_q.get();
  p.inv_freq = d_f.get();
  p.positions = d_pos.get();
  p.num_tokens = c.tokens;
  p.num_heads = c.heads;
  p.rope_dim = kRope;
  p.token_stride = c.token_stride;
  p.simulate_fp4 = c.fp4;
  p.round_bf16 = c.round;
  cuda::launch_indexer_prepare_query(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(d_q.host(), want));
}

TEST(IndexerPrepareQueryCuda, TinyShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64}) check_prepare_query({n, 4, 4 * 128, true, true}, 80 + uint64_t(n));
  check_prepare_query({7, 4, 4 * 128, false, false}, 81);  // hf numerics
  check_prepare_query({7, 4, 4 * 128, true, false}, 82);
  check_prepare_query({7, 4, 4 * 128, false, true}, 83);
  check_prepare_query({7, 3, 3 * 128 + 4, true, true}, 84);  // heads not a multiple of 8, strided
}

TEST(IndexerPrepareQueryCuda, FlashShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64, 4096})
    check_prepare_query({n, 64, 64 * 128, true, true}, 90 + uint64_t(n));
  check_prepare_query({64, 64, 64 * 128, false, false}, 91);
  check_prepare_query({64, 64, 64 * 128, true, false}, 92);
}

void check_scale_weights(int64_t tokens, int64_t heads, uint64_t seed, bool round = false) {
  SCOPED_TRACE("tokens " + std::to_string(tokens) + " heads " + std::to_string(heads) +
               (round ? " rounded" : ""));
  Rng rng(seed);
  const std::vector<float> w = test::random_normal(rng, size_t(tokens * heads), 4.0f);
  std::vector<float> want = w;
  for (int64_t t = 0; t < tokens; ++t)
    cpu::indexer_scale_weights(want.data() + t * heads, heads, 128, want.data() + t * heads);
  if (round) cpu::round_to_bf16(want.data(), int64_t(want.size()));
  Dev<float> d_w(w);
  cuda::launch_indexer_scale_weights(d_w.get(), tokens, heads, 128, round, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(d_w.host(), want));
}

TEST(IndexerScaleWeightsCuda, Shapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64}) check_scale_weights(n, 4, 100 + uint64_t(n));  // tiny
  for (int64_t n : {1, 7, 64, 4096}) check_scale_weights(n, 64, 110 + uint64_t(n));
  check_scale_weights(7, 3, 120);
  for (int64_t n : {1, 64, 4096}) check_scale_weights(n, 64, 130 + uint64_t(n), true);
}

// ---- add_broadcast, gather_rows ----

void check_add_broadcast(int64_t n, int64_t hc, int64_t dim, bool in_place, uint64_t seed) {
  SCOPED_TRACE("tokens " + std::to_string(n) + " hc " + std::to_string(hc) + " dim " +
               std::to_string(dim) + (in_place ? " in place" : ""));
  Rng rng(seed);
  const std::vector<float> e = test::random_normal(rng, size_t(n * dim));
  const std::vector<float> h = test::random_normal(rng, size_t(n * hc * dim));
  std::vector<float> want(h.size());
  for (int64_t i = 0; i < n; ++i)  // ds::dsv4::CpuOps::add_broadcast
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t d = 0; d < dim; ++d)
        want[size_t((i * hc + k) * dim + d)] =
            e[size_t(i * dim + d)] + h[size_t((i * hc + k) * dim + d)];
  Dev<float> d_e(e), d_h(h);
  Dev<float> d_x(h.size());
  DS_CUDA_ASSERT(d_x.buf.poison());
  cuda::AddBroadcastParams p;
  p.e = d_e.get();
  p.h = d_h.get();
  p.x = in_place ? d_h.get() : d_x.get();
  p.num_tokens = n;
  p.hc = hc;
  p.dim = dim;
  cuda::launch_add_broadcast(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(in_place ? d_h.host() : d_x.host(), want));
}

TEST(AddBroadcastCuda, TinyShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64}) check_add_broadcast(n, 4, 256, false, 130 + uint64_t(n));
  check_add_broadcast(7, 4, 256, true, 131);
  check_add_broadcast(7, 3, 250, false, 132);  // one value per thread
}

TEST(AddBroadcastCuda, FlashShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64, 4096}) check_add_broadcast(n, 4, 4096, n == 7, 140 + uint64_t(n));
}

void check_gather(int64_t count, int64_t x_rows, int64_t width, bool bad_row, uint64_t seed) {
  SCOPED_TRACE("rows " + std::to_string(count) + " of " + std::to_string(x_rows) + " width " +
               std::to_string(width));
  Rng rng(seed);
  const std::vector<float> x = test::random_normal(rng, size_t(x_rows * width));
  std::vector<int64_t> rows(static_cast<size_t>(count));
  for (auto& r : rows) r = int64_t(rng.below(uint64_t(x_rows)));  // duplicates allowed
  rows[0] = x_rows - 1;
  if (bad_row) rows[size_t(count - 1)] = -1;
  std::vector<float> want(static_cast<size_t>(count * width));
  for (int64_t r = 0; r < count; ++r) {
    const int64_t s = rows[size_t(r)];
    for (int64_t j = 0; j < width; ++j)
      want[size_t(r * width + j)] = s < 0 ? kNaN : x[size_t(s * width + j)];
  }
  Dev<float> d_x(x);
  Dev<int64_t> d_rows(rows);
  Dev<float> d_out(want.size());
  DS_CUDA_ASSERT(d_out.buf.poison());
  cuda::GatherRowsParams p;
  p.x = d_x.get();
  p.rows = d_rows.get();
  p.out = d_out.get();
  p.num_rows = count;
  p.num_x_rows = x_rows;
  p.width = width;
  cuda::launch_gather_rows(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(d_out.host(), want));
}

TEST(GatherRowsCuda, Shapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64}) check_gather(n, 100, 256, false, 150 + uint64_t(n));  // tiny
  for (int64_t n : {1, 7, 64}) check_gather(n, 4096, 4096, n == 7, 160 + uint64_t(n));
  check_gather(4096, 4096, 4096, false, 170);
  check_gather(7, 20, 7, true, 171);  // odd width: one value per thread
}

// ---- copy_segments ----

// Segments of random lengths (odd ones too) at random offsets, some unaligned, laid out without
// overlap in one poisoned destination; the bytes between segments must stay poisoned.
void check_copy_segments(int64_t count, int64_t max_len, uint64_t seed) {
  SCOPED_TRACE("segments " + std::to_string(count) + " up to " + std::to_string(max_len));
  Rng rng(seed);
  const int64_t src_len = count * (max_len + 4);
  const std::vector<float> src = test::random_normal(rng, size_t(src_len));
  Dev<float> d_src(src);
  std::vector<int64_t> lens(static_cast<size_t>(count)), src_at(lens.size()), dst_at(lens.size());
  int64_t dst_len = 0, longest = 0;
  for (int64_t i = 0; i < count; ++i) {
    lens[size_t(i)] = 1 + int64_t(rng.below(uint64_t(max_len)));
    if (i == 0) lens[0] = max_len;
    src_at[size_t(i)] = int64_t(rng.below(uint64_t(src_len - lens[size_t(i)] + 1)));
    if (i % 3 == 0) src_at[size_t(i)] &= ~int64_t(3);  // some 16-byte aligned pairs
    dst_len += int64_t(rng.below(3));                   // gaps (and misalignment)
    if (i % 3 == 0) dst_len = (dst_len + 3) / 4 * 4;
    dst_at[size_t(i)] = dst_len;
    dst_len += lens[size_t(i)];
    longest = std::max(longest, lens[size_t(i)]);
  }
  dst_len += 5;
  Dev<float> d_dst(static_cast<size_t>(dst_len));
  DS_CUDA_ASSERT(d_dst.buf.poison());
  std::vector<cuda::CopySegment> segs(lens.size());
  const float poison = std::bit_cast<float>(0xFFFFFFFFu);  // test::kPoisonByte in every byte
  std::vector<float> want(static_cast<size_t>(dst_len), poison);
  for (size_t i = 0; i < lens.size(); ++i) {
    segs[i].src = d_src.get() + src_at[i];
    segs[i].dst = d_dst.get() + dst_at[i];
    segs[i].num_floats = lens[i];
    std::copy_n(src.begin() + src_at[i], lens[i], want.begin() + dst_at[i]);
  }
  Dev<cuda::CopySegment> d_segs(segs);
  cuda::launch_copy_segments(d_segs.get(), count, longest, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(bits_equal(d_dst.host(), want));
}

TEST(CopySegmentsCuda, Shapes) {
  DS_REQUIRE_GPU();
  check_copy_segments(1, 1, 180);
  check_copy_segments(5, 40, 181);  // tiny model: rows of 2 x 64 .. 2 x 128 floats
  // Flash: whole CSA rings (8 x 2 x 1024 floats) and HCA row ranges, for many layers at once.
  check_copy_segments(43, 16384, 182);
  check_copy_segments(300, 1031, 183);
}

// ---- pack_kv_entries ----

struct PackCase {
  int64_t rows, head_dim, page_size, kv_stride;
};

void check_pack(const PackCase& c, uint64_t seed) {
  SCOPED_TRACE("rows " + std::to_string(c.rows) + " head_dim " + std::to_string(c.head_dim) +
               " page " + std::to_string(c.page_size) + " stride " + std::to_string(c.kv_stride));
  Rng rng(seed);
  const cpu::KvEntryLayout layout{c.head_dim};
  ASSERT_TRUE(layout.valid());
  const int64_t page_bytes = cpu::kv_page_bytes(layout, c.page_size);
  // Three sequences, each with room for all rows; a padded page table holding a random
  // permutation of the pages (two spare pages are never referenced and must stay poisoned).
  const int64_t num_seqs = 3;
  const int64_t pages_per_seq = (c.rows + c.page_size - 1) / c.page_size + 1;
  const int64_t table_stride = pages_per_seq + 2;
  const int64_t num_pages = num_seqs * pages_per_seq + 2;
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  std::vector<int32_t> table(static_cast<size_t>(num_seqs * table_stride), -7);
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int64_t k = 0; k < pages_per_seq; ++k)
      table[size_t(s * table_stride + k)] = perm[size_t(s * pages_per_seq + k)];
  // Distinct (sequence, entry) targets drawn from all slots; about 1 row in 8 skipped (-1).
  const int64_t cap = pages_per_seq * c.page_size;
  std::vector<int64_t> slots(static_cast<size_t>(num_seqs * cap));
  std::iota(slots.begin(), slots.end(), 0);
  for (size_t i = slots.size() - 1; i > 0; --i) std::swap(slots[i], slots[rng.below(i + 1)]);
  std::vector<int32_t> row_seq(static_cast<size_t>(c.rows)), row_index(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) {
    row_seq[size_t(r)] = int32_t(slots[size_t(r)] / cap);
    row_index[size_t(r)] = int32_t(slots[size_t(r)] % cap);
    if (c.rows > 1 && rng.below(8) == 0) row_index[size_t(r)] = -1;
  }
  std::vector<float> kv = random_kv_rows(rng, c.rows, c.kv_stride);
  std::fill(kv.begin(), kv.begin() + 64, 0.0f);  // one all-zero block (the amax floor)

  std::vector<uint8_t> want = to_bytes_poisoned(static_cast<size_t>(num_pages * page_bytes));
  cpu::PagedKv paged{layout, c.page_size, page_bytes, want.data()};
  for (int64_t r = 0; r < c.rows; ++r) {
    if (row_index[size_t(r)] < 0) continue;
    const int32_t* seq_table = table.data() + row_seq[size_t(r)] * table_stride;
    cpu::pack_kv_entry(layout, kv.data() + r * c.kv_stride,
                       cpu::kv_entry_data(paged, seq_table, row_index[size_t(r)]),
                       cpu::kv_entry_scales(paged, seq_table, row_index[size_t(r)]));
  }

  Dev<float> d_kv(kv);
  Dev<int32_t> d_seq(row_seq), d_index(row_index), d_table(table);
  Dev<uint8_t> d_pool(want.size());
  DS_CUDA_ASSERT(d_pool.buf.poison());
  cuda::PackKvEntriesParams p;
  p.kv = d_kv.get();
  p.row_seq = d_seq.get();
  p.row_index = d_index.get();
  p.page_table = d_table.get();
  p.pool = d_pool.get();
  p.num_rows = c.rows;
  p.head_dim = c.head_dim;
  p.kv_stride = c.kv_stride;
  p.page_table_stride = table_stride;
  p.page_size = c.page_size;
  p.page_bytes = page_bytes;
  cuda::launch_pack_kv_entries(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint8_t> got = d_pool.host();
  EXPECT_TRUE(bits_equal(got, want));  // every byte of the pool, written or not

  // Unpacked, each entry is the FP8 simulation of the nope part and the bf16 rounding of the rope
  // part (a second oracle, independent of pack_kv_entry's byte layout).
  cpu::PagedKv paged_got{layout, c.page_size, page_bytes, got.data()};
  std::vector<float> unpacked, expected;
  for (int64_t r = 0; r < c.rows; ++r) {
    if (row_index[size_t(r)] < 0) continue;
    const int32_t* seq_table = table.data() + row_seq[size_t(r)] * table_stride;
    std::vector<float> out(static_cast<size_t>(c.head_dim));
    cpu::unpack_kv_entry(layout, cpu::kv_entry_data(paged_got, seq_table, row_index[size_t(r)]),
                         cpu::kv_entry_scales(paged_got, seq_table, row_index[size_t(r)]),
                         out.data());
    unpacked.insert(unpacked.end(), out.begin(), out.end());
    std::vector<float> ref(kv.begin() + r * c.kv_stride, kv.begin() + r * c.kv_stride + c.head_dim);
    cpu::simulate_fp8_kv_nope(ref.data(), 1, c.head_dim, cpu::kKvRopeDim);
    cpu::round_to_bf16(ref.data() + layout.nope_dim(), cpu::kKvRopeDim);
    expected.insert(expected.end(), ref.begin(), ref.end());
  }
  EXPECT_TRUE(bits_equal(unpacked, expected)) << "unpacked entries";
}

TEST(PackKvEntriesCuda, TinyShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64}) {
    check_pack({n, 128, 64, 128}, 180 + uint64_t(n));  // CSA entries, 194 B
    check_pack({n, 128, 2, 128}, 190 + uint64_t(n));   // HCA pages of 2 entries
  }
}

TEST(PackKvEntriesCuda, FlashShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 7, 64, 4096}) check_pack({n, 512, 64, 512}, 200 + uint64_t(n));  // 584 B
  check_pack({7, 512, 2, 520}, 210);    // HCA pages, strided rows
  check_pack({64, 256, 16, 256}, 211);  // another nope width (3 scales)
}

// ---- graph capture ----

// The launches record into a CUDA graph (no allocation, no host sync, grid from sizes only) and
// the replayed graph computes what the eager launches do.
TEST(ElementwiseCuda, GraphCaptureTiny) {
  DS_REQUIRE_GPU();
  Rng rng(300);
  constexpr int64_t kN = 7, kVocab = 50, kDim = 256, kHeads = 4;
  std::vector<uint16_t> table(static_cast<size_t>(kVocab * kDim));
  for (auto& b : table) b = float_to_bf16(rng.normal());
  std::vector<int32_t> ids(kN);
  for (auto& id : ids) id = int32_t(rng.below(kVocab));
  const std::vector<float> q0 = test::random_bf16_valued(rng, size_t(kN * kHeads * 128));
  std::vector<int64_t> pos(kN);
  for (auto& v : pos) v = int64_t(rng.below(4096));
  std::vector<float> inv_freq(32);
  cpu::rope_inv_freq(cpu::rope_config_for_layer(4, 64, 10000.0, 160000.0, 16.0, 65536, 32.0, 1.0),
                     inv_freq.data());

  Dev<uint16_t> d_table(table);
  Dev<int32_t> d_ids(ids);
  Dev<float> d_emb(static_cast<size_t>(kN * kDim)), d_q(q0), d_f(inv_freq);
  Dev<uint16_t> d_bf16(static_cast<size_t>(kN * kDim));
  Dev<int64_t> d_pos(pos);
  cudaStream_t stream;
  DS_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  DS_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::EmbedParams ep;
  ep.table = d_table.get();
  ep.ids = d_ids.get();
  ep.out = d_emb.get();
  ep.num_tokens = kN;
  ep.vocab = kVocab;
  ep.dim = kDim;
  cuda::launch_embed(ep, stream);
  cuda::F32ToBf16Params cp;
  cp.x = d_emb.get();
  cp.y = d_bf16.get();
  cp.num_rows = kN;
  cp.cols = cp.x_stride = cp.y_stride = kDim;
  cuda::launch_f32_to_bf16(cp, stream);
  cuda::IndexerPrepareQueryParams qp;
  qp.q = d_q.get();
  qp.inv_freq = d_f.get();
  qp.positions = d_pos.get();
  qp.num_tokens = kN;
  qp.num_heads = kHeads;
  qp.token_stride = kHeads * 128;
  cuda::launch_indexer_prepare_query(qp, stream);
  DS_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  DS_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  DS_CUDA_ASSERT(d_emb.buf.poison());
  DS_CUDA_ASSERT(d_bf16.buf.poison());
  DS_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  DS_CUDA_ASSERT(cudaStreamSynchronize(stream));

  std::vector<float> want_emb(static_cast<size_t>(kN * kDim));
  std::vector<uint16_t> want_bf16(want_emb.size());
  for (int64_t i = 0; i < kN; ++i)
    for (int64_t d = 0; d < kDim; ++d) {
      want_emb[size_t(i * kDim + d)] = bf16_to_float(table[size_t(ids[size_t(i)] * kDim + d)]);
      want_bf16[size_t(i * kDim + d)] = table[size_t(ids[size_t(i)] * kDim + d)];
    }
  std::vector<float> want_q = q0;
  for (int64_t t = 0; t < kN; ++t)
    cpu::indexer_prepare_query(want_q.data() + t * kHeads * 128, kHeads, 128, 64, inv_freq.data(),
                               pos[size_t(t)], true, true);
  EXPECT_TRUE(bits_equal(d_emb.host(), want_emb));
  EXPECT_TRUE(bits_equal(d_bf16.host(), want_bf16));
  EXPECT_TRUE(bits_equal(d_q.host(), want_q));
  DS_CUDA_ASSERT(cudaGraphExecDestroy(exec));
  DS_CUDA_ASSERT(cudaGraphDestroy(graph));
  DS_CUDA_ASSERT(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace ds
