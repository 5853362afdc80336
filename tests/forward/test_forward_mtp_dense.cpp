// An independent check of the MTP layer (dsv4-model.md §9), which transformers does not have:
// the draft logits of Forward::run_mtp in hf numerics (fp32, no simulations) against a
// straightforward non-incremental implementation written here: the input combination
// e_proj(enorm(embed[next])) + h_proj(hnorm(X)) per stream, then the MTP block with dense causal
// attention computed in double precision over all earlier tokens (the sequence is shorter than
// the window, so every earlier token is a key), the sink, the inverse RoPE, and the MTP head.
// mHC, MoE and the linears reuse the kernels (tested on their own in tests/kernels); what this
// test checks is the wiring. Tolerance 1e-4 on logits of rms ~0.3: the two sides differ only in
// the attention's summation order and precision.
#include <gtest/gtest.h>

#include <cmath>

#include "forward_test_util.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/output_projection.h"
#include "kernels/cpu/rope.h"

namespace ds::dsv4::test {
namespace {

using Vec = std::vector<float>;

Vec linear(const Vec& x, int64_t rows, const cpu::LinearWeight& w) {
  Vec y(static_cast<size_t>(rows * w.out_features));
  cpu::linear(x.data(), rows, w, false, y.data());
  return y;
}

Vec rms(const Vec& x, int64_t rows, int64_t dim, const float* weight) {
  Vec y(x.size());
  cpu::rms_norm(x.data(), weight, rows, dim, 1e-6f, y.data());
  return y;
}

TEST(MtpDense, DraftLogitsMatchADenseImplementation) {
  const ModelWeights& w = tiny_model();
  const DeepSeekV4Config& c = w.config();
  const Forward f(&w, ForwardOptions::for_mode(cpu::NumericsMode::kHf));
  const int64_t n = 11, D = c.hidden_size, hc = c.hc_mult, H = c.num_attention_heads;
  const int64_t hd = c.head_dim, rd = c.qk_rope_head_dim;
  ASSERT_LE(n, c.sliding_window);
  const auto tokens = random_tokens(n + 1, 21);

  // Main model streams of positions 0..n-1, then the engine's MTP draft logits.
  SequenceState s = f.new_sequence();
  SequenceChunk chunk;
  chunk.state = &s;
  chunk.tokens = std::span<const int32_t>(tokens.data(), size_t(n));
  for (int64_t r = 0; r < n; ++r) chunk.logit_rows.push_back(r);
  std::vector<ChunkOutput> out;
  ASSERT_TRUE(f.run(std::span<SequenceChunk>(&chunk, 1), &out, true).ok());
  const Vec streams = out[0].streams;  // [n, hc, D]
  MtpChunk m;
  m.state = &s;
  m.streams = streams;
  m.next_tokens = std::span<const int32_t>(tokens.data() + 1, size_t(n));
  for (int64_t r = 0; r < n; ++r) m.logit_rows.push_back(r);
  std::vector<ChunkOutput> draft;
  ASSERT_TRUE(f.run_mtp(std::span<MtpChunk>(&m, 1), &draft).ok());

  // ---- the dense implementation ----
  const MtpWeights& M = w.mtp[0];
  const LayerWeights& L = M.block;
  Vec e(static_cast<size_t>(n * D));
  for (int64_t i = 0; i < n; ++i) {
    cpu::dequantize_weight_row(w.embed, tokens[size_t(i + 1)], e.data() + i * D);
  }
  const Vec ep = linear(rms(e, n, D, M.enorm.data()), n, M.e_proj);                  // [n, D]
  const Vec hp = linear(rms(streams, n * hc, D, M.hnorm.data()), n * hc, M.h_proj);  // [n*hc, D]
  Vec x(static_cast<size_t>(n * hc * D));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t d = 0; d < D; ++d)
        x[size_t((i * hc + k) * D + d)] = ep[size_t(i * D + d)] + hp[size_t((i * hc + k) * D + d)];

  cpu::MhcConfig mc;
  mc.hc_mult = hc;
  mc.dim = D;
  mc.sinkhorn_iters = c.hc_sinkhorn_iters;
  mc.hc_eps = float(c.hc_eps);
  mc.norm_eps = float(c.rms_norm_eps);
  Vec u(static_cast<size_t>(n * D)), post(static_cast<size_t>(n * hc)),
      comb(static_cast<size_t>(n * hc * hc)), x2(x.size());

