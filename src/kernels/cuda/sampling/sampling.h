// Greedy sampling and logprobs on the GPU over fp32 logits rows: the argmax with the lowest-index
// tie rule, log-softmax logprobs of the top-k tokens (k <= 20, the OpenAI API maximum; ordered by
// logit, ties by lower index), the logprob of a given token and whether the row is finite. There is
// no CPU kernel for this; the tests compute the expected values on the host in double.
// Random sampling (temperature, top-k, top-p, min-p, one uniform draw per row): launch_sample_rows,
// cpu::sample_rows bit for bit (kernels/cpu/sampling.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/sampling.h"

namespace ds::cuda {

inline constexpr int kMaxTopLogprobs = 20;

// Floats of workspace launch_sample_greedy needs for `rows` rows of `vocab` logits.
int64_t sampling_workspace_floats(int64_t rows, int64_t vocab);

struct SampleParams {
  const float* logits = nullptr;  // [rows, vocab], rows `stride` elements apart; finite values
                                  // (a NaN is never selected but poisons the row's logprobs)
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t stride = 0;
  int32_t* argmax = nullptr;           // [rows] nullable: greedy token (lowest index among maxima)
  int top_k = 0;                       // 0..kMaxTopLogprobs
  float* top_logprobs = nullptr;       // [rows, top_k] (when top_k > 0)
  int32_t* top_ids = nullptr;          // [rows, top_k]
  const int32_t* token_ids = nullptr;  // [rows] nullable: tokens whose logprob to report; when
                                       // null, token_logprobs reports the argmax token's
  float* token_logprobs = nullptr;     // [rows] nullable
  uint8_t* finite = nullptr;           // [rows] nullable: 1 when every logit of the row is finite
  float* workspace = nullptr;          // [sampling_workspace_floats(rows, vocab)]
};

// Split-vocab pass (each block: max, sum of exp, a local top list) into the workspace, then one
// warp per row merges the splits in a fixed order. No allocation, no host sync, graph-capturable.
void launch_sample_greedy(const SampleParams& params, cudaStream_t stream);

struct SampleRowsParams {
  const float* logits = nullptr;  // [rows, vocab], rows `stride` elements apart
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t stride = 0;
  const cpu::RowSampling* params = nullptr;  // [rows] in device memory
  int32_t* ids = nullptr;                    // [rows] the sampled tokens (0 for a non-finite row)
  uint8_t* finite = nullptr;                 // [rows] 1 when every logit of the row is finite
};

// One block of 1024 threads per row, no workspace, no host sync, graph-capturable.
void launch_sample_rows(const SampleRowsParams& params, cudaStream_t stream);

}  // namespace ds::cuda
