// Benchmark of the sparse MLA decode kernel at DeepSeek-V4-Flash shapes (64 heads x 512, 584-byte
// FP8 KV entries, per-head sink): batch 1, 4, 16, 64, 128 x context 512 and 32K on a CSA layer
// (keys = 128 window + min(512, ctx/4) selected compressed entries: 256 and 640), 1 query token
// per sequence. Each case is timed eagerly (median, rotating over 8 copies of the KV pools so the
// reads come from HBM, not L2) and inside a CUDA graph (8 launches over the 8 copies captured in
// one graph, time / 8: the per-kernel cost inside a decode-step graph).
// Floor = max(bytes / copy ceiling, flops / bf16 GEMM ceiling), both measured in this run; bytes =
// the selected KV entries (584 B each) + indices + q + out + lse, flops = 4 * heads * 512 per key.
// The GPU is kept busy with the case's own launches for ~50 ms before its first timing (clocks
// ramp up from idle during the host setup of each case). "sparse_mla_decode_pdl": the graph with
// SparseMlaParams::pdl set (each attention launch a programmatic dependent of the previous
// kernel in the graph).
// Correctness of the same run: the first 4 queries against the CPU reference (max error relative to
// the test tolerance 2^-7 max|v| + 2^-8 |ref|; <= 1 passes). On compute capability 9.0 every case
// also times the sm_90a kernels' plan: v7 ("sparse_mla_decode_wgmma") and v9 with its producer
// warpgroup ("sparse_mla_decode_wgmma_ws"), each checked the same way, and sweeps their split
// counts ("wgmma split sweep"; " ws" in the shape for v9).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_entry.h"
#include "kernels/cuda/attention/sparse_mla_decode.h"

