// KV compressors (dsv4-model.md §7.6): gated pooling of `ratio` consecutive tokens into one
// compressed entry. CSA (ratio 4) uses overlapping windows: entry w pools the A halves
// ([0:d]) of tokens 4(w-1)..4w-1 and the B halves ([d:2d]) of tokens 4w..4w+3, a per-channel
// softmax over 8 slots; HCA (ratio 128) pools the 128 tokens of window w, width d. The
// per-sequence state ring (REF kv_state / score_state) holds the tokens of the open window (and,
// for CSA, the previous window); a token-by-token push emits entry w when token ratio*w+ratio-1
// arrives, and the chunk form (prefill over T tokens from any start) gives bit-identical entries.
// Emitted entries are raw pooled vectors; compressor_finish_entry applies RMSNorm, RoPE at
// position ratio*w and the reference-mode quantization simulation.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/linear.h"

namespace ds::cpu {

struct CompressorConfig {
  int64_t ratio = 4;       // 4 (CSA, overlapping) or 128 (HCA); REF: overlap iff ratio == 4
  int64_t head_dim = 512;  // d: 512 for the attention compressor, 128 for the indexer's
  int64_t rope_dim = 64;   // rope tail of each entry

  bool overlap() const { return ratio == 4; }
  int64_t coff() const { return overlap() ? 2 : 1; }
  // Width of a token's projected kv/score vector (c * d).
  int64_t width() const { return coff() * head_dim; }
  // Rows of the state ring: CSA 8 (previous window 0..3, current 4..7), HCA 128.
  int64_t state_rows() const { return coff() * ratio; }
};

// Per-sequence, per-layer state (REF Compressor.kv_state / score_state for one batch row).
// score holds score + ape. Reset per sequence with compressor_state_reset.
struct CompressorState {
  std::vector<float> kv;     // [state_rows, width]
  std::vector<float> score;  // [state_rows, width]
};

// Sizes the state for config and resets it: kv = 0, score = -inf (§7.6).
void compressor_state_reset(const CompressorConfig& config, CompressorState* state);

// kv_t = h_t @ wkv^T and score_t = h_t @ wgate^T (no ape; §7.6: fp32 input, REF keeps wkv and
// wgate in fp32 and never quantizes their input).
//   h     [num_tokens, dim]
//   wkv   [width, dim], wgate [width, dim]
//   kv    [num_tokens, width]
//   score [num_tokens, width]
void compressor_project(const CompressorConfig& config, const LinearWeight& wkv,
                        const LinearWeight& wgate, const float* h, int64_t num_tokens, float* kv,
                        float* score);

// Pushes the token at `position` (positions must arrive in order, one sequence per state). When
// (position + 1) % ratio == 0, writes the raw entry number position / ratio to entry and returns
// true; otherwise returns false and leaves entry alone.
//   ape     [ratio, width]
//   kv_t    [width]
//   score_t [width]
//   entry   [head_dim]
bool compressor_push(const CompressorConfig& config, CompressorState* state, const float* ape,
                     const float* kv_t, const float* score_t, int64_t position, float* entry);

// Chunk form over num_tokens tokens at positions start_position .. start_position + num_tokens
// - 1 (start 0 is REF's prefill; any start continues a sequence). Complete windows inside the
// chunk are pooled straight from kv/score; tokens of partial windows go through the ring.
// Writes the entries w = start_position / ratio .. (start_position + num_tokens) / ratio - 1, in
// order, and returns their count. The entries and the state left behind equal those of pushing
// the tokens one by one (bit for bit).
//   ape     [ratio, width]
//   kv      [num_tokens, width]
//   score   [num_tokens, width]
//   entries [returned count, head_dim] (at most num_tokens / ratio + 1 rows)
int64_t compressor_prefill(const CompressorConfig& config, CompressorState* state, const float* ape,
                           const float* kv, const float* score, int64_t start_position,
                           int64_t num_tokens, float* entries);

enum class CompressorKind : uint8_t {
  kAttention,  // main KV compressor: FP8 simulation of the nope part in reference mode
  kIndexer,    // indexer key compressor: Hadamard + FP4 simulation in reference mode
};

struct CompressorFinishParams {
  CompressorKind kind = CompressorKind::kAttention;
  const float* norm_weight = nullptr;  // [head_dim] (compressor.norm.weight)
  const float* inv_freq = nullptr;     // [rope_dim / 2], the layer's compressed (YaRN) table
  float norm_eps = 1e-6f;
  // Reference mode: kAttention -> FP8 sim of [0, d - rope_dim) (blocks of 64, ue8m0);
  // kIndexer -> Hadamard over all d dims, then FP4 sim (blocks of 32).
  bool simulate_quantization = true;
  // Round to bf16 where REF's bf16 activations do: before the norm, after the norm, after RoPE
  // and after the Hadamard. Off for an fp32 (hf-golden) forward.
  bool round_bf16 = true;
};

// §7.6 post-processing of raw entry number entry_index, in place:
// RMSNorm_{norm}(bf16(C)); RoPE of the last rope_dim dims at position ratio * entry_index;
// then the kind's simulation.
//   entry [head_dim]
void compressor_finish_entry(const CompressorConfig& config, const CompressorFinishParams& params,
                             int64_t entry_index, float* entry);

}  // namespace ds::cpu
