"""Trains the embedded tiny DeepSeek-V4 (dsv4.py, config.json = the `tiny` preset) on the Brown
corpus tokens from prep_data.py. Next-token loss on the main model + next-next-token loss on the
MTP layer (weight --mtp-weight) + the indexer distillation loss (--indexer-weight); aux-loss-free
load balancing of the learned routers (gate bias += gamma * sign(mean load - load)); fixed seed.

Vocabulary: token ids seen >= --min-count times in train get rows; all other ids share one
trained row (embed and head; the exported checkpoint copies it into each of their rows), and the
softmax counts every one of them (dsv4.DSV4.nll). Hash routing uses the
tokenizer ids with a fixed random tid2eid table over the full vocabulary.

Writes under --out: weights-NN.safetensors (master weights under the published names, bf16 except
the tensors the checkpoint stores as F32, in shards of <= --shard-mib that merge_weights.py joins;
embed/head hold the used rows + the shared row last, `vocab_ids` lists the used rows' token ids,
tid2eid tables are U8), loss.json (loss curve, held-out perplexity, MTP acceptance), config.json.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4  # noqa: E402
import st  # noqa: E402


def make_tid2eid(vocab, experts, k, seed):
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((vocab, experts)), axis=1)[:, :k].astype(np.int64)


@torch.no_grad()
def evaluate(model, held_model_ids, held_ids, T, device, max_seqs=None, bs=16):
    """Non-overlapping T-token sequences from offset 0, each from position 0, like
    `deepserve eval-checkpoint`: main NLL over T-1 targets, MTP NLL over T-2 targets."""
    S = len(held_ids) // T
    if max_seqs:
        S = min(S, max_seqs)
    tot = {"main_nll": 0.0, "main_n": 0, "main_hit": 0, "mtp_nll": 0.0, "mtp_n": 0, "mtp_hit": 0,
           "mtp_agree": 0}
    model.eval()
    for s0 in range(0, S, bs):
        s1 = min(S, s0 + bs)
        x = torch.from_numpy(held_model_ids[s0 * T:s1 * T].reshape(-1, T)).to(device)
        h = torch.from_numpy(held_ids[s0 * T:s1 * T].reshape(-1, T).astype(np.int64)).to(device)
        logits, mtp = model(x, hash_ids=h)
        # Targets in model ids; the last row stands for every other id.
        nll = model.nll(logits[:, :-1], x[:, 1:])
        am = logits.argmax(-1)
        tot["main_nll"] += nll.sum().item()
        tot["main_n"] += nll.numel()
        tot["main_hit"] += (am[:, :-1] == x[:, 1:]).sum().item()
        mn = model.nll(mtp[:, :-1], x[:, 2:])
        mam = mtp[:, :-1].argmax(-1)
        tot["mtp_nll"] += mn.sum().item()
        tot["mtp_n"] += mn.numel()
        tot["mtp_hit"] += (mam == x[:, 2:]).sum().item()
        tot["mtp_agree"] += (mam == am[:, 1:-1]).sum().item()
    model.train()
    n, m = tot["main_n"], tot["mtp_n"]
    return {"sequences": S, "main_nll": tot["main_nll"] / n, "main_ppl": math.exp(tot["main_nll"] / n),
            "main_top1": tot["main_hit"] / n, "mtp_nll": tot["mtp_nll"] / m,
            "mtp_ppl": math.exp(tot["mtp_nll"] / m), "mtp_top1_vs_text": tot["mtp_hit"] / m,
            "mtp_accept_vs_main_greedy": tot["mtp_agree"] / m}


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--data", required=True)
    ap.add_argument("--config", default=os.path.join(here, "config.json"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--indexer-weight", type=float, default=0.1)
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--min-count", type=int, default=5)
    ap.add_argument("--time-budget", type=float, default=200.0, help="training seconds")
    ap.add_argument("--max-steps", type=int, default=1 << 30)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-seqs", type=int, default=64)
    ap.add_argument("--cpu-eval-seqs", type=int, default=32,
                    help="the held-out prefix also measured by deepserve eval-checkpoint")
    ap.add_argument("--shard-mib", type=float, default=15.0)
    ap.add_argument("--master-dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--final-eval-seqs", type=int, default=0, help="0 = the whole held-out split")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bf16", action="store_true", help="autocast matmuls to bf16 (CUDA)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="residual-branch dropout while training (run 1 had none and overfit)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    t_start = time.time()
    cfg = json.load(open(a.config))
    full_vocab = cfg["vocab_size"]
    train_ids = np.fromfile(os.path.join(a.data, "train.u32"), np.uint32)
    held_ids = np.fromfile(os.path.join(a.data, "heldout.u32"), np.uint32)
    counts = np.bincount(train_ids, minlength=full_vocab)
    vocab_ids = np.nonzero(counts >= a.min_count)[0].astype(np.uint32)
    Vp = len(vocab_ids) + 1  # + the shared row of all other ids
    to_model = np.full(full_vocab, Vp - 1, np.int64)
    to_model[vocab_ids] = np.arange(len(vocab_ids))
    train_m = to_model[train_ids]
    held_m = to_model[held_ids]
    device = torch.device(a.device)
    model = dsv4.DSV4(cfg, vocab_ids=list(range(Vp)))
    model.unused_vocab = full_vocab - Vp  # copies of the shared row beyond the one in the logits
    model.init_random(a.seed)
    model.dropout = a.dropout
    tables = {}
    for l in range(min(cfg["num_hash_layers"], cfg["num_hidden_layers"])):
        t = make_tid2eid(full_vocab, cfg["n_routed_experts"], cfg["num_experts_per_tok"], a.seed + 17 * (l + 1))
        tables[l] = t
        getattr(model, f"tid2eid_{l}").copy_(torch.from_numpy(t))
    model.to(device)
    decay, no_decay = [], []
    for name, p in model.params.items():
        (decay if p.dim() == 2 and not name.endswith("_fn") else no_decay).append(p)
    biases = [model.P(n) for n in model.shapes if n.endswith("gate.bias")]
    no_decay = [p for p in no_decay if all(p is not b for b in biases)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    for b in biases:
        b.requires_grad_(False)
    gen = np.random.default_rng(a.seed)
    T, B = a.seq_len, a.batch
    tr_m = torch.from_numpy(train_m).to(device)
    tr_h = torch.from_numpy(train_ids.astype(np.int64)).to(device)
    log = {"args": vars(a), "vocab_rows": int(len(vocab_ids)), "train_tokens": int(train_ids.size),
           "heldout_tokens": int(held_ids.size),
           "train_coverage": float(np.isin(train_ids, vocab_ids).mean()),
           "heldout_coverage": float(np.isin(held_ids, vocab_ids).mean()),
           "params": int(sum(p.numel() for p in model.parameters())), "curve": [], "evals": []}
    print(json.dumps({k: v for k, v in log.items() if k not in ("curve", "evals", "args")}), flush=True)
    best = (float("inf"), None)
    step, t0 = 0, time.time()
    ema = None
    while step < a.max_steps:
        el = time.time() - t0
        frac = min(1.0, el / a.time_budget)
        if frac >= 1.0:
            break
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.from_numpy(gen.integers(0, len(train_m) - T - 1, B)).to(device)
        idx = starts[:, None] + torch.arange(T + 1, device=device)[None]
        xs, hs = tr_m[idx], tr_h[idx]
        x, h = xs[:, :T], hs[:, :T]
        aux, loads = [], {}
        if a.bf16 and device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits, mtp = model(x, aux=aux, loads=loads, hash_ids=h)
        else:
            logits, mtp = model(x, aux=aux, loads=loads, hash_ids=h)
        main = model.nll(logits, xs[:, 1:T + 1]).mean()
        mtpl = model.nll(mtp, xs[:, 2:T + 1]).mean()
        idxl = sum(aux) / max(1, len(aux))
        loss = main + a.mtp_weight * mtpl + a.indexer_weight * idxl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for pfx, ld in loads.items():
                bias = model.P(pfx + "ffn.gate.bias")
                bias.add_(a.bias_gamma * torch.sign(ld.mean() - ld))
        step += 1
        if step % 20 == 0 or step == 1:
            rec = {"step": step, "time": round(time.time() - t0, 1), "lr": lr, "loss": loss.item(),
                   "main": main.item(), "mtp": mtpl.item(), "indexer_kl": float(idxl.detach()) if torch.is_tensor(idxl) else float(idxl),
                   "grad_norm": float(gn.detach())}
            log["curve"].append(rec)
            if step % 100 == 0 or step == 1:
                print(json.dumps(rec), flush=True)
        if step % a.eval_every == 0:
            ev = evaluate(model, held_m, held_ids, T, device, a.eval_seqs)
            ev.update({"step": step, "time": round(time.time() - t0, 1)})
            log["evals"].append(ev)
            print(json.dumps(ev), flush=True)
            if ev["main_nll"] < best[0]:
                best = (ev["main_nll"], {k: v.detach().clone() for k, v in model.state_dict().items()})
    ev = evaluate(model, held_m, held_ids, T, device, a.eval_seqs)
    ev.update({"step": step, "time": round(time.time() - t0, 1)})
    log["evals"].append(ev)
    print(json.dumps(ev), flush=True)
    if best[1] is not None and best[0] < ev["main_nll"]:
        model.load_state_dict(best[1])
        log["restored_best_eval"] = True
    log["steps"] = step
    log["final_heldout_all"] = evaluate(model, held_m, held_ids, T, device,
                                         a.final_eval_seqs or None)
    log["final_heldout_cpu_prefix"] = evaluate(model, held_m, held_ids, T, device, a.cpu_eval_seqs)
    log["wall_s"] = round(time.time() - t_start, 1)
    print(json.dumps({"final_all": log["final_heldout_all"], "final_prefix": log["final_heldout_cpu_prefix"]}), flush=True)
    # Export the fp32 master weights under the published names.
    out = {}
    for name in model.shapes:
        v = model.P(name).detach().float().cpu().numpy()
        v = np.ascontiguousarray(v, np.float32)
        # bf16 masters (the device run returns at most 64 MiB in 8 files) except the tensors the
        # checkpoint itself stores as F32 (mHC, ape, sink, gate bias: small).
        f32 = name.endswith(("_fn", "_base", "_scale", ".ape", "attn_sink", "gate.bias"))
        out[name] = v if (f32 or a.master_dtype == "f32") else st.f32_to_bf16(v).reshape(v.shape)
    out["vocab_ids"] = vocab_ids.astype(np.uint32)
    for l, t in tables.items():
        out[f"layers.{l}.ffn.gate.tid2eid"] = t.astype(np.uint8)
    # Shards of at most --shard-mib (the device run returns files of at most 16 MiB each);
    # merge_weights.py joins them into the one file make-checkpoint --from reads.
    shard, size, k = {}, 0, 0
    for name in sorted(out):
        nb = out[name].nbytes
        if shard and size + nb > a.shard_mib * (1 << 20):
            k += 1
            st.write_file(os.path.join(a.out, f"weights-{k:02d}.safetensors"), shard, {"format": "pt"})
            shard, size = {}, 0
        shard[name], size = out[name], size + nb
    k += 1
    st.write_file(os.path.join(a.out, f"weights-{k:02d}.safetensors"), shard, {"format": "pt"})
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    json.dump(log, open(os.path.join(a.out, "loss.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
