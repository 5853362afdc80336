#!/usr/bin/env python3
"""Golden logits for the DeepSeek-V4 CPU forward in `hf` numerics, from transformers.

Runs on the GPU machine (transformers 5.17 with DeepseekV4ForCausalLM, torch 2.11; no network).
Input: a DeepSeek-V4 checkpoint directory in the published layout (config.json + safetensors,
DeepSeek-native names, FP8 e4m3 weights with ue8m0 128x128 block scales, MXFP4 routed experts),
normally the tiny model with a 1024-token vocabulary that the C++ test writes
(`DS_WRITE_GOLDEN_CHECKPOINT=DIR build/.../test_forward --gtest_filter=HfGolden.WriteCheckpoint`).

What it does (dsv4-model.md §2 "Golden tests in hf mode", §14, §16 items 9-10):
  1. reads config.json and every tensor itself (a tiny safetensors parser, numpy only), and
     dequantizes FP8 / MXFP4 / bf16 to fp32 exactly (W = e4m3 * 2^(s-127); e2m1 low nibble first
     * 2^(s-127) per 32); so transformers never sees a quantized weight and every activation stays
     fp32 (no fine-grained FP8 path, §16 item 10);
  2. maps the DeepSeek names onto transformers' names (docs/notes/hf_deepseek_v4_names.txt), fusing
     the routed experts into gate_up_proj [E, 2I, H] (w1 rows then w3 rows) and down_proj [E, H, I];
     skips mtp.* (transformers has no MTP layer);
  3. builds DeepseekV4Config with layer_types / mlp_layer_types derived from compress_ratios /
     num_hash_layers and the nested rope_parameters (main: plain theta; compress: YaRN with
     attention_factor 1.0), checks that the model's RoPE tables equal the reference formula
     (§7.3; any mismatch is reported and the reference table is installed);
  4. runs DeepseekV4ForCausalLM in fp32 (CPU by default: no TF32, deterministic) on several
     prompts (one of 320 tokens: 80 CSA entries > index_topk 8, 2 HCA entries, window wraps), with
     a cache-free full forward, and records the logits at a set of positions;
  5. greedy-decodes 32 tokens per prompt with repeated cache-free full forwards (the reference)
     and with generate() (dynamic cache, for information); records both and the top-1/top-2 logit
     margin of each step (a near-tie explains a divergence that is not an error).
  Exact ties in the indexer's top-k are broken toward the lower entry index, as the engine does
  (see install_lower_index_tie_break: torch.topk's tie order is unspecified, and the 4-head tiny
  indexer produces many exact-zero scores).

Output (small enough to commit): OUT.json (metadata, prompts, positions, continuations, probe
values that identify the checkpoint) and OUT_logits.bin (float32 little-endian, the recorded
logits row after row in the order the JSON lists them). Prints a summary.

Usage:
  python3 scripts/golden/make_hf_goldens.py --checkpoint DIR \
      --out tests/fixtures/golden/dsv4_tiny_hf [--device cpu|cuda]
"""
import argparse
import hashlib
import json
import math
import os
import struct
import sys

import numpy as np

# ---------------------------------------------------------------------------------------------
# safetensors reading and exact dequantization (numpy only)


