// CudaOps (see cuda_ops.h): each op launches the kernels of src/kernels/cuda on the backend's
// stream. Host work per step: begin_step lays the plan's per-token arrays (positions, ids, key
// lists of the window and HCA layers, compressor sequence records of every layer) into one host
// blob and uploads it with one copy; ops then only launch.
#include "runtime/cuda/cuda_ops.h"

#include <nvtx3/nvToolsExt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <unordered_set>

#include "core/env.h"
#include "kernels/cpu/kv_entry.h"
#include "kernels/cpu/moe.h"
#include "kernels/cuda/attention/sparse_mla_decode.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/compressor/compressor.h"
#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/cuda/gemm/linear_fp8.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda/mhc/mhc.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/norm/norm.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/cuda/sampling/sampling.h"
#include "model/deepseek_v4/state_access.h"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/kv_cache.h"

namespace ds::runtime {

using dsv4::StepPlan;

namespace {

size_t weight_data_bytes(const cpu::LinearWeight& w) {
  const size_t nk = size_t(w.out_features) * size_t(w.in_features);
  switch (w.format) {
    case cpu::WeightFormat::kF32:
      return nk * 4;
    case cpu::WeightFormat::kBF16:
      return nk * 2;
    case cpu::WeightFormat::kFp8Block:
      return nk;
    case cpu::WeightFormat::kMxfp4:
    case cpu::WeightFormat::kNvfp4:
      return nk / 2;
  }
  return 0;
}

size_t weight_scale_bytes(const cpu::LinearWeight& w) {
  const size_t n = size_t(w.out_features), k = size_t(w.in_features);
  switch (w.format) {
    case cpu::WeightFormat::kF32:
    case cpu::WeightFormat::kBF16:
      return 0;
    case cpu::WeightFormat::kFp8Block:
      return ((n + 127) / 128) * ((k + 127) / 128);
    case cpu::WeightFormat::kMxfp4:
      return n * (k / 32);
    case cpu::WeightFormat::kNvfp4:
      return n * (k / 16);
  }
  return 0;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// A cudaError_t as a Status (DS_CUDA_RETURN_IF_ERROR's form, usable in expressions).
Status cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return ok_status();
  return cuda_status(err, what, __FILE__, __LINE__);
}

}  // namespace

// One layer's state pools: the window rings (slot s owns page s) and the shared KV pages.
struct CudaOps::LayerStore {
  int64_t ratio = 0;
  bool csa = false;
  uint8_t* window = nullptr;  // [max_sequences] pages of window_slots entries
  int64_t window_page_bytes = 0;
  uint8_t* compressed = nullptr;  // [kv_pages] pages of compressed_page_size entries
  int64_t compressed_cap = 0;        // entries of one sequence of max_context tokens
  int64_t compressed_page_size = 0;  // entries per page: 256 / ratio
  int64_t compressed_page_bytes = 0;
  uint8_t* index_keys = nullptr;  // [kv_pages] pages of 64 keys (CSA)
  int64_t index_page_bytes = 0;
  float* ring = nullptr;  // [max_sequences, compressor_state_floats]
  int64_t ring_floats = 0;
  float* index_ring = nullptr;  // CSA: [max_sequences, compressor_state_floats(4, ihd)]
  int64_t index_ring_floats = 0;
  // Speculative checkpoints (CudaOpsOptions::max_checkpoint_tokens = T > 0), per slot:
  //  - snap: the ring rows the steps after a checkpoint may overwrite. CSA: the whole ring (a
  //    completed window shifts it); HCA: the rows of positions P0 .. P0+T-1, [2][T][width].
  //  - log: the projected kv rows then score rows the steps fed the compressor, [2][T][width],
  //    row i = position P0 + i; rollback replays the accepted ones over the restored rows.
  float* snap = nullptr;
  int64_t snap_floats = 0;
  float* log = nullptr;
  int64_t log_floats = 0;
  float* index_snap = nullptr;  // CSA: the indexer compressor's whole ring
  float* index_log = nullptr;
  int64_t index_log_floats = 0;
};

namespace {

// Columns of a compressor ring row: [kv | score] halves hold `width` values per row, 2d for the
// overlapping CSA compressor, d for HCA (kernels/cuda/compressor/compressor.h).
int64_t ring_width(int64_t ratio, int64_t d) { return (ratio == 4 ? 2 : 1) * d; }

// Page-locked host buffers (Ops::host_memory). When the driver cannot pin more memory the buffer
// comes from the heap instead (its copies are then only slower), remembered so that it goes back
// to the heap.
class PinnedHostMemory final : public HostMemorySource {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable);
    if (e == cudaSuccess) return p;
    (void)cudaGetLastError();  // not sticky; clear it for the next call's check
    spdlog::warn("cuda: cudaHostAlloc of {} bytes failed ({}); using pageable memory", bytes,
                 cudaGetErrorString(e));
    p = ::operator new(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    heap_.insert(p);
    return p;
  }
  void deallocate(void* p, size_t) noexcept override {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (heap_.erase(p) != 0) {
        ::operator delete(p);
        return;
      }
    }
    const cudaError_t e = cudaFreeHost(p);
    // At process exit the runtime may be gone before the last buffer (nothing left to free then,
    // and no logger to tell).
    if (e != cudaSuccess && e != cudaErrorCudartUnloading) {
      spdlog::error("cuda: cudaFreeHost failed: {}", cudaGetErrorString(e));
    }
  }

 private:
  std::mutex mutex_;
  std::unordered_set<void*> heap_;  // buffers that fell back to the heap
};

}  // namespace

// The open step's plan in device memory (pointers into the arena, valid until end_step).
struct CudaOps::StepData {
  int64_t num_tokens = 0;
  int64_t num_seqs = 0;
  int64_t max_count = 0;
  const int64_t* positions = nullptr;     // [N]
  const int32_t* ids = nullptr;           // [N]
  const int32_t* query_slot = nullptr;    // [N] slot of each token's sequence (page tables)
  const int32_t* window_idx = nullptr;    // [N, sliding_window] ring slots of each query's window
  const int32_t* window_len = nullptr;    // [N]
  const int32_t* visible4 = nullptr;      // [N] CSA entries visible to each query
  const int32_t* topk_len = nullptr;      // [N] = index_topk
  const int32_t* kv_row_index = nullptr;  // [N] ring slot of each token's kv
  const int64_t* iota = nullptr;          // [N] 0, 1, ..., N-1
  // HCA (ratio 128) key lists: all visible entries.
  const int32_t* hca_idx = nullptr;  // [N, hca_width]
  const int32_t* hca_len = nullptr;  // [N]
  int32_t hca_width = 0;
  // Entries emitted by the compressors, per ratio: sequence (its slot) and index of each row.
  struct Emitted {
    int64_t rows = 0;
    const int32_t* slot = nullptr;   // [rows]
    const int32_t* index = nullptr;  // [rows]
  };
  Emitted emitted4, emitted128;
  // Compressor sequence records per layer (attention ring, then indexer ring).
  std::vector<const cuda::CompressorSeq*> comp_seqs;              // [layers]
  std::vector<const cuda::CompressorSeq*> index_seqs;             // [layers]
  std::vector<int64_t> entry_rows_of_seq4, entry_rows_of_seq128;  // host: first row per seq
  // Speculative logging: per step sequence, the log row of its first token (position - P0 of
  // its slot's armed checkpoint of this part) or -1.
  std::vector<int64_t> log_row;
  bool any_log = false;
  std::vector<int32_t> slots;  // slot of each step sequence
};

CudaOps::CudaOps(const dsv4::ModelWeights& weights, const dsv4::ForwardOptions& options,
                 const CudaOpsOptions& cuda_options)
    : model_(weights),
      config_(weights.config()),
      fwd_(options),
      opt_(cuda_options),
      host_memory_(std::make_shared<PinnedHostMemory>()) {}

CudaOps::~CudaOps() {
  for (auto& [n, g] : graphs_) {
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  }
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : range_events_) cudaEventDestroy(e);
}

Result<std::unique_ptr<CudaOps>> CudaOps::create(const dsv4::ModelWeights& weights,
                                                 const dsv4::ForwardOptions& options,
                                                 const CudaOpsOptions& cuda_options) {
  const cpu::NumericsFlags ref = cpu::numerics_flags(cpu::NumericsMode::kReference);
  if (!options.round_bf16 || options.flags.activation_quantization != ref.activation_quantization ||
      options.flags.fp8_kv_simulation != ref.fp8_kv_simulation ||
      options.flags.indexer_fp4_simulation != ref.indexer_fp4_simulation) {
    return invalid_argument(
        "the CUDA backend runs reference numerics only (--numerics reference); hf numerics is "
        "the CPU backend's fp32 comparison mode");
  }
  if (cuda_options.max_sequences < 1 || cuda_options.max_step_tokens < 1 ||
      cuda_options.max_context < 0 || cuda_options.max_chunk < 0 ||
      cuda_options.max_logit_rows < 0) {
    return invalid_argument("CUDA backend: limits must be positive");
  }
  if (!(cuda_options.gpu_memory_utilization >= 0 && cuda_options.gpu_memory_utilization <= 1)) {
    return invalid_argument("CUDA backend: gpu_memory_utilization must be in [0, 1]");
  }
  std::unique_ptr<CudaOps> ops(new CudaOps(weights, options, cuda_options));
  DS_RETURN_IF_ERROR(ops->init());
  return ops;
}

int64_t CudaOps::layer_index(int64_t slot) const {
  return plan_ != nullptr && plan_->mtp ? config_.num_hidden_layers + slot : slot;
}

Status CudaOps::check(Status status) {
  if (!status.ok() && error_.ok()) error_ = status;
  return status;
}

template <typename T>
T* CudaOps::scratch(int64_t n) {
  void* p = arena_.alloc(size_t(std::max<int64_t>(n, 1)) * sizeof(T));
  if (p == nullptr) {
    (void)check(resource_exhausted("CUDA backend: the step arena (" +
                                   std::to_string(arena_.capacity() >> 20) +
                                   " MiB) is too small for this step; raise max_step_tokens"));
  }
  return static_cast<T*>(p);
}

void* CudaOps::alloc_bytes(int64_t bytes) {
  return scratch<uint8_t>(bytes);
}

