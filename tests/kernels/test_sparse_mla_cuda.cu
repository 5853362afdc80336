// Sparse MLA decode on the GPU (kernels/cuda/attention/sparse_mla_decode.h) against the CPU
// reference ds::cpu::sparse_attention run on the dequantized FP8 entries (cpu::unpack_kv_entry)
// with the same bf16 query, on fresh random inputs with paged pools on shuffled pages, at tiny
// (4 heads x 128) and Flash (64 x 512) shapes and the Pro head count (128), batch 1-128, key
// lengths 1-640, 1-4 query tokens per sequence, -1 indices, empty compressed sets and an empty
// key set. Outputs and workspace are poisoned (NaN) before every run.
//
// Tolerances (bf16 output), derived from what the kernel rounds that the fp32 reference does not:
// the softmax weights are rounded to bf16 before PV and the denominator sums the same rounded
// weights, so each normalized weight carries a relative error <= 2 * 2^-9 and the output an
// absolute error <= 2^-8 * max_j |v_j| (weights sum to <= 1); the bf16 output adds 2^-9 |o|.
// Scores are exact bf16 products accumulated in fp32 (error ~1e-6 relative). We allow twice that:
//   |o - ref| <= 2^-7 * max|v| (over the query's keys) + 2^-8 * |ref|.
// lse: the denominator's relative error is <= 2^-9, so |lse - ref| <= 4e-3 (absolute).
// Split invariance is checked bit for bit: the same inputs under every split count, head-group
// size and tiles-per-step count give identical output and lse bits. The sm_90a kernel (64-key
// tiles, its own bits; run where the device is compute capability 9.0 and the heads are a
// multiple of 64 x 512 dims) is checked the same way against the reference and across its split
// counts. A CUDA-graph test captures one launch and replays it after the lengths, indices and
// queries changed on the device. A programmatic-launch test checks that the kernel waits for the
// kernel that writes its inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_entry.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/attention/sparse_mla_decode.h"
#include "kernels/cuda_test_util.h"

