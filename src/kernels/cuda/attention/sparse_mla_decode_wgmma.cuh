// sm_90a path of the sparse MLA decode kernel (v7, NOTES.md): 64-key tiles on wgmma. Included by
// sparse_mla_decode.cu inside its anonymous namespace, after the shared helpers (merge rule,
// cp.async, PDL, query_split); not a header of its own.
//
// CTA (key split, query, group of 64 heads) = 2 warpgroups, 256 threads, ~218 KB of shared
// memory, one CTA per SM. Per tile of 64 keys:
//   0. (every 10 tiles) all threads resolve indices and page-table entries into shared memory;
//   1. warpgroup w copies (cp.async, one tile ahead) and dequantizes dims [256w, 256w + 256) of
//      the 64 entries into a bf16 tile (8 column blocks of 64 dims, 128-byte swizzle);
//   2. QK^T: warpgroup w scores keys [32w, 32w + 32) of the tile against all 64 heads over all 512
//      dims (32 x wgmma m64n32k16; A = q, B = the tile, both from shared memory);
//   3. softmax: the two warpgroups exchange their per-head maxima (m_t = max of both), write
//      P = bf16(2^(s - m_t)) of their 32 keys into a shared 64 x 64 P tile and exchange their
//      partial sums of P (l_t = WG0's + WG1's);
//   4. PV: warpgroup w multiplies P (A, shared memory) by dims [256w, 256w + 256) of the tile
//      (B, MN-major) in 4 chunks of 64 dims, each from zero (4 x wgmma m64n64k16), and folds
//      O = O a + (P V) b with the same merge rule as the mma.sync kernel, or stores P V as the
//      tile's partial (splits other than the first).
// The fold unit is the 64-key tile, so outputs are bit-identical whatever the split count (the
// combine kernel continues the fold over the partials in tile order), but differ in the last bits
// from the mma.sync kernel's (16-key tiles).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_SPARSE_MLA_WGMMA_PATH 1
#else
#define DS_SPARSE_MLA_WGMMA_PATH 0
#endif

// Timing experiments only (NOTES.md v7), 0 in every real build: 1 skips the dequantization
// (the tile keeps whatever it held), 2 the QK^T wgmma, 3 the PV wgmma, 4 the KV copies.
#ifndef DS_SPARSE_MLA_WG_ABLATE
#define DS_SPARSE_MLA_WG_ABLATE 0
#endif

// 32-dim PV chunks (v9) in flight per warpgroup: 2, or 3-4 (variant, NOTES.md v9 session 36: is
// PV + fold, ~1.55 us per tile against ~0.8 us of shared-memory time, latency-bound?).
#ifndef DS_SPARSE_MLA_PV_DEPTH
#define DS_SPARSE_MLA_PV_DEPTH 2
#endif

namespace wgp {

constexpr int kD = 512;
constexpr int kNope = 448;
constexpr int kHeads = 64;  // heads per CTA (wgmma M)
constexpr int kKeys = kSparseMlaWgmmaTileKeys;
constexpr int kThreads = 256;
constexpr int kDataBytes = kNope + 128;        // 576: e4m3 nope + bf16 rope
constexpr int kScaleBytes = 8;                 // 7 ue8m0 scales + pad
constexpr int kBlockBytes = 64 * 128;          // one column block: 64 rows x 64 bf16
constexpr int kTileBytes = 8 * kBlockBytes;    // 64 rows x 512 bf16
constexpr int kStageStride = kDataBytes + 16;  // 592: rows 16 bytes apart mod 128 (no conflicts)
constexpr int kStageScaleSlot = 16;  // 4 bytes per (warpgroup, half): own copies, own reads
constexpr int kStageBytes = kKeys * (kStageStride + kStageScaleSlot);
constexpr int kStages = 2;
constexpr int kAddrTiles = 10;  // tiles per resolved address chunk (640 keys: one at Flash widths)
constexpr int kAddrKeys = kAddrTiles * kKeys;
constexpr int kResolveIters = (kAddrKeys + kThreads - 1) / kThreads;
constexpr int kOffQ = 0;
constexpr int kOffKv = kOffQ + kTileBytes;
constexpr int kOffP = kOffKv + kTileBytes;
constexpr int kOffStage = kOffP + kBlockBytes;
constexpr int kOffStat = kOffStage + kStages * kStageBytes;  // max[2][64], sum[2][64]
constexpr int kOffAddr = kOffStat + 4 * kHeads * 4;
constexpr int kSmemBytes = 1024 + kOffAddr + kAddrKeys * 8;  // + 1024: base alignment
static_assert(kSmemBytes <= 227 * 1024, "sm_90: at most 227 KB of shared memory per CTA");

// Byte offset of 16-byte chunk `c` (0..7) of row `r` in a column block: the 128-byte swizzle of
// wgmma (chunk XOR row % 8; blocks are 1024-byte aligned).
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
}

