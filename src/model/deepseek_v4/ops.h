// The op interface of the DeepSeek-V4 forward (architecture.md "One forward, two backends"): the
// forward (forward.cpp) is written once as a sequence of these ops; a backend implements them
// over its memory and kernels. CpuOps (cpu_ops.h) runs the fp32 reference kernels of
// src/kernels/cpu; a CUDA backend implements the same list over device memory.
//
// Conventions:
// - Activations are fp32 buffers of the backend's memory (host for the CPU, device for CUDA),
//   taken from the backend's step arena with alloc() and given back in LIFO order with
//   mark()/release(): no allocation outside the arena during a step.
// - Token-wise ops take explicit row counts; ops that need positions, token ids or per-sequence
//   state read them from the StepPlan given to begin_step() (row i of a [num_tokens, ...] buffer
//   is the plan's token i).
// - Weights are the views of ModelWeights (host addresses of the mapped checkpoint); a device
//   backend resolves them to its own copies.
// - Ops that touch per-sequence state (compress, attend, store_window) address a layer by its
//   slot and the plan's `mtp` flag (MTP layers keep their own window ring).
// - The op granularity follows the reference's kernels (one op per reference function), so that
//   each op has one CPU oracle and one fast kernel and can be timed as one component.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/host_memory.h"
#include "core/status.h"
#include "kernels/cpu/compressor.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/sampling.h"
#include "model/deepseek_v4/state.h"
#include "model/deepseek_v4/weights.h"

namespace ds::dsv4 {

// One forward call's tokens, sequences concatenated (built on the host by Forward).
struct StepPlan {
  struct Seq {
    SequenceState* state = nullptr;
    int64_t begin = 0;  // first row in the step
    int64_t count = 0;  // rows
    int64_t start = 0;  // position of the first row
  };
  bool mtp = false;  // the MTP layer's step (its own positions and window ring)
  int64_t num_tokens = 0;
  std::vector<int32_t> ids;        // [num_tokens] token ids (MTP: the next tokens)
  std::vector<int64_t> positions;  // [num_tokens]
  std::vector<int32_t> seq_of;     // [num_tokens] index into seqs
  std::vector<Seq> seqs;
};

// What attend() needs to know about a layer besides its weights.
struct AttendParams {
  int64_t layer_slot = 0;
  const LayerWeights* layer = nullptr;
  float softmax_scale = 0;  // 1 / sqrt(head_dim)
  // §7.8's de-rotation of the output done by attend itself (o = inverse RoPE of the attention
  // output at each token's position with the layer's inv_freq, rounded as the separate rope op
  // rounds): only for a backend that fuses_attend_inverse_rope, and the forward then skips its
  // rope call.
  bool inverse_rope_output = false;
};

// One MoE site (§8): the router, experts and numerics flags of a layer.
using MoeSite = cpu::MoeParams;

// The model components a step's time is attributed to (`deepserve profile`, NVTX ranges). Every
// op of a step runs inside exactly one component range.
enum class Component : uint8_t {
  kEmbed,                 // token embedding
  kMhc,                   // hyper-connection pre/post (mixes, Sinkhorn, collapse, expand)
  kNorm,                  // attn_norm / ffn_norm
  kAttentionProjections,  // wq_a, q_norm, wq_b, wkv, kv_norm, RoPE, wo_a, wo_b
  kCompressor,            // CSA/HCA and indexer compressors
  kIndexer,               // indexer query/weights and top-k selection
  kAttention,             // sparse attention core with sink, window ring update
  kMoe,                   // router, routed and shared experts
  kHead,                  // final hyper-connection collapse, norm, LM head
  kMtpInput,              // MTP layer's enorm/hnorm/e_proj/h_proj
  kCollective,            // tensor/expert-parallel all-reduces (sharded models only)
  kStep,                  // step overhead: begin_step (plan, uploads), handing out the logits,
                          // end_step (the final synchronization of a device backend)
};
inline constexpr int kNumComponents = 12;
const char* component_name(Component component);  // "attention projections", ...

class Ops {
 public:
  virtual ~Ops() = default;