namespace ds {
namespace {

struct Shape {
  int num_seqs = 1;
  int queries_per_seq = 1;
  int num_heads = 64;
  int head_dim = 512;
  int window_width = 128;      // window index slots per query
  int compressed_width = 512;  // compressed index slots per query
  int window_entries = 131;    // entries in each sequence's window pool (ring + draft slots)
  int compressed_entries = 600;
  int page_size = 64;
  double masked_fraction = 0.05;
  double empty_compressed_fraction = 0.2;
  int min_len = 1;  // total keys per query drawn from [min_len, max_len]
  int max_len = 640;
};

// A paged pool on the host: all sequences' pages shuffled over one buffer.
struct HostPool {
  cpu::PagedKv kv;
  std::vector<uint8_t> bytes;
  std::vector<int32_t> page_table;  // [num_seqs, pages_per_seq]
  int pages_per_seq = 0;
  std::vector<std::vector<std::vector<float>>> dequant;  // [seq][entry][head_dim]
};

HostPool make_pool(Rng& rng, int num_seqs, int entries, int head_dim, int page_size) {
  HostPool p;
  p.kv.layout = cpu::KvEntryLayout{head_dim};
  p.kv.page_size = page_size;
  p.kv.page_bytes = cpu::kv_page_bytes(p.kv.layout, page_size);
  p.pages_per_seq = std::max(1, (entries + page_size - 1) / page_size);
  const int num_pages = num_seqs * p.pages_per_seq + 1;  // one spare page, never referenced
  p.bytes.assign(size_t(num_pages) * size_t(p.kv.page_bytes), 0xFF);  // NaN e4m3 / NaN scales
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  p.page_table.assign(perm.begin(), perm.begin() + num_seqs * p.pages_per_seq);
  p.kv.pool = p.bytes.data();
  p.dequant.resize(size_t(num_seqs));
  std::vector<float> v(static_cast<size_t>(head_dim));
  for (int s = 0; s < num_seqs; ++s) {
    const int32_t* table = &p.page_table[size_t(s * p.pages_per_seq)];
    for (int e = 0; e < entries; ++e) {
      // Per-entry and per-64-block magnitudes spread over 2^-6..2^4 so the scales differ.
      for (int b = 0; b < head_dim; b += 64) {
        const float mag = std::ldexp(1.0f, int(rng.below(11)) - 6);
        for (int i = b; i < b + 64; ++i) v[size_t(i)] = cpu::round_bf16(rng.normal() * mag);
      }
      uint8_t* data = cpu::kv_entry_data(p.kv, table, e);
      uint8_t* scales = cpu::kv_entry_scales(p.kv, table, e);
      cpu::pack_kv_entry(p.kv.layout, v.data(), data, scales);
      std::vector<float> back(static_cast<size_t>(head_dim));
      cpu::unpack_kv_entry(p.kv.layout, data, scales, back.data());
      p.dequant[size_t(s)].push_back(back);
    }
  }
  return p;
}

struct Problem {
  Shape shape;
  int num_queries = 0;
  HostPool window, compressed;
  std::vector<int32_t> query_seq, window_idx, window_len, compressed_idx, compressed_len;
  std::vector<uint16_t> q;  // [num_queries, H, D]
  std::vector<float> sink;  // [H]
};

// Draws `len` distinct indices out of [0, pool) (len <= pool), `masked` of them replaced by -1,
// and fills the rest of the row (never read) with an out-of-range index.
void draw_indices(Rng& rng, int len, int pool, double masked, int32_t* row, int width) {
  std::vector<int32_t> all(static_cast<size_t>(pool));
  std::iota(all.begin(), all.end(), 0);
  for (int i = 0; i < len; ++i) {
    std::swap(all[size_t(i)], all[size_t(i) + rng.below(uint64_t(pool - i))]);
    row[i] = rng.uniform() < masked ? -1 : all[size_t(i)];
  }
  for (int i = len; i < width; ++i) row[i] = 1 << 30;
}

void draw_queries(Rng& rng, Problem& pr) {
  const Shape& s = pr.shape;
  pr.window_idx.assign(size_t(pr.num_queries) * s.window_width, 0);
  pr.compressed_idx.assign(size_t(pr.num_queries) * std::max(1, s.compressed_width), 0);
  pr.window_len.assign(size_t(pr.num_queries), 0);
  pr.compressed_len.assign(size_t(pr.num_queries), 0);
  for (int qi = 0; qi < pr.num_queries; ++qi) {
    const int total = s.min_len + int(rng.below(uint64_t(s.max_len - s.min_len + 1)));
    int wl = std::min(total, s.window_width);
    if (rng.uniform() < 0.3) wl = int(rng.below(uint64_t(wl + 1)));  // short window, more entries
    int cl = std::min(total - wl, s.compressed_width);
    if (s.compressed_width > 0 && rng.uniform() < s.empty_compressed_fraction) cl = 0;
    pr.window_len[size_t(qi)] = wl;
    pr.compressed_len[size_t(qi)] = cl;
    draw_indices(rng, wl, s.window_entries, s.masked_fraction,
                 &pr.window_idx[size_t(qi) * s.window_width], s.window_width);
    if (s.compressed_width > 0)
      draw_indices(rng, cl, s.compressed_entries, s.masked_fraction,
                   &pr.compressed_idx[size_t(qi) * s.compressed_width], s.compressed_width);
  }
  pr.q.resize(size_t(pr.num_queries) * s.num_heads * s.head_dim);
  for (size_t i = 0; i < pr.q.size(); i += size_t(s.head_dim)) {
    const float mag = 0.5f + 3.0f * float(rng.uniform());  // sharper and flatter heads
    for (int d = 0; d < s.head_dim; ++d) pr.q[i + size_t(d)] = float_to_bf16(rng.normal() * mag);
  }
}

Problem make_problem(const Shape& s, uint64_t seed) {
  Rng rng(seed);
  Problem pr;
  pr.shape = s;
  pr.num_queries = s.num_seqs * s.queries_per_seq;
  pr.window = make_pool(rng, s.num_seqs, s.window_entries, s.head_dim, s.page_size);
  pr.compressed = make_pool(rng, s.num_seqs, std::max(1, s.compressed_entries), s.head_dim,
                            std::max(1, s.page_size / 4));
  for (int qi = 0; qi < pr.num_queries; ++qi) pr.query_seq.push_back(qi / s.queries_per_seq);
  pr.sink.resize(size_t(s.num_heads));
  for (auto& x : pr.sink) x = rng.normal() * 2.0f;
  draw_queries(rng, pr);
  return pr;
}

struct Reference {
  std::vector<float> out, lse, vmax;  // vmax: max |v| over each query's keys
};

Reference reference(const Problem& pr) {
  const Shape& s = pr.shape;
  Reference r;
  r.out.resize(pr.q.size());
  r.lse.resize(size_t(pr.num_queries) * s.num_heads);
  r.vmax.assign(size_t(pr.num_queries), 0.0f);
  std::vector<float> qf(size_t(s.num_heads) * s.head_dim);
  for (int qi = 0; qi < pr.num_queries; ++qi) {
    const int seq = pr.query_seq[size_t(qi)];
    std::vector<const float*> keys;
    for (int j = 0; j < pr.window_len[size_t(qi)]; ++j) {
      const int idx = pr.window_idx[size_t(qi) * s.window_width + j];
      if (idx >= 0) keys.push_back(pr.window.dequant[size_t(seq)][size_t(idx)].data());
    }
    for (int j = 0; j < pr.compressed_len[size_t(qi)]; ++j) {
      const int idx = pr.compressed_idx[size_t(qi) * s.compressed_width + j];
      if (idx >= 0) keys.push_back(pr.compressed.dequant[size_t(seq)][size_t(idx)].data());
    }
    for (const float* k : keys)
      for (int d = 0; d < s.head_dim; ++d)
        r.vmax[size_t(qi)] = std::max(r.vmax[size_t(qi)], std::fabs(k[d]));
    const size_t qoff = size_t(qi) * s.num_heads * s.head_dim;
    for (size_t i = 0; i < qf.size(); ++i) qf[i] = bf16_to_float(pr.q[qoff + i]);
    cpu::SparseAttentionParams p;
    p.q = qf.data();
    p.keys = keys.data();
    p.num_keys = int64_t(keys.size());
    p.num_heads = s.num_heads;
    p.head_dim = s.head_dim;
    p.softmax_scale = 1.0f / std::sqrt(float(s.head_dim));
    p.sink = pr.sink.data();
    p.out = &r.out[qoff];
    p.lse = &r.lse[size_t(qi) * s.num_heads];
    cpu::sparse_attention(p);
  }
  return r;
}

// Device copies of a problem plus the launch.
struct DeviceProblem {
  test::DeviceBuffer<uint8_t> wpool, cpool;
  test::DeviceBuffer<int32_t> wtable, ctable, query_seq, widx, wlen, cidx, clen;
  test::DeviceBuffer<uint16_t> q, out;
  test::DeviceBuffer<float> sink, lse;
  explicit DeviceProblem(const Problem& pr)
      : wpool(pr.window.bytes.size()),
        cpool(pr.compressed.bytes.size()),
        wtable(pr.window.page_table.size()),
        ctable(pr.compressed.page_table.size()),
        query_seq(pr.query_seq.size()),
        widx(pr.window_idx.size()),
        wlen(pr.window_len.size()),
        cidx(pr.compressed_idx.size()),
        clen(pr.compressed_len.size()),
        q(pr.q.size()),
        out(pr.q.size()),
        sink(pr.sink.size()),
        lse(pr.window_len.size() * pr.shape.num_heads) {}
  bool ok() const {
    return wpool.ok() && cpool.ok() && wtable.ok() && ctable.ok() && query_seq.ok() && widx.ok() &&
           wlen.ok() && cidx.ok() && clen.ok() && q.ok() && out.ok() && sink.ok() && lse.ok();
  }
  cudaError_t upload(const Problem& pr) {
    cudaError_t e;
    if ((e = wpool.upload(pr.window.bytes)) != cudaSuccess) return e;
    if ((e = cpool.upload(pr.compressed.bytes)) != cudaSuccess) return e;
    if ((e = wtable.upload(pr.window.page_table)) != cudaSuccess) return e;
    if ((e = ctable.upload(pr.compressed.page_table)) != cudaSuccess) return e;
    if ((e = query_seq.upload(pr.query_seq)) != cudaSuccess) return e;
    if ((e = sink.upload(pr.sink)) != cudaSuccess) return e;
    return upload_queries(pr);
  }
  cudaError_t upload_queries(const Problem& pr) {
    cudaError_t e;
    if ((e = widx.upload(pr.window_idx)) != cudaSuccess) return e;
    if ((e = wlen.upload(pr.window_len)) != cudaSuccess) return e;
    if ((e = cidx.upload(pr.compressed_idx)) != cudaSuccess) return e;
    if ((e = clen.upload(pr.compressed_len)) != cudaSuccess) return e;
    return q.upload(pr.q);
  }
  cuda::SparseMlaParams params(const Problem& pr, const cuda::SparseMlaPlan& plan, float* ws,
                               size_t ws_bytes) const {
    const Shape& s = pr.shape;
    cuda::SparseMlaParams p;
    p.q = q.get();
    p.sink = sink.get();
    p.out = out.get();
    p.lse = lse.get();
    p.num_queries = pr.num_queries;
    p.num_heads = s.num_heads;
    p.head_dim = s.head_dim;
    p.softmax_scale = 1.0f / std::sqrt(float(s.head_dim));
    p.query_seq = query_seq.get();
    p.window = {wpool.get(), wtable.get(), pr.window.pages_per_seq, int32_t(pr.window.kv.page_size),
                pr.window.kv.page_bytes};
    p.compressed = {cpool.get(), ctable.get(), pr.compressed.pages_per_seq,
                    int32_t(pr.compressed.kv.page_size), pr.compressed.kv.page_bytes};
    p.window_idx = widx.get();
    p.window_len = wlen.get();
    p.window_width = s.window_width;
    p.compressed_idx = cidx.get();
    p.compressed_len = clen.get();
    p.compressed_width = s.compressed_width;
    p.plan = plan;
    p.workspace = ws;
    p.workspace_bytes = ws_bytes;
    return p;
  }
};

struct Result {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

// Output elements and lse values whose bits differ between two results.
struct BitDiffs {
  int64_t out = 0, lse = 0;
};
BitDiffs bit_diffs(const Result& a, const Result& b) {
  BitDiffs d;
  for (size_t i = 0; i < a.out.size(); ++i) d.out += a.out[i] != b.out[i];
  for (size_t i = 0; i < a.lse.size(); ++i)
    d.lse += std::memcmp(&a.lse[i], &b.lse[i], sizeof(float)) != 0;
  return d;
}

// Runs one launch with `plan` (poisoned outputs and workspace) and downloads the results.
void run_plan(const Problem& pr, DeviceProblem& dp, const cuda::SparseMlaPlan& plan, Result& res) {
  const size_t ws_bytes =
      cuda::sparse_mla_workspace_bytes(plan, pr.num_queries, pr.shape.num_heads, pr.shape.head_dim);
  test::DeviceBuffer<float> ws(std::max<size_t>(1, ws_bytes / sizeof(float)));
  ASSERT_TRUE(ws.ok());
  DS_CUDA_ASSERT(ws.poison());
  DS_CUDA_ASSERT(dp.out.poison());
  DS_CUDA_ASSERT(dp.lse.poison());
  const Status st =
      cuda::launch_sparse_mla_decode(dp.params(pr, plan, ws.get(), ws_bytes), nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  DS_CUDA_ASSERT(dp.out.download(res.out));
  DS_CUDA_ASSERT(dp.lse.download(res.lse));
}

void expect_close(const Problem& pr, const Reference& ref, const Result& res, const char* what) {
  const Shape& s = pr.shape;
  int64_t bad = 0, bad_lse = 0;
  double worst = 0;
  for (int qi = 0; qi < pr.num_queries; ++qi)
    for (int h = 0; h < s.num_heads; ++h) {
      const size_t row = (size_t(qi) * s.num_heads + h) * s.head_dim;
      for (int d = 0; d < s.head_dim; ++d) {
        const float got = bf16_to_float(res.out[row + d]);
        const float want = ref.out[row + d];
        const double tol = std::ldexp(ref.vmax[size_t(qi)], -7) + std::ldexp(std::fabs(want), -8);
        const double err = std::fabs(double(got) - want);  // NaN fails below
        if (!(err <= tol)) {
          if (bad < 5)
            ADD_FAILURE() << what << ": query " << qi << " head " << h << " dim " << d << " got "
                          << got << " want " << want << " tol " << tol;
          ++bad;
        }
        if (tol > 0) worst = std::max(worst, err / tol);
      }
      const float gl = res.lse[size_t(qi) * s.num_heads + h];
      const float wl = ref.lse[size_t(qi) * s.num_heads + h];
      const bool lse_ok = std::isinf(wl) ? (std::isinf(gl) && gl < 0) : std::fabs(gl - wl) <= 4e-3f;
      if (!lse_ok) {
        if (bad_lse < 5)
          ADD_FAILURE() << what << ": lse query " << qi << " head " << h << " got " << gl
                        << " want " << wl;
        ++bad_lse;
      }
    }
  EXPECT_EQ(bad, 0) << what;
  EXPECT_EQ(bad_lse, 0) << what;
  ::testing::Test::RecordProperty(std::string("worst_error_over_tolerance_") + what,
                                  std::to_string(worst));
}

int sm_count() {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return 132;
  return n;
}

// Checks the default plan against the reference, then every (split cap, head group) pair for
// identical bits.
void check_problem(const Shape& s, uint64_t seed, const std::vector<int>& split_caps,
                   const std::vector<int>& head_groups) {
  Problem pr = make_problem(s, seed);
  Reference ref = reference(pr);
  DeviceProblem dp(pr);
  ASSERT_TRUE(dp.ok());
  DS_CUDA_ASSERT(dp.upload(pr));
  const cuda::SparseMlaPlan base = cuda::plan_sparse_mla_decode(
      pr.num_queries, s.num_heads, s.window_width, s.compressed_width, sm_count());
  Result first;
  run_plan(pr, dp, base, first);
  expect_close(pr, ref, first, "default plan");
  for (int cap : split_caps)
    for (int hg : head_groups)
      for (int step = 1; step <= (hg == 16 ? 2 : 1); ++step) {  // tiles per step: 2 at 16 heads
        cuda::SparseMlaPlan plan = base;
        plan.max_splits = std::min(cap, std::max(1, plan.max_tiles));
        plan.heads_per_cta = hg;
        plan.tiles_per_step = step;
        Result res;
        run_plan(pr, dp, plan, res);
        const BitDiffs bd = bit_diffs(res, first);
        EXPECT_EQ(bd.out, 0) << "splits " << plan.max_splits << " heads/CTA " << hg
                             << " tiles/step " << step << " (default: " << base.max_splits << ", "
                             << base.heads_per_cta << ", " << base.tiles_per_step << ")";
        EXPECT_EQ(bd.lse, 0) << "lse, splits " << plan.max_splits << " heads/CTA " << hg
                             << " tiles/step " << step;
      }
  // The sm_90a kernels (64-key tiles: their own bits) where the device and the shape allow it:
  // v7's default plan against the reference, then v7 and v9 (the producer warpgroup) at the
  // default split count and every split cap, each against the reference and for v7's bits.
  if (!cuda::sparse_mla_wgmma_supported(s.num_heads, s.head_dim)) return;
  const cuda::SparseMlaPlan wbase = cuda::plan_sparse_mla_decode(
      pr.num_queries, s.num_heads, s.window_width, s.compressed_width, sm_count(), 0, true);
  ASSERT_TRUE(wbase.wgmma);
  cuda::SparseMlaPlan v7 = wbase;
  v7.warp_specialized = false;
  Result wfirst;
  run_plan(pr, dp, v7, wfirst);
  expect_close(pr, ref, wfirst, "wgmma plan");
  std::vector<int> caps = {wbase.max_splits};
  caps.insert(caps.end(), split_caps.begin(), split_caps.end());
  for (const bool ws : {false, true})
    for (int cap : caps) {
      cuda::SparseMlaPlan plan = wbase;
      plan.warp_specialized = ws;
      plan.max_splits = std::min(cap, std::max(1, plan.max_tiles));
      Result res;
      run_plan(pr, dp, plan, res);
      expect_close(pr, ref, res, ws ? "wgmma v9 split cap" : "wgmma split cap");
      const BitDiffs bd = bit_diffs(res, wfirst);
      EXPECT_EQ(bd.out, 0) << (ws ? "v9" : "v7") << ", splits " << plan.max_splits << " (default "
                           << wbase.max_splits << ")";
      EXPECT_EQ(bd.lse, 0) << (ws ? "v9" : "v7") << " lse, splits " << plan.max_splits;
    }
}

// The kernels a device-level test runs: the mma.sync kernel always, the sm_90a ones (v7, and
// v9 with its producer warpgroup) where the device and the shape allow them.
struct KernelChoice {
  const char* name;
  bool wgmma;
  bool warp_specialized;
};
std::vector<KernelChoice> kernels_for(const Shape& s) {
  std::vector<KernelChoice> k = {{"mma.sync kernel", false, false}};
  if (cuda::sparse_mla_wgmma_supported(s.num_heads, s.head_dim)) {
    k.push_back({"wgmma kernel (v7)", true, false});
    k.push_back({"wgmma kernel with a producer warpgroup (v9)", true, true});
  }
  return k;
}

Shape tiny_shape() {
  Shape s;
  s.num_heads = 4;
  s.head_dim = 128;
  s.window_width = 16;
  s.compressed_width = 8;
  s.window_entries = 19;
  s.compressed_entries = 75;
  s.page_size = 8;
  s.max_len = 24;
  return s;
}

// Host arithmetic only (no GPU): at Flash widths on 132 SMs, a split plan places at most one
// CTA per SM, except the batch-1 rule's one-tile CTAs (at most two per SM); batches that fill the
// GPU with heads do not split; every query of the widest key list gets at least one tile per split.
TEST(SparseMlaPlan, SplitsFitOneCtaPerSm) {
  constexpr int32_t kSms = 132, kHeads = 64, kWindow = 128, kTopk = 512;
  for (int32_t batch = 1; batch <= 128; ++batch) {
    const cuda::SparseMlaPlan plan =
        cuda::plan_sparse_mla_decode(batch, kHeads, kWindow, kTopk, kSms);
    const int64_t ctas = int64_t(batch) * (kHeads / plan.heads_per_cta) * plan.max_splits;
    ASSERT_EQ(plan.max_tiles, (kWindow + kTopk) / cuda::kSparseMlaTileKeys);
    ASSERT_LE(plan.max_splits, plan.max_tiles);
    const bool one_tile_per_cta = plan.max_splits == plan.max_tiles;
    if (plan.max_splits > 1 && !one_tile_per_cta) EXPECT_LE(ctas, kSms) << "batch " << batch;
    if (one_tile_per_cta) EXPECT_LE(ctas, 2 * kSms) << "batch " << batch;
    if (2 * int64_t(batch) * (kHeads / plan.heads_per_cta) >= kSms)
      EXPECT_EQ(plan.max_splits, 1) << "batch " << batch;
  }
  // The measured cases (NOTES.md v6): batch 4 -> 8 splits, batch 16 -> 2, batch 1 -> 40.
  EXPECT_EQ(cuda::plan_sparse_mla_decode(4, kHeads, kWindow, kTopk, kSms).max_splits, 8);
  EXPECT_EQ(cuda::plan_sparse_mla_decode(16, kHeads, kWindow, kTopk, kSms).max_splits, 2);
  EXPECT_EQ(cuda::plan_sparse_mla_decode(1, kHeads, kWindow, kTopk, kSms).max_splits, 40);
}

// The sm_90a plan: 64 heads per CTA, 64-key tiles (10 at Flash widths), at most one CTA per SM,
// no split once the queries fill a quarter of the GPU; a head count that is not a multiple of 64
// falls back to the mma.sync plan.
TEST(SparseMlaPlan, WgmmaPlan) {
  constexpr int32_t kSms = 132, kHeads = 64, kWindow = 128, kTopk = 512;
  for (int32_t batch = 1; batch <= 128; ++batch) {
    const cuda::SparseMlaPlan plan =
        cuda::plan_sparse_mla_decode(batch, kHeads, kWindow, kTopk, kSms, 0, true);
    ASSERT_TRUE(plan.wgmma);
    ASSERT_EQ(plan.heads_per_cta, 64);
    ASSERT_EQ(plan.max_tiles, (kWindow + kTopk) / cuda::kSparseMlaWgmmaTileKeys);
    ASSERT_LE(plan.max_splits, plan.max_tiles);
    EXPECT_LE(int64_t(batch) * plan.max_splits, kSms) << "batch " << batch;
    if (4 * batch > kSms) EXPECT_EQ(plan.max_splits, 1) << "batch " << batch;
  }
  EXPECT_EQ(cuda::plan_sparse_mla_decode(1, kHeads, kWindow, kTopk, kSms, 0, true).max_splits, 10);
  EXPECT_EQ(cuda::plan_sparse_mla_decode(16, kHeads, kWindow, kTopk, kSms, 0, true).max_splits, 8);
  EXPECT_EQ(cuda::plan_sparse_mla_decode(2, 128, kWindow, kTopk, kSms, 3, true).max_splits, 3);
  EXPECT_FALSE(cuda::plan_sparse_mla_decode(1, 4, 16, 8, kSms, 0, true).wgmma);
  // The backend's choice between the kernels: 8 CTAs of 64 heads and up.
  EXPECT_FALSE(cuda::sparse_mla_wgmma_preferred(7, 64));
  EXPECT_TRUE(cuda::sparse_mla_wgmma_preferred(8, 64));
  EXPECT_TRUE(cuda::sparse_mla_wgmma_preferred(4, 128));
  EXPECT_FALSE(cuda::sparse_mla_wgmma_preferred(3, 128));
  EXPECT_FALSE(cuda::sparse_mla_wgmma_preferred(64, 4));
}

TEST(SparseMlaCuda, TinyShapes) {
  DS_REQUIRE_GPU();
  Shape s = tiny_shape();
  s.num_seqs = 3;
  s.queries_per_seq = 2;
  check_problem(s, 101, {1, 2, 3}, {16});
  s.num_seqs = 16;
  s.queries_per_seq = 1;
  s.masked_fraction = 0.3;
  check_problem(s, 102, {1, 2}, {16});
}

TEST(SparseMlaCuda, FlashBatch1) {
  DS_REQUIRE_GPU();
  Shape s;
  s.min_len = 600;
  check_problem(s, 201, {1, 2, 3, 7, 40}, {16, 32, 64});
}

TEST(SparseMlaCuda, FlashSpeculativeBatch4) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 4;
  s.queries_per_seq = 4;
  check_problem(s, 301, {1, 5}, {16, 64});
}

TEST(SparseMlaCuda, FlashShortLengthsAndMasks) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 24;
  s.max_len = 40;  // 1..40 keys: partial tiles, window only or window + a few entries
  s.masked_fraction = 0.4;
  s.empty_compressed_fraction = 0.5;
  check_problem(s, 401, {1, 3}, {16, 64});
}

TEST(SparseMlaCuda, FlashBatch128) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 128;
  check_problem(s, 501, {1, 2}, {16, 64});
}

// More than 48 tiles (the kernel's address-table chunk) per query: the pipeline restarts at a
// chunk boundary, inside a split or exactly at one, and both splits and the fold cross it.
TEST(SparseMlaCuda, LongKeySetsCrossAddressChunks) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 2;
  s.compressed_width = 1024;
  s.compressed_entries = 1100;
  s.min_len = 900;
  s.max_len = 1152;  // 57..72 tiles
  check_problem(s, 801, {1, 2, 3}, {16, 64});
}

