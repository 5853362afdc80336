// KV compressors on the GPU against the CPU reference (ds::cpu::compressor_prefill +
// compressor_finish_entry): batches of sequences with their own rings and positions driven
// through several calls (prefill chunks from any start, then decode steps crossing window
// boundaries), CSA (ratio 4, overlap) and HCA (ratio 128), attention (d 512 / tiny 128) and indexer
// (d 128) entries, reference mode (bf16 rounding + FP8 / Hadamard + FP4 simulations), hf mode
// (neither) and raw entries. Outputs are poisoned before each call; the ring's live rows are
// compared after each call.
//
// Tolerances:
//  - Ring rows: bit-exact (copies of kv and of the fp32 sum score + ape).
//  - Raw pooled entries (kv ~ N(0, 1)): 4e-6 absolute + 1e-6 relative, and at most 1% not
//    bit-identical: same slots in the same order, exp in double rounded to fp32 vs libm's expf
//    (which may differ by an ulp now and then).
//  - Finished entries, hf mode (fp32, no rounding): 1e-5 relative (+1e-6): the RMSNorm sum of
//    squares is a tree here, so most values differ in the last ulp (no bit-identity count).
//  - Finished entries, reference mode: at most 1% of the values not bit-identical, and each within
//    one quantization step of the block: a last-ulp difference before the norm can move a value
//    across a bf16 rounding boundary and then across an e4m3 / e2m1 rounding boundary (or move
//    the block amax across a power of two). FP8: |err| <= max|v| / 8 + amax / 2^16;
//    FP4: |err| <= max|v| / 2 + amax / 6 (e2m1 steps are up to 2 at magnitude 4..6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cpu/compressor.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/compressor/compressor.h"
#include "kernels/ops_test_util.h"

