// Lightning indexer on the GPU (kernels/cuda/indexer/indexer.h) against the CPU reference
// (cpu::indexer_scores + cpu::topk_indices, i.e. cpu::indexer_select) run on the unpacked stored
// keys (pack_index_key_host / unpack_index_key_host) and the same fp32 query and weights, on fresh
// random inputs in paged pools on shuffled pages: tiny (4 heads, topk 8) and Flash (64 heads,
// topk 512) shapes, visible counts 1 .. 32768 entries (contexts up to 128K tokens), batch 1-64,
// mixed lengths in one batch, 1-4 query tokens per sequence, visible <= topk, forced split counts,
// CUDA-graph replay with new lengths. Outputs are poisoned (-1 bytes / NaN) before every run.
//
// Selected sets are compared by their reference scores so ties and order do not matter: the
// scores of both sets are sorted and compared element by element, and every selected index must
// be visible and unique, with -1 padding after `count`.
// Tolerance: in REF numerics (FP4-simulated q and keys) the e4m3 values hold q and the keys
// exactly, so the GPU score differs from the fp32 reference only by accumulation order and the
// tensor cores' fp32 accumulation (Hopper keeps fewer mantissa bits: ~2^-13 relative to the
// partial sums). With E = 2^-10 * max_w sum_h |w_h| |q_h| |k_w| (a bound on the magnitude of the
// terms), each score is within E, so the i-th best scores of the two sets are within 2E.
// HF numerics (no FP4 simulation): q is rounded to e4m3 per head (relative 2^-4 per element), so
// E = 2^-4 * the same magnitude bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/indexer.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda_test_util.h"