TEST(SparseMlaCuda, ProHeads128) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_heads = 128;
  s.num_seqs = 2;
  s.queries_per_seq = 2;
  check_problem(s, 601, {1, 4}, {16, 32, 64});
}

TEST(SparseMlaCuda, EmptyAndFullyMaskedKeySets) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 3;
  s.min_len = 0;
  s.max_len = 0;  // no keys at all: output 0, lse -inf
  check_problem(s, 701, {1, 2}, {64});
  s.min_len = 20;
  s.max_len = 200;
  s.masked_fraction = 1.0;  // every index -1
  check_problem(s, 702, {1, 4}, {16});
}

TEST(SparseMlaCuda, GraphReplayWithNewLengths) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 2;
  s.queries_per_seq = 2;
  for (const KernelChoice& kc : kernels_for(s)) {
    SCOPED_TRACE(kc.name);
    Problem pr = make_problem(s, 801);
    DeviceProblem dp(pr);
    ASSERT_TRUE(dp.ok());
    DS_CUDA_ASSERT(dp.upload(pr));
    cuda::SparseMlaPlan plan = cuda::plan_sparse_mla_decode(
        pr.num_queries, s.num_heads, s.window_width, s.compressed_width, sm_count(), 0, kc.wgmma);
    plan.warp_specialized = kc.warp_specialized;
    ASSERT_GT(plan.max_splits, 1);  // exercises the combine kernel inside the graph
    const size_t ws_bytes =
        cuda::sparse_mla_workspace_bytes(plan, pr.num_queries, s.num_heads, s.head_dim);
    test::DeviceBuffer<float> ws(ws_bytes / sizeof(float));
    ASSERT_TRUE(ws.ok());
    cudaStream_t stream;
    DS_CUDA_ASSERT(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    DS_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const Status st =
        cuda::launch_sparse_mla_decode(dp.params(pr, plan, ws.get(), ws_bytes), stream);
    DS_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(st.ok()) << st.to_string();
    cudaGraphExec_t exec;
    DS_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
    Rng rng(802);
    for (int step = 0; step < 3; ++step) {
      draw_queries(rng, pr);  // new lengths, indices and queries; same launch
      Reference ref = reference(pr);
      DS_CUDA_ASSERT(dp.upload_queries(pr));
      DS_CUDA_ASSERT(ws.poison());
      DS_CUDA_ASSERT(dp.out.poison());
      DS_CUDA_ASSERT(dp.lse.poison());
      DS_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      DS_CUDA_ASSERT(cudaStreamSynchronize(stream));
      Result res;
      DS_CUDA_ASSERT(dp.out.download(res.out));
      DS_CUDA_ASSERT(dp.lse.download(res.lse));
      expect_close(pr, ref, res, "graph replay");
    }
    DS_CUDA_ASSERT(cudaGraphExecDestroy(exec));
    DS_CUDA_ASSERT(cudaGraphDestroy(graph));
    DS_CUDA_ASSERT(cudaStreamDestroy(stream));
  }
}

