// Backend sampling (launch_sample_rows): cpu::sample_row bit for bit, one CTA of 1024 threads per
// row, no workspace. Every sum is an integer (the fixed-point masses of kernels/cpu/sampling.h),
// so the block reductions and the shared-memory histogram atomics give the same bits in any order.
//
// Per row: the maximum, its lowest index and the finite check (a strided pass). Greedy rows stop
// there. Untruncated rows: per-thread sums of the masses over contiguous id ranges, an exclusive
// block scan, and the thread whose range holds the draw's target walks it. Truncated rows run
// selections over the descending order (key, id): "the first position whose cumulative count or
// mass reaches a target". A selection's first pass histograms count and mass over 1024 bins of
// x = (w - max) / T (value_bin; the zero-mass tail by ballots) and warp 0 finds the bin where the
// target is reached; four more passes do the same over the key's bytes among that bin's elements;
// the tie at the final key is found by its index in id order (ties share one value, so one mass).
// Selections: top-k's boundary (count k: its prefix mass), top-p's (mass), min-p's count when it
// cuts deeper (count), and the draw (mass).
#include <climits>

#include "kernels/cpu/sampling.h"
#include "kernels/cuda/sampling/sampling.h"

namespace ds::cuda {
namespace {

// DS_SAMPLE_ROWS_THREADS, _MASS_DIGITS and _BATCH are the knobs of the session-17 timing
// experiments (scripts/gpu/h_samp17, OPS_NOTES.md); the defaults are the fastest measured.
#ifndef DS_SAMPLE_ROWS_THREADS
#define DS_SAMPLE_ROWS_THREADS 1024
#endif
constexpr int kThreads = DS_SAMPLE_ROWS_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xFFFFFFFFu;
using u64 = unsigned long long;

constexpr int kBins = 1024;  // histogram bins of the first pass of a selection (value_bin)
constexpr int kTailBin = kBins - 1;

#ifndef DS_SAMPLE_ROWS_MASS_DIGITS
#define DS_SAMPLE_ROWS_MASS_DIGITS 1  // 0: 64-bit atomics (CAS loops in shared memory on sm_90)
#endif

struct Shared {
  uint32_t count[kBins];  // the key passes use the first 256
#if DS_SAMPLE_ROWS_MASS_DIGITS
  uint32_t mass_digit[3][kBins];  // 14-bit digits of each added mass, summed separately
#else
  u64 mass_bins[kBins];
#endif
  u64 scratch[kWarps + 1];
  float max_v[kWarps];
  int max_i[kWarps];
  uint32_t prefix;
  u64 before_count, before_mass;
  int32_t token;
};

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ u64 warp_inclusive_scan_u64(u64 v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 t = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

// Sum over the block; every thread gets it (begins and ends with a barrier).
__device__ u64 block_sum_u64(u64 v, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_u64(v);
  __syncthreads();
  if (lane == 0) sh.scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const u64 t = warp_sum_u64(lane < kWarps ? sh.scratch[lane] : 0);
    if (lane == 0) sh.scratch[kWarps] = t;
  }
  __syncthreads();
  return sh.scratch[kWarps];
}

// Exclusive prefix sum over the threads in index order; *total gets the sum.
__device__ u64 block_exclusive_scan_u64(u64 v, Shared& sh, u64* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const u64 inc = warp_inclusive_scan_u64(v);
  __syncthreads();
  if (lane == 31) sh.scratch[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const u64 w = warp_inclusive_scan_u64(lane < kWarps ? sh.scratch[lane] : 0);
    if (lane < kWarps) sh.scratch[lane] = w;  // inclusive over warps
    if (lane == 31) sh.scratch[kWarps] = w;
  }
  __syncthreads();
  const u64 before_warp = warp == 0 ? 0 : sh.scratch[warp - 1];
  *total = sh.scratch[kWarps];
  return before_warp + inc - v;
}

struct Row {
  const float* x;
  int64_t n;
  float mx, inv_t;
  __device__ uint64_t mass(float w) const {
    return cpu::sampling_mass_of(cpu::sampling_prob(w, mx, inv_t));
  }
};

// The id range [lo, hi) a thread owns in the passes that need id order.
__device__ __forceinline__ void thread_range(int64_t n, int64_t* lo, int64_t* hi) {
  const int64_t chunk = (n + kThreads - 1) / kThreads;
  *lo = min(n, int64_t(threadIdx.x) * chunk);
  *hi = min(n, *lo + chunk);
}

// The passes load kBatch elements per thread before using any (one load per thread in flight
// left each pass bound by the L2 latency: ~40 us per pass over a Flash row, call 3).
#ifndef DS_SAMPLE_ROWS_BATCH
#define DS_SAMPLE_ROWS_BATCH 8
#endif
constexpr int kBatch = DS_SAMPLE_ROWS_BATCH;

// f(i, w, valid) for the elements i = threadIdx.x + k * kThreads, in warp-uniform iterations (f may
// use warp collectives; `valid` is false past n).
template <typename F>
__device__ __forceinline__ void for_strided(const float* x, int64_t n, F&& f) {
  for (int64_t b0 = 0; b0 < n; b0 += int64_t(kThreads) * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = b0 + int64_t(u) * kThreads + threadIdx.x;
      v[u] = i < n ? __ldg(x + i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = b0 + int64_t(u) * kThreads + threadIdx.x;
      f(i, v[u], i < n);
    }
  }
}

// f(i, w) for i in [lo, hi) in order, until f returns true (contiguous: mostly L1 hits; the
// batch size did not matter here, call 5).
template <typename F>
__device__ __forceinline__ void for_range(const float* x, int64_t lo, int64_t hi, F&& f) {
  constexpr int kB = kBatch;
  for (int64_t b = lo; b < hi; b += kB) {
    float v[kB];
#pragma unroll
    for (int u = 0; u < kB; ++u) v[u] = b + u < hi ? __ldg(x + b + u) : 0.0f;
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      if (b + u < hi && f(b + u, v[u])) return;
    }
  }
}

// Adds (c, m) to histogram bin `bin` of the block (integer atomics: order-independent).
__device__ __forceinline__ void hist_add(Shared& sh, int bin, uint32_t c, u64 m) {
  atomicAdd(&sh.count[bin], c);
  if (m == 0) return;
#if DS_SAMPLE_ROWS_MASS_DIGITS
  // Each digit sum stays below 2^31 (at most 2^17 adds of < 2^14; the top digit of sums < 2^57).
  atomicAdd(&sh.mass_digit[0][bin], uint32_t(m & 0x3FFFu));
  atomicAdd(&sh.mass_digit[1][bin], uint32_t((m >> 14) & 0x3FFFu));
  if ((m >> 28) != 0) atomicAdd(&sh.mass_digit[2][bin], uint32_t(m >> 28));
#else
  atomicAdd(&sh.mass_bins[bin], m);
#endif
}

__device__ __forceinline__ u64 bin_mass(const Shared& sh, int bin) {
#if DS_SAMPLE_ROWS_MASS_DIGITS
  return u64(sh.mass_digit[0][bin]) + (u64(sh.mass_digit[1][bin]) << 14) +
         (u64(sh.mass_digit[2][bin]) << 28);
#else
  return sh.mass_bins[bin];
#endif
}

__device__ __forceinline__ void clear_bin(Shared& sh, int bin) {
  sh.count[bin] = 0;
#if DS_SAMPLE_ROWS_MASS_DIGITS
  sh.mass_digit[0][bin] = sh.mass_digit[1][bin] = sh.mass_digit[2][bin] = 0;
#else
  sh.mass_bins[bin] = 0;
#endif
}

struct Selected {
  int32_t id;
  u64 count;  // elements of the order up to and including it
  u64 mass;   // their mass
};

// The value bin of a logit: kBins - 1 for x = (w - max) / T below the mass cutoff (mass 0), else
// floor(-x * 32) (x in [-28, 0]: bins 0 .. 896). Monotone in w, so a bin is a run of the
// descending order; the first pass of a selection spreads its histogram over ~30 bins per unit
// of x instead of the few that the leading key byte takes (which serialized the atomics).
__device__ __forceinline__ int value_bin(float x) {
  if (!(x >= cpu::kSamplingMinExponent)) return kTailBin;
  return min(kTailBin - 1, int(-x * 32.0f));
}

// Warp 0: the first bin of sh.count / sh.mass [bins] at which before + the cumulative count (or
// mass) reaches target; sh.prefix gets `prefix | bin << shift`, sh.before_* the measure before it.
__device__ void find_crossing(Shared& sh, int bins, bool by_mass, u64 target, uint32_t prefix,
                              int shift) {
  const int lane = threadIdx.x & 31;
  const int per = bins / 32;
  u64 lc = 0, lm = 0;
  for (int b = 0; b < per; ++b) {
    lc += sh.count[lane * per + b];
    lm += bin_mass(sh, lane * per + b);
  }
  u64 c = sh.before_count + warp_inclusive_scan_u64(lc) - lc;
  u64 m = sh.before_mass + warp_inclusive_scan_u64(lm) - lm;
  int found = -1;
  u64 fc = 0, fm = 0;
  for (int b = 0; b < per; ++b) {
    const int bin = lane * per + b;
    const u64 bc = sh.count[bin], bm = bin_mass(sh, bin);
    if (found < 0 && bc != 0 && (by_mass ? m + bm : c + bc) >= target) {
      found = bin;
      fc = c;
      fm = m;
    }
    c += bc;
    m += bm;
  }
  const unsigned ok = __ballot_sync(kFull, found >= 0);
  // A target beyond the total cannot happen (the callers' targets are at most their prefix's
  // measure); the last nonempty bin is taken then, so the result stays in range.
  const int src = ok != 0 ? __ffs(ok) - 1 : 31;
  if (ok == 0 && lane == 31) {
    for (int b = bins - 1; b >= 0; --b) {
      if (sh.count[b] != 0) {
        found = b;
        fc = c - sh.count[b];
        fm = m - bin_mass(sh, b);
        break;
      }
    }
  }
  if (lane == src && found >= 0) {
    sh.prefix = prefix | (uint32_t(found) << shift);
    sh.before_count = fc;
    sh.before_mass = fm;
  }
}

// The first element of the descending order (key, id) at which the cumulative count (by_mass
// false) or mass reaches `target` (>= 1 for counts; the measure's total must reach it). Pass 1:
// the value bin (histogram of 1024 bins; the zero-mass tail counted by warp ballots). A count
// target that falls in the tail needs no element: every token with mass is before it (id -1).
// Passes 2-5: the key's bytes among the elements of that bin; then the tie in id order.
__device__ Selected select(const Row& row, bool by_mass, u64 target, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int b = threadIdx.x; b < kBins; b += kThreads) clear_bin(sh, b);
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.before_count = 0;
    sh.before_mass = 0;
  }
  __syncthreads();
  uint32_t tail = 0;
  for_strided(row.x, row.n, [&](int64_t, float w, bool valid) {
    const float x = valid ? (w - row.mx) * row.inv_t : -INFINITY;
    const int bin = value_bin(x);
    const unsigned t = __ballot_sync(kFull, valid && bin == kTailBin);
    if (lane == 0) tail += __popc(t);
    if (bin != kTailBin) hist_add(sh, bin, 1, cpu::sampling_mass_of(cpu::sampling_exp(x)));
  });
  if (lane == 0 && tail != 0) atomicAdd(&sh.count[kTailBin], tail);
  __syncthreads();
  if (warp == 0) find_crossing(sh, kBins, by_mass, target, 0, 0);
  __syncthreads();
  const int vbin = int(sh.prefix);
  const u64 tail_mass = sh.before_mass;
  __syncthreads();  // every thread has read sh.prefix before it is reset
  if (vbin == kTailBin) return Selected{-1, target, tail_mass};
  if (threadIdx.x == 0) sh.prefix = 0;
  for (int level = 0; level < 4; ++level) {
    const int shift = 24 - 8 * level;
    if (threadIdx.x < 256) clear_bin(sh, threadIdx.x);
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    // Runs of one bin accumulate in registers; a thread flushes when its bin changes.
    int run_bin = -1;
    uint32_t run_c = 0;
    u64 run_m = 0;
    for_strided(row.x, row.n, [&](int64_t, float w, bool valid) {
      const float x = (w - row.mx) * row.inv_t;
      if (!valid || value_bin(x) != vbin) return;
      const uint32_t k = cpu::sampling_key(w);
      if (level > 0 && (k >> (shift + 8)) != (prefix >> (shift + 8))) return;
      const int bin = int((k >> shift) & 255u);
      if (bin != run_bin) {
        if (run_c != 0) hist_add(sh, run_bin, run_c, run_m);
        run_bin = bin;
        run_c = 0;
        run_m = 0;
      }
      ++run_c;
      run_m += cpu::sampling_mass_of(cpu::sampling_exp(x));
    });
    // The last runs: one atomic per warp when every lane that has one ends in the same bin.
    const unsigned has = __ballot_sync(kFull, run_c != 0);
    if (has != 0) {
      const int leader = __ffs(has) - 1;
      const int lbin = __shfl_sync(kFull, run_bin, leader);
      if (__all_sync(kFull, run_c == 0 || run_bin == lbin)) {
        const u64 c = warp_sum_u64(run_c), m = warp_sum_u64(run_m);
        if (lane == leader) hist_add(sh, lbin, uint32_t(c), m);
      } else if (run_c != 0) {
        hist_add(sh, run_bin, run_c, run_m);
      }
    }
    __syncthreads();
    if (warp == 0) find_crossing(sh, 256, by_mass, target, prefix, shift);
    __syncthreads();
  }
  const uint32_t key = sh.prefix;
  const u64 before_c = sh.before_count, before_m = sh.before_mass;
  // The tie index j in id order (every tie has the key's value, so one mass).
  const u64 mt = row.mass(cpu::sampling_key_value(key));
  u64 j = 0;
  if (!by_mass) {
    j = target > before_c ? target - before_c - 1 : 0;
  } else if (target > before_m && mt != 0) {
    j = (target - before_m + mt - 1) / mt - 1;
  }
  int64_t lo, hi;
  thread_range(row.n, &lo, &hi);
  u64 ties = 0;
  for_range(row.x, lo, hi, [&](int64_t, float w) {
    ties += cpu::sampling_key(w) == key ? 1 : 0;
    return false;
  });
  u64 total_ties = 0;
  const u64 first = block_exclusive_scan_u64(ties, sh, &total_ties);
  if (j >= total_ties) j = total_ties - 1;  // not reached for valid targets
  if (first <= j && j < first + ties) {
    u64 t = first;
    for_range(row.x, lo, hi, [&](int64_t i, float w) {
      if (cpu::sampling_key(w) != key || t++ != j) return false;
      sh.token = int32_t(i);
      return true;
    });
  }
  __syncthreads();
  return Selected{sh.token, before_c + j + 1, before_m + (j + 1) * mt};
}

