// Session 17 timing experiment for the backend sampling kernel (not part of the build): the
// kernel's translation unit compiled with variant macros (DS_SAMPLE_ROWS_MASS_DIGITS,
// DS_SAMPLE_ROWS_ABLATE), timed on Flash-vocabulary rows of N(0, 9) logits. Prints one line per
// (params, rows): median us of 15 launches and how many of the first 4 rows differ from
// cpu::sample_rows. Build: scripts/gpu/h_samp17/build.sh.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/sampling.cpp"
#include "kernels/cuda/sampling/sample_rows.cu"

#define CK(x)                                                       \
  do {                                                              \
    cudaError_t e_ = (x);                                           \
    if (e_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
      return 1;                                                     \
    }                                                               \
  } while (0)

int main() {
  constexpr int64_t kVocab = 129280;
  const struct {
    const char* name;
    ds::cpu::RowSampling s;
  } cases[] = {{"plain", {1.0, 0, 1.0, 0.0, 0.0}},
               {"top_p", {1.0, 0, 0.9, 0.0, 0.0}},
               {"k_p_min", {0.8, 50, 0.95, 0.01, 0.0}}};
  for (int64_t rows : {1, 64}) {
    ds::Rng rng{uint64_t(rows)};
    std::vector<float> logits(size_t(rows * kVocab));
    for (float& v : logits) v = 3.0f * rng.normal();
    float* dl = nullptr;
    CK(cudaMalloc(&dl, logits.size() * 4));
    CK(cudaMemcpy(dl, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    for (const auto& c : cases) {
      std::vector<ds::cpu::RowSampling> params(size_t(rows), c.s);
      for (int64_t r = 0; r < rows; ++r) params[size_t(r)].uniform = double((r * 37) % 101) / 101.0;
      ds::cpu::RowSampling* dp = nullptr;
      int32_t* di = nullptr;
      uint8_t* df = nullptr;
      CK(cudaMalloc(&dp, params.size() * sizeof(params[0])));
      CK(cudaMalloc(&di, size_t(rows) * 4));
      CK(cudaMalloc(&df, size_t(rows)));
      CK(cudaMemcpy(dp, params.data(), params.size() * sizeof(params[0]), cudaMemcpyHostToDevice));
      ds::cuda::SampleRowsParams p;
      p.logits = dl;
      p.rows = rows;
      p.vocab = p.stride = kVocab;
      p.params = dp;
      p.ids = di;
      p.finite = df;
      cudaEvent_t a, b;
      CK(cudaEventCreate(&a));
      CK(cudaEventCreate(&b));
      std::vector<float> t;
      for (int k = 0; k < 16; ++k) {
        CK(cudaEventRecord(a));
        ds::cuda::launch_sample_rows(p, nullptr);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (k > 0) t.push_back(ms * 1000.0f);
      }
      std::sort(t.begin(), t.end());
      std::vector<int32_t> ids(static_cast<size_t>(rows));
      CK(cudaMemcpy(ids.data(), di, ids.size() * 4, cudaMemcpyDeviceToHost));
      int wrong = 0;
      for (int64_t r = 0; r < std::min<int64_t>(rows, 4); ++r) {
        int32_t want = -1;
        uint8_t fin = 0;
        ds::cpu::sample_rows(logits.data() + r * kVocab, 1, kVocab, &params[size_t(r)], &want,
                             &fin);
        wrong += ids[size_t(r)] != want;
      }
      std::printf("%-8s rows %3lld  %9.2f us  wrong %d\n", c.name, (long long)rows, t[t.size() / 2],
                  wrong);
      cudaFree(dp);
      cudaFree(di);
      cudaFree(df);
    }
    cudaFree(dl);
  }
  return 0;
}