template <typename T>
const T* CudaOps::upload(const std::vector<T>& host) {
  T* d = scratch<T>(int64_t(host.size()));
  if (failed() || host.empty()) return d;
  (void)check(cuda_check(
      cudaMemcpyAsync(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync(plan)"));
  return d;
}

std::pair<int64_t, int64_t> CudaOps::expert_range(const dsv4::LayerWeights& layer) const {
  const int64_t n = int64_t(layer.experts.size());
  const int64_t last = model_.shard.expert_end < 0 ? n : std::min(model_.shard.expert_end, n);
  return {std::clamp<int64_t>(model_.shard.expert_begin, 0, last), last};
}

Status CudaOps::register_weights() {
  const DeepSeekV4Config& c = config_;
  const int64_t D = c.hidden_size, hc = c.hc_mult, mixes = (2 + hc) * hc;
  auto lin = [&](const cpu::LinearWeight& w) -> Status {
    DS_RETURN_IF_ERROR(weights_.add(w.data, weight_data_bytes(w)));
    return weights_.add(w.scale, weight_scale_bytes(w));
  };
  auto vec = [&](const std::vector<float>& v) { return weights_.add(v.data(), v.size() * 4); };
  auto site = [&](const cpu::MhcSiteWeights& s) -> Status {
    DS_RETURN_IF_ERROR(weights_.add(s.fn, size_t(mixes * hc * D) * 4));
    DS_RETURN_IF_ERROR(weights_.add(s.base, size_t(mixes) * 4));
    return weights_.add(s.scale, 3 * 4);
  };
  auto head = [&](const cpu::MhcHeadWeights& s) -> Status {
    DS_RETURN_IF_ERROR(weights_.add(s.fn, size_t(hc * hc * D) * 4));
    DS_RETURN_IF_ERROR(weights_.add(s.base, size_t(hc) * 4));
    return weights_.add(s.scale, 4);
  };
  auto compressor = [&](const dsv4::CompressorWeights& cw) -> Status {
    if (cw.wkv.data == nullptr) return ok_status();
    DS_RETURN_IF_ERROR(lin(cw.wkv));
    DS_RETURN_IF_ERROR(lin(cw.wgate));
    DS_RETURN_IF_ERROR(weights_.add(cw.ape, size_t(cw.config.ratio * cw.config.width()) * 4));
    return vec(cw.norm);
  };
  auto layer = [&](const dsv4::LayerWeights& L) -> Status {
    DS_RETURN_IF_ERROR(site(L.hc_attn));
    DS_RETURN_IF_ERROR(site(L.hc_ffn));
    DS_RETURN_IF_ERROR(vec(L.attn_norm));
    DS_RETURN_IF_ERROR(vec(L.ffn_norm));
    DS_RETURN_IF_ERROR(weights_.add(L.attn_sink, size_t(c.num_attention_heads) * 4));
    for (const cpu::LinearWeight* w : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b, &L.indexer_wq_b,
                                       &L.indexer_weights_proj, &L.gate}) {
      DS_RETURN_IF_ERROR(lin(*w));
    }
    DS_RETURN_IF_ERROR(vec(L.q_norm));
    DS_RETURN_IF_ERROR(vec(L.kv_norm));
    DS_RETURN_IF_ERROR(vec(L.inv_freq));
    DS_RETURN_IF_ERROR(compressor(L.compressor));
    DS_RETURN_IF_ERROR(compressor(L.indexer_compressor));
    DS_RETURN_IF_ERROR(weights_.add(L.gate_bias, size_t(c.n_routed_experts) * 4));
    DS_RETURN_IF_ERROR(weights_.add(L.tid2eid.data(), L.tid2eid.size() * 4));
    // Expert parallelism (sharding.h): only the rank's routed experts cross to the device.
    const auto [first, last] = expert_range(L);
    for (int64_t e = first; e < last; ++e) {
      DS_RETURN_IF_ERROR(lin(L.experts[size_t(e)].w1));
      DS_RETURN_IF_ERROR(lin(L.experts[size_t(e)].w2));
      DS_RETURN_IF_ERROR(lin(L.experts[size_t(e)].w3));
    }
    DS_RETURN_IF_ERROR(lin(L.shared.w1));
    DS_RETURN_IF_ERROR(lin(L.shared.w2));
    return lin(L.shared.w3);
  };
  DS_RETURN_IF_ERROR(lin(model_.embed));
  DS_RETURN_IF_ERROR(lin(model_.head));
  DS_RETURN_IF_ERROR(vec(model_.norm));
  DS_RETURN_IF_ERROR(head(model_.hc_head));
  for (const dsv4::LayerWeights& L : model_.layers) DS_RETURN_IF_ERROR(layer(L));
  for (const dsv4::MtpWeights& M : model_.mtp) {
    DS_RETURN_IF_ERROR(layer(M.block));
    DS_RETURN_IF_ERROR(lin(M.e_proj));
    DS_RETURN_IF_ERROR(lin(M.h_proj));
    DS_RETURN_IF_ERROR(vec(M.enorm));
    DS_RETURN_IF_ERROR(vec(M.hnorm));
    DS_RETURN_IF_ERROR(vec(M.norm));
    DS_RETURN_IF_ERROR(head(M.hc_head));
  }
  DS_RETURN_IF_ERROR(weights_.upload());

  // The cuBLASLt FP8 path takes the block scales as fp32: convert every FP8 weight's grid once.
  std::vector<const cpu::LinearWeight*> fp8;
  std::set<const void*> bf16_input;  // wo_a: never quantizes its input (§2)
  auto collect = [&](const dsv4::LayerWeights& L) {
    for (const cpu::LinearWeight* w : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b, &L.indexer_wq_b,
                                       &L.shared.w1, &L.shared.w2, &L.shared.w3}) {
      if (w->format == cpu::WeightFormat::kFp8Block && w->data != nullptr) fp8.push_back(w);
    }
    bf16_input.insert(L.wo_a.data);
  };
  for (const dsv4::LayerWeights& L : model_.layers) collect(L);
  for (const dsv4::MtpWeights& M : model_.mtp) {
    collect(M.block);
    fp8.push_back(&M.e_proj);
    fp8.push_back(&M.h_proj);
  }
  // cuBLASLt's bf16 GEMM wants N a multiple of 8: pad narrower bf16 weights (the tiny model's
  // 4-head indexer weights_proj) with zero rows once; linear() copies the N real columns out.
  std::vector<const cpu::LinearWeight*> bf16;
  auto collect_bf16 = [&](const dsv4::LayerWeights& L) {
    for (const cpu::LinearWeight* w :
         {&L.indexer_weights_proj, &L.compressor.wkv, &L.compressor.wgate,
          &L.indexer_compressor.wkv, &L.indexer_compressor.wgate}) {
      if (w->format == cpu::WeightFormat::kBF16 && w->data != nullptr) bf16.push_back(w);
    }
  };
  for (const dsv4::LayerWeights& L : model_.layers) collect_bf16(L);
  for (const dsv4::MtpWeights& M : model_.mtp) collect_bf16(M.block);
  bf16.push_back(&model_.head);
  for (const cpu::LinearWeight* w : bf16) {
    if (w->out_features % 8 == 0 || padded_bf16_.count(w->data) != 0) continue;
    const int64_t np = (w->out_features + 7) / 8 * 8, k = w->in_features;
    DS_ASSIGN_OR_RETURN(void* dev, weights_.allocate_derived(size_t(np * k) * 2));
    DS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dev, 0, size_t(np * k) * 2, stream_));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, weights_.find(w->data),
                                            size_t(w->out_features * k) * 2,
                                            cudaMemcpyDeviceToDevice, stream_));
    padded_bf16_[w->data] = {static_cast<const uint16_t*>(dev), np};
  }
  for (const cpu::LinearWeight* w : fp8) {
    if (e8m0_f32_.count(w->scale) != 0) continue;
    const int64_t n = int64_t(weight_scale_bytes(*w));
    DS_ASSIGN_OR_RETURN(void* f32, weights_.allocate_derived(size_t(n) * 4));
    DS_RETURN_IF_ERROR(
        cuda::launch_e8m0_to_f32(weights_.get(w->scale), static_cast<float*>(f32), n, stream_));
    e8m0_f32_[w->scale] = static_cast<const float*>(f32);
  }
  // The large FP8 weights once more in the small-M tile order, for the decode kernels, except
  // those that never read the copy: wo_a (bf16 input; the tile order is read with FP8
  // activations only) and those that the wgmma kernel serves at every M <= 8 (wq_b).
  const bool tiled = opt_.tiled_fp8_min_bytes >= 0 && !env_switched_off("DEEPSERVE_TILED_FP8");
  for (const cpu::LinearWeight* w : fp8) {
    const int64_t bytes = w->out_features * w->in_features;
    if (!tiled || bytes < opt_.tiled_fp8_min_bytes || fp8_tiled_.count(w->data) != 0 ||
        bf16_input.count(w->data) != 0)
      continue;
    cuda::Fp8WeightView v;
    v.out_features = w->out_features;
    v.in_features = w->in_features;
    if (gemm_wgmma_ && cuda::fp8_linear_uses_wgmma(v, 1) && cuda::fp8_linear_uses_wgmma(v, 8))
      continue;
    DS_ASSIGN_OR_RETURN(void* dev, weights_.allocate_derived(size_t(bytes)));
    DS_RETURN_IF_ERROR(cuda::launch_fp8_weight_to_tiles(
        weights_.get(static_cast<const uint8_t*>(w->data)), static_cast<uint8_t*>(dev),
        w->out_features, w->in_features, stream_));
    fp8_tiled_[w->data] = static_cast<const uint8_t*>(dev);
  }
  // wq_a and wkv concatenated (rows of wq_a, then wkv's; their scale grids likewise, so wq_a's
  // rows must end on a 128-row block), for linear_pair at decode sizes.
  const bool fuse = opt_.fused_pair_max_tokens > 0 && !env_switched_off("DEEPSERVE_FUSED_QKV");
  auto fuse_pair = [&](const cpu::LinearWeight& a, const cpu::LinearWeight& b) -> Status {
    if (!fuse || a.format != cpu::WeightFormat::kFp8Block ||
        b.format != cpu::WeightFormat::kFp8Block || a.data == nullptr || b.data == nullptr ||
        a.in_features != b.in_features || a.out_features % 128 != 0 ||
        fused_pairs_.count(a.data) != 0)
      return ok_status();
    const size_t ca = size_t(a.out_features * a.in_features),
                 cb = size_t(b.out_features * b.in_features);
    const size_t sa = weight_scale_bytes(a), sb = weight_scale_bytes(b);
    DS_ASSIGN_OR_RETURN(void* codes, weights_.allocate_derived(ca + cb));
    DS_ASSIGN_OR_RETURN(void* scale, weights_.allocate_derived(sa + sb));
    DS_ASSIGN_OR_RETURN(void* scale_f32, weights_.allocate_derived((sa + sb) * 4));
    auto* c8 = static_cast<uint8_t*>(codes);
    auto* s8 = static_cast<uint8_t*>(scale);
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(c8, weights_.find(a.data), ca,
                                            cudaMemcpyDeviceToDevice, stream_));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(c8 + ca, weights_.find(b.data), cb,
                                            cudaMemcpyDeviceToDevice, stream_));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s8, weights_.get(a.scale), sa,
                                            cudaMemcpyDeviceToDevice, stream_));
    DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s8 + sa, weights_.get(b.scale), sb,
                                            cudaMemcpyDeviceToDevice, stream_));
    DS_RETURN_IF_ERROR(cuda::launch_e8m0_to_f32(s8, static_cast<float*>(scale_f32),
                                                int64_t(sa + sb), stream_));
    fused_pairs_[a.data] = {b.data, c8, s8, static_cast<const float*>(scale_f32)};
    return ok_status();
  };
  for (const dsv4::LayerWeights& L : model_.layers) DS_RETURN_IF_ERROR(fuse_pair(L.wq_a, L.wkv));
  for (const dsv4::MtpWeights& M : model_.mtp)
    DS_RETURN_IF_ERROR(fuse_pair(M.block.wq_a, M.block.wkv));
  // A layer's compressor projections concatenated (rows of the indexer compressor's wkv and
  // wgate on CSA layers, then the attention compressor's), for compress_layer at decode sizes.
  const bool fuse_comp =
      opt_.fused_compress_max_tokens > 0 && !env_switched_off("DEEPSERVE_FUSED_COMPRESS");
  auto fuse_compressors = [&](const dsv4::LayerWeights& L) -> Status {
    if (!fuse_comp || L.compress_ratio == 0 || L.compressor.wkv.data == nullptr ||
        fused_compress_.count(L.compressor.wkv.data) != 0)
      return ok_status();
    std::vector<const cpu::LinearWeight*> parts;
    if (L.kind == LayerKind::kCsa) {
      parts.push_back(&L.indexer_compressor.wkv);
      parts.push_back(&L.indexer_compressor.wgate);
    }
    parts.push_back(&L.compressor.wkv);
    parts.push_back(&L.compressor.wgate);
    const int64_t k = L.compressor.wkv.in_features;
    int64_t rows = 0;
    for (const cpu::LinearWeight* w : parts) {
      if (w->format != cpu::WeightFormat::kBF16 || w->data == nullptr || w->in_features != k ||
          w->out_features % 8 != 0)
        return ok_status();
      rows += w->out_features;
    }
    DS_ASSIGN_OR_RETURN(void* dev, weights_.allocate_derived(size_t(rows * k) * 2));
    auto* dst = static_cast<uint16_t*>(dev);
    for (const cpu::LinearWeight* w : parts) {
      const size_t n = size_t(w->out_features * k);
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, weights_.find(w->data), n * 2,
                                              cudaMemcpyDeviceToDevice, stream_));
      dst += n;
    }
    fused_compress_[L.compressor.wkv.data] = {
        L.kind == LayerKind::kCsa ? L.indexer_compressor.wkv.data : nullptr,
        static_cast<const uint16_t*>(dev), rows};
    return ok_status();
  };
  for (const dsv4::LayerWeights& L : model_.layers) DS_RETURN_IF_ERROR(fuse_compressors(L));
  for (const dsv4::MtpWeights& M : model_.mtp) DS_RETURN_IF_ERROR(fuse_compressors(M.block));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return ok_status();
}

