// Small memory-bound kernels of the CUDA backend (src/model/deepseek_v4/ops.h) that have no family
// of their own: the token embedding, fp32 -> bf16 conversion and in-place bf16 rounding, the FP8
// simulation of the KV nope part, the indexer query preparation and weight scaling, the MTP input
// sum, row gathers, and the packing of fp32 KV rows into FP8 entries of a paged pool. Each kernel
// names its CPU reference; all of them are bit-identical to it (the one caveat, in
// launch_indexer_prepare_query, is the device's double sin/cos against libm's). None allocates or
// synchronizes with the host; grids depend on the sizes only, so every launch is graph-capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

// ---- Embedding ----

// §4: out[i, c, :] = bf16 table row ids[i] as fp32, for every copy c (the hc_mult residual
// copies).
// CPU reference: ds::dsv4::CpuOps::embed (ds::cpu::dequantize_weight_row of a kBF16 table).
struct EmbedParams {
  const uint16_t* table = nullptr;  // [vocab, dim] bf16 bits
  const int32_t* ids = nullptr;     // [num_tokens] device memory; an id outside [0, vocab) gives a
                                    // NaN row (never an out-of-bounds read)
  float* out = nullptr;             // [num_tokens, copies, dim]
  int64_t num_tokens = 0;
  int64_t vocab = 0;
  int64_t dim = 0;
  int64_t copies = 1;
};

void launch_embed(const EmbedParams& params, cudaStream_t stream);

// ---- bf16 conversion and rounding ----

// y = bf16 bits of x, round to nearest even (ds::float_to_bf16, NaN payloads included): the bf16
// input of a GEMM. Rows may be strided on both sides; padding columns of y are not written.
struct F32ToBf16Params {
  const float* x = nullptr;  // [num_rows, cols], rows x_stride elements apart
  uint16_t* y = nullptr;     // [num_rows, cols] bf16 bits, rows y_stride elements apart
  int64_t num_rows = 0;
  int64_t cols = 0;
  int64_t x_stride = 0;  // elements, >= cols
  int64_t y_stride = 0;  // elements, >= cols
};

// Vector loads (4 values) when cols and both strides are multiples of 4 and the pointers aligned,
// else one value per thread.
void launch_f32_to_bf16(const F32ToBf16Params& params, cudaStream_t stream);

// In place: x[i] = the value a bf16 tensor would hold (ds::cpu::round_to_bf16).
//   x [n]
void launch_round_bf16(float* x, int64_t n, cudaStream_t stream);

// Widening: y[i] = the fp32 value of bf16 bits x[i] (exact; ds::cpu::bf16_to_float_array).
//   x [n] bf16 bits, y [n]
void launch_bf16_to_f32(const uint16_t* x, int64_t n, float* y, cudaStream_t stream);

// ---- FP8 simulation of the KV nope part ----

// §7.2 in place: the first head_dim - rope_dim values of each row go through the FP8 simulation
// in blocks of 64 (a last partial block is its own block), the rope tail is left alone.
// CPU reference: ds::cpu::simulate_fp8_kv_nope (src/kernels/cpu/quant.h).
struct SimulateFp8KvParams {
  float* kv = nullptr;  // [num_rows, head_dim], rows row_stride elements apart
  int64_t num_rows = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 64;   // <= head_dim
  int64_t row_stride = 0;  // elements, >= head_dim (head_dim for a dense tensor)
};

// One warp per block of 64.
void launch_simulate_fp8_kv(const SimulateFp8KvParams& params, cudaStream_t stream);

// ---- Lightning indexer (§7.7) ----

inline constexpr int64_t kIndexerHeadDim = 128;  // index_head_dim (Flash and tiny)

// In place for every token at its own position: RoPE of the last rope_dim dims of each head
// (forward), bf16 rounding, then (simulate_fp4) the orthonormal Hadamard of each head, bf16
// rounding and FP4 simulation in blocks of 32 (the rounding steps only when round_bf16).
// CPU reference: ds::cpu::indexer_prepare_query (src/kernels/cpu/indexer.h) per token. Same fp32
// operations in the same order (no FMA contraction); cos/sin are evaluated in double and rounded
// to fp32 as there, so the output is bit-identical unless the device's double sin/cos and libm's
// straddle an fp32 rounding boundary (about 2^-29 per angle; never seen).
struct IndexerPrepareQueryParams {
  float* q = nullptr;                  // [num_tokens, num_heads, 128], tokens token_stride apart;
                                       // 16-byte aligned
  const float* inv_freq = nullptr;     // [rope_dim / 2], the layer's compressed (YaRN) table
  const int64_t* positions = nullptr;  // [num_tokens] device memory
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_dim = kIndexerHeadDim;  // must be 128
  int64_t rope_dim = 64;               // even, <= 128
  int64_t token_stride = 0;            // elements (num_heads * 128 for a dense tensor); mult. of 4
  bool simulate_fp4 = true;
  bool round_bf16 = true;
};

