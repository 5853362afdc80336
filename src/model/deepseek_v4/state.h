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

 private:
  friend class Forward;
  friend class StateAccess;
  int64_t position_ = 0;
  int64_t mtp_position_ = 0;
  std::vector<LayerState> layers_;      // [num_hidden_layers]
  std::vector<LayerState> mtp_layers_;  // [num_nextn_predict_layers]
};

}  // namespace ds::dsv4