  // ---- Step lifecycle and memory ----
  virtual void begin_step(const StepPlan& plan) = 0;
  virtual void end_step() = 0;
  // The first error of the open step (a device backend's ops cannot fail synchronously: a failed
  // op records its error and the later ops of the step do nothing). The forward checks it before
  // end_step and returns it instead of advancing the sequences. CpuOps never fails.
  virtual Status step_status() const { return ok_status(); }
  // The sequence will not be seen again (finished, aborted, freed): a backend that keeps
  // per-sequence storage of its own gives it back. A state seen again afterwards starts fresh.
  virtual void release_sequence(const SequenceState* state) {}
  // Uninitialized scratch of `bytes` bytes (16-byte aligned), valid until release() of an earlier
  // mark.
  virtual void* alloc_bytes(int64_t bytes) = 0;
  virtual size_t mark() const = 0;
  virtual void release(size_t mark) = 0;
  float* alloc(int64_t n) { return static_cast<float*>(alloc_bytes(n * int64_t(sizeof(float)))); }
  int32_t* alloc_i32(int64_t n) {
    return static_cast<int32_t*>(alloc_bytes(n * int64_t(sizeof(int32_t))));
  }

  // Component ranges (nested never; the forward opens one at a time). A CUDA backend emits NVTX
  // ranges here; the profiler times them. Default: nothing.
  virtual void component_begin(Component component) {}
  virtual void component_end(Component component) {}
  // Device time of the component ranges, for a backend that times them itself (CudaOps with
  // CudaOpsOptions::component_events: events recorded on its stream, captured into CUDA graphs
  // too): adds the seconds and the number of every range it timed since the previous call to
  // seconds[c] / ranges[c] (kNumComponents each) and returns true. Step-overhead ranges
  // (Component::kStep) are host work and not timed there. Default: false (the caller times
  // the ranges on the host).
  virtual bool take_component_times(std::span<double> seconds, std::span<int64_t> ranges) {
    return false;
  }
  // Host <-> backend copies of fp32 values (identity copies on the CPU).
  virtual void copy_to_host(const float* src, int64_t n, float* dst) = 0;
  virtual void copy_from_host(const float* src, int64_t n, float* dst) = 0;
  // Several copies to the host, all complete on return (a device backend issues them together and
  // waits once). Default: one copy_to_host each.
  struct HostCopy {
    const float* src = nullptr;  // [n] in the backend's memory
    int64_t n = 0;
    float* dst = nullptr;  // [n] host
  };
  virtual void copy_many_to_host(std::span<const HostCopy> copies) {
    for (const HostCopy& c : copies) copy_to_host(c.src, c.n, c.dst);
  }
  // Per row of x [rows, n] (backend memory): ids[r] = the lowest index of the row's maximum (NaN
  // values never win) and finite[r] = 1 when every value of the row is finite (else 0, and ids[r]
  // means nothing); ids and finite are host arrays, complete on return. A device backend computes
  // them where x is and copies back 5 bytes per row instead of the row (the engine's greedy rows).
  // Default: each row through copy_to_host, then argmax_rows_host.
  virtual void argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* ids, uint8_t* finite);
  // Per row of x [rows, n] (backend memory): ids[r] = cpu::sample_row's token for params[r] (a
  // temperature <= 0 is the argmax) and finite[r] as in argmax_rows (ids[r] = 0 when 0); host
  // arrays, complete on return. Default: each row through copy_to_host, then cpu::sample_rows.
  virtual void sample_rows(const float* x, int64_t rows, int64_t n, const cpu::RowSampling* params,
                           int32_t* ids, uint8_t* finite);
  // Whether the engine should hand this backend the random draws of requests that nothing adjusts
  // (sample_rows) instead of taking their logits: a device backend, where the rows are.
  virtual bool prefers_backend_sampling() const { return false; }
  // Where host buffers that receive copy_to_host results should come from (page-locked memory
  // on a device backend); null: the heap. The forward allocates the step's logits from it.
  virtual std::shared_ptr<HostMemorySource> host_memory() const { return nullptr; }

