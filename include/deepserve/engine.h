// deepserve's public engine API: the only header the server (src/server) and embedders include.
// An Engine owns the model, the tokenizer, the KV cache and one engine thread that runs the
// scheduler (continuous batching, chunked prefill, preemption). Clients submit a request and read
// its events from a RequestStream; abort() or dropping the stream ends it and frees its KV within
// one engine step. Nothing here throws across the API: errors are returned as ApiError values.
//
// Text semantics (what a streaming client sees equals what a non-streaming client gets):
// - RequestEvent::text carries whole UTF-8 characters only; a stop string is held back until it is
//   resolved and is never emitted (neither is anything after it).
// - In chat requests the engine also runs the DeepSeek-V4 output parser, so reasoning text,
//   content and completed tool calls arrive separately (reasoning_content / content / tool_calls).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace deepserve {

// ---------------------------------------------------------------------------------------------
// Errors

enum class ErrorKind {
  kInvalidRequest,  // 400 invalid_request_error (bad value, context overflow, bad token id)
  kNotFound,        // 404 (unknown model)
  kOverloaded,      // 429/503 with Retry-After: queue full
  kUnavailable,     // 503: loading or draining
  kInternal,        // 500: details only in the log
};

struct ApiError {
  ErrorKind kind = ErrorKind::kInternal;
  std::string message;  // safe to show to the client
  std::string param;    // the request field at fault, "" if none
  std::string code;     // machine-readable code ("context_length_exceeded", ...), "" if none
  // Context overflow details (OpenAI / vLLM wording): set when code == "context_length_exceeded".
  int64_t n_prompt_tokens = 0;
  int64_t n_ctx = 0;
};

// ---------------------------------------------------------------------------------------------
// Configuration

struct LoadProgress {
  int64_t shards_done = 0, shards_total = 0;
  double gib_done = 0, gib_total = 0;
  std::string phase;  // "tokenizer", "weights", "kv-cache", "ready"
};

// Test hooks that inject faults at the engine-step boundary (reliability.md §4.1, R6). They act
// only in builds with the CMake option DEEPSERVE_FAULT_HOOKS (default ON; every field defaults to
// "off", so the hooks are inert unless set). In a build without it the fields are ignored.
struct EngineFaultHooks {
  // GF3: NaN into the logits of one request before it samples its output token number
  // `nan_at_output_token` (1-based; the first generated token is 1). The request is chosen by id
  // (nan_request_id) or, when that is "", as the nan_request_ordinal-th request submitted (1-based;
  // 0 = off). That request ends with finish_reason error; the others continue.
  std::string nan_request_id;
  int64_t nan_request_ordinal = 0;
  int64_t nan_at_output_token = 1;
  // SH3: sleep this many milliseconds inside every engine step once `stall_after_steps` steps have
  // run (0 = off). The step counter (EngineMetrics::engine_steps_total) does not move meanwhile.
  int64_t stall_ms = 0;
  int64_t stall_after_steps = 0;
  // GF1-like sticky fault: at engine step `sticky_fault_at_step` (1-based; 0 = off) the step fails
  // as a sticky device error would: every in-flight request ends with finish_reason error, the
  // engine turns dead (health().dead, submit answers kUnavailable).
  int64_t sticky_fault_at_step = 0;
  // Speculative decoding: called for every draft the engine proposes, with the sequence so far
  // (prompt + output) and the MTP draft; it may replace the draft (same or shorter length). The
  // replaced tokens count as proposed from a point mass (for sampling requests). Tests use it to
  // exercise acceptance on a model whose MTP layer predicts nothing.
  std::function<void(const std::vector<int32_t>& tokens, std::vector<int32_t>* draft)>
      spec_draft_override;
  // Speculative decoding: replaces the adaptive policy's choice of k for the next step (given
  // the engine step number, 1-based), e.g. to alternate speculation off and on in tests.
  std::function<int64_t(int64_t step)> spec_k_override;
};

