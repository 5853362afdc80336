// CudaOps: the DeepSeek-V4 op interface (src/model/deepseek_v4/ops.h) on one CUDA GPU. The same
// Forward that runs on CpuOps runs here; activations are fp32 device buffers from a step arena
// allocated once, weights are device copies made at creation (found by their host address), and
// per-sequence state lives in device memory:
//   - window rings of FP8 KV entries (kernels/cpu/kv_entry.h layout), R = sliding_window +
//     max_chunk - 1 slots per (layer, sequence), position p in slot p % R, so that a chunk's
//     tokens can be written before its queries attend without overwriting a key one of them needs;
//   - compressed KV entries in the same FP8 format and the indexer keys (CSA layers, the indexer
//     kernel's packed format) in pages of 256 token positions shared by all sequences (vLLM's
//     block tables): page k of a sequence covers positions [256k, 256k + 256), i.e. 64 entries
//     of a ratio-4 layer, 2 of a ratio-128 layer, 64 indexer keys. One page id names that page in
//     every layer's pools (the engine's KvCacheManager counts the same pages, runtime/kv_cache.h).
//     A sequence takes pages as its positions grow (begin_step) and returns them all at
//     release_sequence(); a device page table [max_sequences, ceil(max_context / 256)] maps its
//     logical pages to page ids, and the kernels reach it through the sequence's slot;
//   - the compressor state rings (fp32, kernels/cuda/compressor layout).
// Every sequence occupies one of `max_sequences` slots (its window rings, compressor rings and
// page-table row) from its first step until release_sequence() (or until a step starts it again
// at position 0, which resets its rings and keeps its pages). A step whose sequences need more
// pages than are free fails with kResourceExhausted before launching anything.
//
// Numerics: reference mode only (FP8 activation quantization, FP8 KV simulation, FP4 indexer
// simulation, bf16 rounding): the stored formats represent those values exactly, so the GPU
// forward differs from the CPU oracle only by accumulation order. hf mode is refused at creation.
//
// Errors: an op that fails (a CUDA error, an arena overflow, a step larger than the limits)
// records the first error, later ops of the step do nothing, and step_status() returns it; the
// forward returns it instead of advancing the sequences.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/rope/rope.h"
#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/ops.h"
#include "runtime/cuda/device_memory.h"

namespace ds::cuda {
class GemmRunner;
}  // namespace ds::cuda

