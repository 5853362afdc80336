"""Tests of the trained-model export path (docs/tiny_model.md):

1. master weights (random, HF-style init + noise, a vocabulary subset with the shared last row)
   -> `deepserve make-checkpoint --from` -> the checkpoint validates; every tensor dequantizes to
   its master value within the format's rounding (bf16: 2^-8 relative; FP8 e4m3 block: half an
   e4m3 step of the block scale; MXFP4: half an e2m1 step of the 32-block scale); rows outside
   vocab_ids equal the shared row; tid2eid round-trips;
2. pack_artifact.py + make-checkpoint --from the artifact reproduces every tensor but embed/head
   bit for bit, and those within FP8 rounding;
3. the PyTorch forward on the exported checkpoint matches `deepserve eval-checkpoint
   --numerics hf --dump-logits` (fp32 both: max |diff| < 1e-4 on logits of magnitude ~1).

  DEEPSERVE=build/<dir>/bin/deepserve /usr/bin/python3 scripts/train_tiny/test_export.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402
import dsv4  # noqa: E402
import st  # noqa: E402
import train  # noqa: E402

DEEPSERVE = os.environ.get("DEEPSERVE", os.path.join(HERE, "../../build/cpu-release/bin/deepserve"))


class ExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.cfg = json.load(open(os.path.join(HERE, "config.json")))
        rng = np.random.default_rng(0)
        cls.vocab_ids = np.sort(rng.choice(np.arange(2, cls.cfg["vocab_size"]), 3000, replace=False)).astype(np.uint32)
        Vp = len(cls.vocab_ids) + 1
        m = dsv4.DSV4(cls.cfg, vocab_ids=list(range(Vp)))
        m.init_random(1)
        out = {}
        g = torch.Generator().manual_seed(2)
        for name, shape in m.shapes.items():
            v = m.P(name).detach()
            v = v + 0.01 * torch.randn(shape, generator=g)  # every value non-trivial
            out[name] = np.ascontiguousarray(v.numpy(), np.float32)
        out["vocab_ids"] = cls.vocab_ids
        cls.tables = {}
        for l in range(cls.cfg["num_hash_layers"]):
            t = train.make_tid2eid(cls.cfg["vocab_size"], cls.cfg["n_routed_experts"], cls.cfg["num_experts_per_tok"], 5 + l)
            cls.tables[l] = t
            out[f"layers.{l}.ffn.gate.tid2eid"] = t.astype(np.uint8)
        cls.master = out
        cls.master_path = os.path.join(d, "master.safetensors")
        st.write_file(cls.master_path, out)
        cls.ckpt = os.path.join(d, "ckpt")
        subprocess.run([DEEPSERVE, "make-checkpoint", "--from", cls.master_path, "--out", cls.ckpt],
                       check=True, capture_output=True)
        cls.exported = st.load_fp32(cls.ckpt)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def full_rows(self, name):
        v = self.master[name]
        full = np.repeat(v[-1:], self.cfg["vocab_size"], 0)
        full[self.vocab_ids.astype(np.int64)] = v[:-1]
        return full

    def test_values_within_format_rounding(self):
        raw = st.read_dir(self.ckpt)
        for name, ref in self.master.items():
            if name == "vocab_ids" or name.endswith("tid2eid"):
                continue
            got = self.exported[name]
            if name in ("embed.weight", "head.weight"):
                ref = self.full_rows(name)
            ref = ref.reshape(got.shape)
            dt = raw[name][0]
            err = np.abs(got - ref)
            if dt == "BF16":
                bound = np.abs(ref) * 2.0 ** -8 + 1e-30
            elif dt == "F32":
                bound = np.zeros_like(ref)
            elif dt == "F8_E4M3":
                # Half an e4m3 step (3 mantissa bits) of the value, or of the block's subnormal
                # step for tiny values: scale * 2^-9.
                sc = st.e8m0(raw[name[:-7] + ".scale"][2]).reshape(raw[name[:-7] + ".scale"][1])
                s = np.repeat(np.repeat(sc, 128, 0), 128, 1)[:ref.shape[0], :ref.shape[1]]
                bound = np.maximum(np.abs(ref) * 2.0 ** -4, s * 2.0 ** -9) * 1.0001
            else:  # MXFP4 (I8): half the largest e2m1 step (2 between 4 and 6) of the block scale
                sc = st.e8m0(raw[name[:-7] + ".scale"][2]).reshape(raw[name[:-7] + ".scale"][1])
                bound = np.repeat(sc, 32, 1) * 1.0 * 1.0001
            self.assertTrue(bool((err <= bound).all()), f"{name} ({dt}): max err {err.max()}")

    def test_unused_rows_and_tables(self):
        E = self.exported["embed.weight"]
        other = np.setdiff1d(np.arange(self.cfg["vocab_size"]), self.vocab_ids.astype(np.int64))
        self.assertTrue(bool((E[other] == E[other[0]]).all()))
        for l, t in self.tables.items():
            self.assertTrue(np.array_equal(self.exported[f"layers.{l}.ffn.gate.tid2eid"], t))

    def test_artifact_round_trip(self):
        art = os.path.join(self.tmp.name, "artifact.safetensors")
        subprocess.run([sys.executable, os.path.join(HERE, "pack_artifact.py"), "--checkpoint", self.ckpt,
                        "--master", self.master_path, "--out", art], check=True, capture_output=True)
        again = os.path.join(self.tmp.name, "again")
        subprocess.run([DEEPSERVE, "make-checkpoint", "--from", art, "--out", again], check=True,
                       capture_output=True)
        a, b = st.read_dir(self.ckpt), st.read_dir(again)
        self.assertEqual(sorted(a), sorted(b))
        for n in a:
            if n in ("embed.weight", "head.weight"):
                x, y = st.bf16_to_f32(a[n][2]), st.bf16_to_f32(b[n][2])
                self.assertLessEqual(float(np.abs(x - y).max()), float(np.abs(x).max()) * 2.0 ** -4)
            else:
                self.assertTrue(np.array_equal(a[n][2], b[n][2]), n)

    def test_forward_matches_cpu_reference(self):
        T = 40
        toks = np.concatenate([[0], self.vocab_ids[:T - 1]]).astype(np.uint32)
        tf = os.path.join(self.tmp.name, "toks.u32")
        toks.tofile(tf)
        dump = os.path.join(self.tmp.name, "logits.f32")
        subprocess.run([DEEPSERVE, "eval-checkpoint", "--model", self.ckpt, "--tokens", tf, "--seq-len",
                        str(T), "--num-seqs", "1", "--numerics", "hf", "--dump-logits", dump],
                       check=True, capture_output=True)
        m = compare.load_model(self.ckpt, hf=True)
        with torch.no_grad():
            lg, mt = m(torch.from_numpy(toks.astype(np.int64))[None])
        V = self.cfg["vocab_size"]
        ref = np.fromfile(dump, np.float32)
        self.assertLess(float(np.abs(lg[0].numpy() - ref[:T * V].reshape(T, V)).max()), 1e-4)
        self.assertLess(float(np.abs(mt[0].numpy() - ref[T * V:].reshape(T - 1, V)).max()), 1e-4)


if __name__ == "__main__":
    torch.set_num_threads(2)
    unittest.main()
