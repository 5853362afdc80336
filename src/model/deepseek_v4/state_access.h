// Access to SequenceState's private parts for the forward and the backends that own per-sequence
// storage (CpuOps). Not for other users: the engine sees a SequenceState only through its public
// members.
#pragma once

#include <cstdint>

#include "model/deepseek_v4/state.h"

namespace ds::dsv4 {

class StateAccess {
 public:
  static LayerState& layer(SequenceState* s, bool mtp, int64_t slot) {
    return mtp ? s->mtp_layers_[size_t(slot)] : s->layers_[size_t(slot)];
  }
  static int64_t& position(SequenceState* s, bool mtp) {
    return mtp ? s->mtp_position_ : s->position_;
  }
  static size_t num_layers(const SequenceState* s, bool mtp) {
    return mtp ? s->mtp_layers_.size() : s->layers_.size();
  }
};

}  // namespace ds::dsv4
