"""Step 1 check: our PyTorch DeepSeek-V4 (dsv4.py) against deepserve's CPU reference forward on
the same checkpoint. Loads a checkpoint directory (safetensors parsed and FP8/MXFP4 dequantized in
numpy, st.py), runs a token sequence, and compares main and MTP logits with the dump written by
`deepserve eval-checkpoint --dump-logits` (same tokens, one sequence).

  python3 compare.py --model DIR --tokens FILE.u32 --seq-len 300 --dump LOGITS.f32 [--hf]
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


def load_model(path, hf=True):
    cfg = json.load(open(os.path.join(path, "config.json")))
    m = dsv4.DSV4(cfg, shared_clamp=hf, router_eps=1e-20 if hf else 0.0)
    w = st.load_fp32(path)
    with torch.no_grad():
        for name in m.shapes:
            m.P(name).copy_(torch.from_numpy(np.ascontiguousarray(w[name], np.float32)).view(m.shapes[name]))
        for l in range(min(cfg["num_hash_layers"], cfg["num_hidden_layers"])):
            getattr(m, f"tid2eid_{l}").copy_(torch.from_numpy(w[f"layers.{l}.ffn.gate.tid2eid"]))
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--seq-len", type=int, default=300)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--hf", action="store_true", help="the dump was made with --numerics hf")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(2)
    m = load_model(a.model, hf=a.hf)
    V = m.cfg["vocab_size"]
    ids = np.fromfile(a.tokens, np.uint32)[:a.seq_len].astype(np.int64)
    T = len(ids)
    with torch.no_grad():
        logits, mtp = m(torch.from_numpy(ids)[None])
    logits, mtp = logits[0].numpy(), mtp[0].numpy()
    ref = np.fromfile(a.dump, np.float32)
    ref_main = ref[:T * V].reshape(T, V)
    ref_mtp = ref[T * V:].reshape(T - 1, V)

    def stats(x, y):
        d = np.abs(x - y)
        return {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
                "rel_max": float(d.max() / np.abs(y).max()),
                "argmax_agree": float((x.argmax(-1) == y.argmax(-1)).mean())}

    res = {"seq_len": T, "numerics": "hf" if a.hf else "reference",
           "main": stats(logits, ref_main), "mtp": stats(mtp, ref_mtp),
           "ref_logit_absmax": float(np.abs(ref_main).max())}
    print(json.dumps(res, indent=2))
    if a.json:
        json.dump(res, open(a.json, "w"), indent=2)


if __name__ == "__main__":
    main()