Status CudaOps::init() {
  const DeepSeekV4Config& c = config_;
  DS_CUDA_RETURN_IF_ERROR(cudaSetDevice(opt_.device));
  DS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, opt_.device));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  kernel_pdl_ = opt_.kernel_pdl && !env_switched_off("DEEPSERVE_GEMM_PDL");
  gemm_wgmma_ = opt_.gemm_wgmma && !env_switched_off("DEEPSERVE_GEMM_WGMMA");
  fused_norm_rope_ = opt_.fused_norm_rope && !env_switched_off("DEEPSERVE_FUSED_NORM_ROPE");
  fused_output_rope_ =
      opt_.fused_output_rope && !env_switched_off("DEEPSERVE_FUSED_OUTPUT_ROPE");
  moe_tuning_.pdl = env_switch("DEEPSERVE_MOE_PDL", opt_.moe_pdl) ? 1 : 0;
  moe_tuning_.f8_order = opt_.moe_f8_order && !env_switched_off("DEEPSERVE_MOE_F8_ORDER") ? 0 : 1;
  moe_tuning_.route_launch =
      env_switch("DEEPSERVE_MOE_ROUTE_IN_LOGITS", opt_.moe_route_in_logits) ? 1 : 2;
  sparse_mla_wgmma_ =
      opt_.sparse_mla_wgmma && !env_switched_off("DEEPSERVE_SPARSE_MLA_WGMMA") &&
      cuda::sparse_mla_wgmma_supported(int32_t(c.num_attention_heads), int32_t(c.head_dim));
  if (opt_.max_context == 0 || opt_.max_context > c.max_position_embeddings) {
    opt_.max_context = c.max_position_embeddings;
  }
  if (opt_.max_chunk == 0 || opt_.max_chunk > opt_.max_step_tokens) {
    opt_.max_chunk = opt_.max_step_tokens;
  }
  if (opt_.max_chunk > opt_.max_context) opt_.max_chunk = opt_.max_context;
  if (opt_.max_logit_rows == 0 || opt_.max_logit_rows > opt_.max_step_tokens) {
    opt_.max_logit_rows = opt_.max_step_tokens;
  }
  if (c.hc_mult != cuda::kMhcHc) {
    return invalid_argument("CUDA backend: hc_mult must be 4 (the mHC kernels' width)");
  }
  DS_RETURN_IF_ERROR(register_weights());
  DS_RETURN_IF_ERROR(build_moe_layers());

  // GEMM workspace: inputs of up to max_step_tokens * hc rows (h_proj reads every stream) and
  // the widest input (wo_a reads heads * head_dim columns).
  const int64_t max_rows = opt_.max_step_tokens * c.hc_mult;
  const int64_t max_cols =
      std::max({c.hidden_size, c.q_lora_rank, c.num_attention_heads * c.head_dim,
                c.o_groups * c.o_lora_rank, c.moe_intermediate_size});
  const size_t gemm_bytes = cuda::GemmRunner::workspace_bytes(max_rows, max_cols);
  DS_ASSIGN_OR_RETURN(gemm_workspace_, DeviceBuffer::allocate(gemm_bytes, "GEMM workspace"));
  DS_ASSIGN_OR_RETURN(
      gemm_, cuda::GemmRunner::create(gemm_workspace_.data(), gemm_bytes, max_rows, max_cols));

  // State pools.
  const cpu::KvEntryLayout kv_layout{c.head_dim};
  if (!kv_layout.valid()) {
    return invalid_argument("CUDA backend: head_dim - 64 must be a positive multiple of 64");
  }
  window_slots_ = c.sliding_window + opt_.max_chunk - 1;
  const int64_t num_layers = c.num_hidden_layers + c.num_nextn_predict_layers;
  layers_.resize(static_cast<size_t>(num_layers));
  const int64_t T = opt_.max_checkpoint_tokens;
  // Per-slot sizes of each layer's pools.
  for (int64_t l = 0; l < num_layers; ++l) {
    LayerStore& ls = layers_[size_t(l)];
    ls.ratio = c.compress_ratios[size_t(l)];
    ls.csa = ls.ratio == 4;
    ls.window_page_bytes = cpu::kv_page_bytes(kv_layout, window_slots_);
    if (ls.ratio != 0) {
      if (kPageTokens % ls.ratio != 0) {
        return invalid_argument("CUDA backend: compress ratio " + std::to_string(ls.ratio) +
                                " does not divide the KV page of " + std::to_string(kPageTokens) +
                                " tokens");
      }
      ls.compressed_cap = ceil_div(opt_.max_context, ls.ratio);
      ls.compressed_page_size = kPageTokens / ls.ratio;
      ls.compressed_page_bytes = cpu::kv_page_bytes(kv_layout, ls.compressed_page_size);
      ls.ring_floats = cuda::compressor_state_floats(ls.ratio, c.head_dim);
      if (T > 0) {
        const int64_t width = ring_width(ls.ratio, c.head_dim);
        ls.snap_floats = ls.csa ? ls.ring_floats : 2 * T * width;
        ls.log_floats = 2 * T * width;
      }
    }
    if (ls.csa) {
      ls.index_page_bytes = cuda::index_key_page_bytes(kPageTokens / 4);
      ls.index_ring_floats = cuda::compressor_state_floats(4, c.index_head_dim);
      if (T > 0) ls.index_log_floats = 2 * T * ring_width(4, c.index_head_dim);
    }
  }
  kv_page_bytes_ = 0;
  for (const LayerStore& ls : layers_) kv_page_bytes_ += ls.compressed_page_bytes + ls.index_page_bytes;
  // Offsets of every pool for S slots and `pages` KV pages; returns the bytes of the whole state
  // buffer.
  std::vector<std::array<size_t, 9>> offsets(static_cast<size_t>(num_layers));
  auto layout = [&](int64_t S, int64_t pages) {
    size_t total = 0;
    auto take = [&](int64_t bytes) {
      const size_t at = total;
      total += (size_t(bytes) + 255) / 256 * 256;
      return at;
    };
    for (int64_t l = 0; l < num_layers; ++l) {
      const LayerStore& ls = layers_[size_t(l)];
      std::array<size_t, 9>& o = offsets[size_t(l)];
      o[0] = take(S * ls.window_page_bytes);
      if (ls.ratio != 0) {
        o[1] = take(pages * ls.compressed_page_bytes);
        o[3] = take(S * ls.ring_floats * 4);
        if (T > 0) {
          o[5] = take(S * ls.snap_floats * 4);
          o[6] = take(S * ls.log_floats * 4);
        }
      }
      if (ls.csa) {
        o[2] = take(pages * ls.index_page_bytes);
        o[4] = take(S * ls.index_ring_floats * 4);
        if (T > 0) {
          o[7] = take(S * ls.index_ring_floats * 4);
          o[8] = take(S * ls.index_log_floats * 4);
        }
      }
    }
    return total;
  };

  // Step arena: activations of the largest step (generously: the forward keeps about a dozen
  // [N, hc*D]-sized buffers and the attention scratch alive at once), the logits rows and the
  // attention / mHC / sampling workspaces.
  const int64_t N = opt_.max_step_tokens;
  const int64_t per_token =
      4 * (12 * c.hc_mult * c.hidden_size + 8 * c.num_attention_heads * c.head_dim +
           8 * c.q_lora_rank + 4 * c.index_n_heads * c.index_head_dim +
           8 * 2 * std::max(c.head_dim, c.index_head_dim) + 4 * c.sliding_window +
           4 * c.index_topk + 64) +
      2 * c.num_attention_heads * c.head_dim * 2;
  const int64_t hca_cols = ceil_div(opt_.max_context, 128);
  const int64_t attn_ws = int64_t(cuda::sparse_mla_workspace_bytes(
      cuda::plan_sparse_mla_decode(
          int32_t(N), int32_t(c.num_attention_heads), int32_t(c.sliding_window),
          int32_t(std::max(c.index_topk, hca_cols)), num_sms_, 0,
          sparse_mla_wgmma_ &&
              cuda::sparse_mla_wgmma_preferred(int32_t(N), int32_t(c.num_attention_heads))),
      int32_t(N), int32_t(c.num_attention_heads), int32_t(c.head_dim)));
  const int64_t arena =
      N * per_token + N * hca_cols * 4 + opt_.max_logit_rows * c.vocab_size * 4 +
      cuda::mhc_workspace_floats(std::max(N, opt_.max_logit_rows), c.hidden_size) * 4 + attn_ws +
      cuda::sampling_workspace_floats(opt_.max_logit_rows, c.vocab_size) * 4 +
      opt_.max_logit_rows * 8 +
      int64_t(moe_workspace_bytes_) +
      int64_t(cuda::indexer_workspace_bytes(cuda::plan_indexer_select(
          int32_t(N), int32_t(ceil_div(opt_.max_context, 4)), int32_t(c.index_topk), num_sms_))) +
      (64 << 20);

  // Slots and KV pages (cuda_ops.h, CudaOpsOptions::kv_pages). With gpu_memory_utilization the
  // budget is what it leaves after everything already allocated on the device (weights,
  // workspaces, other processes) and the step arena (vLLM's --gpu-memory-utilization).
  pages_per_seq_ = ceil_div(opt_.max_context, kPageTokens);
  const int64_t P1 = pages_per_seq_;
  int64_t pages = opt_.max_sequences * P1;
  if (opt_.kv_pages > 0) {
    pages = opt_.kv_pages;
  } else if (opt_.kv_cache_bytes > 0) {
    pages = int64_t(opt_.kv_cache_bytes / uint64_t(std::max<int64_t>(kv_page_bytes_, 1)));
    if (pages < 1) {
      return invalid_argument("CUDA backend: a KV cache of " + std::to_string(opt_.kv_cache_bytes) +
                              " bytes holds no page (one page of " + std::to_string(kPageTokens) +
                              " tokens takes " + std::to_string(kv_page_bytes_) + " bytes)");
    }
  } else if (opt_.gpu_memory_utilization > 0) {
    size_t free_bytes = 0, total_bytes = 0;
    DS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double budget = opt_.gpu_memory_utilization * double(total_bytes) -
                          double(total_bytes - free_bytes) - double(arena);
    // The largest x in [lo, hi] with fits(x), or lo - 1 when none does.
    auto largest = [](int64_t lo, int64_t hi, auto fits) {
      if (!fits(lo)) return lo - 1;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (fits(mid)) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      return lo;
    };
    // The most slots (at most max_sequences) that leave room for one max_context sequence and
    // one page per slot (a slot without a page could not start a sequence).
    const int64_t S = largest(1, opt_.max_sequences, [&](int64_t s) {
      return double(layout(s, std::max(P1, s))) <= budget;
    });
    if (S < 1) {
      const double gib = double(uint64_t(1) << 30);
      char msg[512];
      std::snprintf(msg, sizeof(msg),
                    "CUDA backend: gpu_memory_utilization %.2f of %.1f GiB leaves %.2f GiB after "
                    "what is already allocated (%.2f GiB: weights, workspaces, other processes) "
                    "and the step arena (%.2f GiB); one sequence of max_model_len %lld tokens "
                    "needs %.2f GiB. Lower --max-model-len or --max-num-batched-tokens, or raise "
                    "--gpu-memory-utilization",
                    opt_.gpu_memory_utilization, double(total_bytes) / gib,
                    std::max(0.0, budget) / gib, double(total_bytes - free_bytes) / gib,
                    double(arena) / gib, (long long)opt_.max_context, double(layout(1, P1)) / gib);
      return resource_exhausted(msg);
    }
    opt_.max_sequences = S;
    pages = largest(P1, S * P1, [&](int64_t n) { return double(layout(S, n)) <= budget; });
  }
  kv_pages_total_ = pages;
  const int64_t S = opt_.max_sequences;
  const size_t total = layout(S, pages);
  DS_ASSIGN_OR_RETURN(state_, DeviceBuffer::allocate(total, "sequence state"));
  state_bytes_ = total;
  uint8_t* base = state_.as<uint8_t>();
  for (int64_t l = 0; l < num_layers; ++l) {
    LayerStore& ls = layers_[size_t(l)];
    ls.window = base + offsets[size_t(l)][0];
    auto floats = [&](int k) { return reinterpret_cast<float*>(base + offsets[size_t(l)][k]); };
    if (ls.ratio != 0) {
      ls.compressed = base + offsets[size_t(l)][1];
      ls.ring = floats(3);
      if (T > 0) {
        ls.snap = floats(5);
        ls.log = floats(6);
      }
    }
    if (ls.csa) {
      ls.index_keys = base + offsets[size_t(l)][2];
      ls.index_ring = floats(4);
      if (T > 0) {
        ls.index_snap = floats(7);
        ls.index_log = floats(8);
      }
    }
  }
  checkpoints_.assign(size_t(S), {});

  DS_ASSIGN_OR_RETURN(DeviceBuffer arena_buffer,
                      DeviceBuffer::allocate(size_t(arena), "step arena"));
  arena_ = DeviceArena(std::move(arena_buffer));
  // The indexer's merge counters (IndexerSelectParams::merge_counters): zero once, every launch
  // leaves them zero. DEEPSERVE_INDEXER_FUSED_MERGE=0 keeps the merge kernel (A/B).
  if (!env_switched_off("DEEPSERVE_INDEXER_FUSED_MERGE")) {
    DS_ASSIGN_OR_RETURN(indexer_counters_,
                        DeviceBuffer::allocate(size_t(N) * 4, "indexer merge counters"));
    DS_CUDA_RETURN_IF_ERROR(cudaMemset(indexer_counters_.data(), 0, size_t(N) * 4));
  }
  free_slots_.clear();
  for (int64_t s = S - 1; s >= 0; --s) free_slots_.push_back(s);

  // Page tables: the window rings' (slot s -> its own ring) and the KV pages'.
  std::vector<int32_t> ids(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) ids[size_t(s)] = int32_t(s);
  DS_ASSIGN_OR_RETURN(slot_ids_, DeviceBuffer::allocate(size_t(S) * 4, "slot ids"));
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpy(slot_ids_.data(), ids.data(), size_t(S) * 4,
                                     cudaMemcpyHostToDevice));
  // Unused entries name page 0, so that a stray read stays inside the pool.
  page_table_host_.assign(size_t(S * P1), 0);
  DS_ASSIGN_OR_RETURN(page_table_, DeviceBuffer::allocate(size_t(S * P1) * 4, "KV page table"));
  DS_CUDA_RETURN_IF_ERROR(cudaMemcpy(page_table_.data(), page_table_host_.data(),
                                     size_t(S * P1) * 4, cudaMemcpyHostToDevice));
  pages_held_.assign(size_t(S), 0);
  free_pages_.clear();
  for (int64_t p = pages - 1; p >= 0; --p) free_pages_.push_back(int32_t(p));
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return ok_status();
}

