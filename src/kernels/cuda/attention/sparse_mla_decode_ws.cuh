// sm_90a path, v9 (NOTES.md): v7's tile math (sparse_mla_decode_wgmma.cuh) run by two consumer
// warpgroups, with the copies and the dequantization moved to a third, producer warpgroup, so
// they overlap the consumers' tensor work instead of running between their barriers. Included by
// sparse_mla_decode.cu after sparse_mla_decode_wgmma.cuh, inside its anonymous namespace.
//
// CTA (key split, query, group of 64 heads) = 3 warpgroups, 384 threads, ~226 KB of shared
// memory, one CTA per SM:
//   - producer (warpgroup 2, 72 registers): resolves indices and page-table entries (every 10
//     tiles), copies each tile's 64 entries in chunks of 8 (cp.async, four chunk stages: three
//     chunks in flight while one is dequantized; the next tile's entries prefetched to L2), and
//     dequantizes them into one of two bf16 tiles; an mbarrier per tile says "full" (128 producer
//     arrivals, after a generic-to-async proxy fence) and one says "empty" (256 consumer
//     arrivals, after their last wgmma on the tile);
//   - consumers (warpgroups 0-1, 216 registers): v7's consume_tile on the full tile with PV in
//     32-dim chunks (32 accumulator registers fewer), their two exchanges closed by a barrier of
//     the 256 consumer threads.
// Same arithmetic in the same order as v7: the bits are v7's (tests), whatever the split count.

// Timing experiments only (NOTES.md v9), 0 in every real build: 1 skips the producer's
// conversion (the tiles keep whatever they held), 2 the consumers' tile math (they only wait and
// release), 3 the producer's copies, 4 its L2 prefetch of the next tile.
#ifndef DS_SPARSE_MLA_WS_ABLATE
#define DS_SPARSE_MLA_WS_ABLATE 0
#endif