#if DS_SPARSE_MLA_WGMMA_PATH
// The descriptors, fences, waits and warpgroup barriers of kernels/cuda/common/wgmma.cuh. K-major
// operands (q, keys for QK^T, P) use only the stride offset (1024: 8 rows of 128 bytes). The
// MN-major V operand of PV spans 64 dims = one swizzle width, so only the 8-row stride along K
// (keys) is used; both offsets are set to 1024, which is that stride under either field's meaning.
using wgmma::commit;
using wgmma::desc;
using wgmma::fence;
using wgmma::fence_operand;
using wgmma::fence_proxy_async;
__device__ __forceinline__ void wait0() {
  wgmma::wait<0>();
}
__device__ __forceinline__ void wait1() {
  wgmma::wait<1>();
}
__device__ __forceinline__ void wg_bar(int wg) {
  wgmma::warpgroup_bar(wg);
}

// S[64 x 32] (+)= A[64 x 16] B[16 x 32]: bf16, both K-major in shared memory, fp32 accumulators.
__device__ __forceinline__ void mma_qk(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64], both from shared memory: B K-major, or MN-major
// (transposed) with kTransB.
template <int kTransB>
__device__ __forceinline__ void mma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db,
                                              int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d), "n"(kTransB));
}
// O_t[64 x 64] (+)= P[64 x 16] V[16 x 64]: P K-major, V MN-major (transposed B), shared memory.
__device__ __forceinline__ void mma_pv(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  mma_m64n64k16<1>(d, da, db, scale_d);
}
// O_t[64 x 32] (+)= P[64 x 16] V[16 x 32]: half a column block of V (v9's narrower PV chunks).
__device__ __forceinline__ void mma_pv(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}
// O_t[64 x 32] (+)= P[64 x 16] V[16 x 32] with P in registers (the A fragments of one 16-key step:
// rows r0 / r0 + 8 x keys 2 c4 / 8 + 2 c4, bf16 pairs): V's shared-memory bytes only.
__device__ __forceinline__ void mma_pv_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db,
                                          int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
// S[64 x 64] (+)= A[64 x 16] B[16 x 64]: QK^T of a whole 64-key tile by one warpgroup (v9's
// ping-pong consumers), both operands K-major in shared memory.
__device__ __forceinline__ void mma_qk64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  mma_m64n64k16<0>(d, da, db, scale_d);
}
#endif  // DS_SPARSE_MLA_WGMMA_PATH

}  // namespace wgp

#if DS_SPARSE_MLA_WGMMA_PATH
namespace wgp {

// What a consumer thread (warpgroup wg < 2, 256 threads) of either sm_90a kernel needs to run a
// tile: its accumulator coordinates, the shared-memory operands and the split's outputs.
struct Consumer {
  int wg, w4, g, c4;
  int r0;  // accumulator rows r0 and r0 + 8: heads h0 + r0, h0 + r0 + 8
  int h0;
  bool fold;  // split 0 folds; other splits store per-tile partials
  int64_t slot_base;
  float scale_log2;
  uint32_t q_addr, p_addr;
  uint8_t* p_s;
  float* x_max;  // [warpgroup][row]; the partial sums of P follow at + 2 kHeads
};

// The workspace's per-tile partials: O [query slot][head][kD], then (m, l) [query slot][head].
__device__ __forceinline__ float* ws_ml_of(const SparseMlaParams& p) {
  return p.workspace + int64_t(p.num_queries) * p.plan.max_tiles * p.num_heads * kD;
}

// Split 0's running fold (or nothing, for other splits) of one consumer thread.
struct Fold {
  float run_m[2], run_l[2];
  float o[4][32];
};

__device__ __forceinline__ Consumer make_consumer(const SparseMlaParams& p, uint8_t* smem,
                                                  uint32_t off_p, uint32_t off_stat, int tid, int q,
                                                  int h0, bool fold) {
  Consumer c;
  c.wg = tid >> 7;
  c.w4 = (tid >> 5) & 3;
  const int lane = tid & 31;
  c.g = lane >> 2;
  c.c4 = lane & 3;
  c.r0 = 16 * c.w4 + c.g;
  c.h0 = h0;
  c.fold = fold;
  c.slot_base = int64_t(q) * p.plan.max_tiles;
  c.scale_log2 = p.softmax_scale * kLog2e;
  c.q_addr = smem_addr(smem + kOffQ);
  c.p_addr = smem_addr(smem + off_p);
  c.p_s = smem + off_p;
  c.x_max = reinterpret_cast<float*>(smem + off_stat);
  return c;
}

__device__ __forceinline__ void clear_fold(Fold& f) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    f.run_m[hh] = kNegInf;
    f.run_l[hh] = 0.0f;
  }
