// The DeepSeek-V4 forward (dsv4-model.md §4-§9), written once against the op interface (ops.h):
// embedding, the
// decoder blocks (mHC pre/post around attention and MoE), the final hyper-connection head, norm
// and LM head, and the MTP (NextN) layer. One call advances a batch of sequences, each by a chunk
// of any number of tokens (a prefill chunk or a single decode token) at its own positions, and
// returns the logits (and optionally the pre-head streams) of the requested rows. A full prefill,
// any chunking of it and token-by-token decode give bit-identical results: every token-wise
// operation computes each token independently, compressors consume chunks exactly as they consume
// single tokens (cpu::compressor_prefill), and a query's key set (window, visible compressed
// entries, top-k) depends only on its position.
//
// Numerics (§2): ForwardOptions carries the NumericsFlags of the mode plus `round_bf16`, which
// rounds activations to bf16 at the points where REF keeps bf16 tensors (reference mode). hf mode
// runs in plain fp32 without rounding, as the transformers goldens (fp32) do. Each flag can be
// toggled on its own in tests. See docs/model_forward.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/host_memory.h"
#include "core/status.h"
#include "kernels/cpu/numerics.h"
#include "kernels/cpu/sampling.h"
#include "model/deepseek_v4/ops.h"
#include "model/deepseek_v4/state.h"
#include "model/deepseek_v4/weights.h"

namespace ds::dsv4 {

struct ForwardOptions {
  cpu::NumericsFlags flags = cpu::numerics_flags(cpu::NumericsMode::kReference);
  // Round to bf16 where REF's activations are bf16 (reference mode: on; hf mode: off).
  bool round_bf16 = true;

  static ForwardOptions for_mode(cpu::NumericsMode mode) {
    return ForwardOptions{cpu::numerics_flags(mode), mode == cpu::NumericsMode::kReference};
  }
};

// One sequence's part of a batch.
struct SequenceChunk {
  SequenceState* state = nullptr;   // advanced by tokens.size() positions
  std::span<const int32_t> tokens;  // [num_tokens] at positions state->position() + i
  std::vector<int64_t> logit_rows;  // rows of `tokens` whose logits are wanted (ascending or not)
  // Rows whose pre-head streams are wanted in ChunkOutput::row_streams, independently of
  // logit_rows and want_streams (speculative decoding feeds them to the MTP layer).
  std::vector<int64_t> stream_rows;
  // Only the argmax of each logit row (ties to the lowest id) and whether the row is finite are
  // wanted (a greedy request that nothing adjusts): ChunkOutput::argmax / finite get them and
  // ChunkOutput::logits stays empty (Ops::argmax_rows: 5 bytes per row leave the device).
  bool argmax_only = false;
  // Instead (argmax_only false): a random draw by the backend with these parameters for each logit
  // row (Ops::sample_rows, cpu::sample_row's token): ChunkOutput::argmax gets the tokens.
  std::optional<cpu::RowSampling> backend_sample;
};

struct ChunkOutput {
  // [logit_rows.size(), vocab_size] fp32, in the backend's host memory (Ops::host_memory)
  HostVector<float> logits;
  // SequenceChunk::argmax_only (backend_sample): per logit row, its argmax (the backend's draw)
  // and 1 when the row is finite (0: it holds a NaN or an infinity); empty otherwise.
  std::vector<int32_t> argmax;
  std::vector<uint8_t> finite;
  std::vector<float> streams;  // [logit_rows.size(), hc_mult, hidden] pre-head streams (if asked)
  std::vector<float> row_streams;  // [stream_rows.size(), hc_mult, hidden] (SequenceChunk)
};

// One sequence's part of an MTP batch (§9): the main model's pre-head streams of the tokens at
// positions state->mtp_position() + i, and for each the id of the token that follows it.
struct MtpChunk {
  SequenceState* state = nullptr;
  std::span<const float> streams;        // [num_tokens, hc_mult, hidden]
  std::span<const int32_t> next_tokens;  // [num_tokens]
  std::vector<int64_t> logit_rows;       // rows whose draft logits are wanted
};

// The MoE site of a layer as the forward passes it to Ops::moe (router, experts, numerics flags,
// the shard's expert range); device backends build their per-layer MoE state from it.
MoeSite moe_site(const ModelWeights& weights, const LayerWeights& layer,
                 const ForwardOptions& options);

class Forward {
 public:
  // On the CPU reference backend (a CpuOps owned by this Forward).
  Forward(const ModelWeights* weights, ForwardOptions options);
  // On the given backend (not owned; it must outlive this Forward).
  Forward(const ModelWeights* weights, ForwardOptions options, Ops* ops);
  Forward(Forward&&) noexcept;
  ~Forward();

