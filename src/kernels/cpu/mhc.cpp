// mHC references (REF Block.hc_pre / hc_post, kernel.py hc_split_sinkhorn, ParallelHead.hc_head).
#include "kernels/cpu/mhc.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/dot.h"
#include "kernels/cpu/parallel.h"

namespace ds::cpu {

namespace {
float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}
}  // namespace

void mhc_mixes(const float* x, const float* fn, int64_t num_mixes, int64_t hc_dim, float norm_eps,
               float* mixes) {
  const float sum_sq = dot_f32(x, x, hc_dim);
  const float rsqrt = 1.0f / std::sqrt(sum_sq / float(hc_dim) + norm_eps);
  for (int64_t m = 0; m < num_mixes; ++m) {
    mixes[m] = dot_f32(fn + m * hc_dim, x, hc_dim) * rsqrt;
  }
}

void mhc_sinkhorn(float* comb, int64_t hc, int64_t iters, float eps) {
  auto normalize_rows = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < hc; ++k) sum += comb[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) comb[j * hc + k] /= (sum + eps);
    }
  };
  auto normalize_columns = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int64_t j = 0; j < hc; ++j) sum += comb[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) comb[j * hc + k] /= (sum + eps);
    }
  };
  // Softmax over each row (over k), then + eps.
  for (int64_t j = 0; j < hc; ++j) {
    float* row = comb + j * hc;
    float row_max = row[0];
    for (int64_t k = 1; k < hc; ++k) row_max = std::max(row_max, row[k]);
    float sum = 0.0f;
    for (int64_t k = 0; k < hc; ++k) {
      row[k] = std::exp(row[k] - row_max);
      sum += row[k];
    }
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
  }
  normalize_columns();
  for (int64_t it = 0; it + 1 < iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
}

void mhc_split(const float* mixes, const float* scale, const float* base, int64_t hc, int64_t iters,
               float eps, float* pre, float* post, float* comb) {
  for (int64_t i = 0; i < hc; ++i) pre[i] = sigmoid(mixes[i] * scale[0] + base[i]) + eps;
  for (int64_t i = 0; i < hc; ++i) {
    post[i] = 2.0f * sigmoid(mixes[hc + i] * scale[1] + base[hc + i]);
  }
  // comb[j][k] = m[2hc + hc*j + k] * scale[2] + base[2hc + hc*j + k].
  for (int64_t jk = 0; jk < hc * hc; ++jk) {
    comb[jk] = mixes[2 * hc + jk] * scale[2] + base[2 * hc + jk];
  }
  mhc_sinkhorn(comb, hc, iters, eps);
}

void mhc_pre(const MhcConfig& config, const MhcSiteWeights& weights, const float* x,
             int64_t num_tokens, float* u, float* post, float* comb) {
  const int64_t hc = config.hc_mult, dim = config.dim;
  const int64_t num_mixes = (2 + hc) * hc;
  DS_OMP_PARALLEL_FOR_IF(num_tokens * hc * hc * dim >= kParallelMinWork)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* xt = x + t * hc * dim;
    thread_local std::vector<float> mixes, pre;
    mixes.resize(size_t(num_mixes));
    pre.resize(size_t(hc));
    mhc_mixes(xt, weights.fn, num_mixes, hc * dim, config.norm_eps, mixes.data());
    mhc_split(mixes.data(), weights.scale, weights.base, hc, config.sinkhorn_iters, config.hc_eps,
              pre.data(), post + t * hc, comb + t * hc * hc);
    float* ut = u + t * dim;
    for (int64_t d = 0; d < dim; ++d) {
      float acc = 0.0f;
      for (int64_t i = 0; i < hc; ++i) acc += pre[size_t(i)] * xt[i * dim + d];
      ut[d] = acc;
    }
  }
}

void mhc_post(const MhcConfig& config, const float* o, const float* x, const float* post,
              const float* comb, int64_t num_tokens, float* x_new) {
  const int64_t hc = config.hc_mult, dim = config.dim;
  DS_OMP_PARALLEL_FOR_IF(num_tokens * hc * hc * dim >= kParallelMinWork)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* ot = o + t * dim;
    const float* xt = x + t * hc * dim;
    const float* pt = post + t * hc;
    const float* ct = comb + t * hc * hc;
    float* yt = x_new + t * hc * dim;
    for (int64_t k = 0; k < hc; ++k) {
      for (int64_t d = 0; d < dim; ++d) {
        float acc = pt[k] * ot[d];
        for (int64_t j = 0; j < hc; ++j) acc += ct[j * hc + k] * xt[j * dim + d];
        yt[k * dim + d] = acc;
      }
    }
  }
}

void mhc_head(const MhcConfig& config, const MhcHeadWeights& weights, const float* x,
              int64_t num_tokens, float* y) {
  const int64_t hc = config.hc_mult, dim = config.dim;
  DS_OMP_PARALLEL_FOR_IF(num_tokens * hc * hc * dim >= kParallelMinWork)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* xt = x + t * hc * dim;
    thread_local std::vector<float> mixes;
    mixes.resize(size_t(hc));
    mhc_mixes(xt, weights.fn, hc, hc * dim, config.norm_eps, mixes.data());
    for (int64_t i = 0; i < hc; ++i) {
      mixes[size_t(i)] =
          sigmoid(mixes[size_t(i)] * weights.scale[0] + weights.base[i]) + config.hc_eps;
    }
    float* yt = y + t * dim;
    for (int64_t d = 0; d < dim; ++d) {
      float acc = 0.0f;
      for (int64_t i = 0; i < hc; ++i) acc += mixes[size_t(i)] * xt[i * dim + d];
      yt[d] = acc;
    }
  }
}

}  // namespace ds::cpu