namespace ds {
namespace {

constexpr int kD = cuda::kIndexHeadDim;

struct Shape {
  int num_seqs = 1;
  int queries_per_seq = 1;
  int num_heads = 64;
  int topk = 512;
  int page_size = 64;
  int min_visible = 1;  // the last query token of a sequence sees [min_visible, max_visible]
  int max_visible = 2048;
  bool ref_numerics = true;  // FP4-simulated q and keys
  int dup_period = 0;        // > 0: entry e stores the same key as entry e % dup_period (ties)
  bool negative_weights = false;  // every head weight < 0: all scores <= 0
};

struct Problem {
  Shape s;
  int num_queries = 0;
  std::vector<int> seq_entries;  // entries stored per sequence
  std::vector<int32_t> query_seq, visible;
  std::vector<float> q, w;  // [N, H, 128], [N, H]
  // Host pool (packed on the host; the GPU pack kernel must produce the same bytes).
  std::vector<uint8_t> pool;
  std::vector<int32_t> page_table;
  int pages_per_seq = 0;
  int64_t page_bytes = 0;
  std::vector<std::vector<float>> raw;       // [seq] fp32 keys given to the pack kernel
  std::vector<std::vector<float>> unpacked;  // [seq] stored values
};

void draw_queries(Rng& rng, Problem& pr) {
  const Shape& s = pr.s;
  pr.visible.assign(size_t(pr.num_queries), 0);
  for (int sq = 0; sq < s.num_seqs; ++sq) {
    // The last query token sees v entries; earlier draft tokens see v or fewer (visibility is
    // floor((t+1)/4), so consecutive tokens differ by at most one entry; use up to 2 here).
    const int v = s.min_visible + int(rng.below(uint64_t(s.max_visible - s.min_visible + 1)));
    for (int j = 0; j < s.queries_per_seq; ++j) {
      const int back = s.queries_per_seq - 1 - j;
      pr.visible[size_t(sq * s.queries_per_seq + j)] = std::max(0, v - int(rng.below(2)) * back);
    }
  }
  pr.q.resize(size_t(pr.num_queries) * s.num_heads * kD);
  pr.w.resize(size_t(pr.num_queries) * s.num_heads);
  for (size_t i = 0; i < pr.q.size(); i += kD) {
    const float mag = 0.25f + 2.0f * float(rng.uniform());
    for (int d = 0; d < kD; ++d) pr.q[i + d] = rng.normal() * mag;
    if (s.ref_numerics) cpu::simulate_fp4_blocks(&pr.q[i], kD, cpu::kFp4Block);
  }
  for (auto& x : pr.w) {
    x = rng.normal() * 0.02f;  // may be negative, as the model's weights
    if (s.negative_weights) x = -std::fabs(x) - 1e-3f;
  }
}

Problem make_problem(const Shape& s, uint64_t seed) {
  Rng rng(seed);
  Problem pr;
  pr.s = s;
  pr.num_queries = s.num_seqs * s.queries_per_seq;
  for (int i = 0; i < pr.num_queries; ++i) pr.query_seq.push_back(i / s.queries_per_seq);
  draw_queries(rng, pr);
  // Every sequence stores max_visible entries (later graph replays draw new lengths).
  pr.seq_entries.assign(size_t(s.num_seqs), s.max_visible);
  pr.pages_per_seq = std::max(1, (s.max_visible + s.page_size - 1) / s.page_size);
  pr.page_bytes = cuda::index_key_page_bytes(s.page_size);
  const int num_pages = s.num_seqs * pr.pages_per_seq + 1;
  pr.pool.assign(size_t(num_pages) * size_t(pr.page_bytes), test::kPoisonByte);
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  pr.page_table.assign(perm.begin(), perm.begin() + s.num_seqs * pr.pages_per_seq);
  cuda::IndexKeySource host{pr.pool.data(), pr.page_table.data(), pr.pages_per_seq, s.page_size,
                            pr.page_bytes};
  pr.raw.resize(size_t(s.num_seqs));
  pr.unpacked.resize(size_t(s.num_seqs));
  for (int sq = 0; sq < s.num_seqs; ++sq) {
    const int n = pr.seq_entries[size_t(sq)];
    auto& raw = pr.raw[size_t(sq)];
    auto& un = pr.unpacked[size_t(sq)];
    raw.resize(size_t(n) * kD);
    un.resize(size_t(n) * kD);
    for (int e = 0; e < n; ++e) {
      float* k = &raw[size_t(e) * kD];
      if (s.dup_period > 0 && e >= s.dup_period) {  // the same stored key => the same score
        std::copy_n(&raw[size_t(e % s.dup_period) * kD], kD, k);
        std::copy_n(&un[size_t(e % s.dup_period) * kD], kD, &un[size_t(e) * kD]);
        std::memcpy(cuda::index_key_data_host(host, sq, e),
                    cuda::index_key_data_host(host, sq, e % s.dup_period), kD);
        *cuda::index_key_scale_host(host, sq, e) =
            *cuda::index_key_scale_host(host, sq, e % s.dup_period);
        continue;
      }
      const float mag = std::ldexp(1.0f, int(rng.below(7)) - 3);  // entries of varied magnitude
      for (int d = 0; d < kD; ++d) k[d] = rng.normal() * mag;
      if (s.ref_numerics) cpu::simulate_fp4_blocks(k, kD, cpu::kFp4Block);
      uint8_t* data = cuda::index_key_data_host(host, sq, e);
      float* scale = cuda::index_key_scale_host(host, sq, e);
      cuda::pack_index_key_host(k, data, scale);
      cuda::unpack_index_key_host(data, *scale, &un[size_t(e) * kD]);
    }
  }
  return pr;
}

struct DeviceProblem {
  test::DeviceBuffer<uint8_t> pool;
  test::DeviceBuffer<int32_t> table, query_seq, visible, selected, count;
  test::DeviceBuffer<float> q, w;
  // IndexerSelectParams::merge_counters: zeroed once (upload_and_pack); every launch must leave
  // them zero (run_plan checks).
  test::DeviceBuffer<uint32_t> counters;
  explicit DeviceProblem(const Problem& pr)
      : pool(pr.pool.size()),
        table(pr.page_table.size()),
        query_seq(pr.query_seq.size()),
        visible(pr.visible.size()),
        selected(size_t(pr.num_queries) * pr.s.topk),
        count(pr.visible.size()),
        q(pr.q.size()),
        w(pr.w.size()),
        counters(pr.visible.size()) {}
  bool ok() const {
    return pool.ok() && table.ok() && query_seq.ok() && visible.ok() && selected.ok() &&
           count.ok() && q.ok() && w.ok() && counters.ok();
  }
  // Every merge counter is back at zero.
  void expect_counters_zero(const char* what) const {
    std::vector<uint32_t> c;
    ASSERT_EQ(counters.download(c), cudaSuccess);
    for (size_t i = 0; i < c.size(); ++i)
      ASSERT_EQ(c[i], 0u) << what << ": merge counter of query " << i << " left nonzero";
  }
  cudaError_t upload_queries(const Problem& pr) {
    cudaError_t e;
    if ((e = visible.upload(pr.visible)) != cudaSuccess) return e;
    if ((e = q.upload(pr.q)) != cudaSuccess) return e;
    return w.upload(pr.w);
  }
  cuda::IndexKeySource source(const Problem& pr) const {
    return {pool.get(), table.get(), pr.pages_per_seq, pr.s.page_size, pr.page_bytes};
  }
  cuda::IndexerSelectParams params(const Problem& pr, const cuda::IndexerPlan& plan, void* ws,
                                   size_t ws_bytes) const {
    cuda::IndexerSelectParams p;
    p.q = q.get();
    p.weights = w.get();
    p.query_seq = query_seq.get();
    p.visible = visible.get();
    p.num_queries = pr.num_queries;
    p.num_heads = pr.s.num_heads;
    p.topk = pr.s.topk;
    p.keys = source(pr);
    p.selected = selected.get();
    p.count = count.get();
    p.plan = plan;
    p.workspace = ws;
    p.workspace_bytes = ws_bytes;
    p.merge_counters = counters.get();
    return p;
  }
};

// Uploads the problem; the keys go through the GPU pack kernel (one launch over every entry of
// every sequence, in shuffled row order) and the pool bytes must equal the host packing.
void upload_and_pack(const Problem& pr, DeviceProblem& dp) {
  ASSERT_TRUE(dp.ok());
  DS_CUDA_ASSERT(cudaMemset(dp.counters.get(), 0, dp.counters.bytes()));
  DS_CUDA_ASSERT(dp.pool.poison());
  DS_CUDA_ASSERT(dp.table.upload(pr.page_table));
  DS_CUDA_ASSERT(dp.query_seq.upload(pr.query_seq));
  DS_CUDA_ASSERT(dp.upload_queries(pr));
  std::vector<float> rows;
  std::vector<int32_t> seq, index;
  for (int sq = 0; sq < pr.s.num_seqs; ++sq)
    for (int e = 0; e < pr.seq_entries[size_t(sq)]; ++e) {
      rows.insert(rows.end(), pr.raw[size_t(sq)].begin() + size_t(e) * kD,
                  pr.raw[size_t(sq)].begin() + size_t(e + 1) * kD);
      seq.push_back(sq);
      index.push_back(e);
    }
  // A skipped row (index -1) must write nothing.
  rows.insert(rows.end(), kD, 1e6f);
  seq.push_back(0);
  index.push_back(-1);
  test::DeviceBuffer<float> d_rows(rows.size());
  test::DeviceBuffer<int32_t> d_seq(seq.size()), d_index(index.size());
  ASSERT_TRUE(d_rows.ok() && d_seq.ok() && d_index.ok());
  DS_CUDA_ASSERT(d_rows.upload(rows));
  DS_CUDA_ASSERT(d_seq.upload(seq));
  DS_CUDA_ASSERT(d_index.upload(index));
  cuda::PackIndexKeysParams pp;
  pp.keys = d_rows.get();
  pp.seq = d_seq.get();
  pp.index = d_index.get();
  pp.num_rows = int32_t(seq.size());
  pp.dst = dp.source(pr);
  const Status st = cuda::launch_pack_index_keys(pp, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint8_t> got;
  DS_CUDA_ASSERT(dp.pool.download(got));
  int64_t diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff += got[i] != pr.pool[i];
  ASSERT_EQ(diff, 0) << "GPU-packed pool differs from pack_index_key_host";
}

struct Result {
  std::vector<int32_t> selected, count;
};

// The launch's switches, each of which must leave the selection unchanged: the selects' early
// exit, the compaction of the filter's survivors (session 30) and the merge counters (fused: the
// score kernel merges plans of <= 4096 candidates per query; false: the merge kernel).
struct Switches {
  bool early_exit = true, compact = true, fused = true;
};

void run_plan(const Problem& pr, DeviceProblem& dp, const cuda::IndexerPlan& plan, Result& res,
              const Switches& sw = {}) {
  const size_t ws_bytes = cuda::indexer_workspace_bytes(plan);
  test::DeviceBuffer<uint8_t> ws(std::max<size_t>(16, ws_bytes));
  ASSERT_TRUE(ws.ok());
  DS_CUDA_ASSERT(ws.poison());
  DS_CUDA_ASSERT(dp.selected.poison());
  DS_CUDA_ASSERT(dp.count.poison());
  cuda::IndexerSelectParams p = dp.params(pr, plan, ws.get(), ws_bytes);
  p.select_early_exit = sw.early_exit;
  p.select_compact = sw.compact;
  if (!sw.fused) p.merge_counters = nullptr;
  const Status st = cuda::launch_indexer_select(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  DS_CUDA_ASSERT(dp.selected.download(res.selected));
  DS_CUDA_ASSERT(dp.count.download(res.count));
  dp.expect_counters_zero("run_plan");
}

void expect_matches_reference(const Problem& pr, const Result& res, const char* what) {
  const Shape& s = pr.s;
  int failures = 0;
  double worst = 0;
  for (int qi = 0; qi < pr.num_queries && failures < 5; ++qi) {
    const int v = pr.visible[size_t(qi)];
    const int want_count = std::min(v, s.topk);
    const int32_t* sel = &res.selected[size_t(qi) * s.topk];
    auto fail = [&](const std::string& m) {
      ADD_FAILURE() << what << ": query " << qi << " (visible " << v << "): " << m;
      ++failures;
    };
    if (res.count[size_t(qi)] != want_count) {
      fail("count " + std::to_string(res.count[size_t(qi)]) + " want " +
           std::to_string(want_count));
      continue;
    }
    std::vector<char> seen(size_t(std::max(v, 1)), 0);
    bool ok = true;
    for (int i = 0; i < s.topk && ok; ++i) {
      const int32_t x = sel[i];
      if (i >= want_count) {
        if (x != -1) {
          fail("padding slot " + std::to_string(i) + " holds " + std::to_string(x));
          ok = false;
        }
      } else if (x < 0 || x >= v || seen[size_t(x)]) {
        fail("slot " + std::to_string(i) + " holds invalid or repeated index " + std::to_string(x));
        ok = false;
      } else {
        seen[size_t(x)] = 1;
      }
    }
    if (!ok || v <= s.topk) continue;  // v <= topk: the set is 0 .. v-1, checked above
    if (s.dup_period > 0) {
      // Entries with the same stored key score bit-identically on the GPU, so within each class
      // (e % dup_period) the selected members must be the lowest indices (ties -> lower index).
      std::vector<int> taken(size_t(s.dup_period), 0);
      for (int i = 0; i < want_count; ++i) ++taken[size_t(sel[i] % s.dup_period)];
      for (int i = 0; i < want_count && ok; ++i) {
        const int x = sel[i], cls = x % s.dup_period;
        if (x / s.dup_period >= taken[size_t(cls)]) {
          fail("tie rule: index " + std::to_string(x) + " selected but a lower index with the " +
               "same key was not");
          ok = false;
        }
      }
      if (!ok) continue;
    }
    const int seq = pr.query_seq[size_t(qi)];
    const float* qv = &pr.q[size_t(qi) * s.num_heads * kD];
    const float* wv = &pr.w[size_t(qi) * s.num_heads];
    const float* keys = pr.unpacked[size_t(seq)].data();
    std::vector<float> scores(static_cast<size_t>(v));
    cpu::indexer_scores(qv, wv, keys, v, s.num_heads, kD, scores.data());
    std::vector<int32_t> ref(static_cast<size_t>(s.topk));
    cpu::topk_indices(scores.data(), v, s.topk, ref.data());
    // Magnitude bound of the terms: max_w sum_h |w_h| |q_h| |k_w|.
    double qmag = 0, kmax = 0;
    for (int h = 0; h < s.num_heads; ++h) {
      double n2 = 0;
      for (int d = 0; d < kD; ++d) n2 += double(qv[h * kD + d]) * qv[h * kD + d];
      qmag += std::fabs(wv[h]) * std::sqrt(n2);
    }
    for (int e = 0; e < v; ++e) {
      double n2 = 0;
      for (int d = 0; d < kD; ++d) n2 += double(keys[size_t(e) * kD + d]) * keys[size_t(e) * kD + d];
      kmax = std::max(kmax, std::sqrt(n2));
    }
    const double tol = 2.0 * std::ldexp(qmag * kmax, s.ref_numerics ? -10 : -4);
    std::vector<float> a, b;
    for (int i = 0; i < s.topk; ++i) {
      a.push_back(scores[size_t(sel[i])]);
      b.push_back(scores[size_t(ref[size_t(i)])]);
    }
    std::sort(a.begin(), a.end(), std::greater<float>());
    std::sort(b.begin(), b.end(), std::greater<float>());
    for (int i = 0; i < s.topk; ++i) {
      const double err = std::fabs(double(a[size_t(i)]) - b[size_t(i)]);
      if (tol > 0) worst = std::max(worst, err / tol);
      if (!(err <= tol)) {
        fail("rank " + std::to_string(i) + ": selected score " + std::to_string(a[size_t(i)]) +
             " reference " + std::to_string(b[size_t(i)]) + " tol " + std::to_string(tol));
        break;
      }
    }
  }
  EXPECT_EQ(failures, 0) << what;
  ::testing::Test::RecordProperty(std::string("worst_error_over_tolerance_") + what,
                                  std::to_string(worst));
}

int sm_count() {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return 132;
  return n;
}

// The default plan against the reference, then for identical outputs: each split cap, every
// combination of the launch's switches (Switches), the plan rule before session 30 (splits of
// >= 2 topk keys) and the plan without the crowded-merge cap.
void check_problem(const Shape& s, uint64_t seed, const std::vector<int>& split_caps) {
  Problem pr = make_problem(s, seed);
  DeviceProblem dp(pr);
  upload_and_pack(pr, dp);
  if (::testing::Test::HasFatalFailure()) return;
  const cuda::IndexerPlan base =
      cuda::plan_indexer_select(pr.num_queries, s.max_visible, s.topk, sm_count());
  Result first;
  run_plan(pr, dp, base, first);
  expect_matches_reference(pr, first, "default plan");
  for (int cap : split_caps) {
    const cuda::IndexerPlan plan =
        cuda::plan_indexer_select(pr.num_queries, s.max_visible, s.topk, sm_count(), cap);
    Result res;
    run_plan(pr, dp, plan, res);
    EXPECT_EQ(res.selected, first.selected) << "split cap " << cap << " (" << plan.max_splits
                                            << " splits; default " << base.max_splits << ")";
    EXPECT_EQ(res.count, first.count) << "split cap " << cap;
  }
  for (int variant = 1; variant < 8; ++variant) {  // every other combination of the switches
    Switches sw;
    sw.early_exit = (variant & 1) == 0;
    sw.compact = (variant & 2) == 0;
    sw.fused = (variant & 4) == 0;
    Result res;
    run_plan(pr, dp, base, res, sw);
    const std::string what = "early exit " + std::to_string(sw.early_exit) + ", compaction " +
                             std::to_string(sw.compact) + ", counters " +
                             std::to_string(sw.fused) + " (" + std::to_string(base.max_splits) +
                             " splits)";
    EXPECT_EQ(res.selected, first.selected) << what;
    EXPECT_EQ(res.count, first.count) << what;
  }
  {
    const cuda::IndexerPlan two =
        cuda::plan_indexer_select(pr.num_queries, s.max_visible, s.topk, sm_count(), 0, 2);
    EXPECT_GE(two.min_keys, 2 * s.topk);
    Result res;
    run_plan(pr, dp, two, res);
    EXPECT_EQ(res.selected, first.selected) << "splits of >= 2 topk keys (" << two.max_splits
                                            << " splits; default " << base.max_splits << ")";
    EXPECT_EQ(res.count, first.count) << "splits of >= 2 topk keys";
  }
  {
    const cuda::IndexerPlan uncapped = cuda::plan_indexer_select(
        pr.num_queries, s.max_visible, s.topk, sm_count(), 0, 1, /*cap_crowded_merge=*/false);
    Result res;
    run_plan(pr, dp, uncapped, res);
    EXPECT_EQ(res.selected, first.selected) << "without the crowded-merge cap ("
                                            << uncapped.max_splits << " splits; default "
                                            << base.max_splits << ")";
    EXPECT_EQ(res.count, first.count) << "without the crowded-merge cap";
  }
}

Shape tiny_shape() {
  Shape s;
  s.num_heads = 4;
  s.topk = 8;
  s.page_size = 16;
  s.max_visible = 700;
  return s;
}

TEST(IndexerCuda, TinyShapes) {
  DS_REQUIRE_GPU();
  Shape s = tiny_shape();
  s.num_seqs = 3;
  s.queries_per_seq = 2;
  check_problem(s, 11, {1, 2, 3});
  s.num_seqs = 16;
  s.queries_per_seq = 1;
  s.max_visible = 5000;  // several 2048-key chunks in one split
  check_problem(s, 12, {1, 5});
}

TEST(IndexerCuda, TinyVisibleAtMostTopk) {
  DS_REQUIRE_GPU();
  Shape s = tiny_shape();
  s.num_seqs = 5;
  s.min_visible = 0;
  s.max_visible = 9;  // 0 .. 9 entries around topk = 8
  check_problem(s, 21, {1});
}

TEST(IndexerCuda, FlashBatch1Context128K) {
  DS_REQUIRE_GPU();
  Shape s;
  s.min_visible = 32768;
  s.max_visible = 32768;
  check_problem(s, 31, {1, 3, 8});
}

// Many bit-identical scores: every score occurs ~v / period times, so the 512th-best value is
// shared by many entries and the tie rule decides (checked exactly per class of equal keys, and by
// the identical outputs of every split count).
TEST(IndexerCuda, FlashTiesAtTheBoundary) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 6;
  s.min_visible = 1500;
  s.max_visible = 9000;
  s.dup_period = 97;
  check_problem(s, 101, {1, 2, 3});
  Shape b = s;  // 128K context, batch 1, ties
  b.num_seqs = 1;
  b.min_visible = b.max_visible = 32768;
  b.dup_period = 1000;
  check_problem(b, 102, {1, 5});
}

// Every head weight negative: all scores <= 0 (the sign bit set in the order key). With 64 heads
// the scores are distinct; with 4 heads ~1/16 of the keys score exactly 0 (every ReLU is 0), the
// largest value, so the boundary is a tie among thousands of zeros.
TEST(IndexerCuda, NegativeWeightHeads) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 8;
  s.min_visible = 600;
  s.max_visible = 12000;
  s.negative_weights = true;
  check_problem(s, 111, {1, 2});
  Shape z = s;
  z.num_heads = 4;
  z.num_seqs = 4;
  z.min_visible = 9000;
  z.max_visible = 20000;
  check_problem(z, 112, {1, 3});
}

// Just above topk visible entries (513 ..): one split, the smallest select (n = visible).
TEST(IndexerCuda, FlashJustAboveTopk) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 24;
  s.queries_per_seq = 2;
  s.min_visible = 513;
  s.max_visible = 530;
  check_problem(s, 121, {1});
}

TEST(IndexerCuda, FlashShortAndBoundaryLengths) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 24;
  s.min_visible = 1;
  s.max_visible = 1100;  // around topk 512, 2 x topk and the 16-key tiles
  check_problem(s, 41, {1, 2});
}

