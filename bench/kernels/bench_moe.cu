// MoE forward benchmark (kernels/cuda/moe, issue #8) at the DeepSeek-V4-Flash shape: D 4096,
// 256 routed experts (MXFP4 or NVFP4), top-6, inter 2048, one FP8-block shared expert. Weights are
// random codes with sane scales (3.4 GB of routed experts: far beyond L2, so every step streams
// from HBM). Per token count T:
//   - decode sizes (T <= 64, CUDA graph): the bytes of the distinct experts touched (counted from
//     the routing of this very input) plus the shared expert and the gate, against the measured
//     copy bandwidth: ratio = time / (bytes / copy_bw); the issue's target is expert bytes moving
//     at >= 70% of the copy bandwidth;
//   - prefill sizes (T >= 512): 2 * 3 * D * inter * (T * topk + T) FLOPs against the measured
//     peak of the MMA used (bf16 mma.sync m16n8k16 for the mma.sync kernels, bf16 wgmma for the
//     sm_90a prefill kernel: m64n256k16 with both operands in shared memory, the widest form,
//     measured here; fp32 accumulate);
// Routing is the model's learned routing on random logits (roughly uniform). Correctness is
// covered by tests/kernels/test_moe_cuda.cu; the benchmark checks the output is finite.
//
//   bench_moe [OUT_JSON]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/bench_util.h"
#include "kernels/cpu/moe.h"
#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/cuda/moe/moe.h"

namespace ds {
namespace {

constexpr int64_t kDim = 4096, kInter = 2048, kExperts = 256, kTopk = 6;

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
  return uint32_t(z >> 32);
}

// mode 0: random bytes; 1: bytes in [lo, lo + span); 2: e4m3 codes without NaN;
__global__ void fill_bytes(uint8_t* p, int64_t n, uint32_t seed, int mode, int lo, int span) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(uint64_t(i), seed);
    uint8_t v = uint8_t(h);
    if (mode == 1) v = uint8_t(lo + int(h % uint32_t(span)));
    if (mode == 2) v = uint8_t(h & 0xB7);  // |code| <= 0x37: no NaN, moderate magnitudes
    p[i] = v;
  }
}

__global__ void fill_floats(float* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    p[i] = (float(hash32(uint64_t(i), seed) >> 8) / float(1 << 24) * 2.0f - 1.0f) * scale;
  }
}

// Peak of bf16 mma.sync m16n8k16 (the MMA the MoE kernels use): 8 independent accumulators per
// warp, operands in registers.
__global__ void mma_peak_kernel(int iters, float* sink) {
  uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  for (int i = 0; i < 4; ++i) a[i] = (a[i] & 0x00FF00FFu) | 0x3C003C00u;
  uint32_t b0 = a[0] ^ 0x00010001u, b1 = a[1] ^ 0x00010001u;
  float d[8][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};"
          : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  }
  float s = 0;
  for (int j = 0; j < 8; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  if (s == 12345.0f) *sink = s;
}

// Peak of FP8 mma.sync m16n8k32 e4m3 (the FP8 path's MMA), measured the same way.
__global__ void mma_f8_peak_kernel(int iters, float* sink) {
  uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  for (int i = 0; i < 4; ++i) a[i] = (a[i] & 0x07070707u) | 0x30303030u;
  uint32_t b0 = a[0] ^ 0x01010101u, b1 = a[1] ^ 0x01010101u;
  float d[8][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};"
          : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
  }
  float s = 0;
  for (int j = 0; j < 8; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  if (s == 12345.0f) *sink = s;
}

// Peak of bf16 wgmma (sm_90a): two warpgroups per CTA, one CTA per SM, each warpgroup issuing
// m64n256k16 (A and B from shared memory, 128-byte swizzle, fp32 accumulators) 16 at a time.
// Returns 0 where wgmma does not exist (the kernel then does nothing).
constexpr int kWgPeakSmem = 64 * 128 + 256 * 128 + 1024;  // A, B tiles + alignment
__global__ void __launch_bounds__(256, 1) wgmma_peak_kernel(int iters, float* sink) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t peak_smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(peak_smem));
  const uint32_t a_addr = (base + 1023u) & ~1023u, b_addr = a_addr + 64 * 128;
  for (int i = threadIdx.x; i < (64 + 256) * 64; i += blockDim.x) {
    // bf16 values near 1 (not zeros: zeros run faster)
    reinterpret_cast<uint16_t*>(peak_smem + (a_addr - base))[i] = uint16_t(0x3F80u | (i & 0x3F));
  }
  ds::cuda::wgmma::fence_proxy_async();
  __syncthreads();
  float d[128];  // the first wgmma ignores them (scale-d 0); zeroing them serializes the wgmmas
  const uint64_t da = ds::cuda::wgmma::desc(a_addr), db = ds::cuda::wgmma::desc(b_addr);
  for (int it = 0; it < iters; ++it) {
    ds::cuda::wgmma::fence();
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
          "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
          "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
          "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
          "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
          "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
          "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "
          "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "
          "%123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
            "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
            "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
            "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
            "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
            "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
            "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
            "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
            "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
            "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
            "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]),
            "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
            "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
            "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
            "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
            "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
            "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),
            "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]),
            "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),
            "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
            "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
            "+f"(d[127])
          : "l"(da + 2 * (k & 3)), "l"(db + 2 * (k & 3)), "r"(it | k));
    }
    ds::cuda::wgmma::commit();
    ds::cuda::wgmma::wait<0>();
  }
  float s = 0;
  for (int i = 0; i < 128; ++i) s += d[i];
  if (s == 12345.0f) *sink = s;
#else
  (void)iters, (void)sink;
