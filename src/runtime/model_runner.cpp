// ModelRunner (see model_runner.h): the one-rank runner and the tensor/expert-parallel runner
// with one thread per rank.
#include "runtime/model_runner.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "model/deepseek_v4/forwarding_ops.h"
#include "model/deepseek_v4/sharding.h"
#include "runtime/host_communicator.h"

#if DS_HAVE_CUDA_BACKEND
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_ops.h"
#include "runtime/cuda/nccl_communicator.h"
#endif

namespace ds::runtime {
namespace {

using dsv4::ChunkOutput;
using dsv4::ForwardOptions;
using dsv4::ModelWeights;
using dsv4::MtpChunk;
using dsv4::Ops;
using dsv4::SequenceChunk;
using dsv4::SequenceState;

// ---- One rank ----------------------------------------------------------------------------------

class LocalRunner final : public ModelRunner {
 public:
  LocalRunner(const ModelWeights& weights, const ForwardOptions& options,
              std::unique_ptr<Ops> backend, Ops* ops)
      : backend_(std::move(backend)), forward_(&weights, options, ops) {}

  int world_size() const override { return 1; }
  const DeepSeekV4Config& config() const override { return forward_.config(); }
  SequenceState new_sequence() const override { return forward_.new_sequence(); }
  Status run(std::span<SequenceChunk> batch, std::vector<ChunkOutput>* outputs,
             bool want_streams) override {
    return forward_.run(batch, outputs, want_streams);
  }
  Status run_mtp(std::span<MtpChunk> batch, std::vector<ChunkOutput>* outputs,
                 bool want_streams) override {
    return forward_.run_mtp(batch, outputs, want_streams);
  }
  Status checkpoint(SequenceState* state, bool mtp, int64_t max_tokens) override {
    return forward_.checkpoint(state, mtp, max_tokens);
  }
  Status rollback(SequenceState* state, bool mtp, int64_t to_position) override {
    return forward_.rollback(state, mtp, to_position);
  }
  void release_sequence(const SequenceState* state) override {
    forward_.ops()->release_sequence(state);
  }
  std::optional<DeviceKvCapacity> kv_capacity() const override {
    return device_kv_capacity(*backend_);
  }
  bool prefers_backend_sampling() const override {
    return forward_.ops()->prefers_backend_sampling();
  }
  std::string describe() const override { return describe_backend(*backend_); }

 private:
  std::unique_ptr<Ops> backend_;  // outlives forward_
  dsv4::Forward forward_;
};

// ---- Rank threads ------------------------------------------------------------------------------

// One thread per rank running the same job on every rank at once (a CUDA rank's thread keeps its
// device current for its whole life).
class RankThreads {
 public:
  // grace: how long the other ranks may take to finish a call after one rank failed (a rank that
  // failed stops calling the collectives, and the others would wait for it forever).
  RankThreads(int world, double grace_s)
      : grace_(std::chrono::duration<double>(grace_s)), results_(size_t(world)) {
    for (int r = 0; r < world; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  // Runs job(rank) on every rank and returns each rank's status. When a rank fails and the
  // others have not finished the grace period later, on_stuck() is called (once) to release them.
  std::vector<Status> run(const std::function<Status(int)>& job,
                          const std::function<void()>& on_stuck) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &job;
    done_ = 0;
    failed_ = 0;
    ++generation_;
    start_cv_.notify_all();
    const int world = int(threads_.size());
    done_cv_.wait(lock, [&] { return done_ == world || failed_ > 0; });
    if (done_ < world &&
        !done_cv_.wait_for(lock, grace_, [&] { return done_ == world; })) {
      lock.unlock();
      on_stuck();
      lock.lock();
      done_cv_.wait(lock, [&] { return done_ == world; });
    }
    job_ = nullptr;
    return results_;
  }
  // The rank whose failure the last run() saw first (the cause; the others may be its
  // consequence, e.g. an aborted all-reduce). -1 when every rank succeeded.
  int first_failed() const { return failed_ > 0 ? first_failed_ : -1; }

 private:
  void loop(int rank) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<Status(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      Status st = (*job)(rank);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!st.ok() && failed_++ == 0) first_failed_ = rank;
        results_[size_t(rank)] = std::move(st);
        ++done_;
      }
      done_cv_.notify_all();
    }
  }

