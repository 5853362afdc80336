// Timing experiments only (NOTES.md, session 38): with DS_SPARSE_MLA_TRACE=1 the mma.sync kernel's
// batch-1 plan launches (one query, 40 splits of one tile per CTA) record %globaltimer stamps of each CTA's
// phases and of each combine block, per launch, into a device ring; the host dumps the ring to the
// file named by DS_MLA_TRACE_OUT when a launch with more than one query follows (the bench's next
// batch), and scripts/gpu/h_s38/trace_b1.py summarizes it. 0 in every real build.
#pragma once

#ifndef DS_SPARSE_MLA_TRACE
#define DS_SPARSE_MLA_TRACE 0
#endif

#if DS_SPARSE_MLA_TRACE
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace ds::cuda::mla_trace {

constexpr int kSplits = 40;     // the batch-1 plan's split count (other plans: not recorded)
constexpr int kRing = 512;      // launches kept
constexpr int kCtas = 160;      // attention CTAs recorded per launch (40 splits x 4 head groups)
constexpr int kStamps = 8;      // attention stamps per CTA
constexpr int kBlocks = 64;     // combine blocks recorded per launch (one per head)
constexpr int kCStamps = 4;     // combine stamps per block
__device__ unsigned int g_gen = 0;  // launches so far (the combine's block 0 advances it)
__device__ unsigned long long g_att[kRing][kCtas][kStamps];
__device__ int4 g_att_meta[kRing][kCtas];  // {sm, keys, pdl, gen}
__device__ unsigned long long g_comb[kRing][kBlocks][kCStamps];
__device__ int2 g_comb_meta[kRing][kBlocks];  // {sm, gen}

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ int smid() {
  int s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
__device__ __forceinline__ unsigned int gen() {
  return *reinterpret_cast<volatile unsigned int*>(&g_gen);
}

// A combine block's stamps (thread 0): 0 entry, 1 after the wait for the partials, 2 merged,
// 3 stored; block (q 0, head 0) advances the launch counter at its end.
struct CombineTrace {
  bool on = false;
  unsigned int gen = 0;
  unsigned long long t[kCStamps] = {};
  __device__ void begin(bool traced) {
    on = traced && threadIdx.x == 0 && gridDim.y <= unsigned(kBlocks);
    if (on) {
      t[0] = now();
      gen = mla_trace::gen();
    }
  }
  __device__ void stamp(int k) {
    if (on) t[k] = now();
  }
  __device__ void end() {
    if (!on) return;
    t[3] = now();
    const int slot = int(gen % unsigned(kRing));
    const int h = int(blockIdx.y);
    for (int k = 0; k < kCStamps; ++k) g_comb[slot][h][k] = t[k];
    g_comb_meta[slot][h] = make_int2(smid(), int(gen));
    if (h == 0) atomicAdd(&g_gen, 1u);  // the next launch's ring slot
  }
};

// Host: the ring to `path` (one line per CTA / block with stamps), then the counter reset.
inline void dump(const char* path) {
  if (!path) return;
  cudaDeviceSynchronize();
  std::vector<unsigned long long> att(size_t(kRing) * kCtas * kStamps);
  std::vector<int4> meta(size_t(kRing) * kCtas);
  std::vector<unsigned long long> comb(size_t(kRing) * kBlocks * kCStamps);
  std::vector<int2> cmeta(size_t(kRing) * kBlocks);
  cudaMemcpyFromSymbol(att.data(), g_att, att.size() * sizeof(att[0]));
  cudaMemcpyFromSymbol(meta.data(), g_att_meta, meta.size() * sizeof(meta[0]));
  cudaMemcpyFromSymbol(comb.data(), g_comb, comb.size() * sizeof(comb[0]));
  cudaMemcpyFromSymbol(cmeta.data(), g_comb_meta, cmeta.size() * sizeof(cmeta[0]));
  FILE* f = std::fopen(path, "a");
  if (!f) return;
  for (int s = 0; s < kRing; ++s) {
    for (int c = 0; c < kCtas; ++c) {
      const int4 m = meta[size_t(s) * kCtas + c];
      if (m.y <= 0) continue;
      std::fprintf(f, "A %d %d %d %d %d", m.w, c, m.x, m.y, m.z);
      for (int k = 0; k < kStamps; ++k)
        std::fprintf(f, " %llu", att[(size_t(s) * kCtas + c) * kStamps + k]);
      std::fprintf(f, "\n");
    }
    for (int b = 0; b < kBlocks; ++b) {
      const int2 m = cmeta[size_t(s) * kBlocks + b];
      if (m.x < 0 || comb[(size_t(s) * kBlocks + b) * kCStamps] == 0) continue;
      std::fprintf(f, "C %d %d %d", m.y, b, m.x);
      for (int k = 0; k < kCStamps; ++k)
        std::fprintf(f, " %llu", comb[(size_t(s) * kBlocks + b) * kCStamps + k]);
      std::fprintf(f, "\n");
    }
  }
  std::fprintf(f, "E\n");
  std::fclose(f);
  std::vector<unsigned long long> zero(att.size(), 0);
  cudaMemcpyToSymbol(g_att, zero.data(), zero.size() * sizeof(zero[0]));
  std::vector<int4> zmeta(meta.size(), int4{0, 0, 0, 0});
  cudaMemcpyToSymbol(g_att_meta, zmeta.data(), zmeta.size() * sizeof(zmeta[0]));
  std::vector<unsigned long long> zc(comb.size(), 0);
  cudaMemcpyToSymbol(g_comb, zc.data(), zc.size() * sizeof(zc[0]));
  unsigned int z = 0;
  cudaMemcpyToSymbol(g_gen, &z, sizeof(z));
}

}  // namespace ds::cuda::mla_trace
#endif  // DS_SPARSE_MLA_TRACE
