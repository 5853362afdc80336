// KV compressors on the GPU (dsv4-model.md §7.6): for a batch of sequences, each with its own
// state ring in device memory and its own positions, pool every window the call completes
// (CSA ratio 4 with overlap: 8 slots; HCA ratio 128: 128 slots; a per-channel softmax over the
// slots' score + ape), finish the entries (bf16 rounding, RMSNorm, RoPE at position ratio * w,
// the reference-mode FP8 or Hadamard + FP4 simulation) into caller-provided rows, and update the
// rings. Decode (one token per sequence) and chunks (any start, any count) are the same call.
// CPU reference: ds::cpu::compressor_prefill + compressor_finish_entry (src/kernels/cpu/
// compressor.h); the projections kv = h wkv^T and score = h wgate^T are GEMMs done elsewhere.
//
// Ring layout (one per sequence and compressor, fp32, the CPU CompressorState's two arrays
// back to back): state = [2][state_rows][width], kv rows first, then score (+ape) rows, with
// state_rows = 8 and width = 2d for CSA, state_rows = 128 and width = d for HCA.
//   CSA: rows 0..3 hold the previous complete window (row i = its token 4(w-1)+i), rows 4..7 the
//   tokens of the open window (row 4 + t % 4).  HCA: row t % 128 holds token t of the open window.
// Rows of the open window past its last token are stale (whatever an earlier window left). A
// fresh sequence starts from launch_compressor_state_reset (kv 0, score -inf).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

// One sequence of a compressor call (device memory, an array of these per call).
struct CompressorSeq {
  int64_t row = 0;         // first row of this sequence's tokens in kv / score
  int64_t count = 0;       // tokens in this call (0 allowed)
  int64_t start = 0;       // position of the first token (the ring holds positions < start)
  int64_t entry_row = 0;   // row of `entries` receiving entry start / ratio; later ones follow
  float* state = nullptr;  // this sequence's ring, [2, state_rows, width] (see above)
};

enum class CompressorEntryKind : uint8_t {
  kAttention,  // FP8 simulation of [0, d - rope_dim) in blocks of 64 (reference mode)
  kIndexer,    // Hadamard over all d dims, then FP4 simulation in blocks of 32 (reference mode)
};

struct CompressorParams {
  const float* kv = nullptr;            // [rows, width] projected kv of every token of the call
  const float* score = nullptr;         // [rows, width] projected score (without ape)
  // Floats between consecutive rows of kv and of score (>= width; 0: width). A layer's
  // compressor projections done as one GEMM leave them side by side in wider rows.
  int64_t row_stride = 0;
  const float* ape = nullptr;           // [ratio, width]
  const CompressorSeq* seqs = nullptr;  // [num_seqs] device memory
  int64_t num_seqs = 0;
  int64_t max_count = 0;   // >= every seqs[i].count: sizes the grid (a captured graph can reuse it)
  int64_t ratio = 4;       // 4 (CSA, overlapping) or 128 (HCA)
  int64_t head_dim = 512;  // d: 512 (attention) or 128 (indexer); a multiple of 32, <= 1024
  int64_t rope_dim = 64;
  float* entries =
      nullptr;  // [*, head_dim]: entry w of sequence s at row entry_row + w - start/ratio
  // Finishing (compressor_finish_entry); with finish == false the raw pooled vectors are written.
  bool finish = true;
  CompressorEntryKind kind = CompressorEntryKind::kAttention;
  const float* norm_weight = nullptr;  // [head_dim]
  const float* inv_freq = nullptr;     // [rope_dim / 2] the layer's compressed (YaRN) table
  float norm_eps = 1e-6f;
  bool simulate_quantization = true;  // reference mode
  bool round_bf16 = true;
};

// Floats of one sequence's ring.
inline int64_t compressor_state_floats(int64_t ratio, int64_t head_dim) {
  const int64_t coff = ratio == 4 ? 2 : 1;
  return 2 * (coff * ratio) * (coff * head_dim);
}

// Two kernels: pool + finish (one block per emitted entry, one thread per channel), then the
// ring update (one thread per ring column). No allocation, no host sync, graph-capturable.
void launch_compressor(const CompressorParams& params, cudaStream_t stream);

// Resets the rings of seqs[0..num_seqs) to kv 0, score -inf.
void launch_compressor_state_reset(const CompressorSeq* seqs, int64_t num_seqs, int64_t ratio,
                                   int64_t head_dim, cudaStream_t stream);

}  // namespace ds::cuda