  const std::chrono::duration<double> grace_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  std::vector<std::thread> threads_;
  const std::function<Status(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int done_ = 0, failed_ = 0, first_failed_ = -1;
  bool stop_ = false;
  std::vector<Status> results_;
};

// A CPU rank's link to the others: the forward's all-reduces go through host memory.
class HostReduceOps final : public dsv4::ForwardingOps {
 public:
  HostReduceOps(Ops* inner, HostCommunicator* comm, int rank)
      : ForwardingOps(inner), comm_(comm), rank_(rank) {}
  void begin_step(const dsv4::StepPlan& plan) override {
    failed_ = false;
    ForwardingOps::begin_step(plan);
  }
  void all_reduce_sum(float* x, int64_t n) override {
    if (!comm_->all_reduce_sum(rank_, x, n)) failed_ = true;
  }
  Status step_status() const override {
    if (failed_) return failed_precondition("all-reduce aborted: another rank failed");
    return ForwardingOps::step_status();
  }

 private:
  HostCommunicator* comm_;
  int rank_;
  bool failed_ = false;
};

// ---- Tensor/expert parallel --------------------------------------------------------------------

class ShardedRunner final : public ModelRunner {
 public:
  ShardedRunner(const ModelWeights& full, std::string device, const ParallelConfig& parallel)
      : full_(full), device_(std::move(device)), parallel_(parallel),
        world_(parallel.tensor_parallel_size), ranks_(size_t(world_)),
        scratch_(size_t(world_)) {}

  ~ShardedRunner() override {
    // Each rank's backend is torn down on its own thread (its device current), before the
    // communicators its captured graphs refer to.
    if (threads_) {
      std::function<Status(int)> drop = [this](int r) {
        ranks_[size_t(r)] = Rank{};
        return ok_status();
      };
      threads_->run(drop, [] {});
    }
#if DS_HAVE_CUDA_BACKEND
    comms_.clear();
#endif
    threads_.reset();
  }

  Status init(const ForwardOptions& options, const BackendLimits& limits,
              const RankOpsWrapper& wrap) {
    for (int r = 0; r < world_; ++r) {
      dsv4::ShardSpec spec;
      spec.world_size = world_;
      spec.rank = r;
      spec.tensor_parallel = true;
      spec.expert_parallel = parallel_.expert_parallel;
      // The CUDA MoE kernels run the shared expert as one more expert of the routed experts'
      // width, so on GPUs it stays whole, on rank 0 (a rank-0 surplus of one expert's bytes per
      // layer); CPU ranks split it.
      spec.split_shared_expert = device_ != "cuda";
      DS_ASSIGN_OR_RETURN(ranks_[size_t(r)].weights, dsv4::shard_model(full_, spec));
    }
    const bool cuda = device_ == "cuda";
#if DS_HAVE_CUDA_BACKEND
    if (cuda) {
      std::vector<int> devices(static_cast<size_t>(world_));
      for (int r = 0; r < world_; ++r) devices[size_t(r)] = r;
      DS_ASSIGN_OR_RETURN(comms_, NcclCommunicator::create_local(devices));
    }
#endif
    if (!cuda) host_ = std::make_unique<HostCommunicator>(world_);
    threads_ = std::make_unique<RankThreads>(world_, parallel_.failure_grace_s);
    std::function<Status(int)> create = [&](int r) -> Status {
      Rank& rank = ranks_[size_t(r)];
      BackendLimits rank_limits = limits;
      rank_limits.device_index = r;
      DS_ASSIGN_OR_RETURN(rank.backend, make_backend(device_, *rank.weights, options, rank_limits));
      Ops* ops = rank.backend.get();
#if DS_HAVE_CUDA_BACKEND
      if (cuda) static_cast<CudaOps*>(ops)->set_communicator(comms_[size_t(r)].get());
#endif
      if (!cuda) {
        rank.link = std::make_unique<HostReduceOps>(ops, host_.get(), r);
        ops = rank.link.get();
      }
      if (wrap) {
        if (Ops* wrapped = wrap(r, ops)) ops = wrapped;
      }
      rank.forward = std::make_unique<dsv4::Forward>(rank.weights.get(), options, ops);
      rank.capacity = device_kv_capacity(*rank.backend);
      rank.description = describe_backend(*rank.backend);
      return ok_status();
    };
    // Creation has no collectives: every rank's error is reported as is.
    const std::vector<Status> created = threads_->run(create, [] {});
    for (int r = 0; r < world_; ++r) {
      if (!created[size_t(r)].ok()) {
        return created[size_t(r)].with_context("tensor-parallel rank " + std::to_string(r));
      }
    }
    return ok_status();
  }

