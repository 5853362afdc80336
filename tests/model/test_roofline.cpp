// The roofline calculator against the cost model of dsv4-model.md §13: §13.1 weight bytes per
// component and per expert, U(B), §13.2 KV bytes per sequence, §13.3 FLOPs, §13.4 ideal tokens/s
// on the H200 (within 1%) and on the RTX PRO 6000 at the table's 1.7 TB/s, the MTP estimate of
// §13.4 caveat 3; the prefill closed forms against a per-position sum; bad requests; and the lines
// the CLI prints (the report is built by the library, the CLI only writes it).
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"
#include "model/roofline.h"

namespace ds {
namespace {

RooflineResult run(const DeepSeekV4Config& c, int64_t batch, int64_t context,
                   GpuSpec gpu = kGpuPresets[0]) {
  RooflineRequest q;
  q.gpu = gpu;
  q.batch = batch;
  q.context = context;
  auto r = compute_roofline(c, q);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : RooflineResult{};
}

const RooflineRow* row(const RooflineEstimate& e, const std::string& name) {
  for (const RooflineRow& r : e.rows)
    if (r.component == name) return &r;
  return nullptr;
}

double row_bytes(const RooflineEstimate& e, const std::string& name) {
  const RooflineRow* r = row(e, name);
  EXPECT_NE(r, nullptr) << name;
  return r ? r->bytes : 0;
}

TEST(Roofline, GpuPresets) {
  auto h200 = find_gpu_preset("h200");
  ASSERT_TRUE(h200.ok());
  EXPECT_DOUBLE_EQ(h200->bandwidth_tb_s, 4.8);
  for (const char* n : {"h100", "b200", "rtx-pro-6000"}) {
    auto g = find_gpu_preset(n);
    ASSERT_TRUE(g.ok()) << n;
    EXPECT_TRUE(validate_gpu_spec(*g).ok()) << n;
  }
  auto bad = find_gpu_preset("a100");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("h200, h100, b200, rtx-pro-6000"), std::string::npos);
}

TEST(Roofline, DistinctExperts) {
  // §13.1: U(1) = 6, U(16) = 80.8, U(64) = 199.9.
  EXPECT_NEAR(distinct_experts_hit(256, 6, 1), 6.0, 1e-9);
  EXPECT_NEAR(distinct_experts_hit(256, 6, 16), 80.8, 0.05);
  EXPECT_NEAR(distinct_experts_hit(256, 6, 64), 199.9, 0.05);
  EXPECT_EQ(distinct_experts_hit(256, 6, 0), 0.0);
  EXPECT_NEAR(distinct_experts_hit(256, 6, 1e6), 256.0, 1e-6);
}

// §13.1: dense 7.76 GB (attention 4.60, shared 1.08, compressors/indexers 0.80, head 1.06, gate
// 0.09, mHC 0.14), one expert 13.37 MB, experts 3.45 / 46.46 / 114.9 GB, embedding 8 KB per token.
TEST(Roofline, FlashWeightBytes) {
  const DeepSeekV4Config c = flash_config(43);
  const RooflineResult r = run(c, 1, 512);
  const RooflineEstimate& d = r.decode;
  EXPECT_NEAR(r.dense_weight_bytes * 1e-9, 7.76, 0.005);
  EXPECT_NEAR(row_bytes(d, "attention projections") * 1e-9, 4.60, 0.005);
  EXPECT_NEAR(row_bytes(d, "shared expert") * 1e-9, 1.08, 0.005);
  EXPECT_NEAR((row_bytes(d, "compressors") + row_bytes(d, "indexer")) * 1e-9, 0.80, 0.005);
  EXPECT_NEAR(row_bytes(d, "head") * 1e-9, 1.06, 0.005);
  EXPECT_NEAR(row_bytes(d, "gate") * 1e-9, 0.09, 0.005);
  EXPECT_NEAR(row_bytes(d, "mHC") * 1e-9, 0.14, 0.005);
  // Per layer: attention 106.96 MB, CSA extras 29.88 MB, HCA compressor 8.39 MB (+ about 10 KB of
  // norms and one `ape` row per token, which §13.1 leaves out).
  EXPECT_NEAR(row_bytes(d, "attention projections") / 43 * 1e-6, 106.96, 0.01);
  EXPECT_NEAR((row_bytes(d, "compressors") + row_bytes(d, "indexer") - 20 * 8.388608e6) / 21 * 1e-6,
              29.88, 0.02);
  EXPECT_NEAR(r.expert_bytes * 1e-6, 13.37, 0.005);
  EXPECT_DOUBLE_EQ(row_bytes(d, "embedding rows"), 4096.0 * 2);  // one BF16 row per token
  EXPECT_NEAR(r.routed_expert_bytes * 1e-9, 3.45, 0.005);
  EXPECT_NEAR(run(c, 16, 512).routed_expert_bytes * 1e-9, 46.46, 0.02);
  EXPECT_NEAR(run(c, 64, 512).routed_expert_bytes * 1e-9, 114.9, 0.05);
  // The rows add up and the dtype split covers the same bytes.
  double by_format = 0;
  for (const FormatBytes& f : r.decode_weight_bytes_by_format) by_format += f.bytes;
  EXPECT_NEAR(by_format, d.weight_bytes, 1.0);
  EXPECT_NEAR(d.weight_bytes,
              r.dense_weight_bytes + r.routed_expert_bytes + row_bytes(d, "embedding rows") +
                  row_bytes(d, "hash routing rows"),
              1.0);
  EXPECT_EQ(r.decode_weight_bytes_by_format.front().format, "FP8");  // 7.76 GB > 3.45 GB experts
  EXPECT_EQ(run(c, 16, 512).decode_weight_bytes_by_format.front().format, "MXFP4");
}

// §13.2: SWA 3.21 MB; L=512: 5.19 MB (minus 0.36 MB without the indexer); L=32768: 35.19 MB.
TEST(Roofline, FlashKvBytes) {
  const DeepSeekV4Config c = flash_config(43);
  const RooflineResult a = run(c, 1, 512);
  EXPECT_NEAR(row_bytes(a.decode, "KV: SWA ring") * 1e-6, 3.21, 0.005);
  // 21 x 128 x (584 + 132) = 1.9246 MB; the spec rounds to 1.93.
  EXPECT_NEAR(
      (row_bytes(a.decode, "KV: CSA compressed") + row_bytes(a.decode, "KV: indexer keys")) * 1e-6,
      21 * 128 * (584 + 132) * 1e-6, 1e-9);
  EXPECT_NEAR(
      (row_bytes(a.decode, "KV: CSA compressed") + row_bytes(a.decode, "KV: indexer keys")) * 1e-6,
      1.93, 0.006);
  EXPECT_NEAR(row_bytes(a.decode, "KV: HCA compressed") * 1e-6, 0.05, 0.005);
  EXPECT_NEAR(a.kv_bytes_per_sequence * 1e-6, 5.19, 0.005);
  // 21 x 128 x 132 = 0.3548 MB, "0.36 MB" in the spec.
  EXPECT_NEAR(row_bytes(a.decode, "KV: indexer keys") * 1e-6, 21 * 128 * 132 * 1e-6, 1e-9);
  const RooflineResult b = run(c, 1, 32768);
  EXPECT_NEAR(b.kv_bytes_per_sequence * 1e-6, 35.19, 0.005);
  EXPECT_NEAR(row_bytes(b.decode, "KV: CSA compressed") * 1e-6, 21 * 0.299008, 0.001);
  EXPECT_NEAR(row_bytes(b.decode, "KV: indexer keys") * 1e-6, 21 * 1.081344, 0.001);
  EXPECT_NEAR(row_bytes(b.decode, "KV: HCA compressed") * 1e-6, 2.99, 0.005);
  // KV is per sequence: B sequences read B times as much.
  EXPECT_NEAR(run(c, 16, 32768).decode.kv_bytes, 16 * b.kv_bytes_per_sequence, 1.0);

  RooflineRequest q;
  q.context = 512;
  q.skip_short_indexer = true;
  auto skipped = compute_roofline(c, q);
  ASSERT_TRUE(skipped.ok());
  EXPECT_NEAR((a.kv_bytes_per_sequence - skipped->kv_bytes_per_sequence) * 1e-6, 0.36, 0.006);
  q.context = 32768;  // L/4 > 512: the indexer runs
  auto kept = compute_roofline(c, q);
  ASSERT_TRUE(kept.ok());
  EXPECT_DOUBLE_EQ(kept->kv_bytes_per_sequence, b.kv_bytes_per_sequence);
}

// §13.3: linear 26.5 GFLOP per token; attention + indexer 1.13 (L=512) and 5.62 GFLOP (L=32K);
// B=64 at L=32K is 2.06 TFLOP per step; every §13.4 case is memory-bound by more than 10x.
TEST(Roofline, FlashFlops) {
  const DeepSeekV4Config c = flash_config(43);
  const RooflineResult a = run(c, 1, 512);
  EXPECT_NEAR(a.linear_flops_per_token * 1e-9, 26.5, 0.05);
  EXPECT_NEAR(a.attention_flops_per_token * 1e-9, 1.13, 0.005);
  const RooflineResult b = run(c, 64, 32768);
  EXPECT_NEAR(b.attention_flops_per_token * 1e-9, 5.62, 0.005);
  EXPECT_NEAR(b.decode.flops * 1e-12, 2.06, 0.01);
  const RooflineRow* idx = row(b.decode, "KV: indexer keys");
  ASSERT_NE(idx, nullptr);
  EXPECT_NEAR(idx->fp8_flops / 64 / 21 * 1e-6, 134.2, 0.1);  // 134 MFLOP/layer at 32K
  for (int64_t L : {512, 32768})
    for (int64_t B : {1, 16, 64}) {
      const RooflineResult r = run(c, B, L);
      EXPECT_GT(r.decode.memory_time_s, 10 * r.decode.compute_time_s) << B << " " << L;
      EXPECT_TRUE(r.decode.memory_bound());
    }
}

// §13.4: H200 at 4.8 TB/s, within 1%.
TEST(Roofline, FlashIdealTokensPerSecondH200) {
  const DeepSeekV4Config c = flash_config(43);
  struct Case {
    int64_t context, batch;
    double tok_s, step_ms;
  };
  const Case cases[] = {{512, 1, 428, 2.34},   {512, 16, 1414, 11.32},   {512, 64, 2497, 25.6},
                        {32768, 1, 427, 2.34}, {32768, 16, 1402, 11.42}, {32768, 64, 2459, 26.0}};
  for (const Case& k : cases) {
    const RooflineResult r = run(c, k.batch, k.context);
    EXPECT_NEAR(r.decode.tokens_per_s / k.tok_s, 1.0, 0.01)
        << "L=" << k.context << " B=" << k.batch << ": " << r.decode.tokens_per_s;
    EXPECT_NEAR(r.decode.floor_s * 1e3 / k.step_ms, 1.0, 0.01);
    EXPECT_DOUBLE_EQ(r.decode.tokens, double(k.batch));
  }
}

// §13.4: RTX PRO 6000 at the table's 1.7 TB/s: 152 / 501 / 885 and 151 / 496 / 871.
TEST(Roofline, FlashIdealTokensPerSecondRtxPro6000) {
  const DeepSeekV4Config c = flash_config(43);
  GpuSpec g = *find_gpu_preset("rtx-pro-6000");
  g.bandwidth_tb_s = 1.7;
  const double expect[2][3] = {{152, 501, 885}, {151, 496, 871}};
  const int64_t contexts[2] = {512, 32768}, batches[3] = {1, 16, 64};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      const RooflineResult r = run(c, batches[j], contexts[i], g);
      EXPECT_NEAR(r.decode.tokens_per_s / expect[i][j], 1.0, 0.01)
          << contexts[i] << " " << batches[j] << ": " << r.decode.tokens_per_s;
    }
}