// Speculative decoding (docs/speculative.md), `--speculative-config`.
struct SpeculativeConfig {
  std::string method;                  // "" = off; "mtp" (the model's MTP layer drafts)
  int64_t num_speculative_tokens = 0;  // k: draft tokens per step, [1, 8] (and < sliding_window)
  bool adaptive = true;                // lower k or turn speculation off when it does not pay
};
// Parses {"method": "mtp", "num_speculative_tokens": k, "adaptive": true|false (optional)}.
// Returns false with a message naming the field for bad JSON, unknown fields or bad values.
bool parse_speculative_config(const std::string& json, SpeculativeConfig* out,
                              std::string* error);

struct EngineConfig {
  std::string model_dir;               // "" = the embedded tiny model (generated on first use)
  std::string served_model_name;       // "" = the directory's base name (or "deepseek-v4-tiny")
  std::string device = "cpu";          // "cpu" (CUDA when the backend exists)
  std::string numerics = "reference";  // "reference" | "hf"
  int64_t max_model_len = 0;           // 0 = min(max_position_embeddings, what KV capacity allows)
  int64_t max_num_seqs = 64;           // running sequences per step
  int64_t max_num_batched_tokens = 2048;  // tokens per step (decode tokens + prefill chunks)
  int64_t max_queued_requests = 1024;     // waiting queue bound (429 past it)
  int64_t max_queued_tokens = 1 << 22;    // prompt tokens waiting (429 past it)
  double kv_cache_memory_gib = 0;  // KV pages' size (CPU pool; CUDA: instead of the budget's)
  double gpu_memory_utilization = 0.9;  // CUDA backend: fraction of the GPU's memory to fill
  int64_t num_gpu_blocks_override = 0;  // CUDA backend: > 0 = exactly this many KV pages
  int tensor_parallel_size = 1;  // ranks (GPUs 0..N-1 on CUDA; docs/parallelism.md)
  uint64_t seed = 0;                      // default seed of requests without one
  int num_threads = 0;                    // CPU compute threads; 0 = all cores
  bool full_scan = false;                 // validate every weight value at load (rule 23)
  std::function<void(const LoadProgress&)> on_progress;  // called from the loading thread
  EngineFaultHooks fault;                                // test builds only, see EngineFaultHooks
  SpeculativeConfig speculative;                         // off unless method is set
};

// ---------------------------------------------------------------------------------------------
// Requests

struct SamplingParams {
  double temperature = 1.0;              // 0 = greedy
  double top_p = 1.0;                    // (0, 1]
  int64_t top_k = 0;                     // 0 or -1 = off
  double min_p = 0.0;                    // [0, 1]
  double presence_penalty = 0.0;         // [-2, 2]
  double frequency_penalty = 0.0;        // [-2, 2]
  double repetition_penalty = 1.0;       // (0, 2]
  std::map<int32_t, double> logit_bias;  // token id -> bias in [-100, 100]
  std::optional<uint64_t> seed;          // reproducible per request when set
  int64_t max_tokens = -1;               // -1 = up to the context length
  int64_t min_tokens = 0;                // EOS and stop tokens suppressed before this many
  std::vector<std::string> stop;         // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;   // stop tokens (not included in the output)
  bool ignore_eos = false;
  int64_t logprobs = -1;  // -1 = none; 0 = the sampled token's logprob; k = plus the top k
};

// How the output is interpreted.
enum class OutputMode {
  kText,          // plain completion: text only
  kChat,          // chat, thinking off: content + tool calls
  kChatThinking,  // chat, thinking on: output starts inside reasoning, then content + tool calls
};

struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON object text
};

struct ChatMessage {
  std::string role;  // system, developer, user, assistant, tool
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;  // assistant
  std::vector<ChatToolCall> tool_calls;          // assistant
  std::string tool_call_id;                      // tool
};

struct ChatPrompt {
  std::vector<ChatMessage> messages;
  std::string tools_json;            // OpenAI "tools" array as JSON text; "" = none
  std::string response_format_json;  // "" = none
  bool thinking = false;             // chat_template_kwargs.thinking (DeepSeek convention)
  std::string reasoning_effort;      // "", "high" or "max"
};