#pragma unroll
  for (int cc = 0; cc < 4; ++cc)
#pragma unroll
    for (int i = 0; i < 32; ++i) f.o[cc][i] = 0.0f;
}

// q of the 64 heads into the 8 swizzled column blocks (K-major A operand of QK^T), by the 256
// consumer threads: all 16 loads of a thread in flight before its stores (one load-store round
// trip per thread, not 16: -0.4 to -1.1 us, NOTES.md v7; issuing them between the first address
// chunk's index and page-table loads gained nothing more).
__device__ __forceinline__ void load_q(const SparseMlaParams& p, int q, int h0, int tid,
                                       uint8_t* q_s) {
  const uint16_t* qb = p.q + (int64_t(q) * p.num_heads + h0) * kD;
  constexpr int kQLoads = kHeads * (kD / 8) / kThreads;
  static_assert(kQLoads * kThreads == kHeads * (kD / 8), "q: whole 16-byte vectors per thread");
  uint4 v[kQLoads];
#pragma unroll
  for (int k = 0; k < kQLoads; ++k) {
    const int i = tid + k * kThreads, h = i / (kD / 8), c = i % (kD / 8);
    v[k] = __ldg(reinterpret_cast<const uint4*>(qb + int64_t(h) * kD + c * 8));
  }
#pragma unroll
  for (int k = 0; k < kQLoads; ++k) {
    const int i = tid + k * kThreads, h = i / (kD / 8), c = i % (kD / 8);
    *reinterpret_cast<uint4*>(q_s + (c / 8) * kBlockBytes + swz(h, c % 8)) = v[k];
  }
}

// A tile hook that does nothing (v7, and v9 with whole-tile barriers).
struct NoBlockHook {
  __device__ __forceinline__ void operator()(int) const {}
};

// QK^T of the tile at kv_addr, issued as one wgmma group (not waited for): keys [32 wg, 32 wg + 32)
// x 64 heads over 512 dims into s. before_block(b) runs before column block b's wgmma are issued
// (v9 with per-block barriers waits there for the block to be converted).
template <typename BeforeBlock = NoBlockHook>
__device__ __forceinline__ void issue_qk(const Consumer& c, uint32_t kv_addr, float (&s)[16],
                                         BeforeBlock before_block = {}) {
#pragma unroll
  for (int i = 0; i < 16; ++i) s[i] = 0.0f;
  fence();
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    before_block(b);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      if (DS_SPARSE_MLA_WG_ABLATE != 2)
        mma_qk(s, desc(c.q_addr + uint32_t(b * kBlockBytes + 32 * kk), 16),
               desc(kv_addr + uint32_t(b * kBlockBytes + 4096 * c.wg + 32 * kk), 16),
               (b | kk) != 0);
  }
  commit();
}