namespace ds::runtime {

class NcclCommunicator;  // nccl_communicator.h

struct CudaOpsOptions {
  int device = 0;
  int64_t max_sequences = 8;      // live sequences (state slots)
  int64_t max_context = 0;        // tokens per sequence; 0 = max_position_embeddings
  int64_t max_step_tokens = 512;  // tokens of one forward call, all sequences together
  int64_t max_chunk = 0;          // tokens one sequence adds in one call; 0 = max_step_tokens
  int64_t max_logit_rows = 0;     // rows whose logits one call returns; 0 = max_step_tokens
  // Synchronize the stream at every component boundary, so that a host-clock profiler
  // (profile.h ProfilingOps) measures each component's device time. Turns CUDA graphs off.
  bool synchronous_components = false;
  // Profiling without synchronizing: record a CUDA event on the stream at every component
  // boundary (captured into the decode graphs as event-record nodes, so replayed steps are timed
  // too) and sum each range's device time, read by take_component_times after the step. The
  // events separate the kernels they sit between (no programmatic-launch overlap across a
  // range boundary), so the step is slightly slower than without them.
  bool component_events = false;
  // Decode steps (every sequence advancing by one token, main model) of up to
  // max_graph_tokens sequences are captured into a CUDA graph per batch size on their second
  // occurrence and replayed afterwards.
  bool cuda_graphs = true;
  int64_t max_graph_tokens = 256;
  // Speculative decoding (docs/speculative.md): the most positions one checkpoint may cover
  // (the engine's 1 + num_speculative_tokens); 0 = checkpoint() and rollback() are refused. Each
  // slot then holds a copy of the compressor ring rows a checkpoint may lose and a log of the
  // projected rows fed to each compressor since the checkpoint (docs/cuda_backend.md).
  int64_t max_checkpoint_tokens = 0;
  // KV pages (256 token positions each, shared by all sequences). Sizing, first that applies:
  //  - kv_pages > 0: exactly that many pages;
  //  - kv_cache_bytes > 0: as many pages as fit in that many bytes (at least one);
  //  - gpu_memory_utilization > 0: the device memory this backend may fill (a fraction of the
  //    GPU's total, counting what is already allocated: weights, workspaces, other processes).
  //    After the weights and the step arena, the rest holds max_sequences slots (fewer when they
  //    would leave no room for one sequence of max_context tokens; fewer than one is an error)
  //    and as many pages as fit, at most max_sequences * ceil(max_context / 256);
  //  - otherwise max_sequences * ceil(max_context / 256) pages (every slot can reach
  //    max_context).
  // options() then says the slots (max_sequences) and kv_pages_total() the pages.
  int64_t kv_pages = 0;
  uint64_t kv_cache_bytes = 0;
  double gpu_memory_utilization = 0;
  // FP8 weights of at least this many bytes (default 32 MiB: Flash's wq_b, wo_a, wo_b, the shapes
  // whose tiled plan measured faster) are also held in the small-M tile order
  // (cuda::launch_fp8_weight_to_tiles), which the decode kernels read as 2 KB contiguous pieces
  // at <= 8 tokens (kernels/cuda/gemm/NOTES.md, session 12); prefill's cuBLASLt GEMMs keep the
  // row-major copy. Costs those weights' bytes once more (Flash: 100 MB per layer).
  // < 0: none; DEEPSERVE_TILED_FP8=0 in the environment also turns it off (an A/B switch).
  int64_t tiled_fp8_min_bytes = int64_t(32) << 20;
  // wq_a and wkv (same input) also held concatenated, one [q_lora_rank + head_dim, hidden] FP8
  // weight per layer (Flash: +6.3 MB per layer), which linear_pair runs as one small-M GEMM with
  // a split output for up to this many tokens (kernels/cuda/gemm/NOTES.md, session 14). 0: no
  // copy; DEEPSERVE_FUSED_QKV=0 in the environment also turns it off (an A/B switch).
  int64_t fused_pair_max_tokens = 16;
  // A layer's compressor projections (CSA: the indexer compressor's wkv and wgate, then the
  // attention compressor's; HCA: the attention compressor's) also held as one concatenated bf16
  // weight ([2560, hidden] / [1024, hidden] at Flash: +21 / +8.4 MB per layer), which
  // compress_layer runs as one GEMM for up to this many tokens. 0: no copy;
  // DEEPSERVE_FUSED_COMPRESS=0 in the environment also turns it off (an A/B switch).
  int64_t fused_compress_max_tokens = 64;
  // The small-M FP8 GEMMs and the sparse MLA kernel launch as programmatic dependents of the
  // previous kernel (their weights / addresses are read while it finishes; they wait before
  // reading its outputs). DEEPSERVE_GEMM_PDL=0 in the environment turns it off (A/B switch).
  bool kernel_pdl = true;
  // Decode-sized FP8 linears on the sm_90a wgmma kernel where it measured faster
  // (cuda::fp8_linear_uses_wgmma: wq_b at <= 32 tokens, wo_b at 9-32, quantized wo_a at 9-64);
  // a weight served by it at every M <= 8 gets no tile-ordered copy. DEEPSERVE_GEMM_WGMMA=0 in the
  // environment turns it off (A/B switch).
  bool gemm_wgmma = true;
  // The q and kv paths' RMSNorm, RoPE and FP8 simulation of kv as one launch each
  // (Ops::norm_rope). DEEPSERVE_FUSED_NORM_ROPE=0 turns it off (A/B switch).
  bool fused_norm_rope = true;
  // attend de-rotates its own output (Ops::fuses_attend_inverse_rope): one kernel converts the
  // attention kernel's bf16 output, applies the inverse RoPE and writes o plus its bf16 form,
  // which the grouped wo_a reads (instead of bf16 -> fp32, rope, fp32 -> bf16: three launches).
  // DEEPSERVE_FUSED_OUTPUT_ROPE=0 turns it off (A/B switch).
  bool fused_output_rope = true;
  // Sparse MLA decode on the sm_90a wgmma kernel (64-key tiles) where the device is compute
  // capability 9.0, the shape allows it (head_dim 512, a multiple of 64 heads) and the step has
  // enough query tokens (cuda::sparse_mla_wgmma_preferred: >= 8 at 64 heads); the mma.sync kernel
  // otherwise. DEEPSERVE_SPARSE_MLA_WGMMA=0 turns it off (A/B switch).
  bool sparse_mla_wgmma = true;
  // The MoE kernels launch as programmatic dependents of the previous kernel
  // (cuda::MoeTuning::pdl; each waits at its start, so only the launches overlap). Off: no
  // decode-step gain measured (bench/results/ab_moe_pdl.json); DEEPSERVE_MOE_PDL=1 / =0 in the
  // environment turns it on / off (A/B switch).
  bool moe_pdl = false;
  // The MoE FP8 path's grid order of session 29 (cuda::MoeTuning::f8_order 0: the shared
  // expert's tiles first, then tile by tile). DEEPSERVE_MOE_F8_ORDER=0 turns it off (A/B switch).
  bool moe_f8_order = true;
  // At decode sizes (<= 8 tokens) the MoE router logits kernel also routes and plans, in its last
  // CTA (cuda::MoeTuning::route_launch 1: one launch instead of two; moe/NOTES.md, session 43).
  // DEEPSERVE_MOE_ROUTE_IN_LOGITS=1 / =0 in the environment turns it on / off (A/B switch).
  bool moe_route_in_logits = false;
};

class CudaOps final : public dsv4::Ops {
 public:
  // Uploads the weights and allocates every buffer. `weights` must outlive the CudaOps.
  static Result<std::unique_ptr<CudaOps>> create(const dsv4::ModelWeights& weights,
                                                 const dsv4::ForwardOptions& options,
                                                 const CudaOpsOptions& cuda_options);
  ~CudaOps() override;