  int world_size() const override { return world_; }
  const DeepSeekV4Config& config() const override { return full_.config(); }
  SequenceState new_sequence() const override { return ranks_[0].forward->new_sequence(); }
  bool prefers_backend_sampling() const override {
    return ranks_[0].forward->ops()->prefers_backend_sampling();
  }

  Status run(std::span<SequenceChunk> batch, std::vector<ChunkOutput>* outputs,
             bool want_streams) override {
    DS_RETURN_IF_ERROR(broken_);
    std::vector<std::vector<SequenceChunk>> per_rank;
    DS_RETURN_IF_ERROR(rank_batches(batch, &per_rank));
    return on_ranks([&](int r) {
      if (r == 0) return ranks_[0].forward->run(batch, outputs, want_streams);
      return ranks_[size_t(r)].forward->run(std::span<SequenceChunk>(per_rank[size_t(r)]),
                                            &scratch_[size_t(r)], want_streams);
    });
  }

  Status run_mtp(std::span<MtpChunk> batch, std::vector<ChunkOutput>* outputs,
                 bool want_streams) override {
    DS_RETURN_IF_ERROR(broken_);
    std::vector<std::vector<MtpChunk>> per_rank;
    DS_RETURN_IF_ERROR(rank_batches(batch, &per_rank));
    return on_ranks([&](int r) {
      if (r == 0) return ranks_[0].forward->run_mtp(batch, outputs, want_streams);
      return ranks_[size_t(r)].forward->run_mtp(std::span<MtpChunk>(per_rank[size_t(r)]),
                                                &scratch_[size_t(r)], want_streams);
    });
  }

  Status checkpoint(SequenceState* state, bool mtp, int64_t max_tokens) override {
    DS_RETURN_IF_ERROR(broken_);
    std::vector<SequenceState*> states;
    DS_RETURN_IF_ERROR(rank_states(state, &states));
    return on_ranks([&](int r) {
      return ranks_[size_t(r)].forward->checkpoint(states[size_t(r)], mtp, max_tokens);
    });
  }

  Status rollback(SequenceState* state, bool mtp, int64_t to_position) override {
    DS_RETURN_IF_ERROR(broken_);
    std::vector<SequenceState*> states;
    DS_RETURN_IF_ERROR(rank_states(state, &states));
    return on_ranks([&](int r) {
      return ranks_[size_t(r)].forward->rollback(states[size_t(r)], mtp, to_position);
    });
  }