// PV and the fold of tile t once its P (shared memory at c.p_addr, or the A fragments `pa` of
// each 16-key step when kPRegs) and its statistics (m_t, l_t) are known: the fold coefficients
// (split 0) or the tile's statistics (other splits; stored by the threads with store_ml), then
// dims [256 wg, + 256) of P V. block_done as in softmax_pv_tile.
template <int kPvN, bool kPRegs, typename BlockDone>
__device__ __forceinline__ void pv_tile(const SparseMlaParams& p, const Consumer& c, int t,
                                        uint32_t kv_addr, const uint32_t (*pa)[4],
                                        const float (&m_t)[2], const float (&l_t)[2], bool store_ml,
                                        Fold& f, BlockDone block_done) {
  const int wg = c.wg, c4 = c.c4, r0 = c.r0;
  static_assert(!kPRegs || kPvN == 32, "P in registers: m64n32k16 only");
  // ---- fold coefficients (split 0) or the tile's statistics (other splits) ----
  float ca[2] = {0.0f, 0.0f}, cb[2] = {1.0f, 1.0f};
  if (c.fold) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float m_new;
      merge_coeffs(f.run_m[hh], m_t[hh], m_new, ca[hh], cb[hh]);
      f.run_l[hh] = merge_value(f.run_l[hh], ca[hh], l_t[hh], cb[hh]);
      f.run_m[hh] = m_new;
    }
  } else if (store_ml) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int h = c.h0 + r0 + 8 * hh;
      float* ml = ws_ml_of(p) + ((c.slot_base + t) * p.num_heads + h) * 2;
      ml[0] = m_t[hh];
      ml[1] = l_t[hh];
    }
  }

  // ---- PV: dims [256 wg + kPvN n, + kPvN) from zero per tile, then fold or store. kDepth
  // chunks in flight: chunks n + 1 .. n + kDepth - 1's wgmma run while chunk n is folded. kPvN =
  // 64 (v7) or 32 (v9: 32 accumulator registers fewer, the same sums per output element). ----
  constexpr int kAcc = kPvN / 2;        // accumulators per thread and chunk
  constexpr int kPerBlock = 64 / kPvN;  // chunks per 64-dim column block
  constexpr int kN = 4 * kPerBlock;     // chunks per warpgroup
  constexpr int kDepth = kPvN == 32 ? DS_SPARSE_MLA_PV_DEPTH : 2;
  static_assert(kDepth >= 2 && kDepth <= 4, "2-4 PV chunks in flight");
  float ot_ring[kDepth][kAcc];
  auto issue_pv = [&](int n) {
    float(&ot)[kAcc] = ot_ring[n % kDepth];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ot[i] = 0.0f;
    fence();
    const int blk = 4 * wg + n / kPerBlock;
    const uint32_t col = uint32_t(2 * kPvN * (n % kPerBlock));  // byte offset in the block row
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t dv = desc(kv_addr + uint32_t(blk * kBlockBytes + 2048 * kk) + col, 1024);
      if constexpr (kPRegs) {
        mma_pv_rs(ot, pa[kk], dv, kk != 0);
      } else if (DS_SPARSE_MLA_WG_ABLATE != 3) {
        mma_pv(ot, desc(c.p_addr + uint32_t(32 * kk), 16), dv, kk != 0);
      }
    }
    commit();
  };
#pragma unroll
  for (int n = 0; n < kDepth - 1; ++n) issue_pv(n);
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    if (n + kDepth - 1 < kN) {
      issue_pv(n + kDepth - 1);
      wgmma::wait<kDepth - 1>();
    } else if (kDepth >= 4 && n + 3 == kN) {
      wgmma::wait<2>();
    } else if (kDepth >= 3 && n + 2 == kN) {
      wait1();
    } else if (n + 1 == kN) {
      wait0();
    }
    if (n % kPerBlock == kPerBlock - 1) block_done(4 * wg + n / kPerBlock);
    float(&ot)[kAcc] = ot_ring[n % kDepth];
    const int cc = n / kPerBlock;           // 64-dim chunk of o
    const int i0 = kAcc * (n % kPerBlock);  // its first accumulator in o[cc]
#pragma unroll
    for (int i = 0; i < kAcc; ++i) fence_operand(ot[i]);
    if (c.fold) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int hh = (i >> 1) & 1;
        f.o[cc][i0 + i] = merge_value(f.o[cc][i0 + i], ca[hh], ot[i], cb[hh]);
      }
    } else {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int h = c.h0 + r0 + 8 * hh;
        float* dst = p.workspace + ((c.slot_base + t) * p.num_heads + h) * kD + (4 * wg + cc) * 64 +
                     2 * i0 + 2 * c4;
#pragma unroll
        for (int j = 0; j < kAcc / 4; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(ot[4 * j + 2 * hh], ot[4 * j + 2 * hh + 1]);
      }
    }
  }
}

// P of a 64 x 64 P tile (shared memory at p_tile, the swizzled block layout of exp_store_p) as
// the A fragments of PV's four 16-key steps: rows r0 / r0 + 8 of this thread's warp (ldmatrix,
// 2 KB per warp, once per tile). Read by the generic proxy, so P needs no proxy fence.
__device__ __forceinline__ void load_p_frags(const Consumer& c, uint32_t p_tile,
                                             uint32_t (&pa)[4][4]) {
  const int lane = 4 * c.g + c.c4, mat = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ldmatrix_x4(pa[kk], p_tile + swz(16 * c.w4 + (lane & 7) + 8 * (mat & 1), 2 * kk + (mat >> 1)));
}

