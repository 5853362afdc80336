// sm_90a path, v9 (NOTES.md): v7's tile math (sparse_mla_decode_wgmma.cuh) run by two consumer
// warpgroups, with the copies and the dequantization moved to a third, producer warpgroup, so
// they overlap the consumers' tensor work instead of running between their barriers. Included by
// sparse_mla_decode.cu after sparse_mla_decode_wgmma.cuh, inside its anonymous namespace.
//
// CTA (key split, query, group of 64 heads) = 3 warpgroups, 384 threads, ~207 KB of shared
// memory, one CTA per SM:
//   - producer (warpgroup 2, 72 registers): resolves indices and page-table entries (every 10
//     tiles), then dequantizes in place: thread (h, e) owns entry e of every tile and its column
//     blocks h, h + 2, h + 4, h + 6 (block 7 = the bf16 rope). It copies block b's 64 e4m3 bytes
//     (cp.async, L2 evict-first) into the first half of the bf16 row they become, and the entry's
//     scale word next to them, waits for its own copies only, then converts the row in registers
//     and writes it over them; the rope block is copied to its final place. So a whole tile
//     (37 KB) is in flight at once, no staging ring, and no producer barrier per chunk. Two bf16
//     tiles, with an mbarrier pair per column block: "full" (its 64 converting producer threads,
//     after a generic-to-async proxy fence) and "empty" (the 128 threads of the consumer
//     warpgroup whose PV reads it last, after their last wgmma on it). A tile's copies go out in
//     four commit groups (one per block of the thread), each converted when it lands; the second
//     tile's go out before the first tile's conversion;
//   - consumers (warpgroups 0-1, 216 registers): v7's tile math with PV in 32-dim chunks (32
//     accumulator registers fewer) and P taken from registers (DS_SPARSE_MLA_WS_PV_RS), their two
//     exchanges closed by a barrier of the 256 consumer threads; QK^T waits for each block's full
//     barrier before its wgmma.
// Same arithmetic in the same order as v7: the bits are v7's (tests), whatever the split count.
// Per-block barriers (DS_SPARSE_MLA_WS_BLOCKBAR = 2, the default since session 36): each column
// block of a tile buffer has its own full and empty barrier, so the consumers' QK^T starts on a
// block as soon as it is converted and the producer refills a block as soon as its PV is done.
// The producer's conversion units run in a loop, not unrolled (DS_SPARSE_MLA_WS_UNITLOOP = 1,
// the default since session 36). Variants (NOTES.md v9, sessions 34-37): DS_SPARSE_MLA_WS_BLOCKBAR
// 0 / 1, _PINGPONG, _UNITLOOP 0, _PV_RS 0 (session 34's _PIPE, session 35's _FIRST, session 36's
// _BACKOFF and rolled copy issue, and session 37's early copy issue and paired units measured no
// faster and were removed).

// Timing experiments only (NOTES.md v9), 0 in every real build: 1 skips the producer's
// conversion (the tiles keep whatever they held), 2 the consumers' tile math (they only wait and
// release), 3 the producer's copies.
#ifndef DS_SPARSE_MLA_WS_ABLATE
#define DS_SPARSE_MLA_WS_ABLATE 0
#endif

// 0: one full and one empty barrier per tile buffer; 1: an empty barrier per column block of
// each tile buffer: the producer copies block b of the next tile as soon as the consumers' PV no
// longer reads it; 2 (default): also a full barrier per block (NOTES.md v9, sessions 34-36).
#ifndef DS_SPARSE_MLA_WS_BLOCKBAR
#define DS_SPARSE_MLA_WS_BLOCKBAR 2
#endif
static_assert(!(DS_SPARSE_MLA_WS_BLOCKBAR && DS_SPARSE_MLA_WS_ABLATE),
              "the ablations are written for whole-tile barriers: build with "
              "DS_SPARSE_MLA_WS_BLOCKBAR=0");
