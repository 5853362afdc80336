// Per-sequence state of the DeepSeek-V4 forward (dsv4-model.md §7.6, §7.9, §11): for every layer
// the sliding-window ring of raw KV vectors (after the reference-mode FP8 simulation, exactly what
// attention reads), the compressed KV entries and the indexer keys emitted so far, and the
// compressor state rings (attention compressor on CSA/HCA layers, indexer compressor on CSA
// layers). The MTP layer keeps its own window ring and position counter. The CPU backend stores
// everything in fp32, which represents both numerics modes exactly (the reference mode's bf16 and
// FP8-simulated values are fp32 values). A state belongs to one sequence; reset() starts a new one
// (compressor rings back to kv 0 / score -inf, §15 "compressor state reset").
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/compressor.h"
#include "model/config.h"

namespace ds::dsv4 {

struct LayerState {
  int64_t window_slots = 0;         // ring length (sliding_window)
  std::vector<float> window;        // [window_slots, head_dim]; position p lives in slot p % slots
  std::vector<float> compressed;    // [num_compressed, head_dim], entry w = window of ratio tokens
  std::vector<float> index_keys;    // [num_index_keys, index_head_dim] (CSA only)
  cpu::CompressorState compressor;  // CSA / HCA
  cpu::CompressorState indexer_compressor;  // CSA only
  int64_t num_compressed = 0;
  int64_t num_index_keys = 0;
};

// Speculative decoding (Ops::checkpoint / Ops::rollback, docs/speculative.md): what the CPU backend
// keeps per layer to undo up to `max_tokens` positions after a checkpoint at position P0.
struct CompressorCheckpoint {
  std::vector<int64_t> rows;             // ring rows saved (CSA: all, HCA: those P0.. will write)
  std::vector<float> kv, score;          // [rows.size(), width] their contents at the checkpoint
  std::vector<float> log_kv, log_score;  // [tokens since P0, width] projected rows, for replay
  const float* ape = nullptr;            // the compressor's ape (weights), for replay
};
struct LayerCheckpoint {
  std::vector<float> window;  // [min(max_tokens, window_slots), head_dim] slots of P0, P0+1, ...
  CompressorCheckpoint compressor, indexer_compressor;
  int64_t num_compressed = 0, num_index_keys = 0;
};
struct SequenceCheckpoint {
  bool armed = false;
  int64_t position = 0;    // P0
  int64_t max_tokens = 0;  // positions the state may advance before a rollback
  std::vector<LayerCheckpoint> layers;  // backend data (CpuOps); a device backend keeps its own
};

class SequenceState {
 public:
  SequenceState() = default;
  explicit SequenceState(const DeepSeekV4Config& config) { reset(config); }

  // Sizes everything for `config` and empties it: position 0, no KV, compressor rings reset.
  void reset(const DeepSeekV4Config& config);

  // Tokens the main model has consumed: the position of the next token.
  int64_t position() const { return position_; }
  // Tokens the MTP layer has consumed (its own window ring is at these positions).
  int64_t mtp_position() const { return mtp_position_; }

  // Bytes held (KV, keys and compressor rings), for logs and tests.
  uint64_t bytes() const;

  // The speculative checkpoint of the main layers (mtp false) or of the MTP layers (mtp true),
  // see Forward::checkpoint.
  const SequenceCheckpoint& checkpoint(bool mtp) const { return checkpoints_[mtp ? 1 : 0]; }

 private:
  friend class Forward;
  friend class StateAccess;
  friend class CpuOps;  // keeps its checkpoint data in checkpoints_[].layers
  int64_t position_ = 0;
  int64_t mtp_position_ = 0;
  std::vector<LayerState> layers_;      // [num_hidden_layers]
  std::vector<LayerState> mtp_layers_;  // [num_nextn_predict_layers]
  SequenceCheckpoint checkpoints_[2];   // [main, mtp]
};

}  // namespace ds::dsv4