// Count of elements with p >= min_p (min-p's cut; the maximum's p is 1).
__device__ u64 count_min_p(const Row& row, double min_p, Shared& sh) {
  u64 c = 0;
  for_strided(row.x, row.n, [&](int64_t, float w, bool valid) {
    c += valid && double(cpu::sampling_prob(w, row.mx, row.inv_t)) >= min_p ? 1 : 0;
  });
  return block_sum_u64(c, sh);
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(SampleRowsParams p) {
  __shared__ Shared sh;
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* x = p.logits + r * p.stride;
  const int64_t n = p.vocab;
  const cpu::RowSampling s = p.params[r];

  // The maximum (lowest index among equals) and the finite check.
  float mx = -INFINITY;
  int mi = INT_MAX;
  bool bad = false;
  for_strided(x, n, [&](int64_t i, float v, bool valid) {
    if (!valid) return;
    bad = bad || !isfinite(v);
    if (v > mx) {  // strict: a thread's indices increase
      mx = v;
      mi = int(i);
    }
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(kFull, mx, o);
    const int i2 = __shfl_xor_sync(kFull, mi, o);
    if (v2 > mx || (v2 == mx && i2 < mi)) {
      mx = v2;
      mi = i2;
    }
  }
  if (lane == 0) {
    sh.max_v[warp] = mx;
    sh.max_i[warp] = mi;
  }
  if (__syncthreads_or(bad) != 0) {
    if (threadIdx.x == 0) {
      p.ids[r] = 0;
      p.finite[r] = 0;
    }
    return;
  }
  mx = sh.max_v[0];
  mi = sh.max_i[0];
  for (int w = 1; w < kWarps; ++w) {
    if (sh.max_v[w] > mx || (sh.max_v[w] == mx && sh.max_i[w] < mi)) {
      mx = sh.max_v[w];
      mi = sh.max_i[w];
    }
  }
  if (threadIdx.x == 0) sh.token = mi;  // read only after the barriers of the passes below
  if (s.temperature <= 0) {
    if (threadIdx.x == 0) {
      p.ids[r] = mi;
      p.finite[r] = 1;
    }
    return;
  }
  const Row row{x, n, mx, float(1.0 / s.temperature)};
  const bool use_top_k = s.top_k > 0 && s.top_k < n;
  const bool use_top_p = s.top_p < 1.0;
  const bool use_min_p = s.min_p > 0.0;
  int32_t token = mi;
  if (!use_top_k && !use_top_p) {
    int64_t lo, hi;
    thread_range(n, &lo, &hi);
    auto kept_mass = [&](float w) {
      const float pr = cpu::sampling_prob(w, row.mx, row.inv_t);
      return use_min_p && double(pr) < s.min_p ? uint64_t{0} : cpu::sampling_mass_of(pr);
    };
    u64 sum = 0;
    for_range(x, lo, hi, [&](int64_t, float w) {
      sum += kept_mass(w);
      return false;
    });
    u64 total = 0;
    const u64 before = block_exclusive_scan_u64(sum, sh, &total);
    const u64 target = cpu::sampling_draw_target(s.uniform, total);
    if (before <= target && target < before + sum) {
      u64 cum = before;
      for_range(x, lo, hi, [&](int64_t i, float w) {
        cum += kept_mass(w);
        if (cum <= target) return false;
        sh.token = int32_t(i);
        return true;
      });
    }
    __syncthreads();
    token = sh.token;
  } else {
    u64 keep = use_top_k ? u64(s.top_k) : u64(n);
    u64 kept = 0;  // the mass of the first `keep` elements
    if (use_top_k) {
      kept = select(row, false, keep, sh).mass;
    } else {
      u64 m = 0;
      for_strided(x, n, [&](int64_t, float w, bool valid) { m += valid ? row.mass(w) : 0; });
      kept = block_sum_u64(m, sh);
    }
    if (use_top_p) {
      const Selected t = select(row, true, cpu::sampling_top_p_target(s.top_p, kept), sh);
      keep = t.count;
      kept = t.mass;
    }
    if (use_min_p) {
      const u64 c = count_min_p(row, s.min_p, sh);
      if (c < keep) {
        keep = c;
        kept = select(row, false, keep, sh).mass;
      }
    }
    token = select(row, true, cpu::sampling_draw_target(s.uniform, kept) + 1, sh).id;
  }
  if (threadIdx.x == 0) {
    p.ids[r] = token;
    p.finite[r] = 1;
  }
}

}  // namespace

void launch_sample_rows(const SampleRowsParams& params, cudaStream_t stream) {
  if (params.rows <= 0 || params.vocab <= 0) return;
  sample_rows_kernel<<<unsigned(params.rows), kThreads, 0, stream>>>(params);
}

}  // namespace ds::cuda