// 1: ping-pong consumers (NOTES.md v9, session 34): warpgroup w owns the tiles t = w mod 2 of
// the CTA's sequence: it runs their QK^T alone (m64n64: q read once per 64 keys) and their
// softmax (no max exchange), hands P and (m, l) over through shared memory (a P buffer and an
// mbarrier per tile buffer), and both warpgroups run PV over their 256 dims of every tile in
// tile order with P in registers (ldmatrix from the P buffer, once per tile). A warpgroup
// runs its own tile's QK^T and softmax before the PV of the pair's first tile, so the two
// warpgroups' QK^T overlap. The same arithmetic in the same order as v7 (the bits are v7's).
#ifndef DS_SPARSE_MLA_WS_PINGPONG
#define DS_SPARSE_MLA_WS_PINGPONG 0
#endif
static_assert(!(DS_SPARSE_MLA_WS_PINGPONG &&
                (DS_SPARSE_MLA_WS_BLOCKBAR || DS_SPARSE_MLA_WS_ABLATE)),
              "the ping-pong consumers are written with whole-tile barriers only: build with "
              "DS_SPARSE_MLA_WS_BLOCKBAR=0");

// 1 (default): the producer's conversion loop over its 4 column-block units is not unrolled: one
// copy of the unit's code instead of four, so the first tile's conversion fetches the code once
// (a CTA starts with a cold instruction cache while the start's copies load L2 and HBM; the
// unrolled form's first conversion took ~3x the steady state's). 0: unrolled. (Rolling the
// copy-issue loop as well measured slower and was removed.) NOTES.md v9, session 36.
#ifndef DS_SPARSE_MLA_WS_UNITLOOP
#define DS_SPARSE_MLA_WS_UNITLOOP 1
#endif

// 1 (default with the per-block barriers): PV takes P from registers (ldmatrix of the shared P
// tile once per tile, then wgmma with A in registers: each PV wgmma reads 1 KB of V instead of
// 2 KB of P and 1 KB of V), and P needs no proxy fence. H100, sessions 33 and 37: -2 to -2.5% at
// batch 16, -1% at 64, 0 at 128 (there the producer paces the consumers); the bits are v7's.
// 0: P from shared memory (NOTES.md v9, session 37).
#ifndef DS_SPARSE_MLA_WS_PV_RS
#define DS_SPARSE_MLA_WS_PV_RS (DS_SPARSE_MLA_WS_BLOCKBAR != 0)
#endif
static_assert(!DS_SPARSE_MLA_WS_PV_RS || DS_SPARSE_MLA_WS_BLOCKBAR,
              "DS_SPARSE_MLA_WS_PV_RS is written for the per-block barriers' consumer loop");

// N > 0: CTA (0, 0, 0) of the first launch with N queries records clock64() stamps of its phases
// (consumer threads 0 and 128, producer thread 256); a kernel launched after it prints them (timing
// experiments only; scripts/gpu/h_s33/trace_summary.py reads them).
#ifndef DS_SPARSE_MLA_WS_TRACE
#define DS_SPARSE_MLA_WS_TRACE 0
#endif
#if DS_SPARSE_MLA_WS_TRACE
constexpr int kTraceUnits = 226;  // producer stamps of the first two tiles' conversion units
__device__ unsigned int g_ws_trace_once = 0;
__device__ long long g_ws_trace[3][256];  // [consumer wg 0, consumer wg 1, producer][stamp]
#define DS_WS_STAMP(row, k)                      \
  do {                                           \
    if (tracing) g_ws_trace[row][k] = clock64(); \
  } while (0)
// Printed by a kernel of its own after v9's launch: a printf inside v9 is a function call, and
// ptxas then serializes every wgmma of the kernel (C7510), which would distort what is timed.
__device__ unsigned int g_ws_trace_printed = 0;
__global__ void sparse_mla_ws_trace_print_kernel() {
  if (g_ws_trace_once == 0 || atomicAdd(&g_ws_trace_printed, 1u) != 0) return;
  for (int row = 0; row < 3; ++row)
    for (int k = 0; k < 256; ++k)
      if (g_ws_trace[row][k] != 0) printf("wstrace %d %d %lld\n", row, k, g_ws_trace[row][k]);
}
#else
#define DS_WS_STAMP(row, k) \
  do {                      \
  } while (0)
#endif