// One block per token (its cos/sin table in shared memory), one warp per head (4 values per lane:
// the Hadamard's first two stages in registers, the other five through shuffles).
void launch_indexer_prepare_query(const IndexerPrepareQueryParams& params, cudaStream_t stream);

// In place: w *= head_dim^-0.5 * num_heads^-0.5 (the factor is computed on the host exactly as
// ds::cpu::indexer_scale_weights computes it, then one fp32 multiply per value), then with
// round_bf16 rounded to bf16 values (ds::cpu::round_to_bf16).  w [num_tokens, num_heads]
void launch_indexer_scale_weights(float* w, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                                  bool round_bf16, cudaStream_t stream);

// ---- Row-wise helpers ----

// §9 MTP input: x[i, c, :] = e[i, :] + h[i, c, :] (one fp32 add; ds::dsv4::CpuOps::add_broadcast).
// x may alias h.
struct AddBroadcastParams {
  const float* e = nullptr;  // [num_tokens, dim]
  const float* h = nullptr;  // [num_tokens, hc, dim]
  float* x = nullptr;        // [num_tokens, hc, dim]
  int64_t num_tokens = 0;
  int64_t hc = 0;
  int64_t dim = 0;
};

void launch_add_broadcast(const AddBroadcastParams& params, cudaStream_t stream);

// out[r, :] = x[rows[r], :] (ds::dsv4::CpuOps::gather_rows). out must not overlap x.
struct GatherRowsParams {
  const float* x = nullptr;       // [num_x_rows, width]
  const int64_t* rows = nullptr;  // [num_rows] device memory; a row outside [0, num_x_rows) gives
                                  // a NaN output row
  float* out = nullptr;           // [num_rows, width]
  int64_t num_rows = 0;
  int64_t num_x_rows = 0;
  int64_t width = 0;
};

void launch_gather_rows(const GatherRowsParams& params, cudaStream_t stream);

// Batched device-to-device copy: dst of segment i = src of segment i (num_floats values), for
// every segment of one table, in one launch (the CUDA backend's speculative checkpoints save and
// restore a few rows of every layer's compressor ring of a sequence at once; one cudaMemcpyAsync
// per row range would cost a host call each). Segments must not overlap each other's dst, and a
// segment's src must not overlap any dst.
struct CopySegment {
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t num_floats = 0;
};

// One block row (blockIdx.y) per segment, float4 when both pointers and the count allow it.
//   segments [num_segments] device memory; max_floats >= every segment's num_floats (sizes the
//   grid)
void launch_copy_segments(const CopySegment* segments, int64_t num_segments, int64_t max_floats,
                          cudaStream_t stream);

// ---- FP8 KV entries into a paged pool (§7.2, §11) ----

// Packs fp32 KV rows into the FP8 entry format of src/kernels/cpu/kv_entry.h (nope e4m3 with one
// ue8m0 scale per 64, rope as bf16, pad byte 0; 584 B for head_dim 512, 194 B for 128) and stores
// row r as logical entry row_index[r] of sequence row_seq[r]: page
// page_table[row_seq[r] * page_table_stride + row_index[r] / page_size], slot
// row_index[r] % page_size, addressed as ds::cpu::kv_entry_data / kv_entry_scales do. A row_index
// of -1 skips the row. Bytes written are those of ds::cpu::pack_kv_entry; nothing else in the pool
// is touched. Two rows must not name the same entry.
struct PackKvEntriesParams {
  const float* kv = nullptr;            // [num_rows, head_dim], rows kv_stride elements apart;
                                        // 8-byte aligned
  const int32_t* row_seq = nullptr;     // [num_rows] device memory
  const int32_t* row_index = nullptr;   // [num_rows] device memory, -1 = skip
  const int32_t* page_table = nullptr;  // [num_seqs, page_table_stride] page ids
  uint8_t* pool = nullptr;              // pages of page_bytes; 4-byte aligned
  int64_t num_rows = 0;
  int64_t head_dim = 512;  // nope + 64, nope a positive multiple of 64, nope / 64 <= 31
  int64_t kv_stride = 0;   // elements, even, >= head_dim
  int64_t page_table_stride = 0;
  int64_t page_size = 0;   // entries per page
  int64_t page_bytes = 0;  // ds::cpu::kv_page_bytes(layout, page_size)
};

// One block per row: one warp per 64-value nope block (codes + scale), one more for the rope tail
// (bf16) and the pad byte.
void launch_pack_kv_entries(const PackKvEntriesParams& params, cudaStream_t stream);

}  // namespace ds::cuda