bool CudaOps::grow_pages(int64_t slot, int64_t tokens) {
  const int64_t need = std::min(ceil_div(tokens, kPageTokens), pages_per_seq_);
  int64_t& held = pages_held_[size_t(slot)];
  if (need <= held) return true;
  if (need - held > int64_t(free_pages_.size())) return false;
  int32_t* row = page_table_host_.data() + slot * pages_per_seq_;
  const int64_t first = held;
  for (; held < need; ++held) {
    row[held] = free_pages_.back();
    free_pages_.pop_back();
  }
  // Stream ordered before the step's kernels; a copy from pageable memory is staged at once, and
  // these entries change again only after the sequence is released (after a synchronized step).
  (void)check(cuda_check(cudaMemcpyAsync(page_table_.as<int32_t>() + slot * pages_per_seq_ + first,
                                         row + first, size_t(need - first) * 4,
                                         cudaMemcpyHostToDevice, stream_),
                         "cudaMemcpyAsync(page table)"));
  return true;
}

void CudaOps::free_pages(int64_t slot) {
  const int32_t* row = page_table_host_.data() + slot * pages_per_seq_;
  int64_t& held = pages_held_[size_t(slot)];
  while (held > 0) free_pages_.push_back(row[--held]);
}

int64_t CudaOps::kv_pages_held(const dsv4::SequenceState* state) const {
  const auto it = slot_of_.find(state);
  return it == slot_of_.end() ? 0 : pages_held_[size_t(it->second)];
}

Status CudaOps::reset_slot(int64_t slot) {
  // The compressor rings back to kv 0 / score -inf (§15); the KV pages need no clearing: a
  // query reads only entries written at positions it can see.
  std::vector<cuda::CompressorSeq> seqs;
  for (const LayerStore& ls : layers_) {
    if (ls.ratio == 0) continue;
    cuda::CompressorSeq s;
    s.state = ls.ring + slot * ls.ring_floats;
    seqs.push_back(s);
  }
  std::vector<cuda::CompressorSeq> index_seqs;
  for (const LayerStore& ls : layers_) {
    if (!ls.csa) continue;
    cuda::CompressorSeq s;
    s.state = ls.index_ring + slot * ls.index_ring_floats;
    index_seqs.push_back(s);
  }
  // Layers differ in ratio: reset per layer (a few small launches, only at a sequence's start).
  const cuda::CompressorSeq* d = upload(seqs);
  const cuda::CompressorSeq* di = upload(index_seqs);
  if (failed()) return error_;
  size_t k = 0, ki = 0;
  for (const LayerStore& ls : layers_) {
    if (ls.ratio == 0) continue;
    cuda::launch_compressor_state_reset(d + k++, 1, ls.ratio, config_.head_dim, stream_);
    if (ls.csa) {
      cuda::launch_compressor_state_reset(di + ki++, 1, 4, config_.index_head_dim, stream_);
    }
  }
  return cuda_check(cudaGetLastError(), "launch_compressor_state_reset");
}

void CudaOps::release_sequence(const dsv4::SequenceState* state) {
  auto it = slot_of_.find(state);
  if (it == slot_of_.end()) return;
  checkpoints_[size_t(it->second)] = {};
  free_pages(it->second);
  free_slots_.push_back(it->second);
  slot_of_.erase(it);
}

// ---- Speculative checkpoint / rollback (ops.h contract, docs/cuda_backend.md) ----
//
// What a rollback from position `end` to q (P0 <= q <= end <= P0 + T) must undo, per layer:
//  - the window ring: nothing. The steps wrote the slots of positions P0..end-1, which held
//    positions up to end-1-R (R = sliding_window + max_chunk - 1); with end - q <= T <= max_chunk
//    those are older than the window of any query at q or later, and the slots of rejected
//    positions are rewritten before any query can see them (the window is indexed by position).
//  - compressed KV entries and indexer keys: nothing. Entries emitted by rejected positions lie
//    at indices >= q / ratio, which no query at q or later can see before they are emitted again.
//  - the compressor rings: restored from the checkpoint's copy, then the logged rows of positions
//    P0..q-1 are pushed again through the same compressor kernel, so the ring is the one the
//    accepted positions alone produce.

std::pair<int64_t, int64_t> CudaOps::part_layers(bool mtp) const {
  return mtp ? std::pair<int64_t, int64_t>{config_.num_hidden_layers,
                                           config_.num_hidden_layers +
                                               config_.num_nextn_predict_layers}
             : std::pair<int64_t, int64_t>{0, config_.num_hidden_layers};
}

const dsv4::LayerWeights& CudaOps::layer_weights(int64_t layer) const {
  return layer < config_.num_hidden_layers
             ? model_.layers[size_t(layer)]
             : model_.mtp[size_t(layer - config_.num_hidden_layers)].block;
}

Status CudaOps::copy_segments(const std::vector<cuda::CopySegment>& segments) {
  if (segments.empty()) return ok_status();
  const size_t mark = arena_.mark();
  auto* table = static_cast<cuda::CopySegment*>(
      arena_.alloc(segments.size() * sizeof(cuda::CopySegment)));
  if (table == nullptr) return resource_exhausted("CUDA backend: the step arena is full");
  int64_t longest = 0;
  for (const cuda::CopySegment& seg : segments) longest = std::max(longest, seg.num_floats);
  Status st = cuda_check(cudaMemcpyAsync(table, segments.data(),
                                         segments.size() * sizeof(cuda::CopySegment),
                                         cudaMemcpyHostToDevice, stream_),
                         "cudaMemcpyAsync(copy segments)");
  if (st.ok()) {
    cuda::launch_copy_segments(table, int64_t(segments.size()), longest, stream_);
    st = cuda_check(cudaGetLastError(), "launch_copy_segments");
  }
  arena_.release(mark);  // later users of the bytes are ordered after the copy on the stream
  return st;
}

std::vector<cuda::CopySegment> CudaOps::checkpoint_segments(int64_t slot, bool mtp,
                                                            int64_t position, int64_t max_tokens,
                                                            bool restore) const {
  std::vector<cuda::CopySegment> segs;
  auto add = [&](float* live, float* saved, int64_t n) {
    segs.push_back(restore ? cuda::CopySegment{saved, live, n} : cuda::CopySegment{live, saved, n});
  };
  const int64_t T = opt_.max_checkpoint_tokens;
  const auto [first, last] = part_layers(mtp);
  for (int64_t l = first; l < last; ++l) {
    const LayerStore& ls = layers_[size_t(l)];
    if (ls.ratio == 0) continue;
    float* ring = ls.ring + slot * ls.ring_floats;
    float* snap = ls.snap + slot * ls.snap_floats;
    if (ls.csa) {
      add(ring, snap, ls.ring_floats);
      add(ls.index_ring + slot * ls.index_ring_floats,
          ls.index_snap + slot * ls.index_ring_floats, ls.index_ring_floats);
      continue;
    }
    // HCA: row t % ratio holds position t of the open window; kv rows, then score rows.
    const int64_t width = ring_width(ls.ratio, config_.head_dim);
    for (int64_t i = 0; i < max_tokens; ++i) {
      const int64_t row = (position + i) % ls.ratio;
      for (int64_t half = 0; half < 2; ++half) {
        add(ring + (half * ls.ratio + row) * width, snap + (half * T + i) * width, width);
      }
    }
  }
  return segs;
}