  void release_sequence(const SequenceState* state) override {
    auto it = replicas_.find(state);
    if (broken_.ok()) {
      (void)on_ranks([&](int r) {
        const SequenceState* s = state;
        if (r > 0) {
          if (it == replicas_.end()) return ok_status();
          s = &it->second[size_t(r - 1)];
        }
        ranks_[size_t(r)].forward->ops()->release_sequence(s);
        return ok_status();
      });
    }
    if (it != replicas_.end()) replicas_.erase(it);
  }

  std::optional<DeviceKvCapacity> kv_capacity() const override {
    std::optional<DeviceKvCapacity> cap = ranks_[0].capacity;
    for (const Rank& rank : ranks_) {
      if (!cap || !rank.capacity) return std::nullopt;
      cap->slots = std::min(cap->slots, rank.capacity->slots);
      cap->pages = std::min(cap->pages, rank.capacity->pages);
      cap->max_context = std::min(cap->max_context, rank.capacity->max_context);
    }
    return cap;
  }

  std::string describe() const override {
    std::string s = device_ + " x" + std::to_string(world_) + " (tensor parallel" +
                    (parallel_.expert_parallel ? ", expert parallel" : "") + ")";
    for (int r = 0; r < world_; ++r) {
      s += "; rank " + std::to_string(r) + ": " + ranks_[size_t(r)].description;
    }
    return s;
  }

 private:
  struct Rank {
    std::unique_ptr<ModelWeights> weights;
    std::unique_ptr<Ops> backend;
    std::unique_ptr<Ops> link;  // CPU ranks: the host all-reduce around the backend
    std::unique_ptr<dsv4::Forward> forward;
    std::optional<DeviceKvCapacity> capacity;
    std::string description;
  };

  // Rank r's (r >= 1) state of the sequence whose rank-0 state is `state`: created on first use,
  // and created afresh when the caller restarted the sequence (rank 0 at position 0). Its
  // positions must match rank 0's.
  Result<SequenceState*> replica(SequenceState* state, int r) {
    if (state == nullptr) return invalid_argument("null sequence state");
    auto it = replicas_.find(state);
    if (it == replicas_.end()) {
      std::vector<SequenceState> states;
      for (int q = 1; q < world_; ++q) states.push_back(ranks_[size_t(q)].forward->new_sequence());
      it = replicas_.emplace(state, std::move(states)).first;
    }
    SequenceState& s = it->second[size_t(r - 1)];
    if (state->position() == 0 && state->mtp_position() == 0 &&
        (s.position() != 0 || s.mtp_position() != 0)) {
      s = ranks_[size_t(r)].forward->new_sequence();
    }
    if (s.position() != state->position() || s.mtp_position() != state->mtp_position()) {
      return internal_error("tensor-parallel rank " + std::to_string(r) +
                            "'s sequence state is at position " + std::to_string(s.position()) +
                            ", rank 0's at " + std::to_string(state->position()));
    }
    return &s;
  }

  // The batch as ranks >= 1 see it: the same chunks over their own states (rank 0's entry,
  // unused, stays empty). Chunk is SequenceChunk or MtpChunk.
  template <typename Chunk>
  Status rank_batches(std::span<Chunk> batch, std::vector<std::vector<Chunk>>* out) {
    out->assign(size_t(world_), {});
    for (int r = 1; r < world_; ++r) {
      std::vector<Chunk>& chunks = (*out)[size_t(r)];
      chunks.assign(batch.begin(), batch.end());
      for (Chunk& c : chunks) {
        DS_ASSIGN_OR_RETURN(c.state, replica(c.state, r));
      }
    }
    return ok_status();
  }

  Status rank_states(SequenceState* state, std::vector<SequenceState*>* out) {
    out->assign(size_t(world_), state);
    for (int r = 1; r < world_; ++r) {
      DS_ASSIGN_OR_RETURN((*out)[size_t(r)], replica(state, r));
    }
    return ok_status();
  }