struct GenerateRequest {
  std::string request_id;           // "" = the engine makes one
  std::vector<int32_t> prompt_ids;  // the whole prompt, already tokenized
  SamplingParams sampling;
  OutputMode output_mode = OutputMode::kText;
  std::chrono::milliseconds timeout{0};  // 0 = none; past it the request ends with "length"
};

// ---------------------------------------------------------------------------------------------
// Events

enum class FinishReason { kNone, kStop, kLength, kToolCalls, kAbort, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "tool_calls", "abort", "error"

struct TopLogprob {
  int32_t token_id = 0;
  std::string token;  // the token's text (may be a partial UTF-8 sequence, shown escaped)
  float logprob = 0;
};

struct TokenInfo {
  int32_t token_id = 0;
  std::string token;  // as in TopLogprob
  float logprob = 0;
  std::vector<TopLogprob> top;  // [sampling.logprobs] best alternatives, when asked
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

struct RequestEvent {
  std::string text;                      // committed text (kText: all output; chat: content)
  std::string reasoning;                 // chat thinking mode: reasoning text
  std::vector<ChatToolCall> tool_calls;  // chat: completed tool calls (ids assigned)
  std::vector<TokenInfo> tokens;         // tokens committed with this event (logprobs if asked)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;  // set when finished
  std::string stop_reason;        // the matched stop string, or the stop token as text
  Usage usage;                    // always set on the finished event
  std::optional<ApiError> error;  // finish_reason == kError
  // Timing for metrics and benchmarks (engine clock).
  std::chrono::steady_clock::time_point time;
};

// The read side of one request. Events come in order; the last one has finished == true.
// Destroying the stream (or calling abort) aborts the request if it is still running.
class RequestStream {
 public:
  virtual ~RequestStream() = default;
  // Blocks until an event is ready or `timeout` passes; false on timeout.
  virtual bool next(RequestEvent* event, std::chrono::milliseconds timeout) = 0;
  virtual void abort() = 0;
  virtual const std::string& request_id() const = 0;
};

// ---------------------------------------------------------------------------------------------
// Introspection

struct ModelInfo {
  std::string id;            // served model name
  std::string architecture;  // "DeepseekV4ForCausalLM"
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;
  int64_t num_parameters = 0;
  int64_t eos_token_id = 0;
};

struct EngineMetrics {
  int64_t num_requests_running = 0;
  int64_t num_requests_waiting = 0;
  double kv_cache_usage = 0;  // [0, 1]
  int64_t kv_pages_total = 0, kv_pages_free = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t num_preemptions_total = 0;
  int64_t requests_finished_total = 0;  // by any reason
  int64_t requests_failed_total = 0;    // finish_reason error
  int64_t requests_rejected_total = 0;  // 429/503 at admission
  int64_t engine_steps_total = 0;
  // Where the engine thread's time goes, cumulative seconds per phase of its steps: schedule
  // (aborts, timeouts, the scheduler, the step's chunk list), forward (the model call, the
  // device's work and the logits copy included), sample (judging every sampled row: the parallel
  // phase), emit (tokens into the requests, events, finishing), speculate (MTP drafts). With the
  // step count and the token counts below, a serving benchmark's TPOT splits into the forward's
  // share, the host's and the prefill work sharing the steps.
  double step_schedule_seconds_total = 0;
  double step_forward_seconds_total = 0;
  double step_sample_seconds_total = 0;
  double step_emit_seconds_total = 0;
  double step_speculate_seconds_total = 0;
  // Tokens fed to the model: decode rows (a generated token, plus its drafts) and prefill rows
  // (prompt tokens, and everything a preempted request recomputes); steps with prefill rows.
  int64_t step_decode_tokens_total = 0;
  int64_t step_prefill_tokens_total = 0;
  int64_t prefill_steps_total = 0;
  // Sampled rows whose token is the backend's argmax (greedy rows that nothing adjusts and that
  // ask for no logprobs: their logits never reach the host; DEEPSERVE_BACKEND_ARGMAX=0: none).
  int64_t step_argmax_rows_total = 0;
  // Sampled rows whose random draw the backend made (SequenceChunk::backend_sample: temperature >
  // 0, nothing adjusts the logits, no logprobs, no drafts; DEEPSERVE_BACKEND_SAMPLING=0: none).
  int64_t step_backend_sampled_rows_total = 0;
  // Speculative decoding: verify steps of one sequence with >= 1 draft token (drafts), draft
  // tokens verified, draft tokens accepted; the k the adaptive policy chose last (0 = off).
  // Acceptance rate = accepted / draft tokens; mean accepted length = 1 + accepted / drafts.
  int64_t spec_num_drafts_total = 0;
  int64_t spec_draft_tokens_total = 0;
  int64_t spec_accepted_tokens_total = 0;
  int64_t spec_num_speculative_tokens = 0;
  int64_t requests_corrupted_total = 0;  // ended by non-finite logits (GF3); also counted failed
  int64_t kv_capacity_tokens = 0;        // tokens one sequence can hold at most
  // Free/total per KV pool ("compressed_r4", "compressed_r128", "indexer_keys" in pages of 256
  // tokens; "sequence_slots" in slots). Back to the baseline (all free) when idle (promise 3).
  struct KvPool {
    std::string name;
    int64_t total = 0;
    int64_t free = 0;
  };
  std::vector<KvPool> kv_pools;
  // Histogram samples are reported through the server's own histograms (from event times).
};

class Engine {
 public:
  // Loads the model and the tokenizer, sizes the KV cache and starts the engine thread. Errors
  // (bad directory, corrupt file, KV does not fit) come back with a message naming the cause.
  static std::unique_ptr<Engine> create(const EngineConfig& config, ApiError* error);
  virtual ~Engine() = default;