  // Device bytes held: weights, state, arena and workspaces.
  size_t weight_bytes() const { return weights_.device_bytes(); }
  size_t state_bytes() const { return state_bytes_; }
  size_t arena_bytes() const { return arena_.capacity(); }
  size_t arena_high_water() const { return arena_.high_water(); }
  // FP8 weights also held in the small-M tile order (CudaOpsOptions::tiled_fp8_min_bytes).
  int64_t tiled_fp8_weights() const { return int64_t(fp8_tiled_.size()); }
  // Layers (main and MTP) whose wq_a and wkv are also held concatenated (fused_pair_max_tokens).
  int64_t fused_pairs() const { return int64_t(fused_pairs_.size()); }
  // Layers (main and MTP) whose compressor projections are also held concatenated
  // (fused_compress_max_tokens).
  int64_t fused_compressors() const { return int64_t(fused_compress_.size()); }
  const CudaOpsOptions& options() const { return opt_; }
  cudaStream_t stream() const { return stream_; }
  // KV pages: 256 token positions each (kPageTokens); total, free, held by `state` (0 when it has
  // no slot), and the device bytes of one page over every layer's pools.
  int64_t kv_pages_total() const { return kv_pages_total_; }
  int64_t kv_pages_free() const { return int64_t(free_pages_.size()); }
  int64_t kv_pages_held(const dsv4::SequenceState* state) const;
  int64_t kv_page_bytes() const { return kv_page_bytes_; }
  // Decode-step graphs captured and replayed so far.
  int64_t graph_captures() const { return graph_captures_; }
  int64_t graph_replays() const { return graph_replays_; }
  // Tensor/expert parallelism (sharding.h): the rank's communicator, not owned; set it before the
  // first step (captured graphs hold its all-reduces). nullptr (the default): one rank, and
  // all_reduce_sum does nothing.
  void set_communicator(NcclCommunicator* comm) { comm_ = comm; }
  // Tests and debugging: every compressor ring of a sequence's slot (each layer's attention
  // ring, then its indexer ring, main layers then MTP), copied to the host after a stream sync.
  Result<std::vector<float>> read_compressor_rings(const dsv4::SequenceState* state);