// The softmax pieces over kJ 8-key groups of scores s, where s[4 j + 2 hh + e] is key
// key0 + 8 j + 2 c4 + e of row r0 + 8 hh (the wgmma accumulator layout): scaled to log2 units
// (missing keys -inf), and the row maxima over the quad of threads sharing the rows.
template <int kJ, typename Valid>
__device__ __forceinline__ void scale_mask_rowmax(float (&s)[4 * kJ], Valid valid, int key0, int c4,
                                                  float scale_log2, float (&mloc)[2]) {
  mloc[0] = mloc[1] = kNegInf;
#pragma unroll
  for (int j = 0; j < kJ; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool ok = valid(key0 + 8 * j + 2 * c4 + e);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float& x = s[4 * j + 2 * hh + e];
        x = ok ? __fmul_rn(x, scale_log2) : kNegInf;
        mloc[hh] = fmaxf(mloc[hh], x);
      }
    }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    mloc[hh] = fmaxf(mloc[hh], __shfl_xor_sync(0xFFFFFFFFu, mloc[hh], 1));
    mloc[hh] = fmaxf(mloc[hh], __shfl_xor_sync(0xFFFFFFFFu, mloc[hh], 2));
  }
}

// P = bf16(2^(s - m)) of the same scores into the P tile at p_s (16-byte chunk chunk0 + j of
// rows r0, r0 + 8), and the sums of its bf16 values per 32 keys (4 groups), each in key order
// and then over the quad: lsum[half][hh].
template <int kJ>
__device__ __forceinline__ void exp_store_p(const float (&s)[4 * kJ], const float (&m)[2],
                                            uint8_t* p_s, int chunk0, int r0, int c4,
                                            float (&lsum)[kJ / 4][2]) {
#pragma unroll
  for (int hf = 0; hf < kJ / 4; ++hf) lsum[hf][0] = lsum[hf][1] = 0.0f;
#pragma unroll
  for (int j = 0; j < kJ; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float e0 = m[hh] == kNegInf ? 0.0f : exp2f(s[4 * j + 2 * hh] - m[hh]);
      const float e1 = m[hh] == kNegInf ? 0.0f : exp2f(s[4 * j + 2 * hh + 1] - m[hh]);
      const __nv_bfloat162 pb = __floats2bfloat162_rn(e0, e1);
      const float2 pr = __bfloat1622float2(pb);
      float& l = lsum[j / 4][hh];
      l = __fadd_rn(__fadd_rn(l, pr.x), pr.y);
      *reinterpret_cast<__nv_bfloat162*>(p_s + swz(r0 + 8 * hh, chunk0 + j) + 4 * c4) = pb;
    }
#pragma unroll
  for (int hf = 0; hf < kJ / 4; ++hf)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      lsum[hf][hh] = __fadd_rn(lsum[hf][hh], __shfl_xor_sync(0xFFFFFFFFu, lsum[hf][hh], 1));
      lsum[hf][hh] = __fadd_rn(lsum[hf][hh], __shfl_xor_sync(0xFFFFFFFFu, lsum[hf][hh], 2));
    }
}

// The rest of tile t once its scores s (issue_qk) have landed: the softmax with the other
// consumer warpgroup (two exchanges through shared memory, each closed by `bar`, a barrier of both
// consumer warpgroups), then PV and the fold (split 0) or the tile's partial (other splits).
// Any wgmma group issued after s's (the next tile's QK^T) completes before this returns.
// block_done(b) runs once this warpgroup's last read of column block b is complete (its PV
// chunks; both warpgroups' QK^T reads ended before the exchanges). kPRegs: PV takes P from
// registers (load_p_frags once per tile; v9 variant DS_SPARSE_MLA_WS_PV_RS).
template <int kPvN, bool kPRegs = false, typename Valid, typename Bar,
          typename BlockDone = NoBlockHook>