  virtual const ModelInfo& model_info() const = 0;
  virtual EngineMetrics metrics() const = 0;
  // Human-readable startup summary lines (architecture, parameters, dtypes, KV capacity in tokens,
  // max concurrency at max_model_len).
  virtual std::vector<std::string> summary() const = 0;

  // Tokenizer access (thread-safe).
  virtual bool tokenize(const std::string& text, bool add_special_tokens, std::vector<int32_t>* ids,
                        ApiError* error) const = 0;
  virtual bool detokenize(const std::vector<int32_t>& ids, std::string* text,
                          ApiError* error) const = 0;
  virtual bool encode_chat(const ChatPrompt& prompt, std::vector<int32_t>* ids,
                           ApiError* error) const = 0;

  // Admission: validates the request (token ids, lengths against max_model_len, sampling ranges)
  // and queues it. Returns nullptr with `error` set when refused (400 / 429 / 503).
  virtual std::unique_ptr<RequestStream> submit(GenerateRequest request, ApiError* error) = 0;

  // Stops accepting new requests (submit returns kUnavailable); running ones continue.
  virtual void drain() = 0;
  // Aborts everything still running or queued (each gets a finished event with kAbort).
  virtual void abort_all() = 0;
  // True once every request has finished after drain() / abort_all() (in fact: whenever no
  // request is queued or running).
  virtual bool idle() const = 0;

  // Liveness facts for /health (SH3): the server reports a stall when active > 0 and `steps` has
  // not moved for its stall timeout. `dead` is set after a sticky fault (promise 7).
  struct Health {
    bool dead = false;
    std::string reason;
    int64_t steps = 0;
    int64_t active = 0;  // requests queued or running
    std::chrono::steady_clock::time_point last_step;
  };
  // (Not pure, so that test doubles of Engine need not implement it: the default has no stall
  // timestamp and never reports dead.)
  virtual Health health() const {
    Health h;
    const EngineMetrics m = metrics();
    h.steps = m.engine_steps_total;
    h.active = m.num_requests_running + m.num_requests_waiting;
    h.last_step = std::chrono::steady_clock::now();
    return h;
  }
};

}  // namespace deepserve