// §13.4 caveat 3: one draft, B=1, a=0.7: about 15.9 GB per step and about 510 tok/s.
TEST(Roofline, FlashMtp) {
  const DeepSeekV4Config c = flash_config(43);
  RooflineRequest q;
  q.batch = 1;
  q.context = 512;
  q.mtp_draft_tokens = 1;
  q.mtp_acceptance = 0.7;
  auto r = compute_roofline(c, q);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_DOUBLE_EQ(r->decode.tokens, 1.7);
  EXPECT_DOUBLE_EQ(r->decode_tokens_verified, 2.0);
  EXPECT_NEAR(r->decode.bytes * 1e-9, 15.9, 0.1);
  EXPECT_NEAR(r->decode.tokens_per_s / 510, 1.0, 0.02);
  const double mtp = row_bytes(r->decode, "MTP layer") +
                     row_bytes(r->decode, "MTP routed experts") +
                     row_bytes(r->decode, "head (draft passes)");
  EXPECT_NEAR(mtp * 1e-9, 1.3, 0.05);
}

// The prefill closed forms equal the per-position sum of decode attention FLOPs (tiny config:
// window 16, topk 8, so every regime is crossed by T = 300).
TEST(Roofline, PrefillAttentionSumsMatchPerPosition) {
  const DeepSeekV4Config c = tiny_config();
  for (bool skip : {false, true}) {
    RooflineRequest q;
    q.skip_short_indexer = skip;
    double per_position = 0;
    for (int64_t p = 1; p <= 300; ++p) {
      q.context = p;
      auto r = compute_roofline(c, q);
      ASSERT_TRUE(r.ok());
      per_position += r->attention_flops_per_token;
    }
    q.context = 300;
    auto r = compute_roofline(c, q);
    ASSERT_TRUE(r.ok());
    double kv_flops = 0;
    for (const RooflineRow& row : r->prefill.rows)
      if (row.section == RooflineSection::kKvCache) kv_flops += row.flops();
    EXPECT_NEAR(kv_flops / per_position, 1.0, 1e-12) << "skip " << skip;
  }
}