// Stands for the kernel that produces the attention's inputs: lets its dependents launch at once,
// spins ~50 us, then writes the queries and the lengths. A programmatic dependent that read its
// inputs before griddepcontrol.wait would read the poison.
__global__ void slow_producer(const uint16_t* q_src, uint16_t* q, int64_t nq,
                              const int32_t* wlen_src, int32_t* wlen, const int32_t* clen_src,
                              int32_t* clen, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const long long t0 = clock64();
  while (clock64() - t0 < 100000) {
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nq;
       i += int64_t(gridDim.x) * blockDim.x)
    q[i] = q_src[i];
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      wlen[i] = wlen_src[i];
      clen[i] = clen_src[i];
    }
}

// SparseMlaParams::pdl: the attention kernel launched as a programmatic dependent of the kernel
// that writes its queries and lengths gives the same bits as the plain launch, on a stream and
// inside a graph (where the combine kernel's dependency is an edge of the graph).
TEST(SparseMlaCuda, ProgrammaticLaunchWaitsForTheProducer) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 2;
  s.min_len = 500;
  for (const KernelChoice& kc : kernels_for(s)) {
    SCOPED_TRACE(kc.name);
    Problem pr = make_problem(s, 1001);
    DeviceProblem dp(pr);
    ASSERT_TRUE(dp.ok());
    DS_CUDA_ASSERT(dp.upload(pr));
    cuda::SparseMlaPlan plan = cuda::plan_sparse_mla_decode(
        pr.num_queries, s.num_heads, s.window_width, s.compressed_width, sm_count(), 0, kc.wgmma);
    plan.warp_specialized = kc.warp_specialized;
    ASSERT_GT(plan.max_splits, 1);  // the combine kernel runs too
    Result want;
    run_plan(pr, dp, plan, want);
    expect_close(pr, reference(pr), want, "plain launch");
    test::DeviceBuffer<uint16_t> q_src(pr.q.size());
    test::DeviceBuffer<int32_t> wlen_src(pr.window_len.size()), clen_src(pr.compressed_len.size());
    ASSERT_TRUE(q_src.ok() && wlen_src.ok() && clen_src.ok());
    DS_CUDA_ASSERT(q_src.upload(pr.q));
    DS_CUDA_ASSERT(wlen_src.upload(pr.window_len));
    DS_CUDA_ASSERT(clen_src.upload(pr.compressed_len));
    const size_t ws_bytes =
        cuda::sparse_mla_workspace_bytes(plan, pr.num_queries, s.num_heads, s.head_dim);
    test::DeviceBuffer<float> ws(ws_bytes / sizeof(float));
    ASSERT_TRUE(ws.ok());
    cudaStream_t stream;
    DS_CUDA_ASSERT(cudaStreamCreate(&stream));
    cuda::SparseMlaParams p = dp.params(pr, plan, ws.get(), ws_bytes);
    p.pdl = true;
    auto enqueue = [&]() -> Status {
      slow_producer<<<4, 256, 0, stream>>>(q_src.get(), dp.q.get(), int64_t(pr.q.size()),
                                           wlen_src.get(), dp.wlen.get(), clen_src.get(),
                                           dp.clen.get(), pr.num_queries);
      if (cudaGetLastError() != cudaSuccess) return internal_error("slow_producer launch");
      return cuda::launch_sparse_mla_decode(p, stream);
    };
    for (int use_graph = 0; use_graph < 2; ++use_graph) {
      SCOPED_TRACE(use_graph ? "graph" : "stream");
      for (auto* b : {&dp.q, &dp.out}) DS_CUDA_ASSERT(b->poison());
      DS_CUDA_ASSERT(dp.wlen.poison());
      DS_CUDA_ASSERT(dp.clen.poison());
      DS_CUDA_ASSERT(dp.lse.poison());
      DS_CUDA_ASSERT(ws.poison());
      test::run_on_stream_or_graph(stream, use_graph == 1, enqueue);
      if (HasFatalFailure()) return;
      Result got;
      DS_CUDA_ASSERT(dp.out.download(got.out));
      DS_CUDA_ASSERT(dp.lse.download(got.lse));
      const BitDiffs bd = bit_diffs(got, want);
      EXPECT_EQ(bd.out, 0);
      EXPECT_EQ(bd.lse, 0);
    }
    DS_CUDA_ASSERT(cudaStreamDestroy(stream));
  }
}