#endif
}

double measure_wgmma_tflops(cudaStream_t stream, int sms) {
  int dev = 0, major = 0, minor = 0;
  DS_BENCH_CHECK(cudaGetDevice(&dev));
  DS_BENCH_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  DS_BENCH_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) return 0.0;
  float* sink;
  DS_BENCH_CHECK(cudaMalloc(&sink, 4));
  DS_BENCH_CHECK(cudaFuncSetAttribute(wgmma_peak_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kWgPeakSmem));
  const int iters = 2048;
  const double us = bench::time_us(
      [&](cudaStream_t s) { wgmma_peak_kernel<<<sms, 256, kWgPeakSmem, s>>>(iters, sink); },
      stream, 10, 2);
  DS_BENCH_CHECK(cudaFree(sink));
  const double flops = double(sms) * 2 * iters * 16 * (2.0 * 64 * 256 * 16);
  return flops / (us * 1e-6) / 1e12;
}

// The register-A wgmma (m64nNk16) that the MoE prefill kernel issues, by width N: four warpgroups
// per CTA (the default prefill CTAs), one CTA per SM, groups of four k16 steps committed with
// wait_group 1 between them on two alternating A buffers, B one [128][64] bf16 atom (128-byte
// swizzle). No dequantization and no copies: the kernel's tensor ceiling at each width.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int N>
__device__ __forceinline__ void mma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                       int scale_d);
#include "kernels/cuda/moe/moe_wgmma_rs.inc"  // mma_rs<8, 16, ..., 128>
#endif
constexpr int kWgRsSmem = 128 * 128 + 1024;
template <int N>
__global__ void __launch_bounds__(512, 1) wgmma_rs_width_kernel(int iters, float* sink) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t rs_smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(rs_smem));
  const uint32_t b_addr = (base + 1023u) & ~1023u;
  for (int i = threadIdx.x; i < 128 * 64; i += blockDim.x)
    reinterpret_cast<uint16_t*>(rs_smem + (b_addr - base))[i] = uint16_t(0x3F80u | (i & 0x3F));
  ds::cuda::wgmma::fence_proxy_async();
  __syncthreads();
  uint32_t a[2][4][4];
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int r = 0; r < 4; ++r) a[h][k][r] = 0x3F803F80u | ((threadIdx.x + 5 * k + r) & 0x3F);
  float d[64];  // the first wgmma ignores them (scale-d 0)
  const uint64_t db = ds::cuda::wgmma::desc(b_addr);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ds::cuda::wgmma::wait<1>();
      ds::cuda::wgmma::fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) mma_rs<N>(d, a[h][k], db + 2 * k, (it | h | k) != 0);
      ds::cuda::wgmma::commit();
    }
  }
  ds::cuda::wgmma::wait<0>();
  float s = 0;
  for (int i = 0; i < N / 2; ++i) s += d[i];
  if (s == 12345.0f) *sink = s;
#else
  (void)iters, (void)sink;
#endif
}

template <int N>
double measure_wgmma_rs_tflops(cudaStream_t stream, int sms, float* sink) {
  DS_BENCH_CHECK(cudaFuncSetAttribute(wgmma_rs_width_kernel<N>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kWgRsSmem));
  const int iters = 2048;
  const double us = bench::time_us(
      [&](cudaStream_t s) { wgmma_rs_width_kernel<N><<<sms, 512, kWgRsSmem, s>>>(iters, sink); },
      stream, 10, 2);
  const double flops = double(sms) * 4 * iters * 8 * (2.0 * 64 * N * 16);
  return flops / (us * 1e-6) / 1e12;
}

double measure_mma_f8_tflops(cudaStream_t stream, int sms) {
  float* sink;
  DS_BENCH_CHECK(cudaMalloc(&sink, 4));
  const int iters = 4096, blocks = sms * 4, threads = 256;
  const double us = bench::time_us(
      [&](cudaStream_t s) { mma_f8_peak_kernel<<<blocks, threads, 0, s>>>(iters, sink); }, stream,
      10, 2);
  DS_BENCH_CHECK(cudaFree(sink));
  const double flops = double(blocks) * (threads / 32) * iters * 8 * (2.0 * 16 * 8 * 32);
  return flops / (us * 1e-6) / 1e12;
}

double measure_mma_tflops(cudaStream_t stream, int sms) {
  float* sink;
  DS_BENCH_CHECK(cudaMalloc(&sink, 4));
  const int iters = 4096, blocks = sms * 4, threads = 256;
  const double us = bench::time_us(
      [&](cudaStream_t s) { mma_peak_kernel<<<blocks, threads, 0, s>>>(iters, sink); }, stream,
      10, 2);
  DS_BENCH_CHECK(cudaFree(sink));
  const double flops = double(blocks) * (threads / 32) * iters * 8 * (2.0 * 16 * 8 * 16);
  return flops / (us * 1e-6) / 1e12;
}


// Per-kernel breakdown of one forward: the forward is captured into a graph once, and every kernel
// node of it is timed alone (a one-node graph replayed; median of 20 after 3 warm-ups) on the
// workspace state that the preceding full forwards left (every kernel is idempotent on it). The
// expert GEMMs' share is what the issue's prefill target is about.
struct NodeTime {
  std::string name;
  double us;
};