TEST(IndexerCuda, FlashMixedBatch64) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 64;
  s.min_visible = 1;
  s.max_visible = 4096;
  s.page_size = 32;
  check_problem(s, 51, {1, 4});
}

TEST(IndexerCuda, FlashSpeculative4Tokens) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 4;
  s.queries_per_seq = 4;
  s.min_visible = 500;
  s.max_visible = 9000;
  check_problem(s, 61, {1, 2});
}

TEST(IndexerCuda, HfNumericsWithoutFp4) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 3;
  s.queries_per_seq = 2;
  s.min_visible = 600;
  s.max_visible = 6000;
  s.ref_numerics = false;
  check_problem(s, 71, {1});
}

TEST(IndexerCuda, GraphReplayWithNewLengths) {
  DS_REQUIRE_GPU();
  Shape s;
  s.num_seqs = 3;
  s.queries_per_seq = 2;
  s.min_visible = 1;
  s.max_visible = 12000;
  Problem pr = make_problem(s, 81);
  DeviceProblem dp(pr);
  upload_and_pack(pr, dp);
  if (HasFatalFailure()) return;
  // 16 splits (8192 candidates per query: the merge kernel, with or without counters), then at
  // most 8 (4096: with the counters the score kernel's last split CTA merges, and the replays
  // must leave them at zero; without them the merge kernel).
  for (int cap : {0, 8}) {
    for (bool fused : {true, false}) {
      SCOPED_TRACE("split cap " + std::to_string(cap) + (fused ? ", counters" : ", merge kernel"));
      const cuda::IndexerPlan plan =
          cuda::plan_indexer_select(pr.num_queries, s.max_visible, s.topk, sm_count(), cap);
      ASSERT_GT(plan.max_splits, 1);  // a merge runs inside the graph
      const size_t ws_bytes = cuda::indexer_workspace_bytes(plan);
      test::DeviceBuffer<uint8_t> ws(ws_bytes);
      ASSERT_TRUE(ws.ok());
      cuda::IndexerSelectParams p = dp.params(pr, plan, ws.get(), ws_bytes);
      if (!fused) p.merge_counters = nullptr;
      cudaStream_t stream;
      DS_CUDA_ASSERT(cudaStreamCreate(&stream));
      cudaGraph_t graph;
      DS_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const Status st = cuda::launch_indexer_select(p, stream);
      DS_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
      ASSERT_TRUE(st.ok()) << st.to_string();
      cudaGraphExec_t exec;
      DS_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
      Rng rng(82);
      for (int step = 0; step < 3; ++step) {
        draw_queries(rng, pr);
        DS_CUDA_ASSERT(dp.upload_queries(pr));
        DS_CUDA_ASSERT(ws.poison());
        DS_CUDA_ASSERT(dp.selected.poison());
        DS_CUDA_ASSERT(dp.count.poison());
        DS_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
        DS_CUDA_ASSERT(cudaStreamSynchronize(stream));
        Result res;
        DS_CUDA_ASSERT(dp.selected.download(res.selected));
        DS_CUDA_ASSERT(dp.count.download(res.count));
        expect_matches_reference(pr, res, "graph replay");
        dp.expect_counters_zero("graph replay");
      }
      DS_CUDA_ASSERT(cudaGraphExecDestroy(exec));
      DS_CUDA_ASSERT(cudaGraphDestroy(graph));
      DS_CUDA_ASSERT(cudaStreamDestroy(stream));
    }
  }
}