TEST(SparseMlaCuda, WgmmaRejectsMisalignedQOrOut) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 2;
  if (!cuda::sparse_mla_wgmma_supported(s.num_heads, s.head_dim)) GTEST_SKIP() << "no sm_90 device";
  Problem pr = make_problem(s, 1101);
  DeviceProblem dp(pr);
  ASSERT_TRUE(dp.ok());
  DS_CUDA_ASSERT(dp.upload(pr));
  const cuda::SparseMlaPlan plan = cuda::plan_sparse_mla_decode(
      pr.num_queries, s.num_heads, s.window_width, s.compressed_width, sm_count(), 1, true);
  cuda::SparseMlaParams p = dp.params(pr, plan, nullptr, 0);
  p.num_queries = 1;
  cuda::SparseMlaParams misaligned_q = p;
  misaligned_q.q += 2;  // 4-byte aligned (what the mma.sync kernel needs), not 16
  EXPECT_EQ(cuda::launch_sparse_mla_decode(misaligned_q, nullptr).code(),
            StatusCode::kInvalidArgument);
  cuda::SparseMlaParams misaligned_out = p;
  misaligned_out.out += 2;  // the output is written in 16-byte pieces
  EXPECT_EQ(cuda::launch_sparse_mla_decode(misaligned_out, nullptr).code(),
            StatusCode::kInvalidArgument);
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
}