  // ---- Ops ----
  void begin_step(const dsv4::StepPlan& plan) override;
  void end_step() override;
  Status step_status() const override { return error_; }
  void release_sequence(const dsv4::SequenceState* state) override;
  Status checkpoint(dsv4::SequenceState* state, bool mtp, int64_t position,
                    int64_t max_tokens) override;
  Status rollback(dsv4::SequenceState* state, bool mtp, int64_t to_position) override;
  void* alloc_bytes(int64_t bytes) override;
  size_t mark() const override { return arena_.mark(); }
  void release(size_t mark) override { arena_.release(mark); }
  void component_begin(dsv4::Component component) override;
  void component_end(dsv4::Component component) override;
  bool take_component_times(std::span<double> seconds, std::span<int64_t> ranges) override;
  void copy_to_host(const float* src, int64_t n, float* dst) override;
  void copy_many_to_host(std::span<const HostCopy> copies) override;
  // The greedy kernel (kernels/cuda/sampling) on the device rows, then 5 bytes per row to the
  // host; like the logits copy it ends a decode step's graph and runs after it.
  void argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* ids,
                   uint8_t* finite) override;
  // The sampling kernel (cpu::sample_rows bit for bit) after the graph, 5 bytes per row back.
  void sample_rows(const float* x, int64_t rows, int64_t n, const cpu::RowSampling* params,
                   int32_t* ids, uint8_t* finite) override;
  bool prefers_backend_sampling() const override { return true; }
  // Page-locked memory (cudaHostAlloc, portable to every device), so the logits copy runs at the
  // link's speed.
  std::shared_ptr<HostMemorySource> host_memory() const override { return host_memory_; }
  void copy_from_host(const float* src, int64_t n, float* dst) override;