  // ---- Token-wise ops (rows = the plan's tokens unless a count is given) ----
  // §4: x[i, c, :] = embed[ids[i]] for c < copies.  x [num_tokens, copies, dim]
  virtual void embed(const cpu::LinearWeight& table, int64_t copies, float* x) = 0;
  // y = x @ W^T (cpu::linear), then, with round_output, y rounded to bf16 values as round_bf16
  // would (the forward's rounding point after the linear; a device backend rounds in the GEMM's
  // epilogue).  x [rows, K], y [rows, N]
  virtual void linear(const float* x, int64_t rows, const cpu::LinearWeight& w,
                      bool quantize_activations, float* y, bool round_output) = 0;
  // Two linears of the same input (the forward's wq_a and wkv): y0 = x @ W0^T and y1 = x @ W1^T
  // with what linear() gives for each (the default: two linear calls). A device backend may run
  // them as one GEMM over the concatenated weights at decode sizes; it says so through
  // fuses_linear_pair, and only then does the forward call this (at wq_a's place; otherwise it
  // calls linear for wq_a and, after the query path, for wkv, as before).
  virtual void linear_pair(const float* x, int64_t rows, const cpu::LinearWeight& w0,
                           const cpu::LinearWeight& w1, bool quantize_activations, float* y0,
                           float* y1, bool round_output) {
    linear(x, rows, w0, quantize_activations, y0, round_output);
    linear(x, rows, w1, quantize_activations, y1, round_output);
  }
  virtual bool fuses_linear_pair() const { return false; }
  // §7.8 grouped wo_a, round_output as for linear.
  //   o [num_tokens, heads * head_dim], z [num_tokens, groups * o_lora_rank]
  virtual void grouped_output_projection(const float* o, int64_t groups,
                                         const cpu::LinearWeight& wo_a, float* z,
                                         bool round_output) = 0;
  // Weighted RMSNorm (y may alias x).  x, y [rows, dim]
  virtual void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                        float* y) = 0;
  // Unweighted per-head RMSNorm in place.  x [rows, heads, head_dim]
  virtual void rms_norm_heads(float* x, int64_t rows, int64_t heads, int64_t head_dim,
                              float eps) = 0;
  // §7.3 interleaved RoPE of the last rope_dim dims of each head at the plan's positions.
  //   x [num_tokens, heads, head_dim]
  virtual void rope(float* x, int64_t heads, int64_t head_dim, int64_t rope_dim,
                    const float* inv_freq, cpu::RopeDirection direction) = 0;
  // Reference-mode bf16 rounding in place.  x [n]
  virtual void round_bf16(float* x, int64_t n) = 0;
  // True when this backend rounds the outputs of rms_norm, rms_norm_heads, rope (its rotated
  // dims; the forward gives it inputs that are bf16 values already), mhc_pre (u), mhc_post,
  // mhc_head, attend and indexer_scale_weights to bf16 values itself whenever the forward runs
  // with round_bf16, with the bits round_bf16 would give: the forward then does not call
  // round_bf16 after them (one launch fewer each on a device). Default: false (the CPU backend
  // rounds in separate calls).
  virtual bool rounds_elementwise_outputs() const { return false; }
  // §2 FP8 simulation of the non-rope dims of kv vectors in place.  kv [rows, head_dim]
  virtual void simulate_fp8_kv(float* kv, int64_t rows, int64_t head_dim, int64_t rope_dim) = 0;
  // §7.1 / §7.2 in place: the RMSNorm of each of the `heads` vectors of every token (weighted by
  // `weight` [head_dim] as rms_norm over rows * heads rows; unweighted when null, as
  // rms_norm_heads), then the forward RoPE of their last rope_dim dims, then, with simulate_fp8,
  // the FP8 simulation of the other dims (simulate_fp8_kv); the norm and the RoPE each followed
  // by the forward's bf16 rounding when `round`. The default runs exactly those ops; a backend
  // that fuses them into one launch says so through fuses_norm_rope, and only then does the
  // forward call this (for q and for kv) instead of the separate ops.  x [rows, heads, head_dim]
  virtual void norm_rope(float* x, const float* weight, int64_t rows, int64_t heads,
                         int64_t head_dim, float eps, int64_t rope_dim, const float* inv_freq,
                         bool simulate_fp8, bool round) {
    const bool round_here = round && !rounds_elementwise_outputs();
    if (weight != nullptr)
      rms_norm(x, weight, rows * heads, head_dim, eps, x);
    else
      rms_norm_heads(x, rows, heads, head_dim, eps);
    if (round_here) round_bf16(x, rows * heads * head_dim);
    rope(x, heads, head_dim, rope_dim, inv_freq, cpu::RopeDirection::kForward);
    if (round_here) round_bf16(x, rows * heads * head_dim);
    if (simulate_fp8) simulate_fp8_kv(x, rows * heads, head_dim, rope_dim);
  }
  virtual bool fuses_norm_rope() const { return false; }
  // §7.7 indexer query preparation in place (RoPE, Hadamard, FP4 simulation).
  //   q [num_tokens, heads, head_dim]
  virtual void indexer_prepare_query(float* q, int64_t heads, int64_t head_dim, int64_t rope_dim,
                                     const float* inv_freq, bool fp4_simulation,
                                     bool round_bf16) = 0;
  // §7.7 weights scaling in place.  w [num_tokens, heads]
  virtual void indexer_scale_weights(float* w, int64_t heads, int64_t head_dim) = 0;
  // §5 mHC.  x [rows, hc, dim]; u/o [rows, dim]; post [rows, hc]; comb [rows, hc, hc]
  virtual void mhc_pre(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                       const float* x, int64_t rows, float* u, float* post, float* comb) = 0;
  // mhc_pre, then the block input's RMSNorm of u in place (u = rms_norm(u) * norm_weight), each
  // followed by the forward's bf16 rounding when `round` (the forward's round_bf16 option). The
  // default runs exactly those ops; a backend that fuses them into one launch says so through
  // fuses_mhc_pre_norm, and the forward then calls this (inside the mHC component range: the
  // norm's time is part of mHC's) instead of the two ops in their own ranges.
  virtual void mhc_pre_norm(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                            const float* x, int64_t rows, const float* norm_weight, float eps,
                            bool round, float* u, float* post, float* comb) {
    const bool round_here = round && !rounds_elementwise_outputs();
    mhc_pre(config, weights, x, rows, u, post, comb);
    if (round_here) round_bf16(u, rows * config.dim);
    rms_norm(u, norm_weight, rows, config.dim, eps, u);
    if (round_here) round_bf16(u, rows * config.dim);
  }
  virtual bool fuses_mhc_pre_norm() const { return false; }
  virtual void mhc_post(const cpu::MhcConfig& config, const float* o, const float* x,
                        const float* post, const float* comb, int64_t rows, float* x_new) = 0;
  virtual void mhc_head(const cpu::MhcConfig& config, const cpu::MhcHeadWeights& weights,
                        const float* x, int64_t rows, float* y) = 0;
  // §8 MoE over the plan's tokens (ids from the plan for hash routing).  x, y [num_tokens, dim]
  virtual void moe(const MoeSite& site, const float* x, float* y) = 0;
  // §9 MTP input: x[i, c] = e[i] + h[i, c].  e [num_tokens, dim], h/x [num_tokens, hc, dim]
  virtual void add_broadcast(const float* e, const float* h, int64_t hc, int64_t dim,
                             float* x) = 0;
  // out[r] = x[rows[r]] for whole rows of `width` values.  out [rows.size(), width]
  virtual void gather_rows(const float* x, int64_t width, const std::vector<int64_t>& rows,
                           float* out) = 0;

  // ---- Parallelism ----
  // Sums x elementwise over the ranks of the model's tensor/expert-parallel group, in rank order
  // (so every rank gets the same bits). The forward calls it only for sharded weights
  // (sharding.h); a single-rank backend never sees it and does nothing.  x [n]
  virtual void all_reduce_sum(float* x, int64_t n) {}

  // ---- Per-sequence state ----
  // §7.6: projects the plan's tokens (h [num_tokens, hidden]) with one compressor, feeds each
  // sequence's chunk to its state ring and stores the finished entries (attention entries or
  // indexer keys) in the sequence's cache.
  virtual void compress(int64_t layer_slot, const CompressorWeights& weights,
                        cpu::CompressorKind kind, const cpu::CompressorFinishParams& finish,
                        const float* h) = 0;
  // A layer's compressors, all from the same h: the indexer's first when the layer has one
  // (CSA), then the attention compressor, each as compress() does it (the default: two compress
  // calls). A device backend may project both with one GEMM over their concatenated weights.
  virtual void compress_layer(int64_t layer_slot, const CompressorWeights* indexer,
                              const cpu::CompressorFinishParams* indexer_finish,
                              const CompressorWeights& attention,
                              const cpu::CompressorFinishParams& attention_finish,
                              const float* h) {
    if (indexer != nullptr)
      compress(layer_slot, *indexer, cpu::CompressorKind::kIndexer, *indexer_finish, h);
    compress(layer_slot, attention, cpu::CompressorKind::kAttention, attention_finish, h);
  }
  // §7.7 top-k selection (CSA): each token scores the indexer keys visible to it (entries
  // w < (t + 1) / ratio) and keeps the best index_topk, ascending score order not required;
  // unused slots are -1.
  //   q_index [num_tokens, index_heads, index_head_dim], w_index [num_tokens, index_heads],
  //   selected [num_tokens, index_topk]
  virtual void indexer_select(int64_t layer_slot, const float* q_index, const float* w_index,
                              int32_t* selected) = 0;
  // §7.4/§7.5: each token attends with the per-head sink to its window (earlier tokens from the
  // ring, tokens of this step from kv) and its compressed entries (CSA: `selected`, -1 skipped;
  // HCA: all visible; SWA: none). Does not modify state.
  //   q [num_tokens, heads, head_dim], kv [num_tokens, head_dim],
  //   selected [num_tokens, index_topk] (CSA only, else nullptr), o [num_tokens, heads, head_dim]
  virtual void attend(const AttendParams& params, const float* q, const float* kv,
                      const int32_t* selected, float* o) = 0;
  // Whether attend honours AttendParams::inverse_rope_output (a device backend de-rotates in the
  // kernel that converts the attention output, and keeps its bf16 form for wo_a).
  virtual bool fuses_attend_inverse_rope() const { return false; }
  // The step's kv vectors join each sequence's window ring.  kv [num_tokens, head_dim]
  virtual void store_window(int64_t layer_slot, const float* kv, int64_t head_dim) = 0;

  // ---- Speculative decoding: checkpoint and rollback (docs/speculative.md) ----
  // Called between steps (never inside begin_step/end_step), through Forward::checkpoint and
  // Forward::rollback, which validate the arguments and own the position counters.
  //
  // checkpoint(state, mtp, position, max_tokens): the state's main layers (mtp false) or MTP
  // layers (mtp true) stand at `position` (P0). Record whatever is needed so that after forward
  // steps that advance that part of the state by at most `max_tokens` positions in total (one
  // verify step of 1 + k tokens, or k - 1 chained MTP draft steps), rollback(state, mtp, q) with
  // P0 <= q <= the position reached leaves every per-layer structure bit-identical to a state
  // that consumed positions < q only:
  //   - window ring: the slots of positions q.. again hold what they held at the checkpoint
  //     (max_tokens <= sliding_window, so no slot is written twice);
  //   - compressor state rings (attention and indexer compressors): as after consuming < q. The
  //     CPU backend saves the rows the steps may write (CSA: the whole 8-row ring, because a
  //     finished window shifts it; HCA: the rows (P0 + i) % 128) and logs the projected kv/score
  //     rows the steps feed it; rollback restores the rows and replays the pushes of P0..q-1;
  //   - compressed entries and indexer keys: truncated to floor(q / ratio) (entries are
  //     append-only, so nothing else is restored; a device backend keeps the pages and only
  //     moves its counts back).
  // Memory per sequence and layer (fp32 on the CPU): window min(max_tokens, W) * head_dim; per
  // compressor the saved rows (CSA 8, HCA max_tokens) * width * 2 plus max_tokens * width * 2 of
  // log. A new checkpoint replaces the previous one; rollback consumes it (the state must be
  // checkpointed again before the next speculative advance). The default backend has no
  // rollback: both return unimplemented and the engine runs without speculation.
  virtual Status checkpoint(SequenceState* state, bool mtp, int64_t position,
                            int64_t max_tokens) {
    return unimplemented("this backend cannot checkpoint sequence state (speculative decoding)");
  }
  virtual Status rollback(SequenceState* state, bool mtp, int64_t to_position) {
    return unimplemented("this backend cannot roll sequence state back (speculative decoding)");
  }
};

// Ops::argmax_rows on rows in host memory (the CPU backend's, and the default's after its copy).
void argmax_rows_host(const float* x, int64_t rows, int64_t n, int32_t* ids, uint8_t* finite);

}  // namespace ds::dsv4