Result<std::vector<float>> CudaOps::read_compressor_rings(const dsv4::SequenceState* state) {
  const auto it = slot_of_.find(state);
  if (it == slot_of_.end()) return not_found("CUDA backend: the sequence has no state");
  const int64_t slot = it->second;
  std::vector<float> out;
  auto append = [&](const float* ring, int64_t n) -> Status {
    const size_t at = out.size();
    out.resize(at + size_t(n));
    return cuda_check(cudaMemcpyAsync(out.data() + at, ring + slot * n, size_t(n) * 4,
                                      cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync(read rings)");
  };
  DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  for (const LayerStore& ls : layers_) {
    if (ls.ratio != 0) {
      DS_RETURN_IF_ERROR(append(ls.ring, ls.ring_floats));
      DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    if (ls.csa) {
      DS_RETURN_IF_ERROR(append(ls.index_ring, ls.index_ring_floats));
      DS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
  }
  return out;
}

Status CudaOps::checkpoint(dsv4::SequenceState* state, bool mtp, int64_t position,
                           int64_t max_tokens) {
  if (opt_.max_checkpoint_tokens <= 0) {
    return failed_precondition(
        "CUDA backend: created without max_checkpoint_tokens, so it cannot checkpoint for "
        "speculative decoding");
  }
  if (max_tokens < 1 || max_tokens > opt_.max_checkpoint_tokens || max_tokens > opt_.max_chunk) {
    return invalid_argument("CUDA backend: a checkpoint of " + std::to_string(max_tokens) +
                            " positions (limits: max_checkpoint_tokens " +
                            std::to_string(opt_.max_checkpoint_tokens) + ", max_chunk " +
                            std::to_string(opt_.max_chunk) + ")");
  }
  const auto it = slot_of_.find(state);
  if (it == slot_of_.end()) {
    return failed_precondition("CUDA backend: checkpoint of a sequence that has no state yet");
  }
  const int64_t slot = it->second;
  SlotCheckpoint& cp = checkpoints_[size_t(slot)][mtp ? 1 : 0];
  cp = {};
  DS_RETURN_IF_ERROR(copy_segments(checkpoint_segments(slot, mtp, position, max_tokens, false)));
  cp.armed = true;
  cp.position = position;
  cp.max_tokens = max_tokens;
  return ok_status();
}

Status CudaOps::rollback(dsv4::SequenceState* state, bool mtp, int64_t q) {
  const auto it = slot_of_.find(state);
  if (it == slot_of_.end()) {
    return failed_precondition("CUDA backend: rollback of a sequence that has no state");
  }
  const int64_t slot = it->second;
  SlotCheckpoint& cp = checkpoints_[size_t(slot)][mtp ? 1 : 0];
  if (!cp.armed) return failed_precondition("CUDA backend: rollback without a checkpoint");
  const int64_t p0 = cp.position, n = q - p0;
  if (n < 0 || n > cp.max_tokens) {
    return invalid_argument("CUDA backend: rollback to " + std::to_string(q) +
                            " outside the checkpoint's range");
  }
  cp.armed = false;
  DS_RETURN_IF_ERROR(copy_segments(checkpoint_segments(slot, mtp, p0, cp.max_tokens, true)));
  if (n == 0) return ok_status();
  // Replay the accepted positions' rows through the compressors (pooled entries are discarded:
  // the steps already stored them).
  const int64_t T = opt_.max_checkpoint_tokens;
  const auto [first, last] = part_layers(mtp);
  const size_t mark = arena_.mark();
  Status st = ok_status();
  for (int64_t l = first; l < last && st.ok(); ++l) {
    const LayerStore& ls = layers_[size_t(l)];
    if (ls.ratio == 0) continue;
    const dsv4::LayerWeights& lw = layer_weights(l);
    for (int pass = 0; pass < (ls.csa ? 2 : 1) && st.ok(); ++pass) {
      const bool indexer = pass == 1;
      const dsv4::CompressorWeights& cw = indexer ? lw.indexer_compressor : lw.compressor;
      const int64_t d = cw.config.head_dim, width = cw.config.width();
      const float* log = indexer ? ls.index_log + slot * ls.index_log_floats
                                 : ls.log + slot * ls.log_floats;
      cuda::CompressorSeq seq;
      seq.row = 0;
      seq.count = n;
      seq.start = p0;
      seq.entry_row = 0;
      seq.state = indexer ? ls.index_ring + slot * ls.index_ring_floats
                          : ls.ring + slot * ls.ring_floats;
      auto* d_seq = static_cast<cuda::CompressorSeq*>(arena_.alloc(sizeof(seq)));
      auto* entries = static_cast<float*>(arena_.alloc(size_t((n / ls.ratio + 1) * d) * 4));
      if (d_seq == nullptr || entries == nullptr) {
        st = resource_exhausted("CUDA backend: the step arena is full");
        break;
      }
      st = cuda_check(cudaMemcpyAsync(d_seq, &seq, sizeof(seq), cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync(rollback)");
      if (!st.ok()) break;
      cuda::CompressorParams p;
      p.kv = log;
      p.score = log + T * width;
      p.ape = weights_.get(cw.ape);
      p.seqs = d_seq;
      p.num_seqs = 1;
      p.max_count = n;
      p.ratio = ls.ratio;
      p.head_dim = d;
      p.rope_dim = cw.config.rope_dim;
      p.entries = entries;
      p.finish = false;
      cuda::launch_compressor(p, stream_);
      st = cuda_check(cudaGetLastError(), "launch_compressor(rollback)");
    }
  }
  // The host copy of d_seq must outlive the async copy from pageable memory: cudaMemcpyAsync
  // from pageable memory returns after staging it, so the stack value may go.
  arena_.release(mark);
  return st;
}

void CudaOps::begin_step(const StepPlan& plan) {
  const DeepSeekV4Config& c = config_;
  plan_ = &plan;
  attend_out_ = {};
  error_ = ok_status();
  mode_ = Mode::kEager;
  step_ranges_.clear();
  next_range_event_ = 0;
  open_range_event_ = -1;
  // Nothing lives in the arena between steps: the step's plan arrays start at its base, so a
  // decode step of a given size finds every buffer where its captured graph expects it.
  arena_.release(0);
  step_ = std::make_unique<StepData>();
  StepData& st = *step_;
  const int64_t N = plan.num_tokens, S = int64_t(plan.seqs.size());
  st.num_tokens = N;
  st.num_seqs = S;
  if (N > opt_.max_step_tokens) {
    (void)check(
        out_of_range("CUDA backend: a step of " + std::to_string(N) +
                     " tokens exceeds max_step_tokens = " + std::to_string(opt_.max_step_tokens)));
    return;
  }
  // Slots: a new sequence (or one starting again at position 0) gets a fresh slot state.
  std::vector<int32_t> slots(static_cast<size_t>(S));
  bool any_reset = false;
  for (int64_t i = 0; i < S; ++i) {
    const StepPlan::Seq& s = plan.seqs[size_t(i)];
    st.max_count = std::max(st.max_count, s.count);
    if (s.count > opt_.max_chunk) {
      (void)check(out_of_range("CUDA backend: a chunk of " + std::to_string(s.count) +
                               " tokens exceeds max_chunk = " + std::to_string(opt_.max_chunk)));
      return;
    }
    const int64_t pos = s.start + s.count;
    if (pos > opt_.max_context) {
      (void)check(out_of_range("CUDA backend: position " + std::to_string(pos) +
                               " exceeds max_context = " + std::to_string(opt_.max_context)));
      return;
    }
    auto it = slot_of_.find(s.state);
    if (it == slot_of_.end()) {
      if (free_slots_.empty()) {
        (void)check(resource_exhausted("CUDA backend: more than max_sequences = " +
                                       std::to_string(opt_.max_sequences) + " live sequences"));
        return;
      }
      it = slot_of_.emplace(s.state, free_slots_.back()).first;
      free_slots_.pop_back();
      checkpoints_[size_t(it->second)] = {};
      if (!check(reset_slot(it->second)).ok()) return;
      any_reset = true;
    } else if (s.start == 0 && !plan.mtp) {
      // The state was reset for a new sequence (the MTP layer's first step follows the main
      // model's, which already reset the slot, MTP layers included).
      checkpoints_[size_t(it->second)] = {};
      if (!check(reset_slot(it->second)).ok()) return;
      any_reset = true;
    }
    slots[size_t(i)] = int32_t(it->second);
    if (!grow_pages(it->second, pos)) {
      (void)check(resource_exhausted(
          "CUDA backend: out of KV pages: a sequence at position " + std::to_string(pos) +
          " needs " + std::to_string(ceil_div(pos, kPageTokens)) + " pages of " +
          std::to_string(kPageTokens) + " tokens, holds " +
          std::to_string(pages_held_[size_t(it->second)]) + ", and " +
          std::to_string(free_pages_.size()) + " of " + std::to_string(kv_pages_total_) +
          " are free"));
      return;
    }
    // An armed checkpoint of this part: the compressors log this sequence's rows.
    const SlotCheckpoint& cp = checkpoints_[size_t(it->second)][plan.mtp ? 1 : 0];
    int64_t log_row = -1;
    if (cp.armed && s.count > 0) {
      log_row = s.start - cp.position;
      if (log_row < 0 || log_row + s.count > cp.max_tokens) {
        (void)check(internal_error("CUDA backend: a step goes past its sequence's checkpoint"));
        return;
      }
      st.any_log = true;
    }
    st.log_row.push_back(log_row);
  }
  // A decode step sizes its per-step arrays by bounds, not by contents, so that the arena layout
  // depends on N alone and the step can be captured into a CUDA graph and replayed. Every decode
  // step does, graphs on or off, so that both paths launch the same kernels with the same
  // geometry (reference numerics amplify any difference in summation order).
  const bool bounded = !plan.mtp && N > 0 && N <= opt_.max_graph_tokens && st.max_count == 1;
  // Steps that log for a speculative checkpoint run eagerly (a graph would replay the copies of
  // the step it captured).
  const bool graph_step = bounded && opt_.cuda_graphs && !opt_.synchronous_components &&
                          !any_reset && !st.any_log;

  // Per-token arrays.
  const int64_t W = c.sliding_window, R = window_slots_;
  const std::vector<int64_t>& positions = plan.positions;
  std::vector<int32_t> window_idx(size_t(N * W), -1), window_len(static_cast<size_t>(N));
  std::vector<int32_t> visible4(static_cast<size_t>(N)), topk_len(size_t(N), int32_t(c.index_topk));
  std::vector<int32_t> kv_row_index(static_cast<size_t>(N));
  std::vector<int64_t> iota(static_cast<size_t>(N));
  int64_t hca_width = 0;
  for (int64_t i = 0; i < N; ++i) hca_width = std::max(hca_width, (positions[size_t(i)] + 1) / 128);
  if (bounded) hca_width = ceil_div(opt_.max_context, 128);
  st.hca_width = int32_t(std::max<int64_t>(hca_width, 1));
  std::vector<int32_t> hca_idx(size_t(N * st.hca_width), -1), hca_len(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = positions[size_t(i)];
    const int64_t first = std::max<int64_t>(0, t - W + 1);
    for (int64_t p = first; p <= t; ++p) window_idx[size_t(i * W + p - first)] = int32_t(p % R);
    window_len[size_t(i)] = int32_t(t - first + 1);
    visible4[size_t(i)] = int32_t((t + 1) / 4);
    kv_row_index[size_t(i)] = int32_t(t % R);
    const int64_t vis = (t + 1) / 128;
    for (int64_t w = 0; w < vis; ++w) hca_idx[size_t(i * st.hca_width + w)] = int32_t(w);
    hca_len[size_t(i)] = int32_t(vis);
    iota[size_t(i)] = i;
  }
  // Entries each compressor emits: the windows completed by this step's tokens. A graph step
  // reserves one row per sequence (one token completes at most one window) and marks the rows
  // of sequences that complete none with index -1 (skipped by the pack kernels).
  auto emitted = [&](int64_t ratio, std::vector<int64_t>* first_row) {
    std::vector<int32_t> seq, index;
    for (int64_t i = 0; i < S; ++i) {
      const StepPlan::Seq& s = plan.seqs[size_t(i)];
      first_row->push_back(int64_t(seq.size()));
      const int64_t w0 = s.start / ratio, w1 = (s.start + s.count) / ratio;
      for (int64_t w = w0; w < w1; ++w) {
        seq.push_back(slots[size_t(i)]);
        index.push_back(int32_t(w));
      }
      if (bounded && w1 == w0) {
        seq.push_back(slots[size_t(i)]);
        index.push_back(-1);
      }
    }
    StepData::Emitted e;
    e.rows = int64_t(seq.size());
    e.slot = upload(seq);
    e.index = upload(index);
    return e;
  };
  st.positions = upload(positions);
  st.ids = upload(plan.ids);
  std::vector<int32_t> query_slot(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) query_slot[size_t(i)] = slots[size_t(plan.seq_of[size_t(i)])];
  st.query_slot = upload(query_slot);
  st.slots = slots;
  st.window_idx = upload(window_idx);
  st.window_len = upload(window_len);
  st.visible4 = upload(visible4);
  st.topk_len = upload(topk_len);
  st.kv_row_index = upload(kv_row_index);
  st.hca_idx = upload(hca_idx);
  st.hca_len = upload(hca_len);
  st.iota = upload(iota);
  st.emitted4 = emitted(4, &st.entry_rows_of_seq4);
  st.emitted128 = emitted(128, &st.entry_rows_of_seq128);

  // Compressor records of every layer of this step's kind (main or MTP).
  const int64_t first_layer = plan.mtp ? c.num_hidden_layers : 0;
  const int64_t count = plan.mtp ? c.num_nextn_predict_layers : c.num_hidden_layers;
  st.comp_seqs.assign(size_t(count), nullptr);
  st.index_seqs.assign(size_t(count), nullptr);
  for (int64_t l = 0; l < count; ++l) {
    const LayerStore& ls = layers_[size_t(first_layer + l)];
    if (ls.ratio == 0) continue;
    const std::vector<int64_t>& first_row =
        ls.ratio == 4 ? st.entry_rows_of_seq4 : st.entry_rows_of_seq128;
    std::vector<cuda::CompressorSeq> recs(static_cast<size_t>(S)),
        index_recs(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) {
      const StepPlan::Seq& s = plan.seqs[size_t(i)];
      cuda::CompressorSeq r;
      r.row = s.begin;
      r.count = s.count;
      r.start = s.start;
      r.entry_row = first_row[size_t(i)];
      r.state = ls.ring + slots[size_t(i)] * ls.ring_floats;
      recs[size_t(i)] = r;
      if (ls.csa) {
        r.state = ls.index_ring + slots[size_t(i)] * ls.index_ring_floats;
        index_recs[size_t(i)] = r;
      }
    }
    st.comp_seqs[size_t(l)] = upload(recs);
    if (ls.csa) st.index_seqs[size_t(l)] = upload(index_recs);
  }
  if (!graph_step || failed()) return;

  // First time at this batch size: eager (it also warms cuBLASLt's per-shape plans); second
  // time: capture; afterwards: replay.
  Graph& g = graphs_[N];
  if (g.exec != nullptr) {
    mode_ = Mode::kReplay;
  } else if (g.seen++ >= 1) {
    if (check(cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed),
                         "cudaStreamBeginCapture"))
            .ok()) {
      mode_ = Mode::kCapture;
    }
  }
}

void CudaOps::finish_graph_step() {
  if (mode_ == Mode::kCapture) {
    cudaGraph_t graph = nullptr;
    const cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    mode_ = Mode::kEager;
    if (!check(cuda_check(err, "cudaStreamEndCapture")).ok()) return;
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ierr = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (!check(cuda_check(ierr, "cudaGraphInstantiate")).ok()) return;
    graphs_[step_->num_tokens].exec = exec;
    ++graph_captures_;
    (void)check(cuda_check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch"));
  } else if (mode_ == Mode::kReplay) {
    mode_ = Mode::kEager;
    ++graph_replays_;
    (void)check(
        cuda_check(cudaGraphLaunch(graphs_[step_->num_tokens].exec, stream_), "cudaGraphLaunch"));
  }
}

void CudaOps::end_step() {
  if (mode_ == Mode::kCapture) {  // an error cut the step short: drop the capture
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) {
      cudaGraphDestroy(graph);
    }
    (void)cudaGetLastError();
  }
  mode_ = Mode::kEager;
  if (!failed()) {
    (void)check(cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(end_step)"));
    if (opt_.component_events && !failed()) accumulate_range_times();
  } else {
    cudaStreamSynchronize(stream_);  // let in-flight work finish before the arena is reused
  }
  plan_ = nullptr;
  step_.reset();
}

void CudaOps::component_begin(dsv4::Component component) {
  if (opt_.synchronous_components) cudaStreamSynchronize(stream_);
  nvtxRangePushA(dsv4::component_name(component));
  // Step-overhead ranges are host work around begin_step / end_step (outside the graph).
  if (opt_.component_events && component != dsv4::Component::kStep && plan_ != nullptr &&
      !failed()) {
    open_range_event_ = next_range_event_++;
    record_range_event(open_range_event_);
  }
}

void CudaOps::component_end(dsv4::Component component) {
  if (opt_.synchronous_components) cudaStreamSynchronize(stream_);
  nvtxRangePop();
  if (open_range_event_ >= 0) {
    const int end = next_range_event_++;
    record_range_event(end);
    step_ranges_.push_back({component, open_range_event_, end});
    open_range_event_ = -1;
  }
}

// Event `index` of the step: recorded now (eager), as an event-record node of the graph being
// captured, or not at all when the step replays (its graph records the same event there). The
// forward opens the same ranges in the same order for every step of a given batch size, so the
// indices of a replayed step are those of its capture.
void CudaOps::record_range_event(int index) {
  while (int(range_events_.size()) <= index) {
    cudaEvent_t e = nullptr;
    if (!check(cuda_check(cudaEventCreate(&e), "cudaEventCreate(component range)")).ok()) return;
    range_events_.push_back(e);
  }
  if (mode_ == Mode::kReplay) return;
  cudaEvent_t e = range_events_[size_t(index)];
  (void)check(cuda_check(mode_ == Mode::kCapture
                             ? cudaEventRecordWithFlags(e, stream_, cudaEventRecordExternal)
                             : cudaEventRecord(e, stream_),
                         "cudaEventRecord(component range)"));
}

// After the step's synchronization: every range's device time into the per-component totals.
void CudaOps::accumulate_range_times() {
  for (const TimedRange& r : step_ranges_) {
    if (r.end >= int(range_events_.size())) continue;  // its event was never created
    float ms = 0;
    if (cudaEventElapsedTime(&ms, range_events_[size_t(r.begin)], range_events_[size_t(r.end)]) !=
        cudaSuccess) {
      (void)cudaGetLastError();  // not recorded (a failed step): the range is not counted
      continue;
    }
    range_seconds_[size_t(r.component)] += double(ms) * 1e-3;
    ++range_counts_[size_t(r.component)];
  }
  step_ranges_.clear();
}

bool CudaOps::take_component_times(std::span<double> seconds, std::span<int64_t> ranges) {
  if (!opt_.component_events) return false;
  for (size_t c = 0; c < range_seconds_.size() && c < seconds.size() && c < ranges.size(); ++c) {
    seconds[c] += range_seconds_[c];
    ranges[c] += range_counts_[c];
  }
  range_seconds_.fill(0);
  range_counts_.fill(0);
  return true;
}

void CudaOps::copy_to_host(const float* src, int64_t n, float* dst) {
  const HostCopy copy{src, n, dst};
  copy_many_to_host(std::span<const HostCopy>(&copy, 1));
}

void CudaOps::copy_many_to_host(std::span<const HostCopy> copies) {
  // The logits copy ends a decode step's graph: the work before it is captured or replayed.
  finish_graph_step();
  if (failed()) return;
  for (const HostCopy& c : copies) {
    if (!check(cuda_check(cudaMemcpyAsync(c.dst, c.src, size_t(c.n) * 4, cudaMemcpyDeviceToHost,
                                          stream_),
                          "cudaMemcpyAsync(to host)"))
             .ok()) {
      break;  // the copies issued so far still complete before the sync below
    }
  }
  (void)check(cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(to host)"));
}

void CudaOps::argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* ids,
                          uint8_t* finite) {
  token_kernel(rows, ids, finite, "launch_sample_greedy", [&](int32_t* d_ids, uint8_t* d_finite) {
    float* ws = scratch<float>(cuda::sampling_workspace_floats(rows, n));
    if (failed()) return;
    cuda::SampleParams p;
    p.logits = x;
    p.rows = rows;
    p.vocab = n;
    p.stride = n;
    p.argmax = d_ids;
    p.finite = d_finite;
    p.workspace = ws;
    cuda::launch_sample_greedy(p, stream_);
  });
}

void CudaOps::sample_rows(const float* x, int64_t rows, int64_t n, const cpu::RowSampling* params,
                          int32_t* ids, uint8_t* finite) {
  token_kernel(rows, ids, finite, "launch_sample_rows", [&](int32_t* d_ids, uint8_t* d_finite) {
    const cpu::RowSampling* d_params = upload(std::vector<cpu::RowSampling>(params, params + rows));
    if (failed()) return;
    cuda::SampleRowsParams p;
    p.logits = x;
    p.rows = rows;
    p.vocab = n;
    p.stride = n;
    p.params = d_params;
    p.ids = d_ids;
    p.finite = d_finite;
    cuda::launch_sample_rows(p, stream_);
  });
}

template <typename Launch>
void CudaOps::token_kernel(int64_t rows, int32_t* ids, uint8_t* finite, const char* kernel,
                           Launch&& launch) {
  finish_graph_step();
  if (failed() || rows <= 0) return;
  const size_t mark = arena_.mark();
  int32_t* d_ids = scratch<int32_t>(rows);
  uint8_t* d_finite = scratch<uint8_t>(rows);
  if (!failed()) launch(d_ids, d_finite);
  if (!failed()) tokens_to_host(d_ids, d_finite, rows, ids, finite, kernel);
  arena_.release(mark);
}

void CudaOps::tokens_to_host(const int32_t* d_ids, const uint8_t* d_finite, int64_t rows,
                             int32_t* ids, uint8_t* finite, const char* kernel) {
  if (check(cuda_check(cudaGetLastError(), kernel)).ok() &&
      check(
          cuda_check(cudaMemcpyAsync(ids, d_ids, size_t(rows) * 4, cudaMemcpyDeviceToHost, stream_),
                     "cudaMemcpyAsync(tokens to host)"))
          .ok()) {
    (void)check(
        cuda_check(cudaMemcpyAsync(finite, d_finite, size_t(rows), cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpyAsync(finite flags to host)"));
  }
  (void)check(cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(tokens)"));
}

void CudaOps::copy_from_host(const float* src, int64_t n, float* dst) {
  if (failed()) return;
  (void)check(cuda_check(cudaMemcpyAsync(dst, src, size_t(n) * 4, cudaMemcpyHostToDevice, stream_),
                         "cudaMemcpyAsync(from host)"));
  // The host buffer may die right after this call: wait for the copy.
  (void)check(cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(from host)"));
}

// ---- token-wise ops --------------------------------------------------------------------------

void CudaOps::embed(const cpu::LinearWeight& table, int64_t copies, float* x) {
  if (skip()) return;
  if (table.format != cpu::WeightFormat::kBF16) {
    (void)check(unimplemented("CUDA backend: the embedding must be bf16"));
    return;
  }
  cuda::EmbedParams p;
  p.table = weights_.get(static_cast<const uint16_t*>(table.data));
  p.ids = step_->ids;
  p.num_tokens = step_->num_tokens;
  p.vocab = table.out_features;
  p.dim = table.in_features;
  p.copies = copies;
  p.out = x;
  cuda::launch_embed(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_embed"));
}

uint16_t* CudaOps::to_bf16(const float* x, int64_t rows, int64_t cols) {
  uint16_t* out = scratch<uint16_t>(rows * cols);
  if (failed()) return out;
  cuda::F32ToBf16Params p;
  p.x = x;
  p.y = out;
  p.num_rows = rows;
  p.cols = cols;
  p.x_stride = cols;
  p.y_stride = cols;
  cuda::launch_f32_to_bf16(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_f32_to_bf16"));
  return out;
}

Status CudaOps::linear_impl(const float* x, int64_t rows, const cpu::LinearWeight& w, bool quantize,
                            int groups, float* y, bool round, const uint16_t* x_bf16) {
  // round: the GEMM's output rounded to bf16 values in place of a round_bf16 launch (small-M
  // kernels: in the epilogue; cuBLASLt: one pass over the output).
  const cuda::OutType out_type = round ? cuda::OutType::kF32Bf16 : cuda::OutType::kF32;
  if (rows == 0) return ok_status();
  const int64_t K = w.in_features * groups;
  const size_t mark = arena_.mark();
  // A quantized FP8 linear reads x itself (rounded to bf16 as it is quantized): no bf16 copy.
  const bool fp8_from_f32 = x_bf16 == nullptr && w.format == cpu::WeightFormat::kFp8Block &&
                            quantize && reinterpret_cast<uintptr_t>(x) % 16 == 0 && K % 8 == 0;
  const uint16_t* xb = x_bf16 != nullptr ? x_bf16 : fp8_from_f32 ? nullptr : to_bf16(x, rows, K);
  if (failed()) return error_;
  Status st;
  if (w.format == cpu::WeightFormat::kFp8Block) {
    cuda::Fp8LinearParams p;
    p.w.data = weights_.get(static_cast<const uint8_t*>(w.data));
    p.w.scale = weights_.get(w.scale);
    auto it = e8m0_f32_.find(w.scale);
    p.w.scale_f32 = it == e8m0_f32_.end() ? nullptr : it->second;
    p.w.out_features = w.out_features / groups;
    p.w.in_features = w.in_features;
    p.w.num_groups = groups;
    auto tiled = fp8_tiled_.find(w.data);
    p.w.tiled = tiled == fp8_tiled_.end() ? nullptr : tiled->second;
    p.num_tokens = rows;
    p.x.bf16 = xb;
    p.x.f32 = fp8_from_f32 ? x : nullptr;
    p.x.x_row_stride = K;
    p.quantize_activations = quantize;
    p.y = y;
    p.y_type = out_type;
    p.y_row_stride = w.out_features;
    p.pdl = kernel_pdl_;
    p.wgmma = gemm_wgmma_;
    st = gemm_->linear_fp8(p, stream_);
  } else if (w.format == cpu::WeightFormat::kBF16 && groups == 1) {
    cuda::Bf16LinearParams p;
    p.w = weights_.get(static_cast<const uint16_t*>(w.data));
    p.out_features = w.out_features;
    p.in_features = w.in_features;
    p.num_tokens = rows;
    p.x = xb;
    p.x_row_stride = K;
    p.y = y;
    p.y_type = out_type;
    p.y_row_stride = w.out_features;
    auto pad = padded_bf16_.find(w.data);
    float* y_wide = nullptr;  // [rows, padded N] when the weight is padded
    if (pad != padded_bf16_.end()) {
      y_wide = scratch<float>(rows * pad->second.second);
      if (failed()) return error_;
      p.w = pad->second.first;
      p.out_features = pad->second.second;
      p.y = y_wide;
      p.y_row_stride = pad->second.second;
    }
    st = gemm_->linear_bf16(p, stream_);
    if (st.ok() && y_wide != nullptr) {
      st = cuda_check(cudaMemcpy2DAsync(y, size_t(w.out_features) * 4, y_wide,
                                        size_t(p.y_row_stride) * 4, size_t(w.out_features) * 4,
                                        size_t(rows), cudaMemcpyDeviceToDevice, stream_),
                      "cudaMemcpy2DAsync(padded linear)");
    }
  } else {
    st = unimplemented("CUDA backend: no linear for this weight format");
  }
  arena_.release(mark);
  return st;
}

void CudaOps::linear(const float* x, int64_t rows, const cpu::LinearWeight& w,
                     bool quantize_activations, float* y, bool round_output) {
  if (skip()) return;
  (void)check(linear_impl(x, rows, w, quantize_activations, 1, y, round_output));
}

void CudaOps::linear_pair(const float* x, int64_t rows, const cpu::LinearWeight& w0,
                          const cpu::LinearWeight& w1, bool quantize_activations, float* y0,
                          float* y1, bool round_output) {
  if (skip()) return;
  auto it = fused_pairs_.find(w0.data);
  const bool fused = it != fused_pairs_.end() && it->second.second == w1.data &&
                     quantize_activations && rows > 0 && rows <= opt_.fused_pair_max_tokens &&
                     reinterpret_cast<uintptr_t>(x) % 16 == 0 && w0.in_features % 8 == 0;
  if (!fused) {
    Ops::linear_pair(x, rows, w0, w1, quantize_activations, y0, y1, round_output);
    return;
  }
  cuda::Fp8LinearParams p;
  p.w.data = it->second.codes;
  p.w.scale = it->second.scale;
  p.w.scale_f32 = it->second.scale_f32;
  p.w.out_features = w0.out_features + w1.out_features;
  p.w.in_features = w0.in_features;
  p.w.num_groups = 1;
  p.num_tokens = rows;
  p.x.f32 = x;
  p.x.x_row_stride = w0.in_features;
  p.quantize_activations = true;
  p.y = y0;
  p.y_type = round_output ? cuda::OutType::kF32Bf16 : cuda::OutType::kF32;
  p.y_row_stride = w0.out_features;
  p.y2 = y1;
  p.y2_row_stride = w1.out_features;
  p.split_features = w0.out_features;
  p.pdl = kernel_pdl_;
  p.wgmma = gemm_wgmma_;
  (void)check(gemm_->linear_fp8(p, stream_));
}

void CudaOps::grouped_output_projection(const float* o, int64_t groups,
                                        const cpu::LinearWeight& wo_a, float* z,
                                        bool round_output) {
  if (skip()) return;
  // attend's bf16 form of this o, when it made one (inverse_rope_output): no conversion launch.
  const int64_t n = step_->num_tokens * wo_a.in_features * groups;
  const uint16_t* ob = attend_out_.f32 == o && attend_out_.n == n ? attend_out_.bf16 : nullptr;
  attend_out_ = {};
  // §2: wo_a never quantizes its input. wo_a is [groups * o_lora_rank, heads * hd / groups].
  (void)check(linear_impl(o, step_->num_tokens, wo_a, false, int(groups), z, round_output, ob));
}

void CudaOps::rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                       float* y) {
  if (skip() || rows == 0) return;
  cuda::RmsNormParams p;
  p.x = x;
  p.weight = weights_.get(weight);
  p.y = y;
  p.num_rows = rows;
  p.dim = dim;
  p.x_stride = dim;
  p.y_stride = dim;
  p.eps = eps;
  p.round_bf16 = true;  // rounds_elementwise_outputs()
  cuda::launch_rms_norm(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_rms_norm"));
}

void CudaOps::rms_norm_heads(float* x, int64_t rows, int64_t heads, int64_t head_dim, float eps) {
  if (skip() || rows == 0) return;
  cuda::RmsNormHeadsParams p;
  p.x = x;
  p.num_tokens = rows;
  p.num_heads = heads;
  p.head_dim = head_dim;
  p.token_stride = heads * head_dim;
  p.eps = eps;
  p.round_bf16 = true;
  cuda::launch_rms_norm_heads(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_rms_norm_heads"));
}

void CudaOps::rope(float* x, int64_t heads, int64_t head_dim, int64_t rope_dim,
                   const float* inv_freq, cpu::RopeDirection direction) {
  if (skip() || step_->num_tokens == 0) return;
  cuda::launch_rope(rope_params(x, heads, head_dim, rope_dim, inv_freq, direction), stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_rope"));
}

cuda::RopeParams CudaOps::rope_params(float* x, int64_t heads, int64_t head_dim,
                                      int64_t rope_dim, const float* inv_freq,
                                      cpu::RopeDirection direction) const {
  cuda::RopeParams p;
  p.x = x;
  p.inv_freq = weights_.get(inv_freq);
  p.positions = step_->positions;
  p.num_tokens = step_->num_tokens;
  p.num_heads = heads;
  p.head_dim = head_dim;
  p.rope_dim = rope_dim;
  p.token_stride = heads * head_dim;
  p.inverse = direction == cpu::RopeDirection::kInverse;
  p.round_bf16 = true;  // rounds_elementwise_outputs()
  return p;
}

void CudaOps::round_bf16(float* x, int64_t n) {
  if (skip() || n == 0) return;
  cuda::launch_round_bf16(x, n, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_round_bf16"));
}

void CudaOps::simulate_fp8_kv(float* kv, int64_t rows, int64_t head_dim, int64_t rope_dim) {
  if (skip() || rows == 0) return;
  cuda::SimulateFp8KvParams p;
  p.kv = kv;
  p.num_rows = rows;
  p.head_dim = head_dim;
  p.rope_dim = rope_dim;
  p.row_stride = head_dim;
  cuda::launch_simulate_fp8_kv(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_simulate_fp8_kv"));
}

void CudaOps::norm_rope(float* x, const float* weight, int64_t rows, int64_t heads,
                        int64_t head_dim, float eps, int64_t rope_dim, const float* inv_freq,
                        bool simulate_fp8, bool /*round: always, as rms_norm and rope*/) {
  if (skip() || rows == 0) return;
  // The epilogue's RoPE takes a row's position from its token: one weighted vector per token
  // (kv), or the unweighted heads of each token (q).
  if (!cuda::rms_norm_epilogue_supported(head_dim, rope_dim) || rows != step_->num_tokens ||
      (weight != nullptr && heads != 1)) {
    Ops::norm_rope(x, weight, rows, heads, head_dim, eps, rope_dim, inv_freq, simulate_fp8, true);
    return;
  }
  const float* freq = weights_.get(inv_freq);
  if (weight != nullptr) {
    cuda::RmsNormParams p;
    p.x = x;
    p.weight = weights_.get(weight);
    p.y = x;
    p.num_rows = rows * heads;
    p.dim = head_dim;
    p.x_stride = p.y_stride = head_dim;
    p.eps = eps;
    p.round_bf16 = true;  // rounds_elementwise_outputs()
    p.rope_dim = rope_dim;
    p.inv_freq = freq;
    p.positions = step_->positions;
    p.simulate_fp8_kv = simulate_fp8;
    cuda::launch_rms_norm(p, stream_);
    (void)check(cuda_check(cudaGetLastError(), "launch_rms_norm (rope epilogue)"));
    return;
  }
  cuda::RmsNormHeadsParams p;
  p.x = x;
  p.num_tokens = rows;
  p.num_heads = heads;
  p.head_dim = head_dim;
  p.token_stride = heads * head_dim;
  p.eps = eps;
  p.round_bf16 = true;
  p.rope_dim = rope_dim;
  p.inv_freq = freq;
  p.positions = step_->positions;
  p.simulate_fp8_kv = simulate_fp8;
  cuda::launch_rms_norm_heads(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_rms_norm_heads (rope epilogue)"));
}

void CudaOps::indexer_prepare_query(float* q, int64_t heads, int64_t head_dim, int64_t rope_dim,
                                    const float* inv_freq, bool fp4_simulation, bool round) {
  if (skip() || step_->num_tokens == 0) return;
  cuda::IndexerPrepareQueryParams p;
  p.q = q;
  p.positions = step_->positions;
  p.inv_freq = weights_.get(inv_freq);
  p.num_tokens = step_->num_tokens;
  p.num_heads = heads;
  p.head_dim = head_dim;
  p.rope_dim = rope_dim;
  p.token_stride = heads * head_dim;
  p.simulate_fp4 = fp4_simulation;
  p.round_bf16 = round;
  cuda::launch_indexer_prepare_query(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_indexer_prepare_query"));
}

void CudaOps::indexer_scale_weights(float* w, int64_t heads, int64_t head_dim) {
  if (skip() || step_->num_tokens == 0) return;
  cuda::launch_indexer_scale_weights(w, step_->num_tokens, heads, head_dim,
                                     /*round_bf16=*/true, stream_);  // rounds_elementwise_outputs
  (void)check(cuda_check(cudaGetLastError(), "launch_indexer_scale_weights"));
}

void CudaOps::mhc_pre(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                      const float* x, int64_t rows, float* u, float* post, float* comb) {
  launch_mhc_pre_site(config, weights, x, rows, nullptr, 0.0f, u, post, comb);
}

void CudaOps::mhc_pre_norm(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                           const float* x, int64_t rows, const float* norm_weight, float eps,
                           bool /*round: always, as rms_norm and mhc_pre*/, float* u, float* post,
                           float* comb) {
  launch_mhc_pre_site(config, weights, x, rows, norm_weight, eps, u, post, comb);
}

void CudaOps::launch_mhc_pre_site(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                                  const float* x, int64_t rows, const float* norm_weight,
                                  float eps, float* u, float* post, float* comb) {
  if (skip() || rows == 0) return;
  const size_t mark = arena_.mark();
  cuda::MhcPreParams p;
  p.x = x;
  p.fn = weights_.get(weights.fn);
  p.base = weights_.get(weights.base);
  p.scale = weights_.get(weights.scale);
  p.u = u;
  p.post = post;
  p.comb = comb;
  p.workspace = scratch<float>(cuda::mhc_workspace_floats(rows, config.dim));
  p.num_tokens = rows;
  p.dim = config.dim;
  p.sinkhorn_iters = int(config.sinkhorn_iters);
  p.hc_eps = config.hc_eps;
  p.norm_eps = config.norm_eps;
  p.round_bf16 = true;
  if (norm_weight != nullptr) {
    p.rms_weight = weights_.get(norm_weight);
    p.rms_eps = eps;
  }
  if (!failed()) {
    cuda::launch_mhc_pre(p, stream_);
    (void)check(cuda_check(cudaGetLastError(), "launch_mhc_pre"));
  }
  arena_.release(mark);
}

void CudaOps::mhc_post(const cpu::MhcConfig& config, const float* o, const float* x,
                       const float* post, const float* comb, int64_t rows, float* x_new) {
  if (skip() || rows == 0) return;
  cuda::MhcPostParams p;
  p.o = o;
  p.x = x;
  p.post = post;
  p.comb = comb;
  p.x_new = x_new;
  p.num_tokens = rows;
  p.dim = config.dim;
  p.round_bf16 = true;
  cuda::launch_mhc_post(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_mhc_post"));
}

void CudaOps::mhc_head(const cpu::MhcConfig& config, const cpu::MhcHeadWeights& weights,
                       const float* x, int64_t rows, float* y) {
  if (skip() || rows == 0) return;
  const size_t mark = arena_.mark();
  cuda::MhcHeadParams p;
  p.x = x;
  p.fn = weights_.get(weights.fn);
  p.base = weights_.get(weights.base);
  p.scale = weights_.get(weights.scale);
  p.y = y;
  p.workspace = scratch<float>(cuda::mhc_workspace_floats(rows, config.dim));
  p.num_tokens = rows;
  p.dim = config.dim;
  p.hc_eps = config.hc_eps;
  p.norm_eps = config.norm_eps;
  p.round_bf16 = true;
  if (!failed()) {
    cuda::launch_mhc_head(p, stream_);
    (void)check(cuda_check(cudaGetLastError(), "launch_mhc_head"));
  }
  arena_.release(mark);
}

void CudaOps::moe(const dsv4::MoeSite& site, const float* x, float* y) {
  if (skip() || step_->num_tokens == 0) return;
  auto it = moe_layers_.find(site.experts);
  if (it == moe_layers_.end()) {
    (void)check(internal_error("CUDA backend: MoE site of an unknown layer"));
    return;
  }
  const size_t mark = arena_.mark();
  void* ws = scratch<uint8_t>(int64_t(moe_workspace_bytes_));
  if (!failed()) {
    (void)check(cuda::MoeRunner::forward(*it->second, x, step_->ids, step_->num_tokens, y, ws,
                                         stream_, moe_tuning_));
  }
  arena_.release(mark);
}

Status CudaOps::build_moe_layers() {
  auto lin = [&](cpu::LinearWeight w) {
    w.data = weights_.find(w.data);
    w.scale = static_cast<const uint8_t*>(weights_.find(w.scale));
    return w;
  };
  auto build = [&](const dsv4::LayerWeights& L) -> Status {
    dsv4::MoeSite site = dsv4::moe_site(model_, L, fwd_);
    // The experts outside the rank's range stay empty (MoeDeviceLayer reads only the range).
    std::vector<cpu::ExpertWeights> experts(L.experts.size());
    const auto [first, last] = expert_range(L);
    for (int64_t e = first; e < last; ++e) {
      const cpu::ExpertWeights& w = L.experts[size_t(e)];
      experts[size_t(e)] = {lin(w.w1), lin(w.w2), lin(w.w3)};
    }
    dsv4::MoeSite dev = site;
    dev.router.gate = lin(site.router.gate);
    dev.router.bias = weights_.get(site.router.bias);
    dev.router.tid2eid = weights_.get(site.router.tid2eid);
    dev.experts = experts.data();
    dev.shared = {lin(site.shared.w1), lin(site.shared.w2), lin(site.shared.w3)};
    DS_ASSIGN_OR_RETURN(cuda::MoeDeviceLayer layer, cuda::MoeDeviceLayer::create(dev));
    // Scale codes the FP8 path's or the wgmma prefill kernel's exponent folding cannot hold fall
    // back to slower variants (a host pass over the layer's MXFP4 scales, 1/32 of its expert
    // bytes).
    if (layer.fp8_mma || layer.pf_wgmma) {
      layer.limit_to_scale_code(cuda::max_mxfp4_scale_code(
          L.experts.data(), first, last, site.add_shared ? &site.shared : nullptr));
    }
    auto owned = std::make_unique<cuda::MoeDeviceLayer>(std::move(layer));
    moe_workspace_bytes_ = std::max(moe_workspace_bytes_,
                                    cuda::MoeRunner::workspace_bytes(opt_.max_step_tokens, *owned));
    moe_layers_[site.experts] = std::move(owned);
    return ok_status();
  };
  for (const dsv4::LayerWeights& L : model_.layers) DS_RETURN_IF_ERROR(build(L));
  for (const dsv4::MtpWeights& M : model_.mtp) DS_RETURN_IF_ERROR(build(M.block));
  return ok_status();
}

void CudaOps::add_broadcast(const float* e, const float* h, int64_t hc, int64_t dim, float* x) {
  if (skip() || step_->num_tokens == 0) return;
  cuda::AddBroadcastParams p;
  p.e = e;
  p.h = h;
  p.x = x;
  p.num_tokens = step_->num_tokens;
  p.hc = hc;
  p.dim = dim;
  cuda::launch_add_broadcast(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_add_broadcast"));
}

void CudaOps::gather_rows(const float* x, int64_t width, const std::vector<int64_t>& rows,
                          float* out) {
  if (skip() || rows.empty()) return;
  // Rows 0..n-1 (a decode step's logits rows) come from the step's index array: no upload, so
  // the launch can be captured.
  bool identity = int64_t(rows.size()) <= step_->num_tokens;
  for (size_t r = 0; identity && r < rows.size(); ++r) identity = rows[r] == int64_t(r);
  const int64_t* d_rows = identity ? step_->iota : upload(rows);
  if (skip()) return;
  cuda::GatherRowsParams p;
  p.x = x;
  p.rows = d_rows;
  p.out = out;
  p.num_rows = int64_t(rows.size());
  p.num_x_rows = *std::max_element(rows.begin(), rows.end()) + 1;
  p.width = width;
  cuda::launch_gather_rows(p, stream_);
  (void)check(cuda_check(cudaGetLastError(), "launch_gather_rows"));
}

void CudaOps::all_reduce_sum(float* x, int64_t n) {
  // One rank (no communicator) already holds the whole sum. The NCCL call is stream ordered and
  // capturable, so decode-step graphs hold it like any launch (and replay skips it here).
  if (comm_ == nullptr || skip() || n == 0) return;
  (void)check(comm_->all_reduce_sum(x, n, stream_));
}

// ---- per-sequence state ----------------------------------------------------------------------

void CudaOps::compress(int64_t slot, const dsv4::CompressorWeights& cw, cpu::CompressorKind kind,
                       const cpu::CompressorFinishParams& finish, const float* h) {
  if (skip() || step_->num_tokens == 0) return;
  const int64_t N = step_->num_tokens, width = cw.config.width();
  const size_t mark = arena_.mark();
  float* ckv = scratch<float>(N * width);
  float* cscore = scratch<float>(N * width);
  if (skip()) return;
  // Both projections read the same bf16 copy of h (one conversion launch, not two).
  const uint16_t* hb =
      cw.wgate.in_features == cw.wkv.in_features ? to_bf16(h, N, cw.wkv.in_features) : nullptr;
  if (skip()) return;
  if (!check(linear_impl(h, N, cw.wkv, false, 1, ckv, false, hb)).ok()) return;
  if (!check(linear_impl(h, N, cw.wgate, false, 1, cscore, false, hb)).ok()) return;
  compress_rows(slot, cw, kind, finish, ckv, cscore, width);
  arena_.release(mark);
}

void CudaOps::compress_layer(int64_t slot, const dsv4::CompressorWeights* indexer,
                             const cpu::CompressorFinishParams* indexer_finish,
                             const dsv4::CompressorWeights& attention,
                             const cpu::CompressorFinishParams& attention_finish, const float* h) {
  if (skip() || step_->num_tokens == 0) return;
  const int64_t N = step_->num_tokens;
  auto it = fused_compress_.find(attention.wkv.data);
  const bool fused = it != fused_compress_.end() && N <= opt_.fused_compress_max_tokens &&
                     it->second.indexer == (indexer != nullptr ? indexer->wkv.data : nullptr);
  if (!fused) {
    Ops::compress_layer(slot, indexer, indexer_finish, attention, attention_finish, h);
    return;
  }
  // One GEMM: y [N, rows] holds [indexer kv | indexer score |] kv | score side by side.
  const FusedCompress& fc = it->second;
  const size_t mark = arena_.mark();
  float* y = scratch<float>(N * fc.rows);
  if (skip()) return;
  const int64_t hidden = attention.wkv.in_features;
  const uint16_t* hb = to_bf16(h, N, hidden);
  if (skip()) return;
  cuda::Bf16LinearParams p;
  p.w = fc.w;
  p.out_features = fc.rows;
  p.in_features = hidden;
  p.num_tokens = N;
  p.x = hb;
  p.x_row_stride = hidden;
  p.y = y;
  p.y_type = cuda::OutType::kF32;
  p.y_row_stride = fc.rows;
  if (!check(gemm_->linear_bf16(p, stream_)).ok()) return;
  int64_t col = 0;
  if (indexer != nullptr) {
    const int64_t w = indexer->config.width();
    compress_rows(slot, *indexer, cpu::CompressorKind::kIndexer, *indexer_finish, y, y + w,
                  fc.rows);
    col = 2 * w;
  }
  compress_rows(slot, attention, cpu::CompressorKind::kAttention, attention_finish, y + col,
                y + col + attention.config.width(), fc.rows);
  arena_.release(mark);
}

void CudaOps::compress_rows(int64_t slot, const dsv4::CompressorWeights& cw,
                            cpu::CompressorKind kind, const cpu::CompressorFinishParams& finish,
                            const float* ckv, const float* cscore, int64_t row_stride) {
  if (skip()) return;
  const StepData& st = *step_;
  const int64_t ratio = cw.config.ratio, width = cw.config.width();
  const int64_t d = cw.config.head_dim;
  const bool indexer = kind == cpu::CompressorKind::kIndexer;
  const LayerStore& ls = layers_[size_t(layer_index(slot))];
  const size_t mark = arena_.mark();
  if (st.any_log) {
    // Speculative checkpoint: keep this step's projected rows of the logging sequences.
    float* log = indexer ? ls.index_log : ls.log;
    const int64_t log_floats = indexer ? ls.index_log_floats : ls.log_floats;
    const int64_t T = opt_.max_checkpoint_tokens;
    std::vector<cuda::CopySegment> segs;
    for (int64_t i = 0; i < st.num_seqs; ++i) {
      const int64_t row = st.log_row[size_t(i)];
      if (row < 0) continue;
      const StepPlan::Seq& s = plan_->seqs[size_t(i)];
      float* dst = log + int64_t(st.slots[size_t(i)]) * log_floats;
      if (row_stride == width) {
        segs.push_back({ckv + s.begin * width, dst + row * width, s.count * width});
        segs.push_back({cscore + s.begin * width, dst + (T + row) * width, s.count * width});
        continue;
      }
      for (int64_t r = 0; r < s.count; ++r) {  // rows of the fused projection: one per segment
        segs.push_back({ckv + (s.begin + r) * row_stride, dst + (row + r) * width, width});
        segs.push_back(
            {cscore + (s.begin + r) * row_stride, dst + (T + row + r) * width, width});
      }
    }
    if (!check(copy_segments(segs)).ok()) return;
  }
  const StepData::Emitted& em = ratio == 4 ? st.emitted4 : st.emitted128;
  float* entries = scratch<float>(std::max<int64_t>(em.rows, 1) * d);
  if (skip()) return;
  cuda::CompressorParams p;
  p.kv = ckv;
  p.score = cscore;
  p.row_stride = row_stride;
  p.ape = weights_.get(cw.ape);
  p.seqs = indexer ? st.index_seqs[size_t(slot)] : st.comp_seqs[size_t(slot)];
  p.num_seqs = st.num_seqs;
  p.max_count = st.max_count;
  p.ratio = ratio;
  p.head_dim = d;
  p.rope_dim = cw.config.rope_dim;
  p.entries = entries;
  p.finish = true;
  p.kind = indexer ? cuda::CompressorEntryKind::kIndexer : cuda::CompressorEntryKind::kAttention;
  p.norm_weight = weights_.get(finish.norm_weight);
  p.inv_freq = weights_.get(finish.inv_freq);
  p.norm_eps = finish.norm_eps;
  p.simulate_quantization = finish.simulate_quantization;
  p.round_bf16 = finish.round_bf16;
  cuda::launch_compressor(p, stream_);
  if (!check(cuda_check(cudaGetLastError(), "launch_compressor")).ok()) return;
  if (em.rows > 0) {
    if (indexer) {
      cuda::IndexKeySource keys;
      keys.pool = ls.index_keys;
      keys.page_table = page_table_.as<int32_t>();
      keys.page_table_stride = int32_t(pages_per_seq_);
      keys.page_size = int32_t(kPageTokens / 4);
      keys.page_bytes = ls.index_page_bytes;
      cuda::PackIndexKeysParams pk;
      pk.keys = entries;
      pk.seq = em.slot;
      pk.index = em.index;
      pk.num_rows = int32_t(em.rows);
      pk.dst = keys;
      (void)check(cuda::launch_pack_index_keys(pk, stream_));
    } else {
      (void)check(pack_kv(entries, em.rows, em.slot, em.index, ls.compressed,
                          page_table_.as<int32_t>(), pages_per_seq_, ls.compressed_page_size,
                          ls.compressed_page_bytes, "launch_pack_kv_entries(compressed)"));
    }
  }
  arena_.release(mark);
}

Status CudaOps::pack_kv(const float* rows, int64_t num_rows, const int32_t* row_slot,
                        const int32_t* row_index, uint8_t* pool, const int32_t* page_table,
                        int64_t stride, int64_t page_size, int64_t page_bytes, const char* what) {
  cuda::PackKvEntriesParams pk;
  pk.kv = rows;
  pk.num_rows = num_rows;
  pk.head_dim = config_.head_dim;
  pk.kv_stride = config_.head_dim;
  pk.row_seq = row_slot;
  pk.row_index = row_index;
  pk.pool = pool;
  pk.page_table = page_table;
  pk.page_table_stride = stride;
  pk.page_size = page_size;
  pk.page_bytes = page_bytes;
  cuda::launch_pack_kv_entries(pk, stream_);
  return cuda_check(cudaGetLastError(), what);
}

void CudaOps::indexer_select(int64_t slot, const float* q_index, const float* w_index,
                             int32_t* selected) {
  if (skip() || step_->num_tokens == 0) return;
  const DeepSeekV4Config& c = config_;
  const StepData& st = *step_;
  const LayerStore& ls = layers_[size_t(layer_index(slot))];
  const size_t mark = arena_.mark();
  cuda::IndexerSelectParams p;
  p.q = q_index;
  p.weights = w_index;
  p.query_seq = st.query_slot;
  p.visible = st.visible4;
  p.num_queries = int32_t(st.num_tokens);
  p.num_heads = int32_t(c.index_n_heads);
  p.head_dim = int32_t(c.index_head_dim);
  p.topk = int32_t(c.index_topk);
  p.keys.pool = ls.index_keys;
  p.keys.page_table = page_table_.as<int32_t>();
  p.keys.page_table_stride = int32_t(pages_per_seq_);
  p.keys.page_size = int32_t(kPageTokens / 4);
  p.keys.page_bytes = ls.index_page_bytes;
  p.selected = selected;
  p.plan = cuda::plan_indexer_select(int32_t(st.num_tokens), int32_t(ls.compressed_cap),
                                     int32_t(c.index_topk), num_sms_);
  const size_t ws = cuda::indexer_workspace_bytes(p.plan);
  p.workspace = scratch<uint8_t>(int64_t(ws));
  p.workspace_bytes = ws;
  p.merge_counters = indexer_counters_.as<uint32_t>();  // nullptr when switched off
  if (!failed()) (void)check(cuda::launch_indexer_select(p, stream_));
  arena_.release(mark);
}

void CudaOps::attend(const dsv4::AttendParams& params, const float* q, const float* kv,
                     const int32_t* selected, float* o) {
  if (skip() || step_->num_tokens == 0) return;
  const DeepSeekV4Config& c = config_;
  const StepData& st = *step_;
  const dsv4::LayerWeights& L = *params.layer;
  const LayerStore& ls = layers_[size_t(layer_index(params.layer_slot))];
  const int64_t N = st.num_tokens, H = c.num_attention_heads, hd = c.head_dim;
  attend_out_ = {};
  // With inverse_rope_output the bf16 output outlives this call (grouped_output_projection reads
  // it): taken before the mark, it goes when the forward's attention scope releases.
  uint16_t* ob = params.inverse_rope_output ? scratch<uint16_t>(N * H * hd) : nullptr;
  const size_t mark = arena_.mark();

  // The step's kv vectors join the window rings first: the ring has room for a whole chunk on
  // top of the window (cuda_ops.h), so no key a query of this step needs is overwritten.
  if (!check(pack_kv(kv, N, st.query_slot, st.kv_row_index, ls.window, slot_ids_.as<int32_t>(), 1,
                     window_slots_, ls.window_page_bytes, "launch_pack_kv_entries(window)"))
           .ok()) {
    return;
  }

  uint16_t* qb = to_bf16(q, N * H, hd);
  if (ob == nullptr) ob = scratch<uint16_t>(N * H * hd);
  if (skip()) return;
  cuda::SparseMlaParams p;
  p.q = qb;
  p.sink = weights_.get(L.attn_sink);
  p.out = ob;
  p.num_queries = int32_t(N);
  p.num_heads = int32_t(H);
  p.head_dim = int32_t(hd);
  p.softmax_scale = params.softmax_scale;
  p.query_seq = st.query_slot;
  p.window.pool = ls.window;
  p.window.page_table = slot_ids_.as<int32_t>();
  p.window.page_table_stride = 1;
  p.window.page_size = int32_t(window_slots_);
  p.window.page_bytes = ls.window_page_bytes;
  p.window_idx = st.window_idx;
  p.window_len = st.window_len;
  p.window_width = int32_t(c.sliding_window);
  if (ls.ratio != 0) {
    p.compressed.pool = ls.compressed;
    p.compressed.page_table = page_table_.as<int32_t>();
    p.compressed.page_table_stride = int32_t(pages_per_seq_);
    p.compressed.page_size = int32_t(ls.compressed_page_size);
    p.compressed.page_bytes = ls.compressed_page_bytes;
    if (ls.csa) {
      p.compressed_idx = selected;
      p.compressed_len = st.topk_len;
      p.compressed_width = int32_t(c.index_topk);
    } else {
      p.compressed_idx = st.hca_idx;
      p.compressed_len = st.hca_len;
      p.compressed_width = st.hca_width;
    }
  }
  p.plan = cuda::plan_sparse_mla_decode(
      p.num_queries, p.num_heads, p.window_width, p.compressed_width, num_sms_, 0,
      sparse_mla_wgmma_ && cuda::sparse_mla_wgmma_preferred(p.num_queries, p.num_heads));
  p.workspace_bytes =
      cuda::sparse_mla_workspace_bytes(p.plan, p.num_queries, p.num_heads, p.head_dim);
  p.workspace = scratch<float>(int64_t(p.workspace_bytes / 4 + 1));
  p.pdl = kernel_pdl_;
  if (skip()) return;
  if (!check(cuda::launch_sparse_mla_decode(p, stream_)).ok()) return;
  const cuda::RopeParams rp = rope_params(o, H, hd, c.qk_rope_head_dim, L.inv_freq.data(),
                                          cpu::RopeDirection::kInverse);
  if (params.inverse_rope_output && cuda::rope_bf16_supported(rp, ob, ob)) {
    // One kernel: o = inverse RoPE of the bf16 output, and its bf16 bits in place for wo_a.
    cuda::launch_rope_bf16(rp, ob, ob, stream_);
    if (check(cuda_check(cudaGetLastError(), "launch_rope_bf16")).ok())
      attend_out_ = {o, ob, N * H * hd};
  } else {
    cuda::launch_bf16_to_f32(ob, N * H * hd, o, stream_);
    if (params.inverse_rope_output) cuda::launch_rope(rp, stream_);
    (void)check(cuda_check(cudaGetLastError(), "launch_bf16_to_f32 / launch_rope"));
  }
  arena_.release(mark);
}

void CudaOps::store_window(int64_t slot, const float* kv, int64_t head_dim) {
  // Done by attend(): the ring already holds this step's kv vectors.
}

}  // namespace ds::runtime