// Flash prefill: all weights once (experts U(T) -> 256), head on the last token only,
// compute-bound for a long prompt.
TEST(Roofline, FlashPrefill) {
  const DeepSeekV4Config c = flash_config(43);
  RooflineRequest q;
  q.context = 512;
  q.prefill_tokens = 8192;
  auto r = compute_roofline(c, q);
  ASSERT_TRUE(r.ok());
  const RooflineEstimate& p = r->prefill;
  EXPECT_DOUBLE_EQ(p.tokens, 8192);
  EXPECT_NEAR(r->prefill_distinct_experts, 256.0, 1e-6);
  EXPECT_NEAR(row_bytes(p, "routed experts") * 1e-9, 147.2, 0.05);
  EXPECT_FALSE(p.memory_bound());
  const RooflineRow* head = row(p, "head");
  ASSERT_NE(head, nullptr);
  EXPECT_DOUBLE_EQ(head->flops(), 2.0 * 129280 * 4096);
  // 2 x (active - head) x T + head once + attention.
  const double linear = (r->linear_flops_per_token - 2.0 * 129280 * 4096) * 8192 + head->flops();
  double kv_flops = 0;
  for (const RooflineRow& row : p.rows)
    if (row.section == RooflineSection::kKvCache) kv_flops += row.flops();
  EXPECT_NEAR(p.flops / (linear + kv_flops), 1.0, 1e-9);
  EXPECT_NEAR(p.tokens_per_s, 8192 / p.floor_s, 1e-6);
}