TEST(SparseMlaCuda, RejectsBadParams) {
  DS_REQUIRE_GPU();
  Shape s = tiny_shape();
  Problem pr = make_problem(s, 901);
  DeviceProblem dp(pr);
  ASSERT_TRUE(dp.ok());
  DS_CUDA_ASSERT(dp.upload(pr));
  cuda::SparseMlaPlan plan = cuda::plan_sparse_mla_decode(pr.num_queries, s.num_heads,
                                                          s.window_width, s.compressed_width, 132);
  plan.max_splits = 2;
  cuda::SparseMlaParams p = dp.params(pr, plan, nullptr, 0);  // workspace missing
  EXPECT_EQ(cuda::launch_sparse_mla_decode(p, nullptr).code(), StatusCode::kInvalidArgument);
  plan.max_splits = 1;
  p = dp.params(pr, plan, nullptr, 0);
  p.head_dim = 256;
  EXPECT_EQ(cuda::launch_sparse_mla_decode(p, nullptr).code(), StatusCode::kUnimplemented);
  p.head_dim = 128;
  p.plan.heads_per_cta = 48;
  EXPECT_EQ(cuda::launch_sparse_mla_decode(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.plan.heads_per_cta = 32;
  p.plan.tiles_per_step = 2;  // two tiles per step: 16 heads only
  EXPECT_EQ(cuda::launch_sparse_mla_decode(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.plan.heads_per_cta = 16;
  p.plan.tiles_per_step = 3;
  EXPECT_EQ(cuda::launch_sparse_mla_decode(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.plan.tiles_per_step = 1;
  p.plan.max_tiles = 1;  // narrower than the index widths
  EXPECT_EQ(cuda::launch_sparse_mla_decode(p, nullptr).code(), StatusCode::kInvalidArgument);
  // The sm_90a plan: head_dim 128 and 4 heads are refused (and the whole plan anywhere else).
  p = dp.params(pr, plan, nullptr, 0);
  p.plan.wgmma = true;
  p.plan.heads_per_cta = 64;
  EXPECT_EQ(cuda::launch_sparse_mla_decode(p, nullptr).code(), StatusCode::kInvalidArgument);
  // The producer-warpgroup kernel is a form of the sm_90a plan only.
  p = dp.params(pr, plan, nullptr, 0);
  p.plan.warp_specialized = true;
  EXPECT_EQ(cuda::launch_sparse_mla_decode(p, nullptr).code(), StatusCode::kInvalidArgument);
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace ds