namespace wsp {

constexpr int kConsumerThreads = 256;  // warpgroups 0-1 (= wgp::kThreads: v7's consumer code)
constexpr int kProducerThreads = 128;  // warpgroup 2
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kUnits = 4;  // column blocks per producer thread and tile (8 blocks x 64 keys / 128)
constexpr int kResolveIters = (wgp::kAddrKeys + kProducerThreads - 1) / kProducerThreads;
constexpr int kOffQ = 0;
constexpr int kOffKv = kOffQ + wgp::kTileBytes;  // two bf16 tiles
constexpr int kOffP = kOffKv + 2 * wgp::kTileBytes;
constexpr int kPBuffers = DS_SPARSE_MLA_WS_PINGPONG ? 2 : 1;    // P per tile buffer (ping-pong)
constexpr int kOffStat = kOffP + kPBuffers * wgp::kBlockBytes;  // ping-pong: (m, l)[buf][64]
constexpr int kOffValid = kOffStat + 4 * wgp::kHeads * 4;  // [tile buffer][key]: 1 = key exists
// Barriers per tile buffer: one per column block, or one for the whole tile.
constexpr int kFullBars = DS_SPARSE_MLA_WS_BLOCKBAR == 2 ? 8 : 1;
constexpr int kEmptyBars = DS_SPARSE_MLA_WS_BLOCKBAR ? 8 : 1;
constexpr int kOffBar = kOffValid + 2 * wgp::kKeys;  // full[2][kFullBars], empty[2][kEmptyBars]
constexpr int kPReadyBars = DS_SPARSE_MLA_WS_PINGPONG ? 2 : 0;  // "P of tile buffer b is out"
constexpr int kOffAddr = kOffBar + (2 * (kFullBars + kEmptyBars) + kPReadyBars) * 8;
constexpr int kSmemBytes = 1024 + kOffAddr + wgp::kAddrKeys * 8;  // + 1024: base alignment
static_assert(kOffQ == wgp::kOffQ, "make_consumer reads q at wgp::kOffQ");
static_assert(kConsumerThreads == wgp::kThreads, "consumers run v7's consume_tile");
static_assert(kUnits * kProducerThreads == 8 * wgp::kKeys && kProducerThreads == 2 * wgp::kKeys,
              "producer thread (h, e): entry e of 64, column blocks h + 2 i of 8");
static_assert(kSmemBytes <= 227 * 1024, "sm_90: at most 227 KB of shared memory per CTA");
// setmaxnreg: 2 x 216 + 72 = 504 registers per thread triple <= 3 x 168, what the launch allocates
// (a warpgroup's increase is served by the others' decreases within the CTA).
constexpr int kConsumerRegs = DS_SPARSE_MLA_WS_PV_RS     ? 216
                              : DS_SPARSE_MLA_WS_BLOCKBAR ? 200
                              : DS_SPARSE_MLA_WS_PINGPONG ? 216
                                                          : 208;
// The per-block waits spilled at 80 producer registers with the units unrolled (72 is enough
// with UNITLOOP 1), the ping-pong consumers at 208, the P fragments (DS_SPARSE_MLA_WS_PV_RS) at 208.
constexpr int kProducerRegs = DS_SPARSE_MLA_WS_PV_RS     ? 72
                              : DS_SPARSE_MLA_WS_BLOCKBAR ? 96
                              : DS_SPARSE_MLA_WS_PINGPONG ? 72
                                                          : 80;
static_assert(2 * kConsumerRegs + kProducerRegs <= 3 * (65536 / kThreads / 8 * 8),
              "setmaxnreg: the consumers' increase must come from the producer's decrease");

#if DS_SPARSE_MLA_WGMMA_PATH
__device__ __forceinline__ void consumer_bar() {
  asm volatile("bar.sync 3, 256;\n" ::: "memory");
}
__device__ __forceinline__ void producer_bar() {
  asm volatile("bar.sync 4, 128;\n" ::: "memory");
}
// cp.async.wait_group `pending` (0..7) that also orders the compiler's later shared loads after
// it: the producer reads its own copies with no barrier in between.
__device__ __forceinline__ void copies_landed(int pending) {
  // clang-format off
#define DS_WS_WAIT(n) case n: asm volatile("cp.async.wait_group " #n ";\n" ::: "memory"); break;
  switch (pending) {
    DS_WS_WAIT(0) DS_WS_WAIT(1) DS_WS_WAIT(2) DS_WS_WAIT(3)
    DS_WS_WAIT(4) DS_WS_WAIT(5) DS_WS_WAIT(6) DS_WS_WAIT(7)
  }
#undef DS_WS_WAIT
  // clang-format on
}
// The producer's KV copies carry an L2 evict-first policy: each entry is read once per query, so
// the stream replaces itself in L2 rather than what the kernel and its neighbours reuse (q, out,
// indices, the split partials): -4.3% at batch 128 / 32K on H100 (NOTES.md v9, session 35).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void cp_async16_hint(void* dst, const void* src, uint64_t pol) {
  asm volatile(
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
      "l"(src), "l"(pol));
}
__device__ __forceinline__ void cp_async4_hint(void* dst, const void* src, uint64_t pol) {
  asm volatile(
      "cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)),
      "l"(src), "l"(pol));
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
  // full[buf][k] at bar_full + 8 (kNf buf + k), empty[buf][k] at bar_empty + 8 (kNe buf + k)
  constexpr int kNf = wsp::kFullBars, kNe = wsp::kEmptyBars;
  const uint32_t bar_full = smem_addr(smem + wsp::kOffBar);
  const uint32_t bar_empty = bar_full + 2 * kNf * 8;
  const uint32_t bar_pready = bar_empty + 2 * kNe * 8;  // ping-pong: pready[buf]

  const int split = blockIdx.x;
  const int q = blockIdx.y;
  const int tid = threadIdx.x;

#if DS_SPARSE_MLA_WS_TRACE
  __shared__ int trace_flag;
  if (tid == 0)
    trace_flag = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 &&
                 p.num_queries == DS_SPARSE_MLA_WS_TRACE && atomicAdd(&g_ws_trace_once, 1u) == 0;
#endif
  if (tid == 0) {
    // Per block: its 64 converting producer threads, the 128 threads of the warpgroup whose PV
    // reads it last.
    for (int b = 0; b < 2 * kNf; ++b)
      mbar_init(bar_full + 8 * b, wsp::kProducerThreads / (kNf > 1 ? 2 : 1));
    for (int b = 0; b < 2 * kNe; ++b)
      mbar_init(bar_empty + 8 * b, wsp::kConsumerThreads / (kNe > 1 ? 2 : 1));
    for (int b = 0; b < wsp::kPReadyBars; ++b)
      mbar_init(bar_pready + 8 * b, wsp::kConsumerThreads / 2);  // the owner warpgroup
  }
  __syncthreads();
#if DS_SPARSE_MLA_WS_TRACE
  const bool tracing = trace_flag && (tid == 0 || tid == 128 || tid == 256);
  const int trow = tid >> 7;
#endif
  if (p.pdl || fast_combine(p)) pdl_wait_then_trigger();
  const QuerySplit qs = query_split<kKeys>(p, q);
  if (split >= qs.splits) return;
  const int t_begin = split_begin(qs, split);
  const int t_end = split_begin(qs, split + 1);

  if (tid >= wsp::kConsumerThreads) {
    // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(wsp::kProducerRegs));
    DS_WS_STAMP(trow, 0);
    const int pt = tid - wsp::kConsumerThreads;
    // Entry e of every tile, column blocks h + 2 i (i < 4). A warp holds 32 consecutive entries of
    // one block: its rows' 16-byte pieces fall on distinct banks under the swizzle.
    const int e = pt & (kKeys - 1), h = pt >> 6;
    int2* addr = reinterpret_cast<int2*>(smem + wsp::kOffAddr);
    const int wn = p.window_len[q];
    const int seq = p.query_seq[q];

    const uint64_t kv_policy = wsp::evict_first_policy();
    int n_tile = 0;  // tiles of this CTA dequantized so far: buffer n_tile & 1, use n_tile >> 1
    for (int c0 = t_begin; c0 < t_end; c0 += kAddrTiles) {
      const int c1 = min(t_end, c0 + kAddrTiles);
      wsp::producer_bar();  // the previous chunk's readers of addr are done
      resolve_addresses<kKeys, wsp::kProducerThreads, wsp::kResolveIters>(p, q, seq, wn, qs.n, c0,
                                                                          c1, pt, addr);
      wsp::producer_bar();
      DS_WS_STAMP(trow, 1);
      // Tile t's copies: block b's e4m3 bytes into pieces 0-3 of its bf16 row, the scale word
      // into piece 4; the rope (b = 7) to its place. One commit group per block. wait_parity >= 0
      // (per-block barriers): each block waits for the consumers to free it first.
      auto issue = [&](int t, int bi, int wait_parity) {
        uint8_t* kv = smem + wsp::kOffKv + bi * kTileBytes;
        const int2 a = addr[(t - c0) * kKeys + e];
        const bool ok = a.x >= 0 && DS_SPARSE_MLA_WS_ABLATE != 3;
        const uint8_t* data = nullptr;
        const uint8_t* scales = nullptr;
        if (ok) {
          int slot, page_size;
          const uint8_t* page_ptr = kv_page_of(p, a, slot, page_size);
          data = page_ptr + int64_t(slot) * kDataBytes;
          scales = page_ptr + int64_t(page_size) * kDataBytes + int64_t(slot) * kScaleBytes;
        }
#pragma unroll
        for (int i = 0; i < wsp::kUnits; ++i) {
          const int b = 2 * i + h;
          uint8_t* row = kv + b * kBlockBytes;
          if (kNe > 1 && wait_parity >= 0)
            mbar_wait(bar_empty + 8 * (kNe * bi + b), uint32_t(wait_parity));
          if (ok) {
            if (b < 7) {
#pragma unroll
              for (int c = 0; c < 4; ++c)
                wsp::cp_async16_hint(row + swz(e, c), data + 64 * b + 16 * c, kv_policy);
              wsp::cp_async4_hint(row + swz(e, 4), scales + 4 * (b >> 2), kv_policy);
            } else {
#pragma unroll
              for (int c = 0; c < 8; ++c)
                wsp::cp_async16_hint(row + swz(e, c), data + kNope + 16 * c, kv_policy);
            }
          }
          cp_async_commit();
        }
      };
      // Block b of tile t once its group has landed (this thread's own copies only, so no
      // barrier); `later`: the next tile's groups were committed after this tile's. Zeros for a
      // missing key (its P is 0, and 0 x NaN would poison the output).
      // Per-block barriers: each block is handed to the consumers as soon as it is converted.
      auto convert = [&](bool later, int t, int bi) {
        uint8_t* kv = smem + wsp::kOffKv + bi * kTileBytes;
        const bool ok = addr[(t - c0) * kKeys + e].x >= 0;
#if DS_SPARSE_MLA_WS_UNITLOOP
#pragma unroll 1
#else
#pragma unroll
#endif
        for (int i = 0; i < wsp::kUnits; ++i) {
          const int b = 2 * i + h;
          uint8_t* row = kv + b * kBlockBytes;
          // Trace: the first two tiles' units, 3 stamps each (before / after the wait, converted).
          if (n_tile < 2) DS_WS_STAMP(trow, kTraceUnits + 3 * (wsp::kUnits * n_tile + i));
          wsp::copies_landed((later ? 2 * wsp::kUnits : wsp::kUnits) - 1 - i);
          if (n_tile < 2) DS_WS_STAMP(trow, kTraceUnits + 3 * (wsp::kUnits * n_tile + i) + 1);
          if (!ok) {
#pragma unroll
            for (int c = 0; c < 8; ++c)
              *reinterpret_cast<uint4*>(row + swz(e, c)) = make_uint4(0, 0, 0, 0);
          } else if (b < 7 && DS_SPARSE_MLA_WS_ABLATE != 1) {
            uint4 w[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) w[c] = *reinterpret_cast<const uint4*>(row + swz(e, c));
            const uint32_t sword = *reinterpret_cast<const uint32_t*>(row + swz(e, 4));
            const float scale = __uint_as_float(((sword >> (8 * (b & 3))) & 0xFFu) << 23);
#pragma unroll
            for (int c = 0; c < 4; ++c) {  // e4m3 piece c -> bf16 pieces 2 c, 2 c + 1
              *reinterpret_cast<uint4*>(row + swz(e, 2 * c)) =
                  e4m3x8_to_bf16x8(w[c].x, w[c].y, scale);
              *reinterpret_cast<uint4*>(row + swz(e, 2 * c + 1)) =
                  e4m3x8_to_bf16x8(w[c].z, w[c].w, scale);
            }
          }
          if (n_tile < 2) DS_WS_STAMP(trow, kTraceUnits + 3 * (wsp::kUnits * n_tile + i) + 2);
          if (kNf > 1) {
            fence_proxy_async();  // the block for the consumers' wgmma
            mbar_arrive(bar_full + 8 * (kNf * bi + b));
          }
        }
      };
      bool issued = false;  // tile t's copies are on their way (issued with tile t - 1's)
      for (int t = c0; t < c1; ++t) {
        const int buf = n_tile & 1;
        // While the first tile converts, the second buffer is still unused: the next tile's
        // copies go out with the first's instead of after its conversion. (Doing the same later
        // whenever the next buffer is already free measured no gain: NOTES.md v9.)
        const bool ahead = n_tile == 0 && t + 1 < c1;
        DS_WS_STAMP(trow, 2 + 3 * n_tile);
#pragma unroll 1
        for (int u = issued ? t + 1 : t; u <= (ahead ? t + 1 : t); ++u) {
          // The consumers' last use of this buffer (tile n_tile - 2) is done (per block: in
          // issue).
          const int parity = u == t && n_tile >= 2 ? ((n_tile >> 1) - 1) & 1 : -1;
          if (kNe == 1 && parity >= 0) mbar_wait(bar_empty + 8 * buf, uint32_t(parity));
          issue(u, buf ^ (u - t), parity);
        }
        issued = ahead;
        DS_WS_STAMP(trow, 3 + 3 * n_tile);
        if (h == 0) valid[buf * kKeys + e] = addr[(t - c0) * kKeys + e].x >= 0 ? 1 : 0;
        convert(issued, t, buf);
        DS_WS_STAMP(trow, 4 + 3 * n_tile);
        if (kNf == 1) {
          fence_proxy_async();  // the tile for the consumers' wgmma
          mbar_arrive(bar_full + 8 * buf);
        }
        ++n_tile;
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(wsp::kConsumerRegs));
  DS_WS_STAMP(trow, 0);
  const Consumer c =
      make_consumer(p, smem, wsp::kOffP, wsp::kOffStat, tid, q, blockIdx.z * kHeads, split == 0);
  load_q(p, q, c.h0, tid, smem + wsp::kOffQ);
  Fold f;
  clear_fold(f);
  fence_proxy_async();  // q for the tensor cores
  wsp::consumer_bar();
  DS_WS_STAMP(trow, 1);
  const uint32_t kv_base = smem_addr(smem + wsp::kOffKv);
#if DS_SPARSE_MLA_WS_TRACE
  int bk = 0;  // the stamp of the next barrier call
  auto bar = [&] {
    DS_WS_STAMP(trow, bk);
    wsp::consumer_bar();
    DS_WS_STAMP(trow, bk + 1);
    bk += 2;
  };
#else
  auto bar = [] { wsp::consumer_bar(); };
#endif
#if DS_SPARSE_MLA_WS_PINGPONG
  {
    float* stat = reinterpret_cast<float*>(smem + wsp::kOffStat);  // [buf][m, l][64 heads]
    const int wg = c.wg, c4 = c.c4, r0 = c.r0;
    const int n = t_end - t_begin;
    for (int jp = 0; jp < n; jp += 2) {
      const int own = jp + wg;  // this warpgroup's tile of the pair (tile buffer wg)
      if (own < n) {
        float m_own[2], l_own[2];
        const uint32_t kv = kv_base + uint32_t(wg * kTileBytes);
        mbar_wait(bar_full + 8 * wg, uint32_t(own >> 1) & 1u);
        // QK^T of all 64 keys: the k-steps of v7's two m64n32 halves, in the same order.
        float s[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.0f;
        fence();
#pragma unroll
        for (int b = 0; b < 8; ++b)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            mma_qk64(s, desc(c.q_addr + uint32_t(b * kBlockBytes + 32 * kk), 16),
                     desc(kv + uint32_t(b * kBlockBytes + 32 * kk), 16), (b | kk) != 0);
        commit();
        wait0();
#pragma unroll
        for (int i = 0; i < 32; ++i) fence_operand(s[i]);
        // The softmax of v7 over both 32-key halves at once: the max over all 64 keys, the two
        // halves' sums added as v7 adds its warpgroups'.
        const uint8_t* vld = valid + wg * kKeys;
        scale_mask_rowmax<8>(
            s, [&](int key) { return vld[key] != 0; }, 0, c4, c.scale_log2, m_own);
        float lsum[2][2];  // [half][hh]
        exp_store_p<8>(s, m_own, smem + wsp::kOffP + wg * kBlockBytes, 0, r0, c4, lsum);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) l_own[hh] = __fadd_rn(lsum[0][hh], lsum[1][hh]);
        if (c4 == 0)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            stat[(wg * 2 + 0) * kHeads + r0 + 8 * hh] = m_own[hh];
            stat[(wg * 2 + 1) * kHeads + r0 + 8 * hh] = l_own[hh];
          }
        mbar_arrive(bar_pready + 8 * wg);  // P and (m, l) of tile buffer wg are out
      }
      for (int j = jp; j < jp + 2 && j < n; ++j) {
        const int buf = j & 1;
        const uint32_t kv = kv_base + uint32_t(buf * kTileBytes);
        // P as the A fragments of the 4 16-key steps, from shared memory for either tile (own
        // fragments kept in registers across the other tile's PV would spill).
        // Already complete (the owner waited for it); it orders the producer's tile before this
        // warpgroup's own wgmma reads of it.
        mbar_wait(bar_full + 8 * buf, uint32_t(j >> 1) & 1u);
        mbar_wait(bar_pready + 8 * buf, uint32_t(j >> 1) & 1u);
        uint32_t pa[4][4];
        load_p_frags(c, smem_addr(smem + wsp::kOffP + buf * kBlockBytes), pa);
        float m_t[2], l_t[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          m_t[hh] = stat[(buf * 2 + 0) * kHeads + r0 + 8 * hh];
          l_t[hh] = stat[(buf * 2 + 1) * kHeads + r0 + 8 * hh];
        }
        pv_tile<32, true>(p, c, t_begin + j, kv, pa, m_t, l_t, j == own && c4 == 0, f,
                          NoBlockHook{});
        mbar_arrive(bar_empty + 8 * buf);  // this warpgroup's reads of tile buffer buf are done
      }
    }
  }
#endif
#if !DS_SPARSE_MLA_WS_PINGPONG
  for (int t = t_begin; t < t_end; ++t) {
    const int j = t - t_begin, buf = j & 1;
    DS_WS_STAMP(trow, 2 + 7 * j);
#if DS_SPARSE_MLA_WS_TRACE
    bk = 4 + 7 * j;
#endif
    if (kNf == 1) mbar_wait(bar_full + 8 * buf, uint32_t(j >> 1) & 1u);
    DS_WS_STAMP(trow, 3 + 7 * j);
    const uint8_t* vld = valid + buf * kKeys;
    auto valid_key = [&](int key) { return vld[key] != 0; };
#if DS_SPARSE_MLA_WS_BLOCKBAR
    {
      const uint32_t kv = kv_base + uint32_t(buf * kTileBytes);
      const uint32_t parity = uint32_t(j >> 1) & 1u;
      float s[16];
      issue_qk(c, kv, s, [&](int b) {
        if (kNf > 1) mbar_wait(bar_full + 8 * (kNf * buf + b), parity);
      });
      wait0();
      softmax_pv_tile<32, DS_SPARSE_MLA_WS_PV_RS != 0>(
          p, c, t, kv, s, valid_key, bar, f,
          [&](int b) { mbar_arrive(bar_empty + 8 * (kNe * buf + b)); });
    }
#else
    if (DS_SPARSE_MLA_WS_ABLATE != 2)
      consume_tile<32>(p, c, t, kv_base + uint32_t(buf * kTileBytes), valid_key, bar, f);
#endif
    DS_WS_STAMP(trow, 8 + 7 * j);
    // This thread's wgmma on the buffer are complete (per block: in softmax_pv_tile).
    if (kNe == 1) mbar_arrive(bar_empty + 8 * buf);
  }
#endif  // !DS_SPARSE_MLA_WS_PINGPONG
#if DS_SPARSE_MLA_WS_TRACE
  bk = 200;
#endif
  DS_WS_STAMP(trow, 199);
  finish(p, c, q, qs, f, smem + wsp::kOffQ, bar);
  DS_WS_STAMP(trow, 210);
#else
  __trap();  // launched only on sm_90 devices (sparse_mla_wgmma_available)
#endif  // DS_SPARSE_MLA_WGMMA_PATH
}