std::string short_kernel_name(const char* mangled) {
  static const char* known[] = {"expert_gemm_pf_kernelILb1", "expert_gemm_pf_kernelILb0",
                                "expert_gemm_wg_kernelILb1", "expert_gemm_wg_kernelILb0",
                                "expert_gemm_f8_kernel",     "expert_gemm_kernel",
                                "router_logits_tiled",       "router_logits_small",
                                "route_kernel",
                                "plan_kernel",               "quant_rows",
                                "combine_kernel"};
  const std::string m = mangled ? mangled : "?";
  for (const char* k : known) {
    if (m.find(k) != std::string::npos) {
      std::string n = k;
      if (n == "expert_gemm_pf_kernelILb1") return "gemm_pf_gate_up";
      if (n == "expert_gemm_pf_kernelILb0") return "gemm_pf_down";
      if (n == "expert_gemm_wg_kernelILb1") return "gemm_wg_gate_up";
      if (n == "expert_gemm_wg_kernelILb0") return "gemm_wg_down";
      if (n.find("expert_gemm") == 0) {
        // gate/up vs down: the kFused template argument, the first bool (Lb1 / Lb0) after the
        // tile rows (a later bool, the f16 MMA, must not decide it).
        const size_t b = m.find("ELb", m.find(n));
        return n + (b != std::string::npos && m.compare(b, 4, "ELb1") == 0 ? "_gate_up" : "_down");
      }
      return n;
    }
  }
  return m.substr(0, 40);
}

std::vector<NodeTime> node_breakdown(const std::function<void(cudaStream_t)>& fn,
                                     cudaStream_t stream) {
  cudaGraph_t graph;
  DS_BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  fn(stream);
  DS_BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  size_t n = 0;
  DS_BENCH_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  DS_BENCH_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::vector<NodeTime> out;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    DS_BENCH_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams kp{};
    DS_BENCH_CHECK(cudaGraphKernelNodeGetParams(node, &kp));
    const char* name = nullptr;
    if (cudaFuncGetName(&name, kp.func) != cudaSuccess) name = nullptr;
    cudaGraph_t one;
    cudaGraphNode_t added;
    cudaGraphExec_t exec;
    DS_BENCH_CHECK(cudaGraphCreate(&one, 0));
    DS_BENCH_CHECK(cudaGraphAddKernelNode(&added, one, nullptr, 0, &kp));
    DS_BENCH_CHECK(cudaGraphInstantiate(&exec, one, 0));
    const double us = bench::time_us(
        [&](cudaStream_t s) { DS_BENCH_CHECK(cudaGraphLaunch(exec, s)); }, stream, 20, 3, false);
    DS_BENCH_CHECK(cudaGraphExecDestroy(exec));
    DS_BENCH_CHECK(cudaGraphDestroy(one));
    out.push_back({short_kernel_name(name), us});
  }
  DS_BENCH_CHECK(cudaGraphDestroy(graph));
  return out;
}

struct Matrices {
  uint8_t* data = nullptr;   // [E][rows][bytes per row]
  uint8_t* scale = nullptr;  // [E][scale bytes]
  int64_t data_bytes = 0, scale_bytes = 0;  // per expert
};

Matrices make_fp4(cpu::WeightFormat f, int64_t rows, int64_t cols, int64_t count, uint32_t seed) {
  Matrices m;
  m.data_bytes = rows * cols / 2;
  m.scale_bytes = rows * cols / (f == cpu::WeightFormat::kMxfp4 ? 32 : 16);
  DS_BENCH_CHECK(cudaMalloc(&m.data, size_t(m.data_bytes * count)));
  DS_BENCH_CHECK(cudaMalloc(&m.scale, size_t(m.scale_bytes * count)));
  fill_bytes<<<4096, 256>>>(m.data, m.data_bytes * count, seed, 0, 0, 0);
  if (f == cpu::WeightFormat::kMxfp4) {
    fill_bytes<<<4096, 256>>>(m.scale, m.scale_bytes * count, seed + 1, 1, 118, 4);  // ~2^-8
  } else {
    fill_bytes<<<4096, 256>>>(m.scale, m.scale_bytes * count, seed + 1, 1, 0x30, 8);  // e4m3 ~1
  }
  DS_BENCH_CHECK(cudaGetLastError());
  return m;
}

}  // namespace
}  // namespace ds

// DS_MOE_CASES="fmt:T:path:raster[:rows[:wgs]][:sSTEP][:m|:b][:w][:o1][:a1][:p];..." (e.g.
// "mxfp4:4096:4:1", "mxfp4:4096:4:0:256", "mxfp4:4096:4:0:256:2", "mxfp4:4096:0:0:s32",
// "mxfp4:4096:0:0:b") runs only the forward cases with that weight format, token count,
// MoeTuning::path, pf_raster and (when set) pf_rows, pf_wgs, pf_step, pf_sync 1 / 2 (":m" /
// ":b"), route_by_warp 1 (":w"; the heuristic's rows have path 0), f8_order 1 (":o1"),
// f8_act_rows 1 (":a1"), route_launch 1 / 2 (":r1" / ":r2") and pdl 1 (":p"): one launch
// sequence for a profiler
// (scripts/gpu/h_moe18/run.sh, NCU=1). Unset: every case.
bool case_selected(const char* fmt, int64_t T, const ds::cuda::MoeTuning& t) {
  const char* env = std::getenv("DS_MOE_CASES");
  if (env == nullptr || *env == 0) return true;
  const std::string want =
      std::string(fmt) + ":" + std::to_string(T) + ":" + std::to_string(t.path) + ":" +
      std::to_string(t.pf_raster) + (t.pf_rows != 0 ? ":" + std::to_string(t.pf_rows) : "") +
      (t.pf_wgs != 0 ? ":" + std::to_string(t.pf_wgs) : "") +
      (t.pf_step != 0 ? ":s" + std::to_string(t.pf_step) : "") +
      (t.pf_sync == 1   ? ":m"
       : t.pf_sync == 2 ? ":b"
                        : "") +
      (t.route_by_warp == 1 ? ":w" : "") + (t.f8_order == 1 ? ":o1" : "") +
      (t.f8_act_rows == 1 ? ":a1" : "") +
      (t.route_launch != 0 ? ":r" + std::to_string(t.route_launch) : "") + (t.pdl == 1 ? ":p" : "");
  std::string list = env;
  for (size_t b = 0; b <= list.size();) {
    const size_t e = std::min(list.find(';', b), list.size());
    if (list.compare(b, e - b, want) == 0) return true;
    b = e + 1;
  }
  return false;
}

