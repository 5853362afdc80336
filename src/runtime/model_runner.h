// ModelRunner: what the engine and the profiler run the model through (docs/parallelism.md). One
// rank is a Forward over one backend (backend.h). With tensor_parallel_size W > 1 the model is
// split with shard_model (model/deepseek_v4/sharding.h) into W rank-local models, each with its own
// backend (one GPU per rank on CUDA) and its own thread; every call runs on all ranks at once and
// the ranks sum their partial results with an all-reduce: NCCL between GPUs, a host-memory
// all-reduce between CPU ranks (which exist for tests of the sharded engine without a GPU).
//
// Per-sequence state: the caller owns one SequenceState per sequence, which rank 0 uses; the
// runner keeps the other ranks' states next to it, keyed by its address, created on its first
// run and dropped by release_sequence(). Every rank does the same replicated work in the same
// order, so their states (positions, KV slots and pages) stay identical: logits and streams are
// rank 0's (every rank computes the same bits).
//
// Failure: an error every rank reports alike (a bad request, out of KV pages: found before any
// collective) is returned as is and the runner stays usable. If the ranks disagree (one fails,
// another succeeds or is left waiting in a collective), the runner aborts the group's
// communicators so that no rank waits forever, and from then on every call fails with
// kFailedPrecondition naming the first error (the engine then fails its requests).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/deepseek_v4/forward.h"
#include "runtime/backend.h"

namespace ds::runtime {

struct ParallelConfig {
  // Ranks (GPUs on CUDA: devices 0 .. W-1). W > 1 splits attention heads, the output groups
  // and the shared expert across the ranks (tensor parallel).
  int tensor_parallel_size = 1;
  // With W > 1: routed experts split across the ranks (expert parallel); off, rank 0 runs all.
  bool expert_parallel = true;
  // After one rank fails, how long the others may take to finish the call before the group's
  // communicators are aborted (longer than any healthy step; tests shorten it).
  double failure_grace_s = 20;
};

// Wraps each rank's backend (the profiler's timers): returns the Ops that rank's forward runs
// on, which must outlive the runner; null = the backend itself. Called on the rank's thread.
using RankOpsWrapper = std::function<dsv4::Ops*(int rank, dsv4::Ops* backend)>;

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int world_size() const = 0;
  // The whole model's config (each rank's local config has 1/W of the heads).
  virtual const DeepSeekV4Config& config() const = 0;
  // A fresh per-sequence state (rank 0's).
  virtual dsv4::SequenceState new_sequence() const = 0;

  // Forward::run / run_mtp / checkpoint / rollback on every rank (forward.h).
  virtual Status run(std::span<dsv4::SequenceChunk> batch, std::vector<dsv4::ChunkOutput>* outputs,
                     bool want_streams = false) = 0;
  virtual Status run_mtp(std::span<dsv4::MtpChunk> batch, std::vector<dsv4::ChunkOutput>* outputs,
                         bool want_streams = false) = 0;
  virtual Status checkpoint(dsv4::SequenceState* state, bool mtp, int64_t max_tokens) = 0;
  virtual Status rollback(dsv4::SequenceState* state, bool mtp, int64_t to_position) = 0;
  // Frees the sequence's device slot and pages on every rank (and the other ranks' states).
  virtual void release_sequence(const dsv4::SequenceState* state) = 0;

  // The device KV capacity of one rank (every rank holds the same); nullopt on the CPU.
  virtual std::optional<DeviceKvCapacity> kv_capacity() const = 0;
  // Ops::prefers_backend_sampling of the backend (rank 0's; every rank holds the same kind).
  virtual bool prefers_backend_sampling() const = 0;
  // One line for logs, e.g. "cuda x2 (tensor parallel ...): rank 0: cuda (NVIDIA H200, ...)".
  virtual std::string describe() const = 0;
};

// Builds the runner: the backend(s) of `device` ("cpu" or "cuda") for `weights` (which must
// outlive the runner). Errors: kInvalidArgument for a parallel config the model or machine cannot
// take (W < 1, heads/groups/experts not divisible, more ranks than GPUs), kFailedPrecondition
// when NCCL cannot be loaded for W > 1 on CUDA, and whatever a backend's creation returns.
Result<std::unique_ptr<ModelRunner>> make_model_runner(const std::string& device,
                                                       const dsv4::ModelWeights& weights,
                                                       const dsv4::ForwardOptions& options,
                                                       const BackendLimits& limits,
                                                       const ParallelConfig& parallel,
                                                       RankOpsWrapper wrap = {});

}  // namespace ds::runtime