// Host arithmetic only (runs without a GPU): the split count at Flash's topk on 132 SMs.
TEST(IndexerCuda, PlanCapsTheMergeWhenQueriesCrowdTheSms) {
  // B = 1 at 32K (8192 entries): 16 splits of 512 keys, side by side on the SMs.
  EXPECT_EQ(cuda::plan_indexer_select(1, 8192, 512, 132).max_splits, 16);
  // B = 16: 16 x 16 CTAs exceed 132 SMs, so at most 8 splits (a merge of 4096 candidates).
  EXPECT_EQ(cuda::plan_indexer_select(16, 8192, 512, 132).max_splits, 8);
  EXPECT_EQ(cuda::plan_indexer_select(16, 8192, 512, 132, 0, 1, false).max_splits, 16);
  EXPECT_EQ(cuda::plan_indexer_select(16, 32768, 512, 132).max_splits, 8);
  // B = 64: 2 x 132 / 64 = 4 splits, under the cap either way.
  EXPECT_EQ(cuda::plan_indexer_select(64, 8192, 512, 132).max_splits, 4);
  EXPECT_EQ(cuda::plan_indexer_select(64, 8192, 512, 132, 0, 1, false).max_splits, 4);
  // B = 8 at 32K: 8 x 16 = 128 CTAs fit the SMs: 16 splits.
  EXPECT_EQ(cuda::plan_indexer_select(8, 8192, 512, 132).max_splits, 16);
}