  // Runs `job` on every rank; see model_runner.h for what a failure does.
  Status on_ranks(const std::function<Status(int)>& job) {
    bool aborted = false;
    const std::vector<Status> st = threads_->run(job, [&] {
      aborted = true;
      abort_links();
    });
    const int failed_rank = threads_->first_failed();
    if (failed_rank < 0) return ok_status();
    const Status& first = st[size_t(failed_rank)];
    bool all_alike = true;
    for (const Status& s : st) all_alike = all_alike && s.code() == first.code();
    if (all_alike && !aborted) return first;
    // The ranks disagree: their states may differ, and a collective may be left half done.
    if (!aborted) abort_links();
    broken_ = failed_precondition("the tensor-parallel group failed (rank " +
                                  std::to_string(failed_rank) + ": " + first.message() +
                                  "); restart the server");
    return broken_;
  }

  void abort_links() {
    if (host_) host_->abort();
#if DS_HAVE_CUDA_BACKEND
    for (auto& c : comms_) c->abort();
#endif
  }

  const ModelWeights& full_;
  const std::string device_;
  const ParallelConfig parallel_;
  const int world_;
  std::vector<Rank> ranks_;
  std::vector<std::vector<ChunkOutput>> scratch_;  // outputs of ranks >= 1 (discarded)
  std::unordered_map<const SequenceState*, std::vector<SequenceState>> replicas_;
  std::unique_ptr<HostCommunicator> host_;
#if DS_HAVE_CUDA_BACKEND
  std::vector<std::unique_ptr<NcclCommunicator>> comms_;
#endif
  std::unique_ptr<RankThreads> threads_;  // stopped last (the destructor orders the teardown)
  Status broken_;
};

}  // namespace

Result<std::unique_ptr<ModelRunner>> make_model_runner(const std::string& device,
                                                       const dsv4::ModelWeights& weights,
                                                       const dsv4::ForwardOptions& options,
                                                       const BackendLimits& limits,
                                                       const ParallelConfig& parallel,
                                                       RankOpsWrapper wrap) {
  const int world = parallel.tensor_parallel_size;
  if (world < 1 || world > 64) {
    return invalid_argument("--tensor-parallel-size must be in [1, 64], got " +
                            std::to_string(world));
  }
  if (world == 1) {
    DS_ASSIGN_OR_RETURN(std::unique_ptr<Ops> backend,
                        make_backend(device, weights, options, limits));
    Ops* ops = backend.get();
    if (wrap) {
      if (Ops* wrapped = wrap(0, ops)) ops = wrapped;
    }
    return std::unique_ptr<ModelRunner>(
        std::make_unique<LocalRunner>(weights, options, std::move(backend), ops));
  }
  if (device != "cpu" && device != "cuda") {
    return invalid_argument("unknown device \"" + device + "\" (expected cpu or cuda)");
  }
  {
    dsv4::ShardSpec spec;
    spec.world_size = world;
    spec.expert_parallel = parallel.expert_parallel;
    const Status shardable = dsv4::check_shardable(weights.config(), spec);
    if (!shardable.ok()) {
      return shardable.with_context("--tensor-parallel-size " + std::to_string(world));
    }
  }
  if (device == "cuda") {
#if DS_HAVE_CUDA_BACKEND
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) {
      (void)cudaGetLastError();
      gpus = 0;
    }
    if (gpus < world) {
      return invalid_argument("--tensor-parallel-size " + std::to_string(world) + " needs " +
                              std::to_string(world) + " GPUs; " + std::to_string(gpus) +
                              " visible (one rank per GPU)");
    }
    DS_RETURN_IF_ERROR(nccl_status());
#else
    return invalid_argument(
        "--device cuda: this deepserve was built without CUDA (configure with the cuda-release "
        "preset on a machine with the CUDA toolkit)");
#endif
  }
  auto runner = std::make_unique<ShardedRunner>(weights, device, parallel);
  DS_RETURN_IF_ERROR(runner->init(options, limits, wrap));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace ds::runtime