namespace {

using namespace ds;

constexpr int kHeads = 64, kDim = 512, kWindow = 128, kTopk = 512, kCopies = 8;
constexpr int kWindowEntries = 131, kCompEntries = 1024, kPageSize = 64;

// bf16 GEMM ceiling (cuBLAS, 8192^3), TFLOP/s.
double measure_bf16_tflops(cudaStream_t stream) {
  const int n = 8192;
  __nv_bfloat16 *a, *b, *c;
  DS_BENCH_CHECK(cudaMalloc(&a, size_t(n) * n * 2));
  DS_BENCH_CHECK(cudaMalloc(&b, size_t(n) * n * 2));
  DS_BENCH_CHECK(cudaMalloc(&c, size_t(n) * n * 2));
  DS_BENCH_CHECK(cudaMemsetAsync(a, 0x3c, size_t(n) * n * 2, stream));  // ~0.011, not zeros
  DS_BENCH_CHECK(cudaMemsetAsync(b, 0x3d, size_t(n) * n * 2, stream));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
  cublasSetStream(h, stream);
  const float alpha = 1, beta = 0;
  bool ok = true;
  double us = bench::time_us(
      [&](cudaStream_t) {
        ok &= cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                           CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
      },
      stream, 10, 2);
  cublasDestroy(h);
  DS_BENCH_CHECK(cudaFree(a));
  DS_BENCH_CHECK(cudaFree(b));
  DS_BENCH_CHECK(cudaFree(c));
  return ok ? 2.0 * double(n) * n * n / (us * 1e-6) / 1e12 : 0.0;
}

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* d;
  DS_BENCH_CHECK(cudaMalloc(&d, std::max<size_t>(1, v.size() * sizeof(T))));
  DS_BENCH_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

struct Pool {
  cpu::PagedKv kv;
  std::vector<uint8_t> bytes;  // one copy
  int pages_per_seq = 0;
  std::vector<int32_t> table;  // [seqs, pages_per_seq], copy 0
};

Pool make_pool(Rng& rng, int seqs, int entries, int page_size) {
  Pool p;
  p.kv.layout = cpu::KvEntryLayout{kDim};
  p.kv.page_size = page_size;
  p.kv.page_bytes = cpu::kv_page_bytes(p.kv.layout, page_size);
  p.pages_per_seq = (entries + page_size - 1) / page_size;
  const int pages = seqs * p.pages_per_seq;
  p.bytes.assign(size_t(pages) * size_t(p.kv.page_bytes), 0);
  p.table.resize(size_t(pages));
  std::iota(p.table.begin(), p.table.end(), 0);
  for (size_t i = p.table.size() - 1; i > 0; --i) std::swap(p.table[i], p.table[rng.below(i + 1)]);
  p.kv.pool = p.bytes.data();
  std::vector<float> v(kDim);
  for (int s = 0; s < seqs; ++s)
    for (int e = 0; e < entries; ++e) {
      for (auto& x : v) x = rng.normal();
      const int32_t* t = &p.table[size_t(s) * p.pages_per_seq];
      cpu::pack_kv_entry(p.kv.layout, v.data(), cpu::kv_entry_data(p.kv, t, e),
                         cpu::kv_entry_scales(p.kv, t, e));
    }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = argc > 1 ? argv[1] : "bench/results/sparse_mla_decode.json";
  // "quick": batch 1, 16, 64 and 128 at context 32K only, no sweeps (timing experiments).
  // "small": batch 1 and 4 at both contexts, with their sweeps (batch-1 experiments).
  const bool quick = argc > 2 && std::string(argv[2]) == "quick";
  const bool small = argc > 2 && std::string(argv[2]) == "small";
  cudaStream_t stream;
  DS_BENCH_CHECK(cudaStreamCreate(&stream));
  bench::DeviceInfo dev = bench::device_info();
  const double copy_gbps = bench::measure_copy_bandwidth_gbps(stream);
  const double bf16_tflops = measure_bf16_tflops(stream);
  std::printf("ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", copy_gbps, bf16_tflops);
  std::vector<bench::Record> records;
  {
    bench::Record r;
    r.kernel = "ceiling_bf16_gemm";
    r.shape = "cublasGemmEx 8192^3 bf16";
    r.mode = "eager";
    r.flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
    r.achieved_tflops = bf16_tflops;
    r.time_us = bf16_tflops > 0 ? r.flops / (bf16_tflops * 1e12) * 1e6 : 0;
    r.error_metric = "none";
    records.push_back(r);
  }
  const float scale = 1.0f / std::sqrt(float(kDim));
  for (int ctx : {512, 32768}) {
    if (quick && ctx != 32768) continue;
    const int comp = std::min(kTopk, ctx / 4);
    const int keys = kWindow + comp;
    for (int batch : {1, 4, 16, 64, 128}) {
      if ((quick && batch == 4) || (small && batch > 4)) continue;
      Rng rng(uint64_t(ctx) * 1000 + uint64_t(batch));
      Pool win = make_pool(rng, batch, kWindowEntries, kPageSize);
      Pool cmp = make_pool(rng, batch, kCompEntries, kPageSize);
      // kCopies copies of each pool; copy c's page table points into copy c.
      const int64_t wpages = int64_t(win.table.size()), cpages = int64_t(cmp.table.size());
      uint8_t *dwin, *dcmp;
      DS_BENCH_CHECK(cudaMalloc(&dwin, win.bytes.size() * kCopies));
      DS_BENCH_CHECK(cudaMalloc(&dcmp, cmp.bytes.size() * kCopies));
      std::vector<int32_t*> wtab(kCopies), ctab(kCopies);
      for (int c = 0; c < kCopies; ++c) {
        DS_BENCH_CHECK(cudaMemcpy(dwin + win.bytes.size() * c, win.bytes.data(), win.bytes.size(),
                                  cudaMemcpyHostToDevice));
        DS_BENCH_CHECK(cudaMemcpy(dcmp + cmp.bytes.size() * c, cmp.bytes.data(), cmp.bytes.size(),
                                  cudaMemcpyHostToDevice));
        std::vector<int32_t> wt = win.table, ct = cmp.table;
        for (auto& x : wt) x += int32_t(wpages * c);
        for (auto& x : ct) x += int32_t(cpages * c);
        wtab[size_t(c)] = to_device(wt);
        ctab[size_t(c)] = to_device(ct);
      }
      // Indices: window = 128 distinct ring slots, compressed = `comp` distinct entries.
      std::vector<int32_t> widx(size_t(batch) * kWindow), cidx(size_t(batch) * kTopk, -1);
      std::vector<int32_t> wlen(size_t(batch), kWindow), clen(size_t(batch), comp),
          qseq(static_cast<size_t>(batch));
      std::iota(qseq.begin(), qseq.end(), 0);
      for (int b = 0; b < batch; ++b) {
        std::vector<int32_t> perm(kCompEntries);
        std::iota(perm.begin(), perm.end(), 0);
        for (int i = 0; i < comp; ++i) {
          std::swap(perm[size_t(i)], perm[size_t(i) + rng.below(uint64_t(kCompEntries - i))]);
          cidx[size_t(b) * kTopk + i] = perm[size_t(i)];
        }
        for (int i = 0; i < kWindow; ++i)
          widx[size_t(b) * kWindow + i] = (i + 3 * b) % kWindowEntries;
      }
      std::vector<uint16_t> q(size_t(batch) * kHeads * kDim);
      for (auto& x : q) x = float_to_bf16(rng.normal() * 2.0f);
      std::vector<float> sink(kHeads);
      for (auto& x : sink) x = rng.normal();
      int32_t *d_widx = to_device(widx), *d_cidx = to_device(cidx), *d_wlen = to_device(wlen),
              *d_clen = to_device(clen), *d_qseq = to_device(qseq);
      uint16_t* d_q = to_device(q);
      float* d_sink = to_device(sink);
      uint16_t* d_out;
      float* d_lse;
      DS_BENCH_CHECK(cudaMalloc(&d_out, q.size() * 2));
      DS_BENCH_CHECK(cudaMalloc(&d_lse, size_t(batch) * kHeads * 4));
      const cuda::SparseMlaPlan plan =
          cuda::plan_sparse_mla_decode(batch, kHeads, kWindow, kTopk, dev.sm_count);
      // The sm_90a kernel's plan (v7) where the GPU runs it; the workspace serves both plans
      // and the split sweeps (at most max_tiles splits each).
      const bool wgmma = cuda::sparse_mla_wgmma_supported(kHeads, kDim);
      const cuda::SparseMlaPlan wplan =
          cuda::plan_sparse_mla_decode(batch, kHeads, kWindow, kTopk, dev.sm_count, 0, wgmma);
      cuda::SparseMlaPlan widest = plan, wwidest = wplan;
      widest.max_splits = std::max(1, plan.max_tiles);
      wwidest.max_splits = std::max(1, wplan.max_tiles);
      const size_t ws_bytes =
          std::max(cuda::sparse_mla_workspace_bytes(widest, batch, kHeads, kDim),
                   cuda::sparse_mla_workspace_bytes(wwidest, batch, kHeads, kDim));
      float* d_ws = nullptr;
      if (ws_bytes) DS_BENCH_CHECK(cudaMalloc(&d_ws, ws_bytes));
      auto params = [&](int c) {
        cuda::SparseMlaParams p;
        p.q = d_q;
        p.sink = d_sink;
        p.out = d_out;
        p.lse = d_lse;
        p.num_queries = batch;
        p.num_heads = kHeads;
        p.head_dim = kDim;
        p.softmax_scale = scale;
        p.query_seq = d_qseq;
        p.window = {dwin, wtab[size_t(c)], win.pages_per_seq, kPageSize, win.kv.page_bytes};
        p.compressed = {dcmp, ctab[size_t(c)], cmp.pages_per_seq, kPageSize, cmp.kv.page_bytes};
        p.window_idx = d_widx;
        p.window_len = d_wlen;
        p.window_width = kWindow;
        p.compressed_idx = d_cidx;
        p.compressed_len = d_clen;
        p.compressed_width = kTopk;
        p.plan = plan;
        p.workspace = d_ws;
        p.workspace_bytes = ws_bytes;
        return p;
      };
      const double bytes =
          double(batch) * (double(keys) * (584 + 4) + kHeads * kDim * 2.0 * 2 + kHeads * 4.0);
      const double flops = double(batch) * keys * 4.0 * kHeads * kDim;
      const double floor_us = std::max(bytes / (copy_gbps * 1e9),
                                       bf16_tflops > 0 ? flops / (bf16_tflops * 1e12) : 0.0) *
                              1e6;
      // A plan timed eagerly, in a graph and in a graph with PDL, checked against the reference,
      // recorded under `name` (and name + "_pdl").
      auto measure = [&](const cuda::SparseMlaPlan& plan, const std::string& name) {
        bool use_pdl = false;
        auto launch = [&](int c, cudaStream_t s) {
          cuda::SparseMlaParams p = params(c);
          p.plan = plan;
          p.pdl = use_pdl;
          Status st = cuda::launch_sparse_mla_decode(p, s);
          if (!st.ok()) {
            std::fprintf(stderr, "launch failed: %s\n", st.to_string().c_str());
            std::exit(1);
          }
        };
        {  // ~50 ms of this case's launches: clocks up before the first timing
          const auto t_spin = std::chrono::steady_clock::now();
          for (int i = 0; std::chrono::steady_clock::now() - t_spin < std::chrono::milliseconds(50);
               ++i) {
            for (int c = 0; c < kCopies; ++c) launch(c, stream);
            DS_BENCH_CHECK(cudaStreamSynchronize(stream));
          }
        }
        int iter = 0;
        const double eager_us =
            bench::time_us([&](cudaStream_t s) { launch(iter++ % kCopies, s); }, stream, 40, 5);
        const double graph_us = bench::time_us(
                                    [&](cudaStream_t s) {
                                      for (int c = 0; c < kCopies; ++c) launch(c, s);
                                    },
                                    stream, 20, 3, true) /
                                kCopies;
        use_pdl = true;
        const double graph_pdl_us = bench::time_us(
                                        [&](cudaStream_t s) {
                                          for (int c = 0; c < kCopies; ++c) launch(c, s);
                                        },
                                        stream, 20, 3, true) /
                                    kCopies;
        use_pdl = false;
        // Correctness of this run (copy 0): first 4 queries against the CPU reference.
        DS_BENCH_CHECK(cudaMemsetAsync(d_out, 0xFF, q.size() * 2, stream));
        launch(0, stream);
        DS_BENCH_CHECK(cudaStreamSynchronize(stream));
        std::vector<uint16_t> got(q.size());
        DS_BENCH_CHECK(cudaMemcpy(got.data(), d_out, got.size() * 2, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int b = 0; b < std::min(batch, 4); ++b) {
          std::vector<std::vector<float>> kv;
          const int32_t* wt = &win.table[size_t(b) * win.pages_per_seq];
          const int32_t* ct = &cmp.table[size_t(b) * cmp.pages_per_seq];
          float vmax = 0;
          auto add = [&](const cpu::PagedKv& pkv, const int32_t* t, int idx) {
            std::vector<float> v(kDim);
            cpu::unpack_kv_entry(pkv.layout, cpu::kv_entry_data(pkv, t, idx),
                                 cpu::kv_entry_scales(pkv, t, idx), v.data());
            for (float x : v) vmax = std::max(vmax, std::fabs(x));
            kv.push_back(v);
          };
          for (int i = 0; i < kWindow; ++i) add(win.kv, wt, widx[size_t(b) * kWindow + i]);
          for (int i = 0; i < comp; ++i) add(cmp.kv, ct, cidx[size_t(b) * kTopk + i]);
          std::vector<const float*> ptrs;
          for (auto& v : kv) ptrs.push_back(v.data());
          std::vector<float> qf(size_t(kHeads) * kDim), ref(qf.size());
          for (size_t i = 0; i < qf.size(); ++i)
            qf[i] = bf16_to_float(q[size_t(b) * kHeads * kDim + i]);
          cpu::SparseAttentionParams rp;
          rp.q = qf.data();
          rp.keys = ptrs.data();
          rp.num_keys = int64_t(ptrs.size());
          rp.num_heads = kHeads;
          rp.head_dim = kDim;
          rp.softmax_scale = scale;
          rp.sink = sink.data();
          rp.out = ref.data();
          cpu::sparse_attention(rp);
          for (size_t i = 0; i < ref.size(); ++i) {
            const double g = bf16_to_float(got[size_t(b) * kHeads * kDim + i]);
            const double tol = std::ldexp(vmax, -7) + std::ldexp(std::fabs(ref[i]), -8);
            const double e = std::fabs(g - ref[i]) / tol;
            worst = std::isnan(e) ? 1e30 : std::max(worst, e);
          }
        }
        for (int g = 0; g < 3; ++g) {
          bench::Record r;
          r.kernel = g == 2 ? name + "_pdl" : name;
          r.shape = "B=" + std::to_string(batch) + " ctx=" + std::to_string(ctx) +
                    " keys=" + std::to_string(keys) + " s" + std::to_string(plan.max_splits) +
                    " h" + std::to_string(plan.heads_per_cta) + " p" +
                    std::to_string(plan.tiles_per_step) + (plan.wgmma ? " wgmma" : "") +
                    (plan.warp_specialized ? " ws" : "");
          r.mode = g ? "graph" : "eager";
          r.bytes = bytes;
          r.flops = flops;
          r.floor_us = floor_us;
          r.set_time(g == 2 ? graph_pdl_us : g ? graph_us : eager_us);
          r.error_metric = "max |err| / (2^-7 max|v| + 2^-8 |ref|), first 4 queries (<= 1 passes)";
          r.max_error = worst;
          records.push_back(r);
        }
      };
      measure(plan, "sparse_mla_decode");
      if (wgmma) {  // v7 and v9 (the producer warpgroup) side by side
        cuda::SparseMlaPlan v7 = wplan, v9 = wplan;
        v7.warp_specialized = false;
        v9.warp_specialized = true;
        measure(v7, "sparse_mla_decode_wgmma");
        measure(v9, "sparse_mla_decode_wgmma_ws");
      }
      // An alternative plan timed eagerly and in a graph (the sweeps below; results not checked).
      auto time_alt = [&](const cuda::SparseMlaPlan& alt, const char* sweep) {
        auto launch_alt = [&](int c, cudaStream_t s) {
          cuda::SparseMlaParams p = params(c);
          p.plan = alt;
          Status st = cuda::launch_sparse_mla_decode(p, s);
          if (!st.ok()) {
            std::fprintf(stderr, "launch failed: %s\n", st.to_string().c_str());
            std::exit(1);
          }
        };
        int it = 0;
        const double us =
            bench::time_us([&](cudaStream_t s) { launch_alt(it++ % kCopies, s); }, stream, 20, 3);
        const double gus = bench::time_us(
                               [&](cudaStream_t s) {
                                 for (int c = 0; c < kCopies; ++c) launch_alt(c, s);
                               },
                               stream, 10, 2, true) /
                           kCopies;
        for (int g = 0; g < 2; ++g) {
          bench::Record r;
          r.kernel = "sparse_mla_decode_alt";
          r.shape = "B=" + std::to_string(batch) + " ctx=" + std::to_string(ctx) +
                    " keys=" + std::to_string(keys) + " s" + std::to_string(alt.max_splits) + " h" +
                    std::to_string(alt.heads_per_cta) + " p" + std::to_string(alt.tiles_per_step) +
                    (alt.wgmma ? " wgmma" : "") + (alt.warp_specialized ? " ws" : "");
          r.mode = g ? "graph" : "eager";
          r.bytes = bytes;
          r.flops = flops;
          r.floor_us = floor_us;
          r.set_time(g ? gus : us);  // (the graph rows' ratio and rates used the eager time)
          r.error_metric = std::string("not checked (") + sweep + ")";
          records.push_back(r);
        }
      };
      // Tiles per step: the other value where the head group allows both (16 heads), and the
      // 16-head group with two tiles per step where the plan picked a larger group.
      if (plan.heads_per_cta == 16 && !quick) {
        cuda::SparseMlaPlan alt = plan;
        alt.tiles_per_step = 3 - plan.tiles_per_step;
        time_alt(alt, "tiles per step");
      }
      // Plan sweep: the other head-group sizes with the default split rule, to check the plan's
      // choice.
      for (int hpc : {16, 32, 64}) {
        if (hpc == plan.heads_per_cta || batch < 16 || quick) continue;
        cuda::SparseMlaPlan alt = plan;
        alt.heads_per_cta = hpc;
        alt.tiles_per_step = 1;
        time_alt(alt, "plan sweep");
        if (hpc == 16) {
          alt.tiles_per_step = 2;
          time_alt(alt, "plan sweep");
        }
      }
      // Session 43: batch <= 4 with 32 / 64 heads per CTA (one tile per step) and the splits that
      // give one CTA per SM (at most one tile each): fewer CTAs than the plan's 16-head groups
      // (batch 1: 160, two per SM on some SMs), each converting its keys for more heads.
      for (int hpc : {32, 64}) {
        if (batch > 4 || plan.wgmma || plan.heads_per_cta != 16 || quick) continue;
        cuda::SparseMlaPlan alt = plan;
        alt.heads_per_cta = hpc;
        alt.tiles_per_step = 1;
        const int64_t groups = int64_t(batch) * ((kHeads + hpc - 1) / hpc);
        alt.max_splits = int32_t(std::clamp<int64_t>(dev.sm_count / groups, 1, plan.max_tiles));
        time_alt(alt, "head groups at small batch");
      }
      // Split sweep (default head group) where the plan splits: the split rule's choice against
      // 1..16 splits (each split but the first stores fp32 partials per tile).
      for (int sp : {1, 2, 4, 8, 16}) {
        if (plan.max_splits <= 1 || sp == plan.max_splits || sp > plan.max_tiles || quick) continue;
        cuda::SparseMlaPlan alt = plan;
        alt.max_splits = sp;
        time_alt(alt, "split sweep");
      }
      // Split sweep of the sm_90a kernels, v7 and v9 (quick runs too: they are being tuned).
      for (const bool ws : {false, true})
        for (int sp : {1, 2, 4, 8, 10}) {
          if (!wgmma || sp == wplan.max_splits || sp > wplan.max_tiles || (batch >= 64 && sp > 2))
            continue;
          cuda::SparseMlaPlan alt = wplan;
          alt.warp_specialized = ws;
          alt.max_splits = sp;
          time_alt(alt, "wgmma split sweep");
        }
      for (int c = 0; c < kCopies; ++c) {
        DS_BENCH_CHECK(cudaFree(wtab[size_t(c)]));
        DS_BENCH_CHECK(cudaFree(ctab[size_t(c)]));
      }
      for (void* ptr :
           {(void*)dwin, (void*)dcmp, (void*)d_widx, (void*)d_cidx, (void*)d_wlen, (void*)d_clen,
            (void*)d_qseq, (void*)d_q, (void*)d_sink, (void*)d_out, (void*)d_lse})
        DS_BENCH_CHECK(cudaFree(ptr));
      if (d_ws) DS_BENCH_CHECK(cudaFree(d_ws));
    }
  }
  bench::write_results(out, "sparse_mla_decode", dev, copy_gbps, records);
  return 0;
}
