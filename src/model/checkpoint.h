// A DeepSeek-V4 checkpoint directory as published: config.json plus the sharded safetensors, bound
// to the tensor set the config implies and validated before anything is trusted (reliability.md
// §3.6 rules 20-23): every expected tensor present with its dtype and shape, nothing unexpected
// (apart from a documented ignore list), hash-routing tables in range, and optionally a full scan
// of the values.
#pragma once

#include <functional>
#include <string>

#include "core/status.h"
#include "model/checkpoint_files.h"
#include "model/config.h"

namespace ds {

struct CheckpointValidateOptions {
  // Rule 23: reject NaN/Inf in BF16/F32 tensors, the NaN code 0xFF in E8M0 scales and the e4m3
  // NaN codes (0x7F/0xFF) in FP8 weights. Reads every byte (~160 GB for DeepSeek-V4-Flash).
  bool full_scan = false;
  // Called with (bytes_done, bytes_total) while scanning.
  std::function<void(uint64_t, uint64_t)> on_scan_progress;
};

// Rules 20-22 (and 23 with full_scan) for `files` against `config`. The first failure is returned;
// its message names the tensor and the rule.
//
// tid2eid rule (rule 22): every entry must be in [0, n_routed_experts). A row that names the same
// expert twice is accepted: the forward treats the k entries of a row as k routing slots, exactly
// as the reference indexes them, so a duplicate only gives that expert two slots.
Status validate_checkpoint(CheckpointFiles& files, const DeepSeekV4Config& config,
                           const CheckpointValidateOptions& options = {});

struct Checkpoint {
  DeepSeekV4Config config;
  CheckpointFiles files;
};

// Loads config.json and the shards of `dir` and validates them.
Result<Checkpoint> open_checkpoint(const std::string& dir,
                                   const CheckpointValidateOptions& options = {});

}  // namespace ds