def read_safetensors(path):
    """Returns {name: (dtype_string, shape, raw bytes as a numpy uint8 array)}."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], np.frombuffer(data, np.uint8, end - begin, base + begin))
    return out


def load_checkpoint_tensors(ckpt_dir):
    index_path = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(ckpt_dir, "model.safetensors")):
        shards = ["model.safetensors"]
    else:
        shards = sorted(p for p in os.listdir(ckpt_dir) if p.endswith(".safetensors"))
    tensors = {}
    for shard in shards:
        tensors.update(read_safetensors(os.path.join(ckpt_dir, shard)))
    return tensors


def e4m3_table():
    table = np.zeros(256, np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp = (b >> 3) & 0xF
        man = b & 0x7
        if exp == 0xF and man == 0x7:
            table[b] = np.nan
        elif exp == 0:
            table[b] = sign * (man / 8.0) * 2.0 ** -6
        else:
            table[b] = sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return table


E4M3 = e4m3_table()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e8m0(raw):
    return np.ldexp(np.float32(1.0), raw.astype(np.int32) - 127).astype(np.float32)


def plain_f32(entry):
    dtype, shape, raw = entry
    if dtype == "F32":
        return raw.view(np.float32).reshape(shape).copy()
    if dtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype == "I64":
        return raw.view(np.int64).reshape(shape).copy()
    raise ValueError(f"unexpected plain dtype {dtype}")


def dequant_fp8(weight, scale):
    _, (rows, cols), raw = weight
    w = E4M3[raw].reshape(rows, cols)
    s = e8m0(scale[2]).reshape(scale[1])
    s_full = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:rows, :cols]
    return (w * s_full).astype(np.float32)


def dequant_mxfp4(weight, scale):
    _, (rows, half), raw = weight
    b = raw.reshape(rows, half)
    codes = np.empty((rows, 2 * half), np.uint8)
    codes[:, 0::2] = b & 0xF  # element 2j: low nibble (REF convert.py)
    codes[:, 1::2] = b >> 4
    s = e8m0(scale[2]).reshape(rows, (2 * half) // 32)
    return (E2M1[codes] * np.repeat(s, 32, axis=1)).astype(np.float32)


def dequant_linear(tensors, base):
    weight = tensors[base + ".weight"]
    dtype = weight[0]
    if dtype == "F8_E4M3":
        return dequant_fp8(weight, tensors[base + ".scale"])
    if dtype in ("I8", "U8") and base + ".scale" in tensors:
        return dequant_mxfp4(weight, tensors[base + ".scale"])
    if dtype in ("BF16", "F32"):
        return plain_f32(weight)
    raise ValueError(f"{base}: unsupported weight format {dtype} (NVFP4 / FP8-f32 experts)")


# ---------------------------------------------------------------------------------------------
# checkpoint -> transformers names


def hf_state_dict(tensors, cfg):
    sd = {}
    sd["model.embed_tokens.weight"] = plain_f32(tensors["embed.weight"])
    sd["lm_head.weight"] = plain_f32(tensors["head.weight"])
    sd["model.norm.weight"] = plain_f32(tensors["norm.weight"])
    sd["model.hc_head.hc_fn"] = plain_f32(tensors["hc_head_fn"])
    sd["model.hc_head.hc_base"] = plain_f32(tensors["hc_head_base"])
    sd["model.hc_head.hc_scale"] = plain_f32(tensors["hc_head_scale"])
    n_layers = cfg["num_hidden_layers"]
    for l in range(n_layers):
        src, dst = f"layers.{l}.", f"model.layers.{l}."
        for site in ("attn", "ffn"):
            for part in ("fn", "base", "scale"):
                sd[f"{dst}{site}_hc.{part}"] = plain_f32(tensors[f"{src}hc_{site}_{part}"])
        sd[dst + "input_layernorm.weight"] = plain_f32(tensors[src + "attn_norm.weight"])
        sd[dst + "post_attention_layernorm.weight"] = plain_f32(tensors[src + "ffn_norm.weight"])
        a, h = src + "attn.", dst + "self_attn."
        sd[h + "sinks"] = plain_f32(tensors[a + "attn_sink"])
        sd[h + "q_a_proj.weight"] = dequant_linear(tensors, a + "wq_a")
        sd[h + "q_a_norm.weight"] = plain_f32(tensors[a + "q_norm.weight"])
        sd[h + "q_b_proj.weight"] = dequant_linear(tensors, a + "wq_b")
        sd[h + "kv_proj.weight"] = dequant_linear(tensors, a + "wkv")
        sd[h + "kv_norm.weight"] = plain_f32(tensors[a + "kv_norm.weight"])
        sd[h + "o_a_proj.weight"] = dequant_linear(tensors, a + "wo_a")
        sd[h + "o_b_proj.weight"] = dequant_linear(tensors, a + "wo_b")
        ratio = cfg["compress_ratios"][l]
        if ratio:
            c, hc = a + "compressor.", h + "compressor."
            sd[hc + "position_bias"] = plain_f32(tensors[c + "ape"])
            sd[hc + "kv_proj.weight"] = dequant_linear(tensors, c + "wkv")
            sd[hc + "gate_proj.weight"] = dequant_linear(tensors, c + "wgate")
            sd[hc + "kv_norm.weight"] = plain_f32(tensors[c + "norm.weight"])
        if ratio == 4:
            i, hi = a + "indexer.", h + "compressor.indexer."
            sd[hi + "position_bias"] = plain_f32(tensors[i + "compressor.ape"])
            sd[hi + "kv_proj.weight"] = dequant_linear(tensors, i + "compressor.wkv")
            sd[hi + "gate_proj.weight"] = dequant_linear(tensors, i + "compressor.wgate")
            sd[hi + "kv_norm.weight"] = plain_f32(tensors[i + "compressor.norm.weight"])
            sd[hi + "q_b_proj.weight"] = dequant_linear(tensors, i + "wq_b")
            sd[hi + "scorer.weights_proj.weight"] = dequant_linear(tensors, i + "weights_proj")
        f, m = src + "ffn.", dst + "mlp."
        sd[m + "gate.weight"] = dequant_linear(tensors, f + "gate")
        if l < cfg["num_hash_layers"]:
            sd[m + "gate.tid2eid"] = plain_f32(tensors[f + "gate.tid2eid"]).astype(np.int64)
        else:
            sd[m + "gate.e_score_correction_bias"] = plain_f32(tensors[f + "gate.bias"])
        gate_up, down = [], []
        for e in range(cfg["n_routed_experts"]):
            w1 = dequant_linear(tensors, f"{f}experts.{e}.w1")
            w3 = dequant_linear(tensors, f"{f}experts.{e}.w3")
            gate_up.append(np.concatenate([w1, w3], axis=0))  # chunk(2): gate first, then up
            down.append(dequant_linear(tensors, f"{f}experts.{e}.w2"))
        sd[m + "experts.gate_up_proj"] = np.stack(gate_up)
        sd[m + "experts.down_proj"] = np.stack(down)
        sd[m + "shared_experts.gate_proj.weight"] = dequant_linear(tensors, f + "shared_experts.w1")
        sd[m + "shared_experts.up_proj.weight"] = dequant_linear(tensors, f + "shared_experts.w3")
        sd[m + "shared_experts.down_proj.weight"] = dequant_linear(tensors, f + "shared_experts.w2")
    return sd


LAYER_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def hf_config(cfg):
    from transformers import DeepseekV4Config

    n = cfg["num_hidden_layers"]
    rs = cfg.get("rope_scaling") or {}
    prf = cfg["qk_rope_head_dim"] / cfg["head_dim"]
    factor = float(rs.get("factor", 1.0))
    orig = int(rs.get("original_max_position_embeddings", cfg["max_position_embeddings"]))
    compress = {"rope_type": "default", "rope_theta": float(cfg["compress_rope_theta"]),
                "partial_rotary_factor": prf}
    if rs:
        compress.update({"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig,
                         "beta_fast": float(rs.get("beta_fast", 32)), "beta_slow": float(rs.get("beta_slow", 1)),
                         "attention_factor": 1.0})
    kwargs = dict(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], num_hidden_layers=n,
        num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"], q_lora_rank=cfg["q_lora_rank"], o_groups=cfg["o_groups"],
        o_lora_rank=cfg["o_lora_rank"], sliding_window=cfg["sliding_window"],
        index_n_heads=cfg["index_n_heads"], index_head_dim=cfg["index_head_dim"], index_topk=cfg["index_topk"],
        n_routed_experts=cfg["n_routed_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
        n_shared_experts=cfg["n_shared_experts"], moe_intermediate_size=cfg["moe_intermediate_size"],
        scoring_func=cfg.get("scoring_func", "sqrtsoftplus"), norm_topk_prob=True,
        routed_scaling_factor=cfg["routed_scaling_factor"], swiglu_limit=cfg["swiglu_limit"],
        hc_mult=cfg["hc_mult"], hc_sinkhorn_iters=cfg["hc_sinkhorn_iters"], hc_eps=cfg["hc_eps"],
        rms_norm_eps=cfg["rms_norm_eps"], rope_theta=float(cfg["rope_theta"]),
        compress_rope_theta=float(cfg["compress_rope_theta"]), partial_rotary_factor=prf,
        # Some transformers revisions derive the YaRN factor as max_position_embeddings /
        # original_max_position_embeddings; make that ratio equal the configured factor.
        max_position_embeddings=int(round(factor * orig)) if rs else cfg["max_position_embeddings"],
        layer_types=[LAYER_TYPE[r] for r in cfg["compress_ratios"][:n]],
        mlp_layer_types=["hash_moe" if l < cfg["num_hash_layers"] else "moe" for l in range(n)],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        rope_parameters={"main": {"rope_type": "default", "rope_theta": float(cfg["rope_theta"]),
                                  "partial_rotary_factor": prf},
                         "compress": compress},
        num_nextn_predict_layers=cfg.get("num_nextn_predict_layers", 1),
        tie_word_embeddings=False, bos_token_id=cfg.get("bos_token_id", 0), eos_token_id=cfg.get("eos_token_id", 1),
        attention_bias=False, mlp_bias=False, hidden_act="silu",
    )
    return DeepseekV4Config(**kwargs)


def reference_inv_freq(cfg, compressed):
    """REF precompute_freqs_cis in fp32 (dsv4-model.md §7.3)."""
    dim = cfg["qk_rope_head_dim"]
    theta = float(cfg["compress_rope_theta"] if compressed else cfg["rope_theta"])
    inv = (1.0 / np.power(theta, np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))).astype(np.float32)
    rs = cfg.get("rope_scaling") or {}
    if not compressed or not rs:
        return inv
    orig, factor = rs["original_max_position_embeddings"], rs["factor"]

    def cd(n):
        return dim * math.log(orig / (n * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(cd(rs.get("beta_fast", 32))), 0)
    high = min(math.ceil(cd(rs.get("beta_slow", 1))), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    smooth = 1 - ramp
    return (inv / np.float32(factor) * (1 - smooth) + inv * smooth).astype(np.float32)


def check_rope(model, cfg, torch):
    """Compares every `<type>_inv_freq` buffer with the reference table; installs the reference
    table where they differ. Returns a list of report lines."""
    want = {"main": reference_inv_freq(cfg, False), "compress": reference_inv_freq(cfg, True)}
    report = []
    for name, buf in model.named_buffers():
        for kind in ("main", "compress"):
            if name.endswith(f"{kind}_inv_freq"):
                have = buf.detach().cpu().numpy()
                ref = want[kind]
                err = float(np.max(np.abs(have - ref) / np.abs(ref))) if have.shape == ref.shape else float("inf")
                if err > 1e-6:
                    report.append(f"{name}: max rel diff {err:.3g} from the reference table; replaced")
                    buf.copy_(torch.from_numpy(ref).to(buf.device, buf.dtype))
                elif buf.dtype == torch.float64:
                    # fp64 diagnostic runs: keep the reference fp32 table values exactly.
                    buf.copy_(torch.from_numpy(ref).to(buf.device, buf.dtype))
    return report


# ---------------------------------------------------------------------------------------------


def install_lower_index_tie_break(model, topk):
    """Makes transformers' indexer top-k break exact ties toward the lower entry index, the rule
    of the engine (cpu::topk_indices; dsv4-model.md §7.7 says ties do not matter, so both are
    valid, but torch.topk's tie order is unspecified). With only 4 indexer heads, whose weights
    can be negative, many entries score exactly 0 (every head's ReLU at 0), so ties at the k-th
    place are common in the tiny model. The hook subtracts index * 1e-30 from the scores: zero
    scores become ordered by index, and every nonzero score (|s| >> 1e-22) keeps its fp32 value.
    Returns a list that collects the number of ambiguous selections seen (for the report)."""
    import torch

    ambiguous = []

    def hook(module, inputs, scores):  # [B, S, T]
        b, s_len, t_len = scores.shape
        if t_len > topk:
            top = torch.topk(scores.double(), topk + 1, dim=-1).values
            ambiguous.append(int((top[..., topk - 1] == top[..., topk]).sum()))
        bias = torch.arange(t_len, device=scores.device, dtype=scores.dtype) * 1e-30
        return scores - bias

    for layer in model.model.layers:
        comp = layer.self_attn.compressor
        if comp is not None and hasattr(comp, "indexer"):
            comp.indexer.scorer.register_forward_hook(hook)
    return ambiguous


def lcg_tokens(n, seed, vocab):
    out, s = [], seed
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(2 + (s >> 33) % (vocab - 2))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True, help="output path prefix (writes PREFIX.json, PREFIX_logits.bin)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                    help="model dtype (float64: a diagnostic run that shows how much of a difference "
                         "is fp32 rounding; the committed fixture is float32)")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import DeepseekV4ForCausalLM

    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)

    with open(os.path.join(args.checkpoint, "config.json")) as f:
        cfg = json.load(f)
    tensors = load_checkpoint_tensors(args.checkpoint)
    sd = hf_state_dict(tensors, cfg)

    config = hf_config(cfg)
    config._attn_implementation = "eager"
    # The plain per-expert loop (the default grouped_mm backend has no float64 kernel, and the
    # eager loop is the readable reference).
    config._experts_implementation = "eager"
    dtype = getattr(torch, args.dtype)
    model = DeepseekV4ForCausalLM(config).to(dtype)
    model.eval()
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(np.ascontiguousarray(v)) if v.dtype == np.int64
         else torch.from_numpy(np.ascontiguousarray(v)).to(dtype) for k, v in sd.items()}, strict=False)
    if unexpected:
        sys.exit(f"unexpected keys (name mapping is wrong): {unexpected[:10]}")
    if missing:
        sys.exit(f"missing keys (parameters left at random init): {missing[:10]}")
    if model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
        sys.exit("lm_head is tied to embed_tokens; tie_word_embeddings must be false")
    rope_report = check_rope(model, cfg, torch)
    model.to(args.device)

    vocab = cfg["vocab_size"]
    topk = cfg["index_topk"]
    ties = install_lower_index_tie_break(model, topk)
    # A 320-token prompt gives 80 CSA entries (> index_topk 8) and 2 HCA entries; 130 crosses the
    # first HCA entry; 40 the start of real top-k selection; 5 starts with BOS.
    prompts = [
        {"name": "long_320", "tokens": lcg_tokens(320, 1, vocab)},
        {"name": "hca_boundary_130", "tokens": lcg_tokens(130, 2, vocab)},
        {"name": "short_40", "tokens": lcg_tokens(40, 3, vocab)},
        {"name": "bos_5", "tokens": [cfg.get("bos_token_id", 0)] + lcg_tokens(4, 4, vocab)},
    ]
    interesting = [0, 1, 2, 3, 4, 5, 7, 15, 16, 17, 31, 34, 35, 36, 63, 64, 100, 126, 127, 128, 129,
                   150, 200, 255, 256, 299, 300, 319]
    logits_rows, summary = [], []
    with torch.no_grad():
        for p in prompts:
            ties.clear()
            ids = torch.tensor([p["tokens"]], device=args.device)
            n = len(p["tokens"])
            logits = model(input_ids=ids, use_cache=False).logits[0].float().cpu().numpy()
            positions = sorted(set([q for q in interesting if q < n] + [n - 1]))
            p["positions"] = positions
            p["logits_row_offset"] = len(logits_rows)
            p["topk_ties_broken"] = sum(ties)
            for q in positions:
                logits_rows.append(logits[q].astype(np.float32))
            # Greedy continuation with cache-free full forwards (top-2 margin of each step) ...
            seq = list(p["tokens"])
            greedy, margins = [], []
            for _ in range(args.new_tokens):
                last = model(input_ids=torch.tensor([seq], device=args.device), use_cache=False).logits[0, -1]
                top2 = torch.topk(last.float(), 2)
                greedy.append(int(top2.indices[0]))
                margins.append(float(top2.values[0] - top2.values[1]))
                seq.append(greedy[-1])
            p["greedy_full_forward"] = greedy
            p["greedy_margins"] = margins
            # ... and with generate() (transformers' dynamic cache).
            gen = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False,
                                 min_new_tokens=args.new_tokens, pad_token_id=cfg.get("eos_token_id", 1))
            p["greedy_generate"] = gen[0, n:].tolist()
            agree = p["greedy_generate"] == greedy
            summary.append(f"{p['name']}: {n} tokens, {len(positions)} logit rows, rms logit "
                           f"{float(np.sqrt(np.mean(logits ** 2))):.4f}, top-k ties broken {p['topk_ties_broken']}, "
                           f"min greedy margin {min(margins):.3g}, generate() == full-forward greedy: {agree}")

    probes = {
        "embed.weight[5][:8]": plain_f32(tensors["embed.weight"])[5, :8].tolist(),
        "head.weight[7][:8]": plain_f32(tensors["head.weight"])[7, :8].tolist(),
        "layers.1.attn.wq_a[3][:8]": dequant_linear(tensors, "layers.1.attn.wq_a")[3, :8].tolist(),
        "layers.2.ffn.experts.3.w2[0][:8]": dequant_linear(tensors, "layers.2.ffn.experts.3.w2")[0, :8].tolist(),
    }
    with open(os.path.join(args.checkpoint, "config.json"), "rb") as f:
        config_sha = hashlib.sha256(f.read()).hexdigest()
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    bin_path = args.out + "_logits.bin"
    np.stack(logits_rows).astype("<f4").tofile(bin_path)
    meta = {
        "format": "deepserve hf goldens v1",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "device": args.device,
        "dtype": args.dtype,
        "config_sha256": config_sha,
        "vocab_size": vocab,
        "probes": probes,
        "rope_report": rope_report,
        "logits_file": os.path.basename(bin_path),
        "num_logit_rows": len(logits_rows),
        "prompts": prompts,
    }
    with open(args.out + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {args.device}")
    print("rope:", "reference tables" if not rope_report else "; ".join(rope_report))
    for line in summary:
        print(line)
    print(f"wrote {args.out}.json and {bin_path} ({os.path.getsize(bin_path)} bytes)")


if __name__ == "__main__":
    main()