// Host arithmetic only: which plans the score kernel merges itself (the GPU tests compare both
// forms; this says the fused form is the one they ran).
TEST(IndexerCuda, ScoreKernelMergesPlansOfAtMost4096Candidates) {
  uint32_t counters[64];
  cuda::IndexerSelectParams p;
  p.topk = 512;
  p.merge_counters = counters;
  p.plan = cuda::plan_indexer_select(16, 32768, 512, 132);  // 8 splits: 4096 candidates
  EXPECT_TRUE(cuda::indexer_merges_in_score_kernel(p));
  p.plan = cuda::plan_indexer_select(64, 32768, 512, 132);  // 4 splits
  EXPECT_TRUE(cuda::indexer_merges_in_score_kernel(p));
  p.plan = cuda::plan_indexer_select(1, 32768, 512, 132);  // 16 splits: 8192
  EXPECT_FALSE(cuda::indexer_merges_in_score_kernel(p));
  p.plan = cuda::plan_indexer_select(64, 512, 512, 132);  // one split: no merge at all
  EXPECT_FALSE(cuda::indexer_merges_in_score_kernel(p));
  p.plan = cuda::plan_indexer_select(16, 32768, 512, 132);
  p.merge_counters = nullptr;  // no counters: the merge kernel
  EXPECT_FALSE(cuda::indexer_merges_in_score_kernel(p));
}