__device__ __forceinline__ void softmax_pv_tile(const SparseMlaParams& p, const Consumer& c, int t,
                                                uint32_t kv_addr, float (&s)[16], Valid valid,
                                                Bar bar, Fold& f, BlockDone block_done = {}) {
  const int wg = c.wg, c4 = c.c4, r0 = c.r0;
  float* x_sum = c.x_max + 2 * kHeads;
#pragma unroll
  for (int i = 0; i < 16; ++i) fence_operand(s[i]);
  // ---- softmax: masks, tile max over both warpgroups, P, partial sums ----
  float mloc[2];
  scale_mask_rowmax<4>(s, valid, 32 * wg, c4, c.scale_log2, mloc);
  if (c4 == 0) {
    c.x_max[wg * kHeads + r0] = mloc[0];
    c.x_max[wg * kHeads + r0 + 8] = mloc[1];
  }
  bar();
  float m_t[2], l_t[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    m_t[hh] = fmaxf(c.x_max[r0 + 8 * hh], c.x_max[kHeads + r0 + 8 * hh]);
  float lsum[1][2];
  exp_store_p<4>(s, m_t, c.p_s, 4 * wg, r0, c4, lsum);
  if (c4 == 0) {
    x_sum[wg * kHeads + r0] = lsum[0][0];
    x_sum[wg * kHeads + r0 + 8] = lsum[0][1];
  }
  if constexpr (!kPRegs) fence_proxy_async();  // P for the tensor cores
  bar();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    l_t[hh] = __fadd_rn(x_sum[r0 + 8 * hh], x_sum[kHeads + r0 + 8 * hh]);

  if constexpr (kPRegs) {
    uint32_t pa[4][4];
    load_p_frags(c, c.p_addr, pa);
    pv_tile<kPvN, true>(p, c, t, kv_addr, pa, m_t, l_t, wg == 0 && c4 == 0, f, block_done);
  } else {
    pv_tile<kPvN, false>(p, c, t, kv_addr, nullptr, m_t, l_t, wg == 0 && c4 == 0, f, block_done);
  }
}

// One 64-key tile t whose bf16 entries are in the swizzled tile at kv_addr (steps 2-4 of the
// file comment). valid(key): whether key `key` of the tile exists (missing keys score -inf;
// their bf16 rows are zeros).
template <int kPvN, typename Valid, typename Bar>
__device__ __forceinline__ void consume_tile(const SparseMlaParams& p, const Consumer& c, int t,
                                             uint32_t kv_addr, Valid valid, Bar bar, Fold& f) {
  float s[16];
  issue_qk(c, kv_addr, s);
  wait0();
  softmax_pv_tile<kPvN>(p, c, t, kv_addr, s, valid, bar, f);
}

// After the last tile: split 0 of a split query stores its fold state as slot 0 (continued by
// the combine kernel); a single split normalizes its output into `stage` (64 KB of shared memory
// that no wgmma reads any more once `bar`, a barrier of the 256 consumer threads, has passed: q's)
// and writes it from there in 16-byte pieces, whole 1 KB head rows per warp instruction group,
// instead of 64 scattered 4-byte stores per thread.
template <typename Bar>
__device__ __forceinline__ void finish(const SparseMlaParams& p, const Consumer& c, int q,
                                       const QuerySplit& qs, const Fold& f, uint8_t* stage,
                                       Bar bar) {
  if (!c.fold) return;
  const int wg = c.wg, c4 = c.c4, r0 = c.r0;
  if (qs.splits > 1) {
#pragma unroll
    for (int cc = 0; cc < 4; ++cc)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int h = c.h0 + r0 + 8 * hh;
        float* dst =
            p.workspace + (c.slot_base * p.num_heads + h) * kD + (4 * wg + cc) * 64 + 2 * c4;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(f.o[cc][4 * j + 2 * hh], f.o[cc][4 * j + 2 * hh + 1]);
      }
    if (wg == 0 && c4 == 0)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float* ml = ws_ml_of(p) + (c.slot_base * p.num_heads + c.h0 + r0 + 8 * hh) * 2;
        ml[0] = f.run_m[hh];
        ml[1] = f.run_l[hh];
      }
    return;
  }
  // Head row r of the stage: 64 pieces of 8 dims, piece k at (k ^ (r % 8)) * 16: the 8 rows of a
  // warp's store fall on distinct banks. 32-bit shared addresses (fewer registers than pointers).
  const uint32_t st = smem_addr(stage);
  bar();  // both warpgroups' last QK^T no longer reads q
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = r0 + 8 * hh;  // row % 8 = g
    const float inv = final_scale(f.run_m[hh], f.run_l[hh], p.sink, c.h0 + row);
    const uint32_t row_addr = st + uint32_t(row * 1024 + 512 * wg + 4 * c4);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t v = pack_bf16x2(__fmul_rn(f.o[cc][4 * j + 2 * hh], inv),
                                       __fmul_rn(f.o[cc][4 * j + 2 * hh + 1], inv));
        asm volatile(
            "st.shared.b32 [%0], %1;\n" ::"r"(row_addr + uint32_t((8 * cc + (j ^ c.g)) << 4)),
            "r"(v)
            : "memory");
      }
    if (p.lse && wg == 0 && c4 == 0)
      p.lse[int64_t(q) * p.num_heads + c.h0 + row] = final_lse(f.run_m[hh], f.run_l[hh]);
  }
  bar();
  const int tid = 128 * wg + 32 * c.w4 + 4 * c.g + c4;
  uint16_t* out = p.out + (int64_t(q) * p.num_heads + c.h0) * kD;
  constexpr int kPieces = kHeads * kD / 8;  // 16-byte pieces of the 64 x 512 output