  // Attention site: dense causal attention with sink (SWA-only layer, plain RoPE table).
  cpu::mhc_pre(mc, L.hc_attn, x.data(), n, u.data(), post.data(), comb.data());
  const Vec h = rms(u, n, D, L.attn_norm.data());
  const Vec qr = rms(linear(h, n, L.wq_a), n, c.q_lora_rank, L.q_norm.data());
  Vec q = rms(linear(qr, n, L.wq_b), n * H, hd, nullptr);  // per-head unweighted norm
  Vec kv = rms(linear(h, n, L.wkv), n, hd, L.kv_norm.data());
  for (int64_t i = 0; i < n; ++i) {
    cpu::rope_rotate(q.data() + i * H * hd, H, hd, rd, L.inv_freq.data(), i,
                     cpu::RopeDirection::kForward);
    cpu::rope_rotate(kv.data() + i * hd, 1, hd, rd, L.inv_freq.data(), i,
                     cpu::RopeDirection::kForward);
  }
  Vec o(static_cast<size_t>(n * H * hd), 0.0f);
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t hh = 0; hh < H; ++hh) {
      std::vector<double> sc(static_cast<size_t>(t + 1));
      double mx = -1e300;
      for (int64_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < hd; ++d)
          dot += double(q[size_t((t * H + hh) * hd + d)]) * double(kv[size_t(j * hd + d)]);
        sc[size_t(j)] = dot * scale;
        mx = std::max(mx, sc[size_t(j)]);
      }
      double den = std::exp(double(L.attn_sink[hh]) - mx);
      for (auto& v : sc) den += (v = std::exp(v - mx));
      for (int64_t d = 0; d < hd; ++d) {
        double acc = 0;
        for (int64_t j = 0; j <= t; ++j) acc += sc[size_t(j)] * double(kv[size_t(j * hd + d)]);
        o[size_t((t * H + hh) * hd + d)] = float(acc / den);
      }
    }
    cpu::rope_rotate(o.data() + t * H * hd, H, hd, rd, L.inv_freq.data(), t,
                     cpu::RopeDirection::kInverse);
  }
  Vec a(static_cast<size_t>(n * D));
  cpu::output_projection(o.data(), n, c.o_groups, L.wo_a, L.wo_b, false, false, a.data());
  cpu::mhc_post(mc, a.data(), x.data(), post.data(), comb.data(), n, x2.data());
  x.swap(x2);

  // MoE site (learned routing, hf numerics: shared expert clamped, router epsilon 1e-20).
  cpu::mhc_pre(mc, L.hc_ffn, x.data(), n, u.data(), post.data(), comb.data());
  const Vec g = rms(u, n, D, L.ffn_norm.data());
  cpu::MoeParams mp;
  mp.router_config = {c.n_routed_experts, c.num_experts_per_tok, float(c.routed_scaling_factor),
                      1e-20f};
  mp.router.gate = L.gate;
  mp.router.bias = L.gate_bias;
  mp.experts = L.experts.data();
  mp.shared = L.shared;
  mp.swiglu_limit = float(c.swiglu_limit);
  mp.shared_expert_clamp = true;
  mp.quantize_activations = false;
  mp.round_bf16 = false;
  Vec ffn(static_cast<size_t>(n * D));
  cpu::moe_forward(mp, g.data(), nullptr, n, ffn.data());
  cpu::mhc_post(mc, ffn.data(), x.data(), post.data(), comb.data(), n, x2.data());
  x.swap(x2);

  // MTP head: its own hc_head and norm, the shared head.
  Vec y(static_cast<size_t>(n * D));
  cpu::mhc_head(mc, M.hc_head, x.data(), n, y.data());
  const Vec logits = linear(rms(y, n, D, M.norm.data()), n, w.head);

  double max_diff = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(logits[i] - draft[0].logits[i])));
  }
  std::printf("[ mtp    ] draft logits vs dense implementation: max |d| %.3g\n", max_diff);
  EXPECT_LE(max_diff, 1e-4);
}

}  // namespace
}  // namespace ds::dsv4::test