  const DeepSeekV4Config& config() const { return weights_->config(); }
  const ForwardOptions& options() const { return options_; }
  // The backend this forward runs on (to release sequences, read its step status).
  Ops* ops() const { return ops_; }

  // A fresh per-sequence state for this model.
  SequenceState new_sequence() const { return SequenceState(config()); }

  // Runs the main model over every chunk of the batch (each sequence at most once per call).
  // outputs gets one ChunkOutput per chunk; streams are filled when want_streams. Bad input
  // (token id out of range, a row outside the chunk, a null or repeated state, a position past
  // max_position_embeddings) is an error and leaves every state untouched.
  Status run(std::span<SequenceChunk> batch, std::vector<ChunkOutput>* outputs,
             bool want_streams = false) const;

  // Runs MTP layer 0 (§9) over every chunk; outputs[i].logits are the draft logits of the
  // requested rows, outputs[i].streams the MTP block's pre-head streams (when want_streams, for
  // chaining). Advances each state's mtp_position().
  Status run_mtp(std::span<MtpChunk> batch, std::vector<ChunkOutput>* outputs,
                 bool want_streams = false) const;

  // Speculative decoding (docs/speculative.md; the backend's contract is in ops.h). checkpoint()
  // marks the state's main layers (mtp false) or MTP layers (mtp true) at their current position
  // P0 and allows them to advance by at most max_tokens positions (1 <= max_tokens <=
  // sliding_window; run()/run_mtp() refuse more) until rollback(to_position) with P0 <=
  // to_position <= position, which makes that part of the state equal, bit for bit, to a state
  // that consumed the positions < to_position only, and consumes the checkpoint.
  Status checkpoint(SequenceState* state, bool mtp, int64_t max_tokens) const;
  Status rollback(SequenceState* state, bool mtp, int64_t to_position) const;

 private:
  // x [num_tokens, hc, hidden] in the backend's memory, advanced in place.
  void block(const LayerWeights& layer, int64_t layer_slot, int64_t num_tokens, float* x) const;
  // u [num_tokens, hidden] -> out [num_tokens, hidden]
  void attention(const LayerWeights& layer, int64_t layer_slot, int64_t num_tokens, const float* u,
                 float* out) const;
  // Where head() puts the next `rows` rows of its logits: copied into `logits` [rows, vocab], or
  // only their argmax or the backend's draw and finite flags (SequenceChunk::argmax_only and
  // backend_sample: `sampling`, a temperature of 0 for the argmax).
  struct HeadDestination {
    int64_t rows = 0;
    float* logits = nullptr;
    int32_t* argmax = nullptr;
    uint8_t* finite = nullptr;
    cpu::RowSampling sampling;
  };
  // The logits of the given plan rows, to the destinations in order.
  void head(const float* x, const std::vector<int64_t>& rows, const cpu::MhcHeadWeights& hc_head,
            const std::vector<float>& norm, std::span<const HeadDestination> destinations) const;
  // backend_tokens: per chunk, the backend's choice of its tokens instead of logits (a temperature
  // of 0: the argmax); empty: none.
  void outputs_for(std::span<const std::vector<int64_t>> logit_rows,
                   std::span<const std::optional<cpu::RowSampling>> backend_tokens,
                   const StepPlan& plan, const float* x, const cpu::MhcHeadWeights& hc_head,
                   const std::vector<float>& norm, bool want_streams,
                   std::vector<ChunkOutput>* outputs) const;
  void maybe_round(float* x, int64_t n) const;
  // maybe_round after rms_norm, rms_norm_heads, rope, mHC, attend and the indexer weight scaling,
  // unless the backend rounds those outputs itself (Ops::rounds_elementwise_outputs).
  void round_elementwise_output(float* x, int64_t n) const;

  const ModelWeights* weights_;
  ForwardOptions options_;
  std::unique_ptr<Ops> owned_ops_;  // the CPU backend when no backend was given
  Ops* ops_;
};

}  // namespace ds::dsv4
