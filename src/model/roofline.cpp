// The roofline calculator (dsv4-model.md §13). Weight bytes and parameter counts are summed from
// expected_tensors() by component; a row scales them by the fraction of the tensor a step reads
// (1 for dense weights, U/E for routed experts, rows/vocab for the embedding and the hash tables).
// KV bytes use kv_entry_bytes()/indexer_key_bytes(). FLOPs are 2 per multiply-add: 2 x parameters
// per token for every weight (head included), 4 x heads x head_dim per attended key (QK and PV,
// §13.3) and 2 x index heads x index_head_dim per scored indexer key (§7.7). The assumptions are
// listed in docs/roofline.md. The text report and the JSON document are built here as strings (no
// printing) so that the tests check exactly what the CLI writes.
#include "model/roofline.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "model/tensor_spec.h"

namespace ds {

Result<GpuSpec> find_gpu_preset(std::string_view name) {
  for (const GpuSpec& g : kGpuPresets)
    if (name == g.name) return g;
  return invalid_argument("unknown GPU \"" + std::string(name) +
                          "\" (known: " + gpu_preset_names() + ", or custom peaks)");
}

std::string gpu_preset_names() {
  std::string out;
  for (const GpuSpec& g : kGpuPresets) {
    if (!out.empty()) out += ", ";
    out += g.name;
  }
  return out;
}

Status validate_gpu_spec(const GpuSpec& g) {
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  const std::string who = std::string("GPU ") + (g.name ? g.name : "custom");
  if (!positive(g.bandwidth_tb_s))
    return invalid_argument(who + ": bandwidth must be a positive number of TB/s");
  if (!positive(g.bf16_tflops))
    return invalid_argument(who + ": BF16 peak must be a positive number of TFLOP/s");
  if (!positive(g.fp8_tflops))
    return invalid_argument(who + ": FP8 peak must be a positive number of TFLOP/s");
  if (!(std::isfinite(g.memory_gb) && g.memory_gb >= 0))
    return invalid_argument(who + ": memory must be a non-negative number of GB");
  return ok_status();
}

const char* roofline_section_name(RooflineSection section) {
  switch (section) {
    case RooflineSection::kWeights:
      return "weights";
    case RooflineSection::kKvCache:
      return "kv";
  }
  return "?";
}

double distinct_experts_hit(int64_t num_experts, int64_t top_k, double num_tokens) {
  if (num_experts <= 0 || top_k <= 0 || !(num_tokens > 0)) return 0;
  const double e = double(num_experts);
  const double miss = 1.0 - double(std::min(top_k, num_experts)) / e;
  return e * (1.0 - std::pow(miss, num_tokens));
}

namespace {

constexpr size_t kNc = size_t(kNumTensorComponents);

// A position table read one row per token (compressor `ape[ratio][c*d]`: row t mod ratio, §7.6).
struct RowTable {
  double bytes = 0;
  double rows = 0;
  std::string format;
};

// Bytes and parameters of one component, summed over the tensors of the main model or of MTP.
struct ComponentTotals {
  double bytes = 0;
  std::vector<RowTable> row_tables;  // included in `bytes`
  double fp8_params = 0;   // logical elements of FP8 / FP4 weights (FP8 tensor cores, §10.1)
  double bf16_params = 0;  // other parameters (BF16, F32): BF16 tensor cores
  std::map<std::string, double> bytes_by_format;
};
using Totals = std::array<ComponentTotals, kNc>;

// "FP8" for e4m3 weights and their block scales, "MXFP4"/"NVFP4" for packed e2m1 experts and their
// scales, else the stored dtype.
std::string storage_format(const TensorSpec& t) {
  switch (t.role) {
    case QuantRole::kFp8Weight:
    case QuantRole::kFp8Scale:
    case QuantRole::kFp8ScaleF32:
      return "FP8";
    case QuantRole::kMxfp4Weight:
    case QuantRole::kMxfp4Scale:
      return "MXFP4";
    case QuantRole::kNvfp4Weight:
    case QuantRole::kNvfp4Scale:
    case QuantRole::kNvfp4GlobalScale:
    case QuantRole::kNvfp4InputScale:
      return "NVFP4";
    case QuantRole::kPlain:
      break;
  }
  return std::string(dtype_name(t.dtype));
}

// REF's GEMMs quantize the activation to FP8 and run FP8 (FP4 weights are cast to FP8, §10.1).
bool on_fp8_cores(QuantRole role) {
  return role == QuantRole::kFp8Weight || role == QuantRole::kMxfp4Weight ||
         role == QuantRole::kNvfp4Weight;
}

// Sums for one component set; the format of a row is its dominant format (>= 95% of the bytes),
// else "mixed".
struct Merged {
  double bytes = 0, fp8_params = 0, bf16_params = 0;
  std::map<std::string, double> bytes_by_format;
  std::vector<RowTable> row_tables;
  std::string format() const {
    for (const auto& [f, b] : bytes_by_format)
      if (b >= 0.95 * bytes) return f;
    return bytes_by_format.empty() ? "-" : "mixed";
  }
};

Merged merge(const Totals& t, std::initializer_list<TensorComponent> comps) {
  Merged m;
  for (TensorComponent c : comps) {
    const ComponentTotals& ct = t[size_t(c)];
    m.bytes += ct.bytes;
    m.fp8_params += ct.fp8_params;
    m.bf16_params += ct.bf16_params;
    for (const auto& [f, b] : ct.bytes_by_format) m.bytes_by_format[f] += b;
    m.row_tables.insert(m.row_tables.end(), ct.row_tables.begin(), ct.row_tables.end());
  }
  return m;
}

// Every MTP component except the routed experts.
Merged merge_mtp_dense(const Totals& t) {
  Merged m;
  for (size_t i = 0; i < kNc; ++i) {
    if (i == size_t(TensorComponent::kRoutedExpert)) continue;
    const ComponentTotals& ct = t[i];
    m.bytes += ct.bytes;
    m.fp8_params += ct.fp8_params;
    m.bf16_params += ct.bf16_params;
    for (const auto& [f, b] : ct.bytes_by_format) m.bytes_by_format[f] += b;
    m.row_tables.insert(m.row_tables.end(), ct.row_tables.begin(), ct.row_tables.end());
  }
  return m;
}

std::string fmt(const char* f, double a) {
  char buf[128];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

// "1 token", "16 tokens", "2 draft passes".
std::string count(double n, const std::string& noun) {
  if (n == 1.0) return "1 " + noun;
  return fmt("%.0f ", n) + noun + (noun.back() == 's' ? "es" : "s");
}

// Collects rows of one estimate and the decode step's bytes by format.
class RowBuilder {
 public:
  explicit RowBuilder(RooflineEstimate* est, std::map<std::string, double>* by_format)
      : est_(est), by_format_(by_format) {}

  // A weight row reading `read_fraction` of `m` and doing 2 FLOPs per parameter per token for
  // `flop_tokens` tokens, times `flop_fraction` of the parameters (k/E for routed experts). Of a
  // position table only min(flop_tokens, rows) rows are read.
  void weights(std::string name, const Merged& m, double read_fraction, double flop_tokens,
               double flop_fraction, std::string detail) {
    if (m.bytes <= 0) return;
    RooflineRow r;
    r.component = std::move(name);
    r.section = RooflineSection::kWeights;
    r.format = m.format();
    r.detail = std::move(detail);
    std::map<std::string, double> unread;  // bytes of position tables not read, by format
    for (const RowTable& t : m.row_tables)
      unread[t.format] += t.bytes * (1.0 - std::min(flop_tokens, t.rows) / t.rows);
    double unread_total = 0;
    for (const auto& [f, b] : unread) unread_total += b;
    r.bytes = (m.bytes - unread_total) * read_fraction;
    r.fp8_flops = 2.0 * m.fp8_params * flop_tokens * flop_fraction;
    r.bf16_flops = 2.0 * m.bf16_params * flop_tokens * flop_fraction;
    if (by_format_)
      for (const auto& [f, b] : m.bytes_by_format) {
        const auto it = unread.find(f);
        (*by_format_)[f] += (b - (it == unread.end() ? 0.0 : it->second)) * read_fraction;
      }
    est_->rows.push_back(std::move(r));
  }

  void kv(std::string name, std::string format, double bytes, double fp8_flops, double bf16_flops,
          std::string detail) {
    RooflineRow r;
    r.component = std::move(name);
    r.section = RooflineSection::kKvCache;
    r.format = std::move(format);
    r.detail = std::move(detail);
    r.bytes = bytes;
    r.fp8_flops = fp8_flops;
    r.bf16_flops = bf16_flops;
    est_->rows.push_back(std::move(r));
  }

 private:
  RooflineEstimate* est_;
  std::map<std::string, double>* by_format_;
};

void finish(RooflineEstimate* e, const GpuSpec& gpu) {
  for (const RooflineRow& r : e->rows) {
    (r.section == RooflineSection::kWeights ? e->weight_bytes : e->kv_bytes) += r.bytes;
    e->fp8_flops += r.fp8_flops;
    e->bf16_flops += r.bf16_flops;
  }
  e->bytes = e->weight_bytes + e->kv_bytes;
  e->flops = e->fp8_flops + e->bf16_flops;
  e->memory_time_s = e->bytes / (gpu.bandwidth_tb_s * 1e12);
  e->compute_time_s =
      e->fp8_flops / (gpu.fp8_tflops * 1e12) + e->bf16_flops / (gpu.bf16_tflops * 1e12);
  e->floor_s = std::max(e->memory_time_s, e->compute_time_s);
  e->tokens_per_s = e->floor_s > 0 ? e->tokens / e->floor_s : 0;
}

// ---- KV entries a query reads (§7.4, §13.2) ---------------------------------------------------

// Per query with `ctx` tokens visible (itself included), per layer of each kind.
struct KvCounts {
  double swa = 0;       // raw window entries: min(ctx, window)
  double csa_sel = 0;   // compressed entries attended in a CSA layer: min(topk, floor(ctx/4))
  double idx_keys = 0;  // indexer keys scored in a CSA layer: floor(ctx/4)
  double hca = 0;       // compressed entries of an HCA layer: floor(ctx/128)
};

KvCounts decode_counts(const DeepSeekV4Config& c, int64_t ctx, bool skip_short_indexer) {
  KvCounts k;
  k.swa = double(std::min(ctx, c.sliding_window));
  const int64_t c4 = ctx / 4;
  k.csa_sel = double(std::min(c.index_topk, c4));
  k.idx_keys = (skip_short_indexer && c4 <= c.index_topk) ? 0.0 : double(c4);
  k.hca = double(ctx / 128);
  return k;
}

// Sum over p = 1..n of floor(p / r).
double sum_floor_div(int64_t n, int64_t r) {
  if (n <= 0) return 0;
  const double q = double(n / r), rem = double(n % r);
  return double(r) * q * (q - 1) / 2 + q * (rem + 1);
}

// Sum over p = 1..n of min(cap, floor(p / r)).
double sum_min_floor_div(int64_t n, int64_t r, int64_t cap) {
  const int64_t last_below = cap * r + (r - 1);  // floor(p/r) <= cap for p <= last_below
  if (n <= last_below) return sum_floor_div(n, r);
  return sum_floor_div(last_below, r) + double(n - last_below) * double(cap);
}

// Sums of KvCounts over the queries at positions 1..T of a prompt (prefill, causal).
KvCounts prefill_sums(const DeepSeekV4Config& c, int64_t t, bool skip_short_indexer) {
  KvCounts k;
  const double w = double(c.sliding_window), n = double(t);
  k.swa = t <= c.sliding_window ? n * (n + 1) / 2 : w * (w + 1) / 2 + (n - w) * w;
  k.csa_sel = sum_min_floor_div(t, 4, c.index_topk);
  k.idx_keys = sum_floor_div(t, 4);
  // Skipping: queries whose floor(p/4) <= topk (p <= 4*topk + 3) score nothing.
  if (skip_short_indexer) k.idx_keys -= sum_floor_div(std::min(t, 4 * c.index_topk + 3), 4);
  k.hca = sum_floor_div(t, 128);
  return k;
}

struct LayerCounts {
  int64_t swa = 0, csa = 0, hca = 0;
};

}  // namespace

Result<RooflineResult> compute_roofline(const DeepSeekV4Config& c, const RooflineRequest& req) {
  if (auto s = validate_gpu_spec(req.gpu); !s.ok()) return s;
  if (req.batch < 1 || req.batch > kMaxRooflineBatch)
    return invalid_argument("batch must be in [1, " + std::to_string(kMaxRooflineBatch) +
                            "], got " + std::to_string(req.batch));
  if (req.context < 1 || req.context > kMaxRooflineTokens)
    return invalid_argument("context must be in [1, " + std::to_string(kMaxRooflineTokens) +
                            "] tokens, got " + std::to_string(req.context));
  if (req.prefill_tokens < 0 || req.prefill_tokens > kMaxRooflineTokens)
    return invalid_argument("prefill tokens must be in [0, " + std::to_string(kMaxRooflineTokens) +
                            "], got " + std::to_string(req.prefill_tokens));
  if (req.mtp_draft_tokens < 0 || req.mtp_draft_tokens > kMaxMtpDraftTokens)
    return invalid_argument("MTP draft tokens must be in [0, " +
                            std::to_string(kMaxMtpDraftTokens) + "], got " +
                            std::to_string(req.mtp_draft_tokens));
  if (!(req.mtp_acceptance >= 0.0 && req.mtp_acceptance <= 1.0))
    return invalid_argument("MTP acceptance must be in [0, 1]");
  if (req.mtp_draft_tokens > 0 && c.num_nextn_predict_layers < 1)
    return invalid_argument("MTP speculation needs an MTP layer (num_nextn_predict_layers = 0)");

  RooflineResult res;
  res.request = req;

  // ---- weights by component (§13.1) ----
  Totals main{}, mtp{};
  const std::vector<TensorSpec> tensors = expected_tensors(c);
  for (const TensorSpec& t : tensors) {
    ComponentTotals& ct = (t.is_mtp() ? mtp : main)[size_t(t.component)];
    const double bytes = double(t.stored_bytes());
    ct.bytes += bytes;
    ct.bytes_by_format[storage_format(t)] += bytes;
    const std::string_view name = t.name;
    if (name.size() > 4 && name.substr(name.size() - 4) == ".ape" && !t.shape.empty())
      ct.row_tables.push_back({bytes, double(t.shape[0]), storage_format(t)});
    if (!t.is_parameter()) continue;
    (on_fp8_cores(t.role) ? ct.fp8_params : ct.bf16_params) += double(t.numel());
  }
  const ModelStats stats = compute_model_stats(c, tensors);
  res.resident_weight_bytes = double(stats.main_weight_bytes) +
                              (req.mtp_draft_tokens > 0 ? double(stats.mtp_weight_bytes) : 0);

  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
  const double n_main = double(c.num_hidden_layers);
  const double vocab = double(c.vocab_size);
  res.expert_bytes = main[size_t(TensorComponent::kRoutedExpert)].bytes / (n_main * double(E));

  LayerCounts lc, mtp_lc;
  for (int64_t l = 0; l < c.num_layers_total(); ++l) {
    LayerCounts& x = c.is_mtp_layer(l) ? mtp_lc : lc;
    switch (c.layer_kind(l)) {
      case LayerKind::kSwa:
        ++x.swa;
        break;
      case LayerKind::kCsa:
        ++x.csa;
        break;
      case LayerKind::kHca:
        ++x.hca;
        break;
    }
  }
  res.num_swa_layers = lc.swa;
  res.num_csa_layers = lc.csa;
  res.num_hca_layers = lc.hca;

  using TC = TensorComponent;
  const Merged embed = merge(main, {TC::kEmbed});
  const Merged attention = merge(main, {TC::kAttention});
  const Merged compressors = merge(main, {TC::kCompressor});
  const Merged indexer = merge(main, {TC::kIndexer});
  const Merged mhc = merge(main, {TC::kMhc, TC::kHcHead});
  const Merged norms = merge(main, {TC::kNorm, TC::kFinalNorm});
  const Merged gate = merge(main, {TC::kGate});
  const Merged hash = merge(main, {TC::kHashTable});
  const Merged shared = merge(main, {TC::kSharedExpert});
  const Merged routed = merge(main, {TC::kRoutedExpert});
  const Merged head = merge(main, {TC::kHead});
  const Merged mtp_dense = merge_mtp_dense(mtp);
  const Merged mtp_routed = merge(mtp, {TC::kRoutedExpert});

  {
    // 2 x active parameters, head included (§13.3): every dense parameter plus k experts.
    const auto p = [](const Merged& m) { return m.fp8_params + m.bf16_params; };
    res.linear_flops_per_token =
        2.0 * (p(attention) + p(compressors) + p(indexer) + p(mhc) + p(norms) + p(gate) +
               p(shared) + p(head) + p(routed) * double(k) / double(E));
  }

  // The weight rows of a step in which `tokens` pass through the main model, the head runs on
  // `head_tokens` of them, and the MTP layer runs `mtp_passes` times over `mtp_tokens` tokens each.
  const auto weight_rows = [&](RowBuilder& rb, double tokens, double head_tokens, double u,
                               double mtp_passes, double mtp_tokens, double mtp_head_tokens) {
    const double rows_read = std::min(tokens, vocab);
    rb.weights("embedding rows", embed, rows_read / vocab, 0, 0,
               fmt("%.0f rows (one per token)", rows_read));
    rb.weights("attention projections", attention, 1, tokens, 1,
               fmt("%.0f layers: wq_a, wq_b, wkv, wo_a, wo_b", n_main));
    rb.weights("compressors", compressors, 1, tokens, 1,
               fmt("%.0f CSA + HCA layers", double(lc.csa + lc.hca)));
    rb.weights("indexer", indexer, 1, tokens, 1,
               fmt("%.0f CSA layers: wq_b, weights_proj, compressor", double(lc.csa)));
    rb.weights("mHC", mhc, 1, tokens, 1, "hc_attn, hc_ffn per layer + hc_head");
    rb.weights("norms", norms, 1, tokens, 1, "RMSNorm weights");
    rb.weights("gate", gate, 1, tokens, 1, fmt("%.0f layers", n_main));
    rb.weights("hash routing rows", hash, rows_read / vocab, 0, 0,
               fmt("%.0f tid2eid rows per hash layer", rows_read));
    rb.weights("shared expert", shared, 1, tokens, 1, fmt("%.0f layers", n_main));
    rb.weights("routed experts", routed, u / double(E), tokens, double(k) / double(E),
               fmt("U = %.2f", u) + fmt(" of %.0f distinct per layer", double(E)) +
                   fmt(" x %.0f layers", n_main) + fmt(" x %.2f MB", res.expert_bytes * 1e-6));
    rb.weights("head", head, 1, head_tokens, 1, count(head_tokens, "token"));
    if (mtp_passes > 0) {
      const double mu = distinct_experts_hit(E, k, mtp_tokens);
      rb.weights("MTP layer", mtp_dense, mtp_passes, mtp_tokens * mtp_passes, 1,
                 count(mtp_passes, "draft pass"));
      rb.weights("MTP routed experts", mtp_routed, mtp_passes * mu / double(E),
                 mtp_tokens * mtp_passes, double(k) / double(E),
                 fmt("U = %.2f per pass", mu) + " x " + count(mtp_passes, "pass"));
      rb.weights("head (draft passes)", head, mtp_passes, mtp_head_tokens * mtp_passes, 1,
                 count(mtp_passes, "draft pass"));
    }
  };

  const int64_t entry = kv_entry_bytes(c);
  const int64_t idx_entry = indexer_key_bytes(c, req.indexer_format);
  const double attn_per_key = 4.0 * double(c.num_attention_heads) * double(c.head_dim);
  const double idx_per_key = 2.0 * double(c.index_n_heads) * double(c.index_head_dim);
  const std::string kv_fmt = "KV " + std::to_string(entry) + " B";
  const std::string idx_fmt =
      std::string(req.indexer_format == IndexerKeyFormat::kFp8 ? "FP8 " : "FP4 ") +
      std::to_string(idx_entry) + " B";
  const double swa_layers_all = double(lc.swa + lc.csa + lc.hca);  // every layer has a window
  const double mtp_window_layers = double(mtp_lc.swa + mtp_lc.csa + mtp_lc.hca);

  // ---- decode (§13.1-§13.4) ----
  {
    const double B = double(req.batch), d = double(req.mtp_draft_tokens);
    const double a = req.mtp_acceptance;
    const double n_tokens = B * (1.0 + d);  // through the main model (verification)
    double emitted = 1.0, pw = 1.0;
    for (int64_t i = 0; i < req.mtp_draft_tokens; ++i) emitted += (pw *= a);
    RooflineEstimate& e = res.decode;
    e.tokens = B * emitted;
    res.decode_tokens_verified = n_tokens;
    res.distinct_experts = distinct_experts_hit(E, k, n_tokens);
    res.routed_expert_bytes = routed.bytes * res.distinct_experts / double(E);
    std::map<std::string, double> by_format;
    RowBuilder rb(&e, &by_format);
    weight_rows(rb, n_tokens, n_tokens, res.distinct_experts, d, B, B);

    // KV read once per sequence per step; every verified token attends to the same entries.
    const KvCounts q = decode_counts(c, req.context, req.skip_short_indexer);
    const double swa_b = swa_layers_all * q.swa * double(entry);
    const double csa_b = double(lc.csa) * q.csa_sel * double(entry);
    const double idx_b = double(lc.csa) * q.idx_keys * double(idx_entry);
    const double hca_b = double(lc.hca) * q.hca * double(entry);
    res.kv_bytes_per_sequence = swa_b + csa_b + idx_b + hca_b;
    res.attention_flops_per_token =
        attn_per_key *
            (swa_layers_all * q.swa + double(lc.csa) * q.csa_sel + double(lc.hca) * q.hca) +
        idx_per_key * double(lc.csa) * q.idx_keys;
    rb.kv("KV: SWA ring", kv_fmt, B * swa_b, 0, n_tokens * attn_per_key * swa_layers_all * q.swa,
          fmt("%.0f entries", q.swa) + fmt(" x %.0f layers", swa_layers_all) +
              fmt(" x %.0f seqs", B));
    if (lc.csa > 0) {
      rb.kv("KV: CSA compressed", kv_fmt, B * csa_b, 0,
            n_tokens * attn_per_key * double(lc.csa) * q.csa_sel,
            fmt("min(topk, L/4) = %.0f", q.csa_sel) + fmt(" x %.0f layers", double(lc.csa)) +
                fmt(" x %.0f seqs", B));
      rb.kv("KV: indexer keys", idx_fmt, B * idx_b,
            n_tokens * idx_per_key * double(lc.csa) * q.idx_keys, 0,
            q.idx_keys == 0 && req.skip_short_indexer
                ? std::string("skipped (L/4 <= topk)")
                : fmt("L/4 = %.0f", q.idx_keys) + fmt(" x %.0f layers", double(lc.csa)) +
                      fmt(" x %.0f seqs", B));
    }
    if (lc.hca > 0)
      rb.kv("KV: HCA compressed", kv_fmt, B * hca_b, 0,
            n_tokens * attn_per_key * double(lc.hca) * q.hca,
            fmt("L/128 = %.0f", q.hca) + fmt(" x %.0f layers", double(lc.hca)) +
                fmt(" x %.0f seqs", B));
    if (d > 0 && mtp_window_layers > 0)
      rb.kv("KV: MTP SWA ring", kv_fmt, B * d * mtp_window_layers * q.swa * double(entry), 0,
            B * d * attn_per_key * mtp_window_layers * q.swa,
            fmt("%.0f entries", q.swa) + " x " + count(d, "draft pass") + fmt(" x %.0f seqs", B));
    finish(&e, req.gpu);
    for (const RooflineRow& row : e.rows) {
      if (row.section != RooflineSection::kWeights) continue;
      static const char* const kNotDense[] = {"embedding rows",     "hash routing rows",
                                              "routed experts",     "MTP layer",
                                              "MTP routed experts", "head (draft passes)"};
      if (std::find(std::begin(kNotDense), std::end(kNotDense), row.component) ==
          std::end(kNotDense))
        res.dense_weight_bytes += row.bytes;
    }
    for (const auto& [f, b] : by_format) res.decode_weight_bytes_by_format.push_back({f, b});
    std::sort(res.decode_weight_bytes_by_format.begin(), res.decode_weight_bytes_by_format.end(),
              [](const FormatBytes& x, const FormatBytes& y) { return x.bytes > y.bytes; });
  }

  // ---- prefill: one sequence of T tokens into an empty cache ----
  {
    const int64_t t = req.prefill_tokens > 0 ? req.prefill_tokens : req.context;
    const double T = double(t);
    const bool mtp_on = req.mtp_draft_tokens > 0;
    RooflineEstimate& e = res.prefill;
    e.tokens = T;
    res.prefill_distinct_experts = distinct_experts_hit(E, k, T);
    RowBuilder rb(&e, nullptr);
    // Logits only for the last position (REF), so the head runs on one token.
    weight_rows(rb, T, 1, res.prefill_distinct_experts, mtp_on ? 1 : 0, T, 1);
    // KV written once (the ring keeps the last `window` raw entries); attention FLOPs summed over
    // the causal queries.
    const KvCounts last = decode_counts(c, t, false);
    const KvCounts sum = prefill_sums(c, t, req.skip_short_indexer);
    rb.kv("KV: SWA ring", kv_fmt, swa_layers_all * last.swa * double(entry), 0,
          attn_per_key * swa_layers_all * sum.swa,
          fmt("%.0f entries written", last.swa) + fmt(" x %.0f layers", swa_layers_all));
    if (lc.csa > 0) {
      rb.kv(
          "KV: CSA compressed", kv_fmt, double(lc.csa) * last.idx_keys * double(entry), 0,
          attn_per_key * double(lc.csa) * sum.csa_sel,
          fmt("T/4 = %.0f entries written", last.idx_keys) + fmt(" x %.0f layers", double(lc.csa)));
      rb.kv("KV: indexer keys", idx_fmt, double(lc.csa) * last.idx_keys * double(idx_entry),
            idx_per_key * double(lc.csa) * sum.idx_keys, 0,
            fmt("T/4 = %.0f keys written", last.idx_keys) + fmt(" x %.0f layers", double(lc.csa)));
    }
    if (lc.hca > 0)
      rb.kv("KV: HCA compressed", kv_fmt, double(lc.hca) * last.hca * double(entry), 0,
            attn_per_key * double(lc.hca) * sum.hca,
            fmt("T/128 = %.0f entries written", last.hca) + fmt(" x %.0f layers", double(lc.hca)));
    if (mtp_on && mtp_window_layers > 0)
      rb.kv("KV: MTP SWA ring", kv_fmt, mtp_window_layers * last.swa * double(entry), 0,
            attn_per_key * mtp_window_layers * sum.swa, fmt("%.0f entries written", last.swa));
    finish(&e, req.gpu);
  }
  return res;
}

// ---- reports ----------------------------------------------------------------------------------

// Decimal units, as in dsv4-model.md §13 (1 GB = 1e9 B).
std::string human_bytes(double b) {
  if (b >= 1e9) return fmt("%.2f GB", b * 1e-9);
  if (b >= 1e6) return fmt("%.2f MB", b * 1e-6);
  if (b >= 1e3) return fmt("%.1f KB", b * 1e-3);
  return fmt("%.0f B", b);
}

std::string human_flops(double f) {
  if (f <= 0) return "0";
  if (f >= 1e12) return fmt("%.2f TFLOP", f * 1e-12);
  if (f >= 1e9) return fmt("%.2f GFLOP", f * 1e-9);
  if (f >= 1e6) return fmt("%.2f MFLOP", f * 1e-6);
  if (f >= 1e3) return fmt("%.1f KFLOP", f * 1e-3);
  return fmt("%.0f FLOP", f);
}

std::string human_time(double s) {
  if (s >= 1.0) return fmt("%.3f s", s);
  if (s >= 1e-3) return fmt("%.2f ms", s * 1e3);
  return fmt("%.2f us", s * 1e6);
}

namespace {

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

void append_table(std::string* out, const RooflineEstimate& e, double bw_bytes_s) {
  *out += pad("component", 24) + pad("format", 11) + pad("bytes", 12) + pad("FLOPs", 14) +
          pad("t@BW", 11) + pad("share", 8) + "counted\n";
  for (const RooflineRow& r : e.rows) {
    *out += pad(r.component, 24) + pad(r.format, 11) + pad(human_bytes(r.bytes), 12) +
            pad(human_flops(r.flops()), 14) + pad(human_time(r.bytes / bw_bytes_s), 11) +
            pad(fmt("%.1f%%", e.bytes > 0 ? 100.0 * r.bytes / e.bytes : 0.0), 8) + r.detail + "\n";
  }
  *out += pad("total", 35) + pad(human_bytes(e.bytes), 12) + pad(human_flops(e.flops), 14) +
          pad(human_time(e.memory_time_s), 11) + "100.0%\n";
}

std::string floor_line(const RooflineEstimate& e) {
  const bool mem = e.memory_bound();
  const double ratio = mem ? e.memory_time_s / std::max(e.compute_time_s, 1e-30)
                           : e.compute_time_s / std::max(e.memory_time_s, 1e-30);
  return "floor: max(memory " + human_time(e.memory_time_s) + ", compute " +
         human_time(e.compute_time_s) + ") = " + human_time(e.floor_s) + ", " +
         (mem ? "memory" : "compute") + fmt("-bound (%.1fx)\n", ratio);
}

}  // namespace

std::string format_roofline_report(const DeepSeekV4Config& c, const RooflineResult& r,
                                   std::string_view model_label) {
  const RooflineRequest& q = r.request;
  const double bw = q.gpu.bandwidth_tb_s * 1e12;
  std::string out;
  out +=
      "model: " + std::string(model_label) + fmt(" (%.0f layers: ", double(c.num_hidden_layers)) +
      fmt("%.0f SWA + ", double(r.num_swa_layers)) + fmt("%.0f CSA + ", double(r.num_csa_layers)) +
      fmt("%.0f HCA; ", double(r.num_hca_layers)) +
      fmt("%.0f routed experts, ", double(c.n_routed_experts)) +
      fmt("top-%.0f, ", double(c.num_experts_per_tok)) + expert_format_name(c.expert_format) +
      " experts)\n";
  out += "gpu: " + std::string(q.gpu.name ? q.gpu.name : "custom") +
         fmt(" (%.2f TB/s, ", q.gpu.bandwidth_tb_s) +
         fmt("BF16 %.0f TFLOP/s, ", q.gpu.bf16_tflops) +
         fmt("FP8 %.0f TFLOP/s dense)\n", q.gpu.fp8_tflops);

  // ---- decode ----
  const RooflineEstimate& d = r.decode;
  out += "\ndecode step: " + fmt("batch %.0f, ", double(q.batch)) +
         fmt("context %.0f", double(q.context));
  if (q.mtp_draft_tokens > 0)
    out += ", MTP " + count(double(q.mtp_draft_tokens), "draft") +
           fmt(" (acceptance %.2f", q.mtp_acceptance) +
           fmt(", %.0f tokens verified", r.decode_tokens_verified) +
           fmt(", %.2f expected per step)", d.tokens);
  out += "\n";
  append_table(&out, d, bw);
  out += "weights " + human_bytes(d.weight_bytes) + ": dense " + human_bytes(r.dense_weight_bytes) +
         ", routed experts " + human_bytes(r.routed_expert_bytes) +
         fmt(" (U(%.0f) = ", r.decode_tokens_verified) + fmt("%.2f", r.distinct_experts) +
         fmt(" of %.0f per layer x ", double(c.n_routed_experts)) + human_bytes(r.expert_bytes) +
         ")\n";
  out += "kv " + human_bytes(d.kv_bytes) + ": " + human_bytes(r.kv_bytes_per_sequence) +
         " per sequence\n";
  out += "weights by format:";
  for (const FormatBytes& f : r.decode_weight_bytes_by_format)
    out += " " + f.format + " " + human_bytes(f.bytes) + ";";
  if (out.back() == ';') out.pop_back();
  out += "\nflops per token: linear " + human_flops(r.linear_flops_per_token) +
         ", attention + indexer " + human_flops(r.attention_flops_per_token) + "\n";
  out += floor_line(d);
  out += fmt("ideal decode: %.0f tok/s", d.tokens_per_s) +
         fmt(" (%.2f tokens per step / ", d.tokens) + human_time(d.floor_s) + ")\n";

  // ---- prefill ----
  const RooflineEstimate& p = r.prefill;
  out += "\nprefill: " +
         fmt("%.0f tokens (one sequence, empty cache; logits for the last token)\n", p.tokens);
  append_table(&out, p, bw);
  out += floor_line(p);
  out += fmt("ideal prefill: %.0f tok/s", p.tokens_per_s) +
         " (time to first token >= " + human_time(p.floor_s) + ")\n";

  // ---- capacity (§13.4 caveat 1) ----
  if (q.gpu.memory_gb > 0) {
    const double mem = q.gpu.memory_gb * 1e9;
    out += "\nresident weights " + human_bytes(r.resident_weight_bytes) + " vs " +
           human_bytes(mem) + " of GPU memory: ";
    if (r.resident_weight_bytes <= mem)
      out += "fits on one GPU (before KV and workspace)\n";
    else
      out += fmt("needs at least %.0f GPUs (ideal above assumes the weights fit)\n",
                 std::ceil(r.resident_weight_bytes / mem));
  }
  return out;
}

std::string roofline_to_json(const DeepSeekV4Config& c, const RooflineResult& r,
                             std::string_view model_label) {
  using nlohmann::json;
  const RooflineRequest& q = r.request;
  const auto estimate = [](const RooflineEstimate& e) {
    json rows = json::array();
    for (const RooflineRow& row : e.rows)
      rows.push_back({{"component", row.component},
                      {"section", roofline_section_name(row.section)},
                      {"format", row.format},
                      {"bytes", row.bytes},
                      {"fp8_flops", row.fp8_flops},
                      {"bf16_flops", row.bf16_flops},
                      {"flops", row.flops()},
                      {"share", e.bytes > 0 ? row.bytes / e.bytes : 0.0},
                      {"counted", row.detail}});
    return json{{"rows", rows},
                {"tokens", e.tokens},
                {"weight_bytes", e.weight_bytes},
                {"kv_bytes", e.kv_bytes},
                {"bytes", e.bytes},
                {"fp8_flops", e.fp8_flops},
                {"bf16_flops", e.bf16_flops},
                {"flops", e.flops},
                {"memory_time_s", e.memory_time_s},
                {"compute_time_s", e.compute_time_s},
                {"floor_s", e.floor_s},
                {"memory_bound", e.memory_bound()},
                {"tokens_per_s", e.tokens_per_s}};
  };
  json by_format = json::object();
  for (const FormatBytes& f : r.decode_weight_bytes_by_format) by_format[f.format] = f.bytes;
  json decode = estimate(r.decode);
  decode["tokens_verified"] = r.decode_tokens_verified;
  decode["distinct_experts_per_layer"] = r.distinct_experts;
  decode["expert_bytes"] = r.expert_bytes;
  decode["dense_weight_bytes"] = r.dense_weight_bytes;
  decode["routed_expert_bytes"] = r.routed_expert_bytes;
  decode["kv_bytes_per_sequence"] = r.kv_bytes_per_sequence;
  decode["linear_flops_per_token"] = r.linear_flops_per_token;
  decode["attention_flops_per_token"] = r.attention_flops_per_token;
  decode["weight_bytes_by_format"] = by_format;
  json prefill = estimate(r.prefill);
  prefill["distinct_experts_per_layer"] = r.prefill_distinct_experts;
  json doc = {{"model",
               {{"source", std::string(model_label)},
                {"num_hidden_layers", c.num_hidden_layers},
                {"swa_layers", r.num_swa_layers},
                {"csa_layers", r.num_csa_layers},
                {"hca_layers", r.num_hca_layers},
                {"n_routed_experts", c.n_routed_experts},
                {"num_experts_per_tok", c.num_experts_per_tok},
                {"expert_format", expert_format_name(c.expert_format)}}},
              {"gpu",
               {{"name", q.gpu.name ? q.gpu.name : "custom"},
                {"bandwidth_tb_s", q.gpu.bandwidth_tb_s},
                {"bf16_tflops", q.gpu.bf16_tflops},
                {"fp8_tflops", q.gpu.fp8_tflops},
                {"memory_gb", q.gpu.memory_gb}}},
              {"request",
               {{"batch", q.batch},
                {"context", q.context},
                {"prefill_tokens", r.prefill.tokens},
                {"indexer_keys", q.indexer_format == IndexerKeyFormat::kFp8 ? "fp8" : "fp4"},
                {"skip_short_indexer", q.skip_short_indexer},
                {"mtp_draft_tokens", q.mtp_draft_tokens},
                {"mtp_acceptance", q.mtp_acceptance}}},
              {"decode", decode},
              {"prefill", prefill},
              {"resident_weight_bytes", r.resident_weight_bytes}};
  return doc.dump(2) + "\n";
}

}  // namespace ds