int main(int argc, char** argv) {
  using namespace ds;
  const std::string out = argc > 1 ? argv[1] : "bench/results/moe.json";
  cudaStream_t stream;
  DS_BENCH_CHECK(cudaStreamCreate(&stream));
  bench::DeviceInfo dev = bench::device_info();
  const double copy_gbps = bench::measure_copy_bandwidth_gbps(stream);
  const double mma_tflops = measure_mma_tflops(stream, dev.sm_count);
  const double mma_f8_tflops = measure_mma_f8_tflops(stream, dev.sm_count);
  const double wgmma_tflops = measure_wgmma_tflops(stream, dev.sm_count);
  std::printf("ceilings: copy %.0f GB/s, bf16 mma.sync %.0f TFLOP/s, e4m3 mma.sync %.0f TFLOP/s, "
              "bf16 wgmma %.0f TFLOP/s\n",
              copy_gbps, mma_tflops, mma_f8_tflops, wgmma_tflops);
  std::vector<bench::Record> records;
  {
    bench::Record r;
    r.kernel = "ceiling_mma_sync_bf16";
    r.shape = "m16n8k16 f32 acc, registers only";
    r.mode = "eager";
    r.achieved_tflops = mma_tflops;
    r.error_metric = "none";
    records.push_back(r);
    r.kernel = "ceiling_mma_sync_e4m3";
    r.shape = "m16n8k32 f32 acc, registers only";
    r.achieved_tflops = mma_f8_tflops;
    records.push_back(r);
    if (wgmma_tflops > 0.0) {
      r.kernel = "ceiling_wgmma_bf16";
      r.shape = "m64n256k16 f32 acc, A and B in shared memory, 2 warpgroups per SM";
      r.achieved_tflops = wgmma_tflops;
      records.push_back(r);
      // The prefill kernel's wgmma shapes (register A, N = its tile widths), same conditions
      // otherwise: what each width can reach at most.
      float* sink;
      DS_BENCH_CHECK(cudaMalloc(&sink, 4));
      const auto width = [&](auto n_c) {
        constexpr int N = decltype(n_c)::value;
        const double t = measure_wgmma_rs_tflops<N>(stream, dev.sm_count, sink);
        std::printf("wgmma m64n%dk16 register A, 4 warpgroups: %.0f TFLOP/s (%.1f%% of the peak)\n",
                    N, t, 100.0 * t / wgmma_tflops);
        r.kernel = "ceiling_wgmma_rs_n" + std::to_string(N);
        r.shape = "m64n" + std::to_string(N) +
                  "k16 f32 acc, A in registers, B in shared memory, 4 warpgroups per SM";
        r.achieved_tflops = t;
        records.push_back(r);
      };
      [&]<int... I>(std::integer_sequence<int, I...>) {
        (width(std::integral_constant<int, 16 * (I + 1)>{}), ...);
      }(std::make_integer_sequence<int, 8>{});
      DS_BENCH_CHECK(cudaFree(sink));
    }
  }

  // Shared expert (FP8 128x128 blocks), gate (fp32), inputs.
  uint8_t *s_data[3], *s_scale[3];
  for (int i = 0; i < 3; ++i) {
    const int64_t rows = i == 2 ? kDim : kInter, cols = i == 2 ? kInter : kDim;
    DS_BENCH_CHECK(cudaMalloc(&s_data[i], size_t(rows * cols)));
    DS_BENCH_CHECK(cudaMalloc(&s_scale[i], size_t(rows * cols / (128 * 128))));
    fill_bytes<<<4096, 256>>>(s_data[i], rows * cols, 50 + i, 2, 0, 0);
    fill_bytes<<<64, 256>>>(s_scale[i], rows * cols / (128 * 128), 60 + i, 1, 118, 4);
  }
  const int64_t shared_bytes = 3 * kDim * kInter + 3 * kDim * kInter / (128 * 128);
  float *gate, *bias;
  DS_BENCH_CHECK(cudaMalloc(&gate, size_t(kExperts * kDim) * 4));
  DS_BENCH_CHECK(cudaMalloc(&bias, size_t(kExperts) * 4));
  fill_floats<<<1024, 256>>>(gate, kExperts * kDim, 70, 0.03f);
  fill_floats<<<1, 256>>>(bias, kExperts, 71, 0.01f);
  const int64_t max_t = 8192;
  float *x, *y;
  DS_BENCH_CHECK(cudaMalloc(&x, size_t(max_t * kDim) * 4));
  DS_BENCH_CHECK(cudaMalloc(&y, size_t(max_t * kDim) * 4));
  fill_floats<<<4096, 256>>>(x, max_t * kDim, 72, 1.0f);
  DS_BENCH_CHECK(cudaDeviceSynchronize());

  for (cpu::WeightFormat fmt : {cpu::WeightFormat::kMxfp4, cpu::WeightFormat::kNvfp4}) {
    const char* fname = fmt == cpu::WeightFormat::kMxfp4 ? "mxfp4" : "nvfp4";
    Matrices w1 = make_fp4(fmt, kInter, kDim, kExperts, 1);
    Matrices w3 = make_fp4(fmt, kInter, kDim, kExperts, 3);
    Matrices w2 = make_fp4(fmt, kDim, kInter, kExperts, 5);
    const int64_t expert_bytes =
        w1.data_bytes + w1.scale_bytes + w3.data_bytes + w3.scale_bytes + w2.data_bytes +
        w2.scale_bytes;
    std::vector<cpu::ExpertWeights> experts(kExperts);
    const float gs = fmt == cpu::WeightFormat::kNvfp4 ? 0.01f : 1.0f;
    for (int64_t e = 0; e < kExperts; ++e) {
      experts[size_t(e)].w1 = {fmt, kInter, kDim, w1.data + e * w1.data_bytes,
                               w1.scale + e * w1.scale_bytes, gs};
      experts[size_t(e)].w3 = {fmt, kInter, kDim, w3.data + e * w3.data_bytes,
                               w3.scale + e * w3.scale_bytes, gs};
      experts[size_t(e)].w2 = {fmt, kDim, kInter, w2.data + e * w2.data_bytes,
                               w2.scale + e * w2.scale_bytes, gs};
    }
    cpu::MoeParams p;
    p.router_config = {kExperts, kTopk, 1.5f, 0.0f};
    p.router.gate = {cpu::WeightFormat::kF32, kExperts, kDim, gate, nullptr, 1.0f};
    p.router.bias = bias;
    p.experts = experts.data();
    p.shared.w1 = {cpu::WeightFormat::kFp8Block, kInter, kDim, s_data[0], s_scale[0], 1.0f};
    p.shared.w3 = {cpu::WeightFormat::kFp8Block, kInter, kDim, s_data[1], s_scale[1], 1.0f};
    p.shared.w2 = {cpu::WeightFormat::kFp8Block, kDim, kInter, s_data[2], s_scale[2], 1.0f};
    auto layer = cuda::MoeDeviceLayer::create(p);
    if (!layer.ok()) {
      std::fprintf(stderr, "create: %s\n", layer.status().message().c_str());
      return 1;
    }
    void* ws;
    DS_BENCH_CHECK(cudaMalloc(&ws, cuda::MoeRunner::workspace_bytes(max_t, *layer)));
    const std::vector<int64_t> sizes =
        fmt == cpu::WeightFormat::kMxfp4
            ? std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192}
            : std::vector<int64_t>{1, 16, 64, 512, 4096};
    // (T, tuning) cases: the heuristic for every size, plus a sweep of the GEMM variants.
    struct BenchCase {
      int64_t T;
      cuda::MoeTuning tuning;
    };
    std::vector<BenchCase> cases;
    for (int64_t T : sizes) cases.push_back({T, {}});
    // The kernels before this session's prefill path, forced (same run, same weights): the
    // session-5 defaults were the FP8 decode kernel with 16-row tiles at T = 512 and the bf16
    // kernel with 64-row tiles at T >= 1024; and the prefill path forced at T = 128 / 256.
    cases.push_back({512, cuda::MoeTuning{16, 2, fmt == cpu::WeightFormat::kMxfp4 ? 2 : 1, 8}});
    cases.push_back({4096, cuda::MoeTuning{64, 1, 1, 0}});
    if (fmt == cpu::WeightFormat::kMxfp4) {
      // Decode: the FP8 path with the e4m3 mma.sync forced (the default before session 8 on
      // sm_90), and K split / ring variants of the f16 mma.sync (session 8's default on sm_90).
      for (int64_t T : {1, 2, 4, 8, 16, 32, 64})
        cases.push_back({T, cuda::MoeTuning{0, 0, 2, 0, 1}});
      for (int64_t T : {1, 2, 4, 8, 16, 32, 64}) {
        for (int ks : {1, 2, 4}) cases.push_back({T, cuda::MoeTuning{8, ks, 2, 0, 2}});
        if (T <= 4 || T == 16 || T == 64)
          cases.push_back({T, cuda::MoeTuning{8, T <= 4 ? 4 : 2, 2, 16, 2}});
      }
      // 8 warps per CTA (16 warps per SM), both MMAs, every K split.
      for (int64_t T : {1, 2, 4, 8, 16, 32, 64})
        for (int ks : {1, 2, 4}) cases.push_back({T, cuda::MoeTuning{8, ks, 2, 0, 2, 8}});
      for (int64_t T : {1, 16, 64}) cases.push_back({T, cuda::MoeTuning{8, 2, 2, 0, 1, 8}});
      cases.push_back({8192, cuda::MoeTuning{64, 1, 1, 0}});
      for (int64_t T : {128, 256}) cases.push_back({T, cuda::MoeTuning{0, 0, 3, 0}});
      // The bf16 mma.sync prefill kernel (the 128-row default before the wgmma kernel, and still
      // off sm_90) against the wgmma one, and the wgmma kernel forced below its heuristic.
      for (int64_t T : {1024, 4096, 8192}) cases.push_back({T, cuda::MoeTuning{0, 0, 3, 0}});
      if (layer->pf_wgmma)
        for (int64_t T : {128, 256, 512, 1024}) cases.push_back({T, cuda::MoeTuning{0, 0, 4, 0}});
      // Session 29: the wgmma prefill kernel at decode sizes (tiles of <= 128 rows, wgmma widths
      // of 8 / 16), in its default CTAs (256 rows, four warpgroups) and in 128-row CTAs.
      if (layer->pf_wgmma) {
        for (int64_t T : {1, 2, 4, 8, 16, 32, 64}) {
          cases.push_back({T, cuda::MoeTuning{0, 0, 4, 0}});
          cuda::MoeTuning t{0, 0, 4, 0};
          t.pf_rows = 128;
          cases.push_back({T, t});
        }
      }
    } else {
      cases.push_back({4096, cuda::MoeTuning{0, 0, 3, 0}});
    }
    const bool mx = fmt == cpu::WeightFormat::kMxfp4;
    // Programmatic dependent launches of the MoE kernels (MoeTuning::pdl) against the default plain
    // launches, the decode sizes in a graph (each MoE kernel overlaps only its launch); also with
    // the FP8 path's grid order before (f8_order 1, session 29).
    const std::vector<int64_t> pdl_sizes =
        mx ? std::vector<int64_t>{1, 2, 4, 8, 16, 64} : std::vector<int64_t>{1, 16, 64};
    for (int64_t T : pdl_sizes) {
      cuda::MoeTuning t;
      t.pdl = 1;
      cases.push_back({T, t});
      t.f8_order = 1;
      cases.push_back({T, t});
    }
    // Session 29: the FP8 path's grid order before (MoeTuning::f8_order 1) and the whole activation
    // tile (f8_act_rows 1) next to the default rows above.
    if (mx) {
      for (int64_t T : {1, 2, 4, 8, 16, 32, 64}) {
        cuda::MoeTuning t;
        t.f8_order = 1;
        cases.push_back({T, t});
        // The activation tile's rows before (the whole tile), and both forms before.
        cuda::MoeTuning full;
        full.f8_act_rows = 1;
        cases.push_back({T, full});
        t.f8_act_rows = 1;
        cases.push_back({T, t});
      }
    }
    // The decode-size routing by a warp per token (MoeTuning::route_by_warp 1) next to the default
    // rows above (the CTA routes by rank up to 2 tokens at E = 256).
    for (int64_t T : mx ? std::vector<int64_t>{1, 2, 4, 8} : std::vector<int64_t>{1}) {
      cuda::MoeTuning t;
      t.route_by_warp = 1;
      cases.push_back({T, t});
    }
    // Session 43: the routing and plan in the router logits kernel's last CTA (MoeTuning::
    // route_launch 1, T <= 8) next to the default rows, plain and with PDL.
    if (mx) {
      for (int64_t T : {1, 2, 4, 8}) {
        cuda::MoeTuning t;
        t.route_launch = 1;
        cases.push_back({T, t});
        if (T <= 2) {
          t.pdl = 1;
          cases.push_back({T, t});
        }
      }
    }
    // The prefill grids in the order before session 20 (MoeTuning::pf_raster = 1: tiles side by
    // side) next to the default rows (the N blocks of a tile side by side).
    if (layer->pf_wgmma) {
      const std::vector<int64_t> ts = mx ? std::vector<int64_t>{512, 1024, 4096, 8192}
                                         : std::vector<int64_t>{4096};
      for (int64_t T : ts) {
        cuda::MoeTuning t{0, 0, 4, 0};
        t.pf_raster = 1;
        cases.push_back({T, t});
      }
    }
    if (mx) {
      cuda::MoeTuning t{0, 0, 3, 0};
      t.pf_raster = 1;
      cases.push_back({4096, t});
    }
    // The wgmma prefill kernel's other CTA shapes next to the default rows above (256 weight rows in
    // four warpgroups): 128 rows (MoeTuning::pf_rows) and 256 rows in two warpgroups (pf_wgs; path
    // 4 forced at 512 / 1024, the default at 4096 / 8192).
    if (layer->pf_wgmma) {
      const std::vector<int64_t> ts = mx ? std::vector<int64_t>{512, 1024, 4096, 8192}
                                         : std::vector<int64_t>{4096};
      for (int64_t T : ts) {
        cuda::MoeTuning t{0, 0, 4, 0};
        t.pf_rows = 128;
        cases.push_back({T, t});
      }
      for (int64_t T : ts) {
        cuda::MoeTuning t{0, 0, 4, 0};
        t.pf_rows = 256;
        t.pf_wgs = 2;
        cases.push_back({T, t});
      }
      // The default CTAs with tile widths in steps of 32 and of 8 (MoeTuning::pf_step) next to
      // the default steps of 16 (the default rows at 4096 / 8192).
      for (int step : {32, 8}) {
        for (int64_t T : {int64_t(4096), int64_t(8192)}) {
          if (!mx && T != 4096) continue;
          cuda::MoeTuning t;
          t.pf_step = step;
          cases.push_back({T, t});
        }
      }
      // The default CTAs with the CTA barrier per chunk instead of the default per-slot
      // mbarriers (MoeTuning::pf_sync 2).
      for (int64_t T : {int64_t(1024), int64_t(4096), int64_t(8192)}) {
        if (!mx && T != 4096) continue;
        cuda::MoeTuning t;
        t.pf_sync = 2;
        cases.push_back({T, t});
      }
    }
    for (const BenchCase& bc : cases) {
      const int64_t T = bc.T;
      if (!case_selected(fname, T, bc.tuning)) continue;
      auto fwd = [&](cudaStream_t s) {
        Status st = cuda::MoeRunner::forward(*layer, x, nullptr, T, y, ws, s, bc.tuning);
        if (!st.ok()) {
          std::fprintf(stderr, "forward: %s\n", st.message().c_str());
          std::exit(1);
        }
      };
      // Distinct experts touched by this input (the routing is deterministic).
      int32_t* ex;
      float* wt;
      DS_BENCH_CHECK(cudaMalloc(&ex, size_t(T * kTopk) * 4));
      DS_BENCH_CHECK(cudaMalloc(&wt, size_t(T * kTopk) * 4));
      Status st = cuda::MoeRunner::route(*layer, x, nullptr, T, ex, wt, ws, stream);
      if (!st.ok()) return 1;
      std::vector<int32_t> hex(size_t(T * kTopk));
      DS_BENCH_CHECK(cudaMemcpy(hex.data(), ex, hex.size() * 4, cudaMemcpyDeviceToHost));
      DS_BENCH_CHECK(cudaFree(ex));
      DS_BENCH_CHECK(cudaFree(wt));
      const int64_t distinct = int64_t(std::set<int32_t>(hex.begin(), hex.end()).size());

      const bool graph = T <= 64;
      const double eager_us = bench::time_us(fwd, stream, 20, 3, false);
      const double us = graph ? bench::time_us(fwd, stream, 50, 5, true) : eager_us;
      std::vector<float> hy(size_t(T * kDim));
      DS_BENCH_CHECK(cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost));
      int64_t nonfinite = 0;
      for (float v : hy) nonfinite += std::isfinite(v) ? 0 : 1;

      const double routed_bytes = double(distinct) * double(expert_bytes);
      const double bytes = routed_bytes + double(shared_bytes) + double(kExperts * kDim * 4) +
                           double(T * kDim * 8);
      const double flops = 2.0 * 3.0 * double(kDim) * double(kInter) * double(T * kTopk + T);
      // The MMA the grouped GEMMs run on: wgmma for the sm_90a prefill kernel (forced, or the
      // 128-row default where the layer has it), else bf16 mma.sync (the FP8 path's is below).
      const bool wg = bc.tuning.path == 4 ||
                      (bc.tuning.path == 0 && bc.tuning.tile_tokens == 0 && layer->pf_wgmma &&
                       cuda::MoeRunner::tile_tokens(T, *layer) == 128);
      const double fwd_peak = wg ? wgmma_tflops : mma_tflops;
      bench::Record r;
      r.kernel = std::string("moe_forward_") + fname;
      if (bc.tuning.tile_tokens > 0 || bc.tuning.path > 0) {
        r.kernel += "_bt" + std::to_string(bc.tuning.tile_tokens) + "_ks" +
                    std::to_string(bc.tuning.k_split);
        if (bc.tuning.path > 0)
          r.kernel += bc.tuning.path == 4   ? "_wg"
                      : bc.tuning.path == 3 ? "_pf"
                      : bc.tuning.path == 2 ? "_fp8"
                                            : "_bf16";
        if (bc.tuning.ring_kb > 0) r.kernel += "_ring" + std::to_string(bc.tuning.ring_kb);
        if (bc.tuning.mma > 0) r.kernel += bc.tuning.mma == 1 ? "_e4m3" : "_f16";
        if (bc.tuning.warps > 0) r.kernel += "_w" + std::to_string(bc.tuning.warps);
        if (bc.tuning.pf_raster == 1) r.kernel += "_tilesfirst";
        if (bc.tuning.pf_rows != 0) r.kernel += "_r" + std::to_string(bc.tuning.pf_rows);
        if (bc.tuning.pf_wgs != 0) r.kernel += "_wgs" + std::to_string(bc.tuning.pf_wgs);
      }
      if (bc.tuning.pf_step != 0) r.kernel += "_s" + std::to_string(bc.tuning.pf_step);
      if (bc.tuning.pf_sync != 0) r.kernel += bc.tuning.pf_sync == 1 ? "_mbar" : "_bar";
      if (bc.tuning.pdl) r.kernel += "_pdl";
      if (bc.tuning.route_by_warp) r.kernel += "_rwarp";
      if (bc.tuning.route_launch == 1) r.kernel += "_rfused";
      if (bc.tuning.f8_order) r.kernel += "_order1";
      if (bc.tuning.f8_act_rows) r.kernel += "_fulltile";
      char shape[160];
      std::snprintf(shape, sizeof shape,
                    "T=%lld D=4096 E=256 k=6 inter=2048 distinct=%lld expert=%.2fMB +shared fp8",
                    (long long)T, (long long)distinct, double(expert_bytes) / 1e6);
      r.shape = shape;
      r.mode = graph ? "graph" : "eager";
      r.bytes = bytes;
      r.flops = flops;
      if (T <= 128) {
        r.floor_us = bytes / (copy_gbps * 1e9) * 1e6;
      } else {
        r.floor_us = std::max(flops / (fwd_peak * 1e12), bytes / (copy_gbps * 1e9)) * 1e6;
      }
      r.set_time(us);
      r.max_error = double(nonfinite);
      r.error_metric = "non-finite outputs (correctness: test_moe_cuda)";
      records.push_back(r);
      std::printf("%s bt%d ks%d p%d r%d m%d w%d rs%d rows%d pdl%d o%d a%d T=%-5lld distinct=%-3lld "
                  "eager %9.1f us  %s %9.1f us  %7.0f GB/s (expert bytes %.0f GB/s = %.0f%% of "
                  "copy)  %6.1f TFLOP/s (%.0f%% of mma)\n",
                  fname, bc.tuning.tile_tokens, bc.tuning.k_split, bc.tuning.path,
                  bc.tuning.ring_kb, bc.tuning.mma, bc.tuning.warps, bc.tuning.pf_raster,
                  bc.tuning.pf_rows, bc.tuning.pdl, bc.tuning.f8_order,
                  bc.tuning.f8_act_rows, (long long)T,
                  (long long)distinct, eager_us, graph ? "graph" : "     ",
                  us, r.achieved_gbps, routed_bytes / (us * 1e-6) / 1e9,
                  100.0 * routed_bytes / (us * 1e-6) / 1e9 / copy_gbps, r.achieved_tflops,
                  100.0 * r.achieved_tflops / fwd_peak);
      // The GEMM nodes also at T = 2 and 4 for the default rows (the sizes under the 70% line).
      const bool plain = bc.tuning.tile_tokens == 0 && bc.tuning.path == 0 && bc.tuning.pdl == 0 &&
                         bc.tuning.f8_order == 0 && bc.tuning.f8_act_rows == 0 &&
                         bc.tuning.route_by_warp == 0 && bc.tuning.route_launch == 0;
      if (T == 1 || T == 16 || T == 64 || T >= 512 || (T <= 4 && plain) ||
          (T <= 4 && bc.tuning.route_launch == 1 && bc.tuning.pdl == 0)) {
        // Kernel breakdown: the expert GEMMs against the peak of the MMA they use, the router
        // logits against the copy bandwidth.
        const std::vector<NodeTime> nodes = node_breakdown(fwd, stream);
        double gemm_us = 0.0, logits_us = 0.0;
        bool f8 = false;
        std::string line;
        for (const NodeTime& nt : nodes) {
          char buf[96];
          std::snprintf(buf, sizeof buf, " %s %.1f", nt.name.c_str(), nt.us);
          line += buf;
          if (nt.name.find("gemm") != std::string::npos) gemm_us += nt.us;
          if (nt.name.find("f8") != std::string::npos) f8 = true;
          if (nt.name.find("router_logits") != std::string::npos) logits_us += nt.us;
        }
        std::printf("  nodes (us, each alone):%s\n", line.c_str());
        // The FP8 path's f16 variant (session 8) runs f16 mma.sync: the bf16 / f16 peak.
        const bool h16 = f8 && (bc.tuning.mma == 0 ? layer->fp8_f16 : bc.tuning.mma == 2);
        const char* mma_name = wg ? "bf16 wgmma" : !f8 ? "bf16 mma.sync" : h16 ? "f16 mma.sync"
                                                                              : "e4m3 mma.sync";
        const double peak = wg ? wgmma_tflops : f8 && !h16 ? mma_f8_tflops : mma_tflops;
        bench::Record g = r;
        g.kernel = "moe_gemms_" + r.kernel.substr(std::string("moe_forward_").size());
        g.shape = std::string(shape) + " (" + mma_name + ")";
        g.mode = "graph node";
        g.bytes = routed_bytes + double(shared_bytes);
        g.floor_us = T <= 128 ? g.bytes / (copy_gbps * 1e9) * 1e6
                              : std::max(flops / (peak * 1e12), g.bytes / (copy_gbps * 1e9)) * 1e6;
        g.set_time(gemm_us);
        records.push_back(g);
        std::printf("  expert GEMMs %.1f us = %.1f TFLOP/s = %.1f%% of the %s peak "
                    "(%.0f TFLOP/s); weight bytes %.0f GB/s = %.0f%% of copy\n",
                    gemm_us, g.achieved_tflops, 100.0 * g.achieved_tflops / peak, mma_name, peak,
                    g.achieved_gbps, 100.0 * g.achieved_gbps / copy_gbps);
        // (Not for the fused routing's rows: their logits node also routes and plans.)
        if (T <= 64 && bc.tuning.tile_tokens == 0 && bc.tuning.pdl == 0 &&
            bc.tuning.route_launch != 1) {
          bench::Record lr;
          lr.kernel = "moe_router_logits";
          lr.shape = "T=" + std::to_string(T) + " gate fp32 [256, 4096]";
          lr.mode = "graph node";
          lr.bytes = double(kExperts * kDim * 4) + double(T * kDim * 4) + double(T * kExperts * 4);
          lr.floor_us = lr.bytes / (copy_gbps * 1e9) * 1e6;
          lr.set_time(logits_us);
          lr.error_metric = "none (routing checked by test_moe_cuda)";
          records.push_back(lr);
          std::printf("  router logits T=%lld %.2f us = %.0f GB/s = %.0f%% of copy\n",
                      (long long)T, logits_us, lr.achieved_gbps,
                      100.0 * lr.achieved_gbps / copy_gbps);
        }
      }
    }
    if (fmt == cpu::WeightFormat::kMxfp4) {
      // The routing alone (gate logits + top-k), the part every step pays before the experts.
      for (int64_t T : {1, 64, 4096}) {
        int32_t* ex;
        float* wt;
        DS_BENCH_CHECK(cudaMalloc(&ex, size_t(T * kTopk) * 4));
        DS_BENCH_CHECK(cudaMalloc(&wt, size_t(T * kTopk) * 4));
        const double us = bench::time_us(
            [&](cudaStream_t s) {
              if (!cuda::MoeRunner::route(*layer, x, nullptr, T, ex, wt, ws, s).ok()) std::exit(1);
            },
            stream, 50, 5, T <= 64);
        bench::Record r;
        r.kernel = "moe_route";
        r.shape = "T=" + std::to_string(T) + " gate fp32 [256, 4096]";
        r.mode = T <= 64 ? "graph" : "eager";
        r.bytes = double(kExperts * kDim * 4) + double(T * kDim * 4);
        r.floor_us = r.bytes / (copy_gbps * 1e9) * 1e6;
        r.set_time(us);
        r.error_metric = "none";
        records.push_back(r);
        std::printf("route T=%-5lld %8.1f us\n", (long long)T, us);
        DS_BENCH_CHECK(cudaFree(ex));
        DS_BENCH_CHECK(cudaFree(wt));
      }
    }
    DS_BENCH_CHECK(cudaFree(ws));
    for (Matrices* m : {&w1, &w3, &w2}) {
      DS_BENCH_CHECK(cudaFree(m->data));
      DS_BENCH_CHECK(cudaFree(m->scale));
    }
  }
  bench::write_results(out, "moe", dev, copy_gbps, records);
  return 0;
}