namespace ds {
namespace {

using test::Dev;

enum class Mode { kRaw, kHf, kReference };

struct Setup {
  int64_t ratio, d;
  cuda::CompressorEntryKind kind;
  Mode mode;
};

std::string name(const Setup& s) {
  return std::string(s.ratio == 4 ? "CSA" : "HCA") + " d " + std::to_string(s.d) +
         (s.kind == cuda::CompressorEntryKind::kIndexer ? " indexer" : " attention") +
         (s.mode == Mode::kRaw  ? " raw"
          : s.mode == Mode::kHf ? " hf"
                                : " reference");
}

class CompressorHarness {
 public:
  // pad > 0: kv and score reach the kernel side by side in rows of 2 width + pad floats (kv at
  // column 0, score at column width + pad; CompressorParams::row_stride), as when a layer's
  // projections run as one GEMM.
  CompressorHarness(const Setup& s, int64_t num_seqs, uint64_t seed, int64_t pad = 0)
      : s_(s),
        pad_(pad),
        rng_(seed),
        num_seqs_(num_seqs),
        cpu_states_(static_cast<size_t>(num_seqs)),
        positions_(static_cast<size_t>(num_seqs), 0) {
    cfg_.ratio = s.ratio;
    cfg_.head_dim = s.d;
    cfg_.rope_dim = 64;
    width_ = cfg_.width();
    ape_ = test::random_normal(rng_, size_t(s.ratio * width_), 0.5f);
    norm_w_ = test::random_normal(rng_, size_t(s.d), 0.2f, 1.0f);
    const cpu::RopeConfig rc =
        cpu::rope_config_for_layer(s.ratio, 64, 10000.0, 160000.0, 16.0, 65536, 32.0, 1.0);
    inv_freq_.resize(32);
    cpu::rope_inv_freq(rc, inv_freq_.data());
    for (auto& st : cpu_states_) cpu::compressor_state_reset(cfg_, &st);
    state_floats_ = cuda::compressor_state_floats(s.ratio, s.d);
    d_states_ = std::make_unique<Dev<float>>(static_cast<size_t>(state_floats_ * num_seqs));
    d_ape_ = std::make_unique<Dev<float>>(ape_);
    d_norm_ = std::make_unique<Dev<float>>(norm_w_);
    d_freq_ = std::make_unique<Dev<float>>(inv_freq_);
    // Reset through the kernel (the rings start as garbage).
    EXPECT_EQ(d_states_->buf.poison(), cudaSuccess);
    std::vector<cuda::CompressorSeq> seqs(static_cast<size_t>(num_seqs));
    for (int64_t i = 0; i < num_seqs; ++i)
      seqs[size_t(i)].state = d_states_->get() + i * state_floats_;
    Dev<cuda::CompressorSeq> d_seqs(seqs);
    cuda::launch_compressor_state_reset(d_seqs.get(), num_seqs, s.ratio, s.d, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  // One call: counts[i] new tokens for sequence i. Compares entries and rings.
  void call(const std::vector<int64_t>& counts) {
    int64_t rows = 0, max_count = 0;
    for (int64_t c : counts) rows += c, max_count = std::max(max_count, c);
    SCOPED_TRACE(name(s_) + ", call with " + std::to_string(rows) + " tokens");
    std::vector<float> kv = test::random_normal(rng_, size_t(rows * width_));
    std::vector<float> score = test::random_normal(rng_, size_t(rows * width_), 2.0f);
    // CPU reference.
    cpu::CompressorFinishParams fp;
    fp.kind = s_.kind == cuda::CompressorEntryKind::kIndexer ? cpu::CompressorKind::kIndexer
                                                             : cpu::CompressorKind::kAttention;
    fp.norm_weight = norm_w_.data();
    fp.inv_freq = inv_freq_.data();
    fp.simulate_quantization = s_.mode == Mode::kReference;
    fp.round_bf16 = s_.mode == Mode::kReference;
    std::vector<float> want;
    std::vector<cuda::CompressorSeq> seqs(static_cast<size_t>(num_seqs_));
    int64_t row = 0, entry_row = 0;
    for (int64_t i = 0; i < num_seqs_; ++i) {
      const int64_t start = positions_[size_t(i)], count = counts[size_t(i)];
      std::vector<float> entries(static_cast<size_t>((count / s_.ratio + 1) * s_.d));
      const int64_t n = cpu::compressor_prefill(
          cfg_, &cpu_states_[size_t(i)], ape_.data(), kv.data() + row * width_,
          score.data() + row * width_, start, count, entries.data());
      EXPECT_EQ(n, (start + count) / s_.ratio - start / s_.ratio);
      if (s_.mode != Mode::kRaw) {
        for (int64_t e = 0; e < n; ++e)
          cpu::compressor_finish_entry(cfg_, fp, start / s_.ratio + e, entries.data() + e * s_.d);
      }
      want.insert(want.end(), entries.begin(), entries.begin() + n * s_.d);
      seqs[size_t(i)] = {row, count, start, entry_row, d_states_->get() + i * state_floats_};
      row += count;
      entry_row += n;
      positions_[size_t(i)] += count;
    }
    total_entries_ += entry_row;
    // GPU.
    const int64_t stride = pad_ > 0 ? 2 * width_ + pad_ : width_;
    if (pad_ > 0) {  // both in one buffer, the gaps poisoned with NaN
      std::vector<float> both(size_t(std::max<int64_t>(rows, 1) * stride),
                              std::numeric_limits<float>::quiet_NaN());
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(kv.begin() + r * width_, width_, both.begin() + r * stride);
        std::copy_n(score.begin() + r * width_, width_, both.begin() + r * stride + width_ + pad_);
      }
      kv = std::move(both);
      score.clear();
    }
    Dev<float> d_kv(kv.empty() ? std::vector<float>(1) : kv);
    Dev<float> d_score(score.empty() ? std::vector<float>(1) : score);
    Dev<cuda::CompressorSeq> d_seqs(seqs);
    Dev<float> d_entries(static_cast<size_t>(std::max<int64_t>(entry_row, 1) * s_.d));
    ASSERT_EQ(d_entries.buf.poison(), cudaSuccess);
    cuda::CompressorParams p;
    p.kv = d_kv.get();
    p.score = pad_ > 0 ? d_kv.get() + width_ + pad_ : d_score.get();
    p.row_stride = pad_ > 0 ? stride : 0;
    p.ape = d_ape_->get();
    p.seqs = d_seqs.get();
    p.num_seqs = num_seqs_;
    p.max_count = max_count;
    p.ratio = s_.ratio;
    p.head_dim = s_.d;
    p.rope_dim = 64;
    p.entries = d_entries.get();
    p.finish = s_.mode != Mode::kRaw;
    p.kind = s_.kind;
    p.norm_weight = d_norm_->get();
    p.inv_freq = d_freq_->get();
    p.simulate_quantization = fp.simulate_quantization;
    p.round_bf16 = fp.round_bf16;
    cuda::launch_compressor(p, nullptr);
    DS_CUDA_ASSERT(cudaGetLastError());
    DS_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<float> got = d_entries.host();
    got.resize(want.size());
    check_entries(got, want);
    check_rings();
  }

  int64_t total_entries() const { return total_entries_; }

 private:
  void check_entries(const std::vector<float>& got, const std::vector<float>& want) {
    if (want.empty()) return;
    float kv_max = 0;
    for (float v : want) kv_max = std::max(kv_max, std::fabs(v));
    test::Diff d;
    if (s_.mode == Mode::kRaw) {
      d = test::compare(got, want, 4e-6, 1e-6);
    } else if (s_.mode == Mode::kHf) {
      d = test::compare(got, want, 1e-6, 1e-5);
    } else {
      // Within one quantization step of the (reference) block amax.
      const bool fp4 = s_.kind == cuda::CompressorEntryKind::kIndexer;
      const int64_t block = fp4 ? 32 : 64;
      d.count = int64_t(want.size());
      for (size_t e0 = 0; e0 < want.size(); e0 += size_t(block)) {
        float amax = 0;
        for (size_t i = e0; i < e0 + size_t(block); ++i) amax = std::max(amax, std::fabs(want[i]));
        for (size_t i = e0; i < e0 + size_t(block); ++i) {
          const double err = std::fabs(double(got[i]) - want[i]);
          const double mag = std::max(std::fabs(got[i]), std::fabs(want[i]));
          const double tol = fp4 ? mag / 2 + amax / 6.0 : mag / 8 + amax / 65536.0;
          if (got[i] != want[i]) ++d.differ;
          if (!(err <= tol)) {
            ++d.beyond;
            if (d.first_bad < 0) {
              d.first_bad = int64_t(i);
              d.got_bad = got[i];
              d.want_bad = want[i];
            }
          }
          d.max_abs = std::max(d.max_abs, err);
        }
      }
    }
    EXPECT_EQ(d.beyond, 0) << test::describe(d);
    // hf mode: the norm's sum order alone makes most values differ in the last ulp.
    if (s_.mode != Mode::kHf) EXPECT_LE(d.differ, d.count / 100) << test::describe(d);
    differ_ += d.differ;
  }

  void check_rings() {
    const int64_t rows = cfg_.state_rows();
    std::vector<float> all = d_states_->host();
    for (int64_t i = 0; i < num_seqs_; ++i) {
      const float* g = all.data() + i * state_floats_;
      const cpu::CompressorState& c = cpu_states_[size_t(i)];
      const int64_t phase_end = positions_[size_t(i)] % s_.ratio;
      int64_t bad = 0;
      for (int64_t r = 0; r < rows; ++r) {
        // Live rows: CSA previous window (0..3) and the open window's filled rows.
        const int64_t cur = s_.ratio == 4 ? r - 4 : r;
        if (!(s_.ratio == 4 && r < 4) && !(cur >= 0 && cur < phase_end)) continue;
        for (int64_t col = 0; col < width_; ++col) {
          const size_t k = size_t(r * width_ + col);
          bad += std::memcmp(&g[k], &c.kv[k], 4) != 0;
          bad += std::memcmp(&g[rows * width_ + k], &c.score[k], 4) != 0;
        }
      }
      EXPECT_EQ(bad, 0) << "ring of sequence " << i;
    }
  }

  Setup s_;
  int64_t pad_ = 0;
  Rng rng_;
  int64_t num_seqs_;
  cpu::CompressorConfig cfg_;
  int64_t width_ = 0, state_floats_ = 0, total_entries_ = 0, differ_ = 0;
  std::vector<float> ape_, norm_w_, inv_freq_;
  std::vector<cpu::CompressorState> cpu_states_;
  std::vector<int64_t> positions_;
  std::unique_ptr<Dev<float>> d_states_, d_ape_, d_norm_, d_freq_;
};

// Prefill chunks of mixed sizes and starts for 4 sequences, then decode steps.
void run_csa(const Setup& s, uint64_t seed, bool flash, int64_t pad = 0) {
  CompressorHarness h(s, 4, seed, pad);
  h.call({5, 3, 0, 64});               // partial windows, an empty sequence, whole windows
  h.call({37, 1, 16, 3});              // continue from mid-window starts
  if (flash) h.call({4096, 0, 1, 1});  // a prefill chunk next to decode steps
  for (int step = 0; step < 6; ++step) h.call({1, 1, 1, 1});  // crosses 3 -> 4 boundaries
  h.call({2, 7, 0, 300});
  EXPECT_GT(h.total_entries(), 30);
}

void run_hca(const Setup& s, uint64_t seed, bool flash, int64_t pad = 0) {
  CompressorHarness h(s, 3, seed, pad);
  h.call({127, 300, 1});  // sequence 0 stops one short of the first window
  h.call({1, 1, 126});    // 127 -> 128: sequence 0 emits from the ring alone
  for (int step = 0; step < 3; ++step) h.call({1, 1, 1});
  h.call({flash ? 4096 : 200, 129, 0});
  EXPECT_GT(h.total_entries(), 5);
}

using Kind = cuda::CompressorEntryKind;

TEST(CompressorCuda, TinyCsaAttention) {
  DS_REQUIRE_GPU();
  for (Mode m : {Mode::kRaw, Mode::kHf, Mode::kReference})
    run_csa({4, 128, Kind::kAttention, m}, 1, false);
}

TEST(CompressorCuda, TinyIndexer) {
  DS_REQUIRE_GPU();
  for (Mode m : {Mode::kHf, Mode::kReference}) run_csa({4, 128, Kind::kIndexer, m}, 2, false);
}

TEST(CompressorCuda, TinyHca) {
  DS_REQUIRE_GPU();
  for (Mode m : {Mode::kRaw, Mode::kReference}) run_hca({128, 128, Kind::kAttention, m}, 3, false);
}

TEST(CompressorCuda, FlashCsaAttention) {
  DS_REQUIRE_GPU();
  for (Mode m : {Mode::kRaw, Mode::kHf, Mode::kReference})
    run_csa({4, 512, Kind::kAttention, m}, 11, true);
}

TEST(CompressorCuda, FlashIndexer) {
  DS_REQUIRE_GPU();
  run_csa({4, 128, Kind::kIndexer, Mode::kReference}, 12, true);
}

TEST(CompressorCuda, FlashHca) {
  DS_REQUIRE_GPU();
  for (Mode m : {Mode::kRaw, Mode::kHf, Mode::kReference})
    run_hca({128, 512, Kind::kAttention, m}, 13, true);
}

// kv and score in shared wider rows (CompressorParams::row_stride), at both ratios and entry
// kinds: the layout CudaOps::compress_layer hands over.
TEST(CompressorCuda, StridedRows) {
  DS_REQUIRE_GPU();
  run_csa({4, 128, Kind::kAttention, Mode::kReference}, 21, false, 40);
  run_csa({4, 128, Kind::kIndexer, Mode::kReference}, 22, false, 8);
  run_hca({128, 128, Kind::kAttention, Mode::kReference}, 23, false, 16);
  run_hca({128, 512, Kind::kAttention, Mode::kRaw}, 24, false, 8);
}

}  // namespace
}  // namespace ds
