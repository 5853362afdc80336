"""The training script's held-out numbers for a master-weights file (merge_weights.py output),
on the same sequences `deepserve eval-checkpoint` uses (non-overlapping --seq-len windows from
the start of the token file, first --num-seqs), fp32, no quantization.

  python3 eval_master.py --weights W.safetensors --tokens heldout.u32 --seq-len 256 --num-seqs 32
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4  # noqa: E402
import st  # noqa: E402
import train  # noqa: E402


def load_master(path, cfg):
    raw = st.read_file(path)
    vocab_ids = raw["vocab_ids"][2].astype(np.int64)
    Vp = raw["embed.weight"][1][0]
    assert Vp == len(vocab_ids) + 1, "expects the shared last row"
    m = dsv4.DSV4(cfg, vocab_ids=list(range(Vp)))
    m.unused_vocab = cfg["vocab_size"] - Vp
    with torch.no_grad():
        for name, shape in m.shapes.items():
            dt, sh, arr = raw[name]
            v = st.bf16_to_f32(arr) if dt == "BF16" else arr.astype(np.float32)
            m.P(name).copy_(torch.from_numpy(v.reshape(shape)))
        for l in range(min(cfg["num_hash_layers"], cfg["num_hidden_layers"])):
            dt, sh, arr = raw[f"layers.{l}.ffn.gate.tid2eid"]
            getattr(m, f"tid2eid_{l}").copy_(torch.from_numpy(arr.reshape(sh).astype(np.int64)))
    to_model = np.full(cfg["vocab_size"], Vp - 1, np.int64)
    to_model[vocab_ids] = np.arange(len(vocab_ids))
    return m, to_model


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--weights", required=True)
    ap.add_argument("--config", default=os.path.join(here, "config.json"))
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--num-seqs", type=int, default=32)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(2)
    cfg = json.load(open(a.config))
    m, to_model = load_master(a.weights, cfg)
    ids = np.fromfile(a.tokens, np.uint32)
    r = train.evaluate(m, to_model[ids], ids, a.seq_len, torch.device("cpu"), a.num_seqs, bs=4)
    print(json.dumps(r, indent=2))
    if a.json:
        json.dump(r, open(a.json, "w"), indent=2)


if __name__ == "__main__":
    main()