TEST(Roofline, RejectsBadRequests) {
  const DeepSeekV4Config c = flash_config(43);
  RooflineRequest q;
  q.batch = 0;
  EXPECT_EQ(compute_roofline(c, q).status().code(), StatusCode::kInvalidArgument);
  q = {};
  q.context = 0;
  EXPECT_FALSE(compute_roofline(c, q).ok());
  q = {};
  q.prefill_tokens = -1;
  EXPECT_FALSE(compute_roofline(c, q).ok());
  q = {};
  q.gpu.bandwidth_tb_s = 0;
  EXPECT_NE(compute_roofline(c, q).status().message().find("bandwidth"), std::string::npos);
  q = {};
  q.gpu.fp8_tflops = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(compute_roofline(c, q).ok());
  q = {};
  q.mtp_draft_tokens = 1;
  q.mtp_acceptance = 1.5;
  EXPECT_FALSE(compute_roofline(c, q).ok());
  DeepSeekV4Config no_mtp = c;
  no_mtp.num_nextn_predict_layers = 0;
  no_mtp.compress_ratios.pop_back();
  q = {};
  q.mtp_draft_tokens = 1;
  EXPECT_FALSE(compute_roofline(no_mtp, q).ok());
}

TEST(Roofline, TinyPresetRuns) {
  const RooflineResult r = run(tiny_config(), 4, 100);
  EXPECT_GT(r.decode.tokens_per_s, 0);
  EXPECT_GT(r.prefill.tokens_per_s, 0);
  EXPECT_EQ(r.num_swa_layers + r.num_csa_layers + r.num_hca_layers, 4);
}

// What `deepserve roofline --preset flash --batch 16 --context 512` prints (the CLI writes this
// string as is) and what `--json` prints.
TEST(Roofline, CliReportLines) {
  const DeepSeekV4Config c = flash_config(43);
  const RooflineResult r = run(c, 16, 512);
  const std::string text = format_roofline_report(c, r, "preset flash");
  for (const char* line :
       {"model: preset flash (43 layers: 2 SWA + 21 CSA + 20 HCA; 256 routed experts, top-6, "
        "mxfp4 experts)\n",
        "gpu: h200 (4.80 TB/s, BF16 989 TFLOP/s, FP8 1979 TFLOP/s dense)\n",
        "decode step: batch 16, context 512\n", "ideal decode: 1414 tok/s", "memory-bound",
        "routed experts 46.47 GB (U(16) = 80.84 of 256 per layer x 13.37 MB)",
        "kv 82.97 MB: 5.19 MB per "
        "sequence\n",
        "\nprefill: 512 tokens"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n---\n" << text;
  const std::string js = roofline_to_json(c, r, "preset flash");
  const nlohmann::json j = nlohmann::json::parse(js);
  EXPECT_EQ(j["gpu"]["name"], "h200");
  EXPECT_EQ(j["request"]["batch"], 16);
  EXPECT_NEAR(j["decode"]["tokens_per_s"].get<double>(), 1414, 14);
  EXPECT_NEAR(j["decode"]["distinct_experts_per_layer"].get<double>(), 80.84, 0.01);
  EXPECT_TRUE(j["decode"]["rows"].is_array());
  EXPECT_EQ(j["decode"]["rows"][0]["component"], "embedding rows");
  EXPECT_TRUE(j["prefill"]["tokens_per_s"].is_number());
}

}  // namespace
}  // namespace ds
