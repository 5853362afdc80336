// SequenceState sizing and reset (see state.h).
#include "model/deepseek_v4/state.h"

namespace ds::dsv4 {

namespace {

void reset_layer(const DeepSeekV4Config& c, int64_t layer, LayerState* s) {
  *s = LayerState{};
  s->window_slots = c.sliding_window;
  s->window.assign(size_t(c.sliding_window * c.head_dim), 0.0f);
  const LayerKind kind = c.layer_kind(layer);
  if (kind != LayerKind::kSwa) {
    cpu::CompressorConfig cc;
    cc.ratio = c.compress_ratios[size_t(layer)];
    cc.head_dim = c.head_dim;
    cc.rope_dim = c.qk_rope_head_dim;
    cpu::compressor_state_reset(cc, &s->compressor);
  }
  if (kind == LayerKind::kCsa) {
    cpu::CompressorConfig cc;
    cc.ratio = c.compress_ratios[size_t(layer)];
    cc.head_dim = c.index_head_dim;
    cc.rope_dim = c.qk_rope_head_dim;
    cpu::compressor_state_reset(cc, &s->indexer_compressor);
  }
}

uint64_t layer_bytes(const LayerState& s) {
  return 4 * uint64_t(s.window.size() + s.compressed.size() + s.index_keys.size() +
                      s.compressor.kv.size() + s.compressor.score.size() +
                      s.indexer_compressor.kv.size() + s.indexer_compressor.score.size());
}

}  // namespace

void SequenceState::reset(const DeepSeekV4Config& config) {
  position_ = 0;
  mtp_position_ = 0;
  layers_.resize(size_t(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l)
    reset_layer(config, l, &layers_[size_t(l)]);
  mtp_layers_.resize(size_t(config.num_nextn_predict_layers));
  for (int64_t j = 0; j < config.num_nextn_predict_layers; ++j) {
    reset_layer(config, config.num_hidden_layers + j, &mtp_layers_[size_t(j)]);
  }
  checkpoints_[0] = SequenceCheckpoint{};
  checkpoints_[1] = SequenceCheckpoint{};
}

uint64_t SequenceState::bytes() const {
  uint64_t total = 0;
  for (const auto& s : layers_) total += layer_bytes(s);
  for (const auto& s : mtp_layers_) total += layer_bytes(s);
  return total;
}

}  // namespace ds::dsv4