  void embed(const cpu::LinearWeight& table, int64_t copies, float* x) override;
  void linear(const float* x, int64_t rows, const cpu::LinearWeight& w, bool quantize_activations,
              float* y, bool round_output) override;
  // One GEMM over the concatenated weights (split output) at <= fused_pair_max_tokens tokens
  // where the pair is held fused; two linears otherwise.
  void linear_pair(const float* x, int64_t rows, const cpu::LinearWeight& w0,
                   const cpu::LinearWeight& w1, bool quantize_activations, float* y0, float* y1,
                   bool round_output) override;
  bool fuses_linear_pair() const override { return !fused_pairs_.empty(); }
  void grouped_output_projection(const float* o, int64_t groups, const cpu::LinearWeight& wo_a,
                                 float* z, bool round_output) override;
  void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                float* y) override;
  void rms_norm_heads(float* x, int64_t rows, int64_t heads, int64_t head_dim, float eps) override;
  void rope(float* x, int64_t heads, int64_t head_dim, int64_t rope_dim, const float* inv_freq,
            cpu::RopeDirection direction) override;
  void round_bf16(float* x, int64_t n) override;
  // Reference numerics only (create): rms_norm, rms_norm_heads, rope, the mHC ops and
  // indexer_scale_weights round in their kernels; attend's output is bf16 (the sparse MLA
  // kernel's) widened to fp32.
  bool rounds_elementwise_outputs() const override { return true; }
  void simulate_fp8_kv(float* kv, int64_t rows, int64_t head_dim, int64_t rope_dim) override;
  // One launch (the RMSNorm kernel's RoPE / FP8 epilogue) where the head size allows it
  // (cuda::rms_norm_epilogue_supported), else the separate kernels.
  void norm_rope(float* x, const float* weight, int64_t rows, int64_t heads, int64_t head_dim,
                 float eps, int64_t rope_dim, const float* inv_freq, bool simulate_fp8,
                 bool round) override;
  bool fuses_norm_rope() const override { return fused_norm_rope_; }
  bool fuses_attend_inverse_rope() const override { return fused_output_rope_; }
  void indexer_prepare_query(float* q, int64_t heads, int64_t head_dim, int64_t rope_dim,
                             const float* inv_freq, bool fp4_simulation, bool round_bf16) override;
  void indexer_scale_weights(float* w, int64_t heads, int64_t head_dim) override;
  void mhc_pre(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights, const float* x,
               int64_t rows, float* u, float* post, float* comb) override;
  // One launch at decode sizes (the norm inside mhc_pre's cluster kernel), mhc_pre's kernels +
  // rms_norm's otherwise; rounds as mhc_pre and rms_norm do.
  void mhc_pre_norm(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                    const float* x, int64_t rows, const float* norm_weight, float eps, bool round,
                    float* u, float* post, float* comb) override;
  bool fuses_mhc_pre_norm() const override { return true; }
  void mhc_post(const cpu::MhcConfig& config, const float* o, const float* x, const float* post,
                const float* comb, int64_t rows, float* x_new) override;
  void mhc_head(const cpu::MhcConfig& config, const cpu::MhcHeadWeights& weights, const float* x,
                int64_t rows, float* y) override;
  void moe(const dsv4::MoeSite& site, const float* x, float* y) override;
  void add_broadcast(const float* e, const float* h, int64_t hc, int64_t dim, float* x) override;
  void gather_rows(const float* x, int64_t width, const std::vector<int64_t>& rows,
                   float* out) override;
  void all_reduce_sum(float* x, int64_t n) override;

  void compress(int64_t layer_slot, const dsv4::CompressorWeights& weights,
                cpu::CompressorKind kind, const cpu::CompressorFinishParams& finish,
                const float* h) override;
  // One bf16 GEMM for the layer's compressor projections at <= fused_compress_max_tokens tokens
  // where the concatenated weight is held; two compress calls otherwise.
  void compress_layer(int64_t layer_slot, const dsv4::CompressorWeights* indexer,
                      const cpu::CompressorFinishParams* indexer_finish,
                      const dsv4::CompressorWeights& attention,
                      const cpu::CompressorFinishParams& attention_finish,
                      const float* h) override;
  void indexer_select(int64_t layer_slot, const float* q_index, const float* w_index,
                      int32_t* selected) override;
  void attend(const dsv4::AttendParams& params, const float* q, const float* kv,
              const int32_t* selected, float* o) override;
  void store_window(int64_t layer_slot, const float* kv, int64_t head_dim) override;

 private:
  struct LayerStore;  // one layer's state pools
  struct StepData;    // the step's uploaded plan

  CudaOps(const dsv4::ModelWeights& weights, const dsv4::ForwardOptions& options,
          const CudaOpsOptions& cuda_options);
  Status init();
  Status register_weights();
  Status build_moe_layers();
  // The routed experts of `layer` this rank runs, [first, last) (all without expert parallelism).
  std::pair<int64_t, int64_t> expert_range(const dsv4::LayerWeights& layer) const;
  Status check(Status status);  // records the first error; returns it
  bool failed() const { return !error_.ok(); }
  // Ops launch nothing after an error, and nothing while a captured graph stands in for them.
  bool skip() const { return failed() || mode_ == Mode::kReplay; }
  void finish_graph_step();  // at the logits copy: end the capture / launch the graph
  int64_t layer_index(int64_t slot) const;  // main slot or num_hidden_layers + MTP slot
  template <typename T>
  T* scratch(int64_t n);  // arena allocation of n T's (nullptr + error on overflow)
  uint16_t* to_bf16(const float* x, int64_t rows, int64_t cols);  // arena bf16 copy
  // mhc_pre, with the RMSNorm of u fused in when norm_weight is set (mhc_pre_norm).
  void launch_mhc_pre_site(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                           const float* x, int64_t rows, const float* norm_weight, float eps,
                           float* u, float* post, float* comb);
  // x_bf16: a bf16 copy of x the caller made already (else the input is converted here, or
  // quantized straight from fp32 for an FP8 linear in reference numerics).
  Status linear_impl(const float* x, int64_t rows, const cpu::LinearWeight& w, bool quantize,
                     int groups, float* y, bool round, const uint16_t* x_bf16 = nullptr);
  template <typename T>
  const T* upload(const std::vector<T>& host);  // arena copy of a host array (this step)
  // A kernel that picks one token per row (argmax_rows, sample_rows) after the step's graph:
  // `launch(d_ids, d_finite)` on the stream with arena outputs, then tokens_to_host.
  template <typename Launch>
  void token_kernel(int64_t rows, int32_t* ids, uint8_t* finite, const char* kernel,
                    Launch&& launch);
  // After a sampling kernel: its launch checked, then ids / finite flags to the host, synced.
  void tokens_to_host(const int32_t* d_ids, const uint8_t* d_finite, int64_t rows, int32_t* ids,
                      uint8_t* finite, const char* kernel);
  Status reset_slot(int64_t slot);
  // The layers of one part of the model: main (false) or MTP (true).
  std::pair<int64_t, int64_t> part_layers(bool mtp) const;
  const dsv4::LayerWeights& layer_weights(int64_t layer) const;
  // One launch of cuda::launch_copy_segments over a host table (arena copy, stream ordered).
  Status copy_segments(const std::vector<cuda::CopySegment>& segments);
  // Checkpoint save (restore = false) or restore of slot `slot`'s compressor rows, `mtp` part.
  std::vector<cuda::CopySegment> checkpoint_segments(int64_t slot, bool mtp, int64_t position,
                                                     int64_t max_tokens, bool restore) const;
  // FP8 KV entries of rows [num_rows, head_dim] into `pool` through `page_table` (a row per
  // slot, `stride` entries): row r to entry row_index[r] of the sequence in slot row_slot[r]
  // (a row_index of -1 skips it).
  // launch_rope's parameters for x [num_tokens, heads, head_dim] at the step's positions.
  cuda::RopeParams rope_params(float* x, int64_t heads, int64_t head_dim, int64_t rope_dim,
                               const float* inv_freq, cpu::RopeDirection direction) const;
  // compress's part after the projections: the speculative log, the pooling / finishing kernels
  // and the packing of emitted entries. ckv / cscore: [num_tokens, row_stride] (>= width).
  void compress_rows(int64_t slot, const dsv4::CompressorWeights& cw, cpu::CompressorKind kind,
                     const cpu::CompressorFinishParams& finish, const float* ckv,
                     const float* cscore, int64_t row_stride);
  Status pack_kv(const float* rows, int64_t num_rows, const int32_t* row_slot,
                 const int32_t* row_index, uint8_t* pool, const int32_t* page_table,
                 int64_t stride, int64_t page_size, int64_t page_bytes, const char* what);
  // Gives slot `slot` pages up to `tokens` positions (host table and device page table); false
  // when the free pages do not suffice (nothing is taken then).
  bool grow_pages(int64_t slot, int64_t tokens);
  void free_pages(int64_t slot);

  const dsv4::ModelWeights& model_;
  const DeepSeekV4Config& config_;
  dsv4::ForwardOptions fwd_;
  CudaOpsOptions opt_;
  cudaStream_t stream_ = nullptr;
  int num_sms_ = 0;
  Status error_;

  WeightStore weights_;
  std::unordered_map<const void*, const float*> e8m0_f32_;  // FP8 weight scale grids as fp32
  // FP8 weights' tile-ordered copies (CudaOpsOptions::tiled_fp8_min_bytes): host data -> device.
  std::unordered_map<const void*, const uint8_t*> fp8_tiled_;
  // wq_a and wkv concatenated (fused_pair_max_tokens), keyed by wq_a's host data.
  struct FusedPair {
    const void* second = nullptr;  // wkv's host data
    const uint8_t* codes = nullptr;
    const uint8_t* scale = nullptr;
    const float* scale_f32 = nullptr;
  };
  std::unordered_map<const void*, FusedPair> fused_pairs_;
  // A layer's compressor projections concatenated (fused_compress_max_tokens), keyed by the
  // attention compressor's wkv host data: rows [indexer wkv, indexer wgate,] wkv, wgate.
  struct FusedCompress {
    const void* indexer = nullptr;  // the indexer compressor's wkv host data (CSA), else null
    const uint16_t* w = nullptr;    // [rows, hidden] bf16
    int64_t rows = 0;
  };
  std::unordered_map<const void*, FusedCompress> fused_compress_;
  bool kernel_pdl_ = true;  // CudaOpsOptions::kernel_pdl, unless DEEPSERVE_GEMM_PDL=0
  bool gemm_wgmma_ = true;  // CudaOpsOptions::gemm_wgmma, unless DEEPSERVE_GEMM_WGMMA=0
  // Ops::fuses_norm_rope: CudaOpsOptions::fused_norm_rope, unless DEEPSERVE_FUSED_NORM_ROPE=0
  bool fused_norm_rope_ = true;
  bool fused_output_rope_ = true;  // CudaOpsOptions::fused_output_rope, unless the env switch
  // The last attend's de-rotated output in bf16 (inverse_rope_output), in the forward's arena
  // until its attention scope ends: grouped_output_projection reads it for that o (and forgets
  // it); begin_step and every attend reset it.
  struct AttendOut {
    const float* f32 = nullptr;
    const uint16_t* bf16 = nullptr;
    int64_t n = 0;
  };
  AttendOut attend_out_;
  // CudaOpsOptions::sparse_mla_wgmma on a device and shape that run it, unless
  // DEEPSERVE_SPARSE_MLA_WGMMA=0.
  bool sparse_mla_wgmma_ = false;
  // CudaOpsOptions::moe_pdl unless DEEPSERVE_MOE_PDL says otherwise; CudaOpsOptions::
  // moe_f8_order unless DEEPSERVE_MOE_F8_ORDER=0; CudaOpsOptions::moe_route_in_logits unless
  // DEEPSERVE_MOE_ROUTE_IN_LOGITS says otherwise.
  cuda::MoeTuning moe_tuning_;
  // bf16 weights padded to a multiple of 8 rows: host data -> (device copy, padded rows).
  std::unordered_map<const void*, std::pair<const uint16_t*, int64_t>> padded_bf16_;
  // Per-layer MoE state, keyed by the layer's host expert array (MoeSite::experts).
  std::unordered_map<const cpu::ExpertWeights*, std::unique_ptr<cuda::MoeDeviceLayer>> moe_layers_;
  size_t moe_workspace_bytes_ = 0;
  DeviceArena arena_;
  DeviceBuffer gemm_workspace_;
  std::unique_ptr<cuda::GemmRunner> gemm_;
  DeviceBuffer state_;
  size_t state_bytes_ = 0;
  DeviceBuffer indexer_counters_;  // [max_step_tokens] IndexerSelectParams::merge_counters
  std::vector<LayerStore> layers_;  // [num_hidden_layers + num_nextn_predict_layers]
  int64_t window_slots_ = 0;        // R

  // Sequence slots.
  std::unordered_map<const dsv4::SequenceState*, int64_t> slot_of_;
  std::vector<int64_t> free_slots_;
  DeviceBuffer slot_ids_;  // [max_sequences] 0, 1, ...: the window rings' page table (a slot's own)
  // KV pages: the device page table [max_sequences, pages_per_seq_] and its host copy, the pages
  // each slot holds (a prefix of its row) and the free page ids.
  DeviceBuffer page_table_;
  std::vector<int32_t> page_table_host_;
  std::vector<int64_t> pages_held_;  // [max_sequences]
  std::vector<int32_t> free_pages_;
  int64_t pages_per_seq_ = 0;  // ceil(max_context / 256)
  int64_t kv_pages_total_ = 0;
  int64_t kv_page_bytes_ = 0;
  // Speculative checkpoints by slot and part (main, MTP).
  struct SlotCheckpoint {
    bool armed = false;
    int64_t position = 0;    // P0
    int64_t max_tokens = 0;  // the steps may advance the part to P0 + max_tokens
  };
  std::vector<std::array<SlotCheckpoint, 2>> checkpoints_;  // [max_sequences]

  // The open step.
  const dsv4::StepPlan* plan_ = nullptr;
  std::unique_ptr<StepData> step_;

  // CUDA graphs of decode steps, by batch size. The arena is a bump allocator and a decode
  // step's allocations depend only on its batch size (graph steps size every per-step array by
  // bounds), so every replay finds its buffers at the captured addresses; begin_step refreshes
  // their contents.
  enum class Mode : uint8_t { kEager, kCapture, kReplay };
  struct Graph {
    int64_t seen = 0;
    cudaGraphExec_t exec = nullptr;
  };
  Mode mode_ = Mode::kEager;
  std::unordered_map<int64_t, Graph> graphs_;
  int64_t graph_captures_ = 0, graph_replays_ = 0;
  NcclCommunicator* comm_ = nullptr;  // set_communicator
  std::shared_ptr<HostMemorySource> host_memory_;  // pinned host buffers (host_memory)

  // component_events: the events of the open step's range boundaries, in call order (reused
  // from step to step: end_step reads them after its synchronization), the ranges they delimit,
  // and the device seconds / range counts per component since take_component_times.
  struct TimedRange {
    dsv4::Component component;
    int begin = 0, end = 0;  // indices into range_events_
  };
  void record_range_event(int index);
  void accumulate_range_times();
  std::vector<cudaEvent_t> range_events_;
  std::vector<TimedRange> step_ranges_;
  int next_range_event_ = 0;
  int open_range_event_ = -1;  // the begin event of the open range, -1: none
  std::array<double, dsv4::kNumComponents> range_seconds_{};
  std::array<int64_t, dsv4::kNumComponents> range_counts_{};
};

}  // namespace ds::runtime