namespace wsp {

constexpr int kConsumerThreads = 256;  // warpgroups 0-1 (= wgp::kThreads: v7's consumer code)
constexpr int kProducerThreads = 128;  // warpgroup 2
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kChunkKeys = 8;  // keys per copy stage
constexpr int kStages = 4;     // copy stages: kStages - 1 chunks in flight while one converts
constexpr int kChunks = wgp::kKeys / kChunkKeys;
constexpr int kRawStride = wgp::kStageStride;  // 592: rows 16 bytes apart mod 128
constexpr int kRawStageBytes = kChunkKeys * (kRawStride + 8);
constexpr int kResolveIters = (wgp::kAddrKeys + kProducerThreads - 1) / kProducerThreads;
constexpr int kOffQ = 0;
constexpr int kOffKv = kOffQ + wgp::kTileBytes;  // two bf16 tiles
constexpr int kOffP = kOffKv + 2 * wgp::kTileBytes;
constexpr int kOffRaw = kOffP + wgp::kBlockBytes;  // kStages chunk stages
constexpr int kOffStat = kOffRaw + kStages * kRawStageBytes;
constexpr int kOffValid = kOffStat + 4 * wgp::kHeads * 4;  // [tile buffer][key]: 1 = key exists
constexpr int kOffBar = kOffValid + 2 * wgp::kKeys;        // full[2], empty[2]
constexpr int kOffAddr = kOffBar + 4 * 8;
constexpr int kSmemBytes = 1024 + kOffAddr + wgp::kAddrKeys * 8;  // + 1024: base alignment
static_assert(kOffQ == wgp::kOffQ, "make_consumer reads q at wgp::kOffQ");
static_assert(kConsumerThreads == wgp::kThreads, "consumers run v7's consume_tile");
static_assert(kSmemBytes <= 227 * 1024, "sm_90: at most 227 KB of shared memory per CTA");
// setmaxnreg: 2 x 216 + 72 = 504 registers per thread triple = 3 x 168, what the launch allocates
// (a warpgroup's increase is served by the others' decreases within the CTA).
constexpr int kConsumerRegs = 216;
constexpr int kProducerRegs = 72;
static_assert(2 * kConsumerRegs + kProducerRegs <= 3 * (65536 / kThreads / 8 * 8),
              "setmaxnreg: the consumers' increase must come from the producer's decrease");

#if DS_SPARSE_MLA_WGMMA_PATH
__device__ __forceinline__ void consumer_bar() {
  asm volatile("bar.sync 3, 256;\n" ::: "memory");
}
__device__ __forceinline__ void producer_bar() {
  asm volatile("bar.sync 4, 128;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(dst)), "l"(src));
}
// `bytes` (a multiple of 16, 16-byte aligned) from global memory into L2.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
#endif  // DS_SPARSE_MLA_WGMMA_PATH

}  // namespace wsp

__global__ void __launch_bounds__(wsp::kThreads, 1)
    sparse_mla_decode_ws_kernel(const SparseMlaParams p) {
#if DS_SPARSE_MLA_WGMMA_PATH
  using namespace wgp;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint8_t* valid = smem + wsp::kOffValid;
  const uint32_t bar_full = smem_addr(smem + wsp::kOffBar);  // full[b] at + 8 b
  const uint32_t bar_empty = bar_full + 16;                  // empty[b] at + 8 b

  const int split = blockIdx.x;
  const int q = blockIdx.y;
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(bar_full + 8 * b, wsp::kProducerThreads);
      mbar_init(bar_empty + 8 * b, wsp::kConsumerThreads);
    }
  }
  __syncthreads();
  if (p.pdl || fast_combine(p)) pdl_wait_then_trigger();
  const QuerySplit qs = query_split<kKeys>(p, q);
  if (split >= qs.splits) return;
  const int t_begin = split_begin(qs, split);
  const int t_end = split_begin(qs, split + 1);

  if (tid >= wsp::kConsumerThreads) {
    // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(wsp::kProducerRegs));
    const int pt = tid - wsp::kConsumerThreads;
    const int pe = pt >> 4, pj = pt & 15;  // entry of an 8-key chunk, 16-byte piece lane
    uint8_t* raw = smem + wsp::kOffRaw;
    int2* addr = reinterpret_cast<int2*>(smem + wsp::kOffAddr);
    const int wn = p.window_len[q];
    const int seq = p.query_seq[q];

    // Chunk `sub` of tile t into stage st: thread (pe, pj) copies 16-byte pieces pj and pj + 16
    // of its entry (the 36 pieces: 448 e4m3 dims, then 64 bf16 rope dims), piece 32 + pj for
    // pj < 4 and, for pj == 4, the entry's 8 scale bytes.
    auto issue = [&](int t, int c0, int sub, int st) {
      const int2 a = addr[(t - c0) * kKeys + wsp::kChunkKeys * sub + pe];
      if (a.x < 0 || DS_SPARSE_MLA_WS_ABLATE == 3) return;
      int slot, page_size;
      const uint8_t* page_ptr = kv_page_of(p, a, slot, page_size);
      const uint8_t* data = page_ptr + int64_t(slot) * kDataBytes;
      uint8_t* dst = raw + st * wsp::kRawStageBytes + pe * wsp::kRawStride;
      cp_async16(dst + 16 * pj, data + 16 * pj);
      cp_async16(dst + 16 * (pj + 16), data + 16 * (pj + 16));
      if (pj < 4)
        cp_async16(dst + 16 * (32 + pj), data + 16 * (32 + pj));
      else if (pj == 4)
        wsp::cp_async8(raw + st * wsp::kRawStageBytes + wsp::kChunkKeys * wsp::kRawStride + pe * 8,
                       page_ptr + int64_t(page_size) * kDataBytes + int64_t(slot) * kScaleBytes);
    };
    // Chunk `sub` of tile t (stage st) -> rows [8 sub, 8 sub + 8) of the bf16 tile kv: thread
    // (pe, pj) converts e4m3 pieces pj and pj + 16 (< 28) and copies rope piece 28 + pj (pj < 8);
    // zeros for a missing key (its P is 0, and 0 x NaN would poison the output). Every shared
    // load first, then the conversions and stores.
    auto convert = [&](int t, int c0, int sub, int st, uint8_t* kv) {
      const int row = wsp::kChunkKeys * sub + pe;
      const bool ok = addr[(t - c0) * kKeys + row].x >= 0;
      const uint8_t* src = raw + st * wsp::kRawStageBytes + pe * wsp::kRawStride;
      const bool two = pj < 12, rope = pj < 8;
      uint2 sw = make_uint2(0, 0);
      uint4 w0 = make_uint4(0, 0, 0, 0), w1 = w0, r = w0;
      if (ok) {
        sw = *reinterpret_cast<const uint2*>(raw + st * wsp::kRawStageBytes +
                                             wsp::kChunkKeys * wsp::kRawStride + pe * 8);
        w0 = *reinterpret_cast<const uint4*>(src + 16 * pj);
        if (two) w1 = *reinterpret_cast<const uint4*>(src + 16 * (pj + 16));
        if (rope) r = *reinterpret_cast<const uint4*>(src + kNope + 16 * pj);
      }
      auto put = [&](int pc, const uint4& w) {  // e4m3 dims [16 pc, 16 pc + 16), scale block pc / 4
        const int blk = pc >> 2;
        uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
        if (ok) {
          const uint32_t sbyte = ((blk < 4 ? sw.x : sw.y) >> (8 * (blk & 3))) & 0xFFu;
          const float scale = __uint_as_float(sbyte << 23);  // 2^(byte - 127)
          lo = e4m3x8_to_bf16x8(w.x, w.y, scale);
          hi = e4m3x8_to_bf16x8(w.z, w.w, scale);
        }
        *reinterpret_cast<uint4*>(kv + blk * kBlockBytes + swz(row, 2 * (pc & 3))) = lo;
        *reinterpret_cast<uint4*>(kv + blk * kBlockBytes + swz(row, 2 * (pc & 3) + 1)) = hi;
      };
      put(pj, w0);
      if (two) put(pj + 16, w1);
      if (rope) *reinterpret_cast<uint4*>(kv + 7 * kBlockBytes + swz(row, pj)) = r;
    };

    int n_tile = 0;  // tiles of this CTA dequantized so far: buffer n_tile & 1, use n_tile >> 1
    for (int c0 = t_begin; c0 < t_end; c0 += kAddrTiles) {
      const int c1 = min(t_end, c0 + kAddrTiles);
      wsp::producer_bar();  // the previous chunk's readers of addr are done
      resolve_addresses<kKeys, wsp::kProducerThreads, wsp::kResolveIters>(p, q, seq, wn, qs.n, c0,
                                                                          c1, pt, addr);
      wsp::producer_bar();
      const int n = (c1 - c0) * wsp::kChunks;
      // Chunks k + 1 .. k + kStages - 1 in flight while chunk k is converted.
      for (int k = 0; k < wsp::kStages - 1; ++k) {
        if (k < n) issue(c0 + k / wsp::kChunks, c0, k % wsp::kChunks, k);
        cp_async_commit();
      }
      for (int k = 0; k < n; ++k) {
        const int t = c0 + k / wsp::kChunks, sub = k % wsp::kChunks, st = k % wsp::kStages;
        const int k2 = k + wsp::kStages - 1;  // its stage held chunk k - 1, converted already
        if (k2 < n) issue(c0 + k2 / wsp::kChunks, c0, k2 % wsp::kChunks, k2 % wsp::kStages);
        cp_async_commit();
        if (DS_SPARSE_MLA_WS_ABLATE != 4 && sub == 0 && t + 1 < c1 && pt < kKeys) {
          // the next tile's entries into L2
          const int2 a = addr[(t + 1 - c0) * kKeys + pt];
          if (a.x >= 0) {
            int slot, page_size;
            const uint8_t* page_ptr = kv_page_of(p, a, slot, page_size);
            wsp::prefetch_l2(page_ptr + int64_t(slot) * kDataBytes, kDataBytes);
          }
        }
        cp_async_wait<wsp::kStages - 1>();  // this thread's pieces of chunk k have landed
        wsp::producer_bar();                // ... and every other thread's
        const int buf = n_tile & 1;
        uint8_t* kv = smem + wsp::kOffKv + buf * kTileBytes;
        if (sub == 0) {
          // The consumers' last use of this buffer (tile n_tile - 2) is done.
          if (n_tile >= 2) mbar_wait(bar_empty + 8 * buf, uint32_t((n_tile >> 1) - 1) & 1u);
          if (pt < kKeys) valid[buf * kKeys + pt] = addr[(t - c0) * kKeys + pt].x >= 0 ? 1 : 0;
        }
        if (DS_SPARSE_MLA_WS_ABLATE != 1) convert(t, c0, sub, st, kv);
        if (sub == wsp::kChunks - 1) {
          fence_proxy_async();  // the tile for the consumers' wgmma
          mbar_arrive(bar_full + 8 * buf);
          ++n_tile;
        }
        wsp::producer_bar();  // stage st is free for chunk k + kStages
      }
    }
    cp_async_wait<0>();
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(wsp::kConsumerRegs));
  const Consumer c =
      make_consumer(p, smem, wsp::kOffP, wsp::kOffStat, tid, q, blockIdx.z * kHeads, split == 0);
  load_q(p, q, c.h0, tid, smem + wsp::kOffQ);
  Fold f;
  clear_fold(f);
  fence_proxy_async();  // q for the tensor cores
  wsp::consumer_bar();
  const uint32_t kv_base = smem_addr(smem + wsp::kOffKv);
  for (int t = t_begin; t < t_end; ++t) {
    const int j = t - t_begin, buf = j & 1;
    mbar_wait(bar_full + 8 * buf, uint32_t(j >> 1) & 1u);
    const uint8_t* vld = valid + buf * kKeys;
    if (DS_SPARSE_MLA_WS_ABLATE != 2)
      consume_tile<32>(
          p, c, t, kv_base + uint32_t(buf * kTileBytes), [&](int key) { return vld[key] != 0; },
          [] { wsp::consumer_bar(); }, f);
    mbar_arrive(bar_empty + 8 * buf);  // this thread's wgmma on the buffer are complete
  }
  finish(p, c, q, qs, f);
#else
  __trap();  // launched only on sm_90 devices (sparse_mla_wgmma_available)
#endif  // DS_SPARSE_MLA_WGMMA_PATH
}