TEST(IndexerCuda, RejectsBadParams) {
  DS_REQUIRE_GPU();
  Shape s = tiny_shape();
  s.max_visible = 64;
  Problem pr = make_problem(s, 91);
  DeviceProblem dp(pr);
  upload_and_pack(pr, dp);
  if (HasFatalFailure()) return;
  cuda::IndexerPlan plan = cuda::plan_indexer_select(pr.num_queries, 100000, s.topk, 132);
  ASSERT_GT(plan.max_splits, 1);
  cuda::IndexerSelectParams p = dp.params(pr, plan, nullptr, 0);  // workspace missing
  EXPECT_EQ(cuda::launch_indexer_select(p, nullptr).code(), StatusCode::kInvalidArgument);
  plan.max_splits = 1;
  p = dp.params(pr, plan, nullptr, 0);
  p.head_dim = 64;
  EXPECT_EQ(cuda::launch_indexer_select(p, nullptr).code(), StatusCode::kUnimplemented);
  p.head_dim = 128;
  p.num_heads = 65;
  EXPECT_EQ(cuda::launch_indexer_select(p, nullptr).code(), StatusCode::kUnimplemented);
  p.num_heads = 4;
  p.topk = 16;  // differs from the plan's
  EXPECT_EQ(cuda::launch_indexer_select(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.topk = 8;
  {  // splits shorter than topk keys: a split's candidate list would not be full
    cuda::IndexerPlan shortsplit = plan;
    shortsplit.min_keys = s.topk - 1;
    cuda::IndexerSelectParams ps = dp.params(pr, shortsplit, nullptr, 0);
    EXPECT_EQ(cuda::launch_indexer_select(ps, nullptr).code(), StatusCode::kInvalidArgument);
  }
  {  // more merge candidates than the merge holds (plan_indexer_select never makes it)
    cuda::IndexerPlan big = plan;
    big.max_splits = 2000;
    cuda::IndexerSelectParams pb = dp.params(pr, big, nullptr, 0);
    EXPECT_EQ(cuda::launch_indexer_select(pb, nullptr).code(), StatusCode::kInvalidArgument);
  }
  p.keys.page_bytes = 100;
  EXPECT_EQ(cuda::launch_indexer_select(p, nullptr).code(), StatusCode::kInvalidArgument);
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace ds