#pragma unroll 4
  for (int k = 0; k < kPieces / kThreads; ++k) {
    const int i = tid + k * kThreads, row = i / 64, piece = i % 64;
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(st + uint32_t(row * 1024 + ((piece ^ (row & 7)) << 4)))
                 : "memory");
    *reinterpret_cast<uint4*>(out + int64_t(row) * kD + 8 * piece) = v;
  }
}

}  // namespace wgp
#endif  // DS_SPARSE_MLA_WGMMA_PATH

__global__ void __launch_bounds__(wgp::kThreads, 1)
    sparse_mla_decode_wgmma_kernel(const SparseMlaParams p) {
#if DS_SPARSE_MLA_WGMMA_PATH
  using namespace wgp;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint8_t* kv_s = smem + kOffKv;
  uint8_t* stage = smem + kOffStage;
  int2* addr = reinterpret_cast<int2*>(smem + kOffAddr);  // {page or -1, slot | window << 31}

  const int split = blockIdx.x;
  const int q = blockIdx.y;
  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int w4 = (tid >> 5) & 3;
  const int lane = tid & 31;

  if (p.pdl || fast_combine(p)) pdl_wait_then_trigger();
  const QuerySplit qs = query_split<kKeys>(p, q);
  if (split >= qs.splits) return;
  const int t_begin = split_begin(qs, split);
  const int t_end = split_begin(qs, split + 1);
  const int wn = p.window_len[q];
  const int seq = p.query_seq[q];
  const Consumer c =
      make_consumer(p, smem, kOffP, kOffStat, tid, q, blockIdx.z * kHeads, split == 0);
  load_q(p, q, c.h0, tid, smem + kOffQ);

  // Copy / dequantize role: warp w4 of warpgroup wg owns entries [16 w4, 16 w4 + 16) of a tile;
  // lane -> entry 16 w4 + lane % 16, half lane / 16 of the warpgroup's bytes of that entry.
  //   wg 0, half h: e4m3 dims [128h, 128h + 128)            (scale word 0: scales 0..3)
  //   wg 1, half 0: e4m3 dims [256, 384)                    (scale word 1: scales 4..6)
  //   wg 1, half 1: e4m3 dims [384, 448) + bf16 rope dims [448, 512)
  const int ld_entry = 16 * w4 + (lane & 15);
  const int ld_half = lane >> 4;
  const int fp8_begin = wg == 0 ? 128 * ld_half : 256 + 128 * ld_half;
  const int fp8_chunks = (wg == 1 && ld_half == 1) ? 4 : 8;  // 16-byte chunks of e4m3
  const bool has_rope = wg == 1 && ld_half == 1;
  const int scale_slot = 4 * (2 * wg + ld_half);

  auto resolve = [&](int c0, int c1) {
    resolve_addresses<kKeys, kThreads, kResolveIters>(p, q, seq, wn, qs.n, c0, c1, tid, addr);
  };

  // This thread's bytes of its entry of tile t into raw stage st.
  auto issue = [&](int t, int c0, int st) {
    const int2 a = addr[(t - c0) * kKeys + ld_entry];
    if (a.x < 0 || DS_SPARSE_MLA_WG_ABLATE == 4) return;
    int slot, page_size;
    const uint8_t* page_ptr = kv_page_of(p, a, slot, page_size);
    const uint8_t* data = page_ptr + int64_t(slot) * kDataBytes;
    uint8_t* dst = stage + st * kStageBytes + ld_entry * kStageStride;
    for (int i = 0; i < fp8_chunks; ++i)
      cp_async16(dst + fp8_begin + 16 * i, data + fp8_begin + 16 * i);
    if (has_rope)
      for (int i = 0; i < 8; ++i) cp_async16(dst + kNope + 16 * i, data + kNope + 16 * i);
    cp_async4(
        stage + st * kStageBytes + kKeys * kStageStride + ld_entry * kStageScaleSlot + scale_slot,
        page_ptr + int64_t(page_size) * kDataBytes + int64_t(slot) * kScaleBytes + 4 * wg);
  };

  // This thread's bytes of tile t (raw stage st) -> bf16 in the swizzled tile; zeros for a
  // missing key (its P is 0, and 0 x NaN would poison the output).
  auto dequant = [&](int t, int c0, int st) {
    const int2 a = addr[(t - c0) * kKeys + ld_entry];
    const uint8_t* src = stage + st * kStageBytes + ld_entry * kStageStride;
    if (DS_SPARSE_MLA_WG_ABLATE == 1) return;
    if (a.x < 0) {
      for (int i = 0; i < 2 * fp8_chunks; ++i) {
        const int d = fp8_begin + 8 * i;
        *reinterpret_cast<uint4*>(kv_s + (d / 64) * kBlockBytes + swz(ld_entry, (d % 64) / 8)) =
            make_uint4(0, 0, 0, 0);
      }
      if (has_rope)
        for (int i = 0; i < 8; ++i)
          *reinterpret_cast<uint4*>(kv_s + 7 * kBlockBytes + swz(ld_entry, i)) =
              make_uint4(0, 0, 0, 0);
      return;
    }
    const uint32_t sword = *reinterpret_cast<const uint32_t*>(
        stage + st * kStageBytes + kKeys * kStageStride + ld_entry * kStageScaleSlot + scale_slot);
#pragma unroll 2
    for (int i = 0; i < fp8_chunks; ++i) {
      const int d0 = fp8_begin + 16 * i;  // 16 e4m3 dims, one scale block
      const uint32_t sbyte = (sword >> (8 * ((d0 / 64) - 4 * wg))) & 0xFFu;
      const float scale = __uint_as_float(sbyte << 23);  // 2^(byte - 127)
      const uint4 raw = *reinterpret_cast<const uint4*>(src + d0);
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int d = d0 + 8 * half;
        *reinterpret_cast<uint4*>(kv_s + (d / 64) * kBlockBytes + swz(ld_entry, (d % 64) / 8)) =
            e4m3x8_to_bf16x8(w[half * 2], w[half * 2 + 1], scale);
      }
    }
    if (has_rope)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        *reinterpret_cast<uint4*>(kv_s + 7 * kBlockBytes + swz(ld_entry, i)) =
            *reinterpret_cast<const uint4*>(src + kNope + 16 * i);
  };

  Fold f;
  clear_fold(f);
  const uint32_t kv_addr = smem_addr(kv_s);
  fence_proxy_async();  // q for the tensor cores (the first barrier below publishes it)

  for (int c0 = t_begin; c0 < t_end; c0 += kAddrTiles) {
    const int c1 = min(t_end, c0 + kAddrTiles);
    __syncthreads();  // earlier readers of addr are done
    resolve(c0, c1);
    __syncthreads();
    issue(c0, c0, 0);
    cp_async_commit();
    for (int t = c0; t < c1; ++t) {
      const int st = (t - c0) & 1;
      if (t + 1 < c1) issue(t + 1, c0, st ^ 1);  // stage st ^ 1: this thread's tile t - 1 bytes
      cp_async_commit();
      cp_async_wait<1>();  // this thread's bytes of tile t have landed
      wg_bar(wg);          // the warpgroup's PV of tile t - 1 no longer reads its half of kv_s
      dequant(t, c0, st);
      fence_proxy_async();
      __syncthreads();  // the whole tile (both halves) visible to both warpgroups
      consume_tile<64>(
          p, c, t, kv_addr, [&](int key) { return addr[(t - c0) * kKeys + key].x >= 0; },
          [] { __syncthreads(); }, f);
    }
  }
  cp_async_wait<0>();
  finish(p, c, q, qs, f, smem + kOffQ, [] { __syncthreads(); });
#else
  __trap();  // launched only on sm_90 devices (sparse_mla_wgmma_available)
#endif  // DS_SPARSE_MLA_WGMMA_PATH
}
