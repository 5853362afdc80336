"""Compact DeepSeek-V4 model in PyTorch for training the embedded tiny model.

Full-sequence (training) form of the forward in src/model/deepseek_v4/forward.cpp, with the exact
semantics of /work/shared/docs/dsv4-model.md (sequences start at position 0): mHC with Sinkhorn,
CSA (overlapping ratio-4 compressor + lightning indexer + top-k) and HCA (ratio-128 compressor)
attention with sliding window and sink, grouped output projection, MoE with shared expert, hash
routing (tid2eid) in the first layers and sqrt-softplus noaux top-k routing elsewhere, and the MTP
layer. Parameters are fp32 and keyed by the published checkpoint names, so loading a checkpoint
and exporting one is a name-for-name copy. No FP8/FP4 simulation (this equals the engine's `hf`
numerics except for the shared-expert clamp, selectable with `shared_clamp`).

The vocabulary can be a subset of the tokenizer's: embed/head then hold the used rows plus one
shared last row that every other id uses (export copies it into their rows); `unused_vocab` more
copies of its logit are counted in the softmax, so the loss equals the full-vocabulary loss of the
exported model.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F


def rope_inv_freq(cfg, ratio):
    """src/kernels/cpu/rope.cpp rope_inv_freq (fp32, YaRN ramp for compressed layers)."""
    dim = cfg["qk_rope_head_dim"]
    half = dim // 2
    rs = cfg.get("rope_scaling") or {}
    if ratio == 0:
        theta, yarn = cfg["rope_theta"], False
    else:
        theta = cfg["compress_rope_theta"]
        yarn = rs.get("original_max_position_embeddings", 0) > 0
    inv = np.array([np.float32(1.0) / np.float32(theta ** float(np.float32(2 * i) / np.float32(dim)))
                    for i in range(half)], np.float32)
    if not yarn:
        return inv
    omp = rs["original_max_position_embeddings"]

    def cdim(rot):
        return dim * math.log(omp / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(cdim(rs["beta_fast"])), 0.0)
    high = min(math.ceil(cdim(rs["beta_slow"])), float(dim - 1))
    if low == high:
        high += 0.001
    factor = np.float32(rs["factor"])
    for i in range(half):
        ramp = np.clip((np.float32(i) - np.float32(low)) / (np.float32(high) - np.float32(low)),
                       np.float32(0), np.float32(1))
        smooth = np.float32(1) - ramp
        inv[i] = inv[i] / factor * (np.float32(1) - smooth) + inv[i] * smooth
    return inv


def rope(x, cos, sin, inverse=False):
    """Rotates the last rope_dim values of x[..., T, heads, hd] (interleaved pairs).
    cos/sin: [T, rd/2]."""
    rd = cos.shape[-1] * 2
    nope, r = x[..., :-rd], x[..., -rd:]
    re, im = r[..., 0::2], r[..., 1::2]
    c = cos[:, None, :]
    s = -sin[:, None, :] if inverse else sin[:, None, :]
    out = torch.stack([re * c - im * s, re * s + im * c], dim=-1).flatten(-2)
    return torch.cat([nope, out], dim=-1)


def rms(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def swiglu(a, b, limit):
    if limit > 0:
        a = torch.clamp(a, max=limit)
        b = torch.clamp(b, -limit, limit)
    return F.silu(a) * b


class DSV4(torch.nn.Module):
    def __init__(self, cfg, vocab_ids=None, shared_clamp=False, router_eps=0.0):
        super().__init__()
        self.cfg = cfg
        self.shared_clamp = shared_clamp
        self.router_eps = router_eps
        # Residual-branch dropout for training only: applied while autograd records (never under
        # no_grad, so every evaluation and export path sees the deterministic model).
        self.dropout = 0.0
        full_vocab = cfg["vocab_size"]
        self.V = full_vocab if vocab_ids is None else len(vocab_ids)
        self.unused_vocab = full_vocab - self.V
        self.params = torch.nn.ParameterDict()
        self.shapes = {}
        for name, shape in self.tensor_shapes().items():
            self.shapes[name] = shape
            self.params[name.replace(".", "__")] = torch.nn.Parameter(torch.zeros(shape))
        L = cfg["num_hidden_layers"]
        for l in range(L + cfg["num_nextn_predict_layers"]):
            ratio = cfg["compress_ratios"][l]
            inv = torch.tensor(rope_inv_freq(cfg, ratio))
            self.register_buffer(f"inv_freq_{l}", inv, persistent=False)
        for l in range(min(cfg["num_hash_layers"], L)):
            # Indexed by tokenizer ids (forward's hash_ids), full vocabulary.
            self.register_buffer(f"tid2eid_{l}", torch.zeros(full_vocab, cfg["num_experts_per_tok"],
                                                             dtype=torch.long))

    # ---- names and shapes (published layout, logical fp32 shapes) ----
    def tensor_shapes(self):
        c = self.cfg
        D, hc = c["hidden_size"], c["hc_mult"]
        H, hd, rd = c["num_attention_heads"], c["head_dim"], c["qk_rope_head_dim"]
        qr, G, R = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
        E, I = c["n_routed_experts"], c["moe_intermediate_size"]
        ih, ihd = c["index_n_heads"], c["index_head_dim"]
        mix = (2 + hc) * hc
        s = {"embed.weight": (self.V, D), "head.weight": (self.V, D), "norm.weight": (D,),
             "hc_head_fn": (hc, hc * D), "hc_head_base": (hc,), "hc_head_scale": (1,)}
        L = c["num_hidden_layers"]
        for l in range(L + c["num_nextn_predict_layers"]):
            p = f"layers.{l}." if l < L else f"mtp.{l - L}."
            ratio = c["compress_ratios"][l]
            s.update({p + "hc_attn_fn": (mix, hc * D), p + "hc_attn_base": (mix,),
                      p + "hc_attn_scale": (3,), p + "hc_ffn_fn": (mix, hc * D),
                      p + "hc_ffn_base": (mix,), p + "hc_ffn_scale": (3,),
                      p + "attn_norm.weight": (D,), p + "ffn_norm.weight": (D,),
                      p + "attn.attn_sink": (H,), p + "attn.wq_a.weight": (qr, D),
                      p + "attn.q_norm.weight": (qr,), p + "attn.wq_b.weight": (H * hd, qr),
                      p + "attn.wkv.weight": (hd, D), p + "attn.kv_norm.weight": (hd,),
                      p + "attn.wo_a.weight": (G * R, H * hd // G),
                      p + "attn.wo_b.weight": (D, G * R)})
            if ratio:
                coff = 2 if ratio == 4 else 1
                s.update({p + "attn.compressor.ape": (ratio, coff * hd),
                          p + "attn.compressor.wkv.weight": (coff * hd, D),
                          p + "attn.compressor.wgate.weight": (coff * hd, D),
                          p + "attn.compressor.norm.weight": (hd,)})
            if ratio == 4:
                s.update({p + "attn.indexer.wq_b.weight": (ih * ihd, qr),
                          p + "attn.indexer.weights_proj.weight": (ih, D),
                          p + "attn.indexer.compressor.ape": (ratio, 2 * ihd),
                          p + "attn.indexer.compressor.wkv.weight": (2 * ihd, D),
                          p + "attn.indexer.compressor.wgate.weight": (2 * ihd, D),
                          p + "attn.indexer.compressor.norm.weight": (ihd,)})
            s[p + "ffn.gate.weight"] = (E, D)
            if not (l < L and l < c["num_hash_layers"]):
                s[p + "ffn.gate.bias"] = (E,)
            for e in range(E):
                s.update({p + f"ffn.experts.{e}.w1.weight": (I, D),
                          p + f"ffn.experts.{e}.w2.weight": (D, I),
                          p + f"ffn.experts.{e}.w3.weight": (I, D)})
            s.update({p + "ffn.shared_experts.w1.weight": (I, D),
                      p + "ffn.shared_experts.w2.weight": (D, I),
                      p + "ffn.shared_experts.w3.weight": (I, D)})
            if l >= L:
                s.update({p + "e_proj.weight": (D, D), p + "h_proj.weight": (D, D),
                          p + "enorm.weight": (D,), p + "hnorm.weight": (D,),
                          p + "norm.weight": (D,), p + "hc_head_fn": (hc, hc * D),
                          p + "hc_head_base": (hc,), p + "hc_head_scale": (1,)})
        return s

    def P(self, name):
        return self.params[name.replace(".", "__")]

    def init_random(self, seed):
        """HF-style init: linears N(0, 0.02) (output projections scaled down), norms 1,
        mHC scale 1 / base 0 / fn N(0, 0.02), sink/ape/bias 0."""
        g = torch.Generator().manual_seed(seed)
        nl = self.cfg["num_hidden_layers"] + 1
        with torch.no_grad():
            for name, shape in self.shapes.items():
                p = self.P(name)
                if name.endswith("norm.weight") or name.endswith("_scale"):
                    p.fill_(1.0)
                elif name.endswith("_base") or name.endswith("attn_sink") or \
                        name.endswith(".ape") or name.endswith("gate.bias"):
                    p.zero_()
                else:
                    std = 0.02
                    if name.endswith("wo_b.weight") or name.endswith("w2.weight"):
                        std = 0.02 / math.sqrt(2 * nl)
                    p.copy_(torch.randn(shape, generator=g) * std)

    # ---- pieces ----
    def hc_pre(self, p, X):
        c = self.cfg
        hc, eps = c["hc_mult"], c["hc_eps"]
        fn, base, scale = self.P(p + "_fn"), self.P(p + "_base"), self.P(p + "_scale")
        xf = X.flatten(-2)
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])
        m = (xf @ fn.t()) * r
        pre = torch.sigmoid(m[..., :hc] * scale[0] + base[:hc]) + eps
        post = 2 * torch.sigmoid(m[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
        C = (m[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
        C = torch.softmax(C, -1) + eps
        C = C / (C.sum(-2, keepdim=True) + eps)
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            C = C / (C.sum(-1, keepdim=True) + eps)
            C = C / (C.sum(-2, keepdim=True) + eps)
        u = (pre.unsqueeze(-1) * X).sum(-2)
        return u, post, C

    @staticmethod
    def hc_post(o, X, post, C):
        return post.unsqueeze(-1) * o.unsqueeze(-2) + torch.einsum("btjk,btjd->btkd", C, X)

    def hc_head(self, p, X):
        c = self.cfg
        fn, base, scale = self.P(p + "hc_head_fn"), self.P(p + "hc_head_base"), \
            self.P(p + "hc_head_scale")
        xf = X.flatten(-2)
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])
        m = (xf @ fn.t()) * r
        pre = torch.sigmoid(m * scale[0] + base) + c["hc_eps"]
        return (pre.unsqueeze(-1) * X).sum(-2)

    def compress(self, p, h, ratio, d, cos, sin):
        """Compressed entries of every complete window: [B, T // ratio, d]."""
        B, T, _ = h.shape
        nw = T // ratio
        if nw == 0:  # no complete window yet
            return h.new_zeros(B, 0, d)
        kv = h[:, :nw * ratio] @ self.P(p + ".wkv.weight").t()
        sc = h[:, :nw * ratio] @ self.P(p + ".wgate.weight").t()
        kv = kv.view(B, nw, ratio, -1)
        sc = sc.view(B, nw, ratio, -1) + self.P(p + ".ape")
        if ratio == 4:  # overlapping: previous window's first half + current window's second half
            pk = F.pad(kv[:, :-1, :, :d], (0, 0, 0, 0, 1, 0), value=0.0)
            ps = F.pad(sc[:, :-1, :, :d], (0, 0, 0, 0, 1, 0), value=float("-inf"))
            kv = torch.cat([pk, kv[..., d:]], 2)
            sc = torch.cat([ps, sc[..., d:]], 2)
        w = torch.softmax(sc, 2)
        e = (w * kv).sum(2)
        e = rms(e, self.P(p + ".norm.weight"), self.cfg["rms_norm_eps"])
        pos = torch.arange(nw, device=h.device) * ratio
        return rope(e.unsqueeze(-2), cos[pos], sin[pos]).squeeze(-2)

    def attention(self, p, l, h, cos_all, sin_all, cos_c, sin_c, aux):
        c = self.cfg
        B, T, D = h.shape
        H, hd, eps = c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"]
        ratio = c["compress_ratios"][l]
        W, k = c["sliding_window"], c["index_topk"]
        a = p + "attn."
        qr = rms(h @ self.P(a + "wq_a.weight").t(), self.P(a + "q_norm.weight"), eps)
        q = (qr @ self.P(a + "wq_b.weight").t()).view(B, T, H, hd)
        q = rope(rms(q, None, eps), cos_all, sin_all)
        kv = rms(h @ self.P(a + "wkv.weight").t(), self.P(a + "kv_norm.weight"), eps)
        kv = rope(kv.unsqueeze(-2), cos_all, sin_all).squeeze(-2)
        scale = hd ** -0.5
        t = torch.arange(T, device=h.device)
        s_win = torch.einsum("bthd,bsd->bhts", q, kv) * scale
        win_mask = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - W)
        s_win = s_win.masked_fill(~win_mask, float("-inf"))
        parts, vals = [s_win], [kv]
        if ratio:
            comp = self.compress(a + "compressor", h, ratio, hd, cos_c, sin_c)  # [B, nw, hd]
            nw = comp.shape[1]
            wi = torch.arange(nw, device=h.device)
            visible = wi[None, :] < ((t[:, None] + 1) // ratio)  # [T, nw]
            s_comp = torch.einsum("bthd,bwd->bhtw", q, comp) * scale
            if ratio == 4:
                ih, ihd = c["index_n_heads"], c["index_head_dim"]
                qi = (qr @ self.P(a + "indexer.wq_b.weight").t()).view(B, T, ih, ihd)
                qi = rope(qi, cos_all, sin_all)
                wts = (h @ self.P(a + "indexer.weights_proj.weight").t()) * (ihd ** -0.5 * ih ** -0.5)
                keys = self.compress(a + "indexer.compressor", h, ratio, ihd, cos_c, sin_c)
                isc = (torch.relu(torch.einsum("bthd,bwd->bthw", qi, keys)) *
                       wts.unsqueeze(-1)).sum(2)  # [B, T, nw]
                isc_m = isc.masked_fill(~visible, -1e30)  # finite: rows without keys stay NaN-free
                kk = min(k, nw)
                sel = torch.zeros_like(isc, dtype=torch.bool)
                if kk > 0:
                    # Ties (e.g. several all-ReLU-zero scores) go to the lower index, as the CPU
                    # reference's topk_indices does.
                    top = torch.sort(isc_m.detach(), dim=-1, descending=True, stable=True).indices[..., :kk]
                    sel.scatter_(-1, top, True)
                sel = sel & visible
                mask = sel.unsqueeze(1)
                if aux is not None and nw > 0:
                    # Indexer distillation (V3.2 style): the indexer's distribution over the visible
                    # entries follows the main attention's (detached, head-mean) distribution.
                    vis = visible[None]
                    tgt = torch.softmax(s_comp.detach().masked_fill(~visible, float("-inf")), -1)
                    tgt = tgt.mean(1).nan_to_num(0.0)
                    logp = torch.log_softmax(isc_m, -1).masked_fill(~vis, 0.0)
                    rows = vis.any(-1)
                    kl = (tgt * (torch.log(tgt.clamp_min(1e-12)) - logp)).masked_fill(~vis, 0.0).sum(-1)
                    aux.append((kl * rows).sum() / (rows.sum() * B).clamp_min(1))
            else:
                mask = visible[None, None]
            parts.append(s_comp.masked_fill(~mask, float("-inf")))
            vals.append(comp)
        sink = self.P(a + "attn_sink").view(1, H, 1, 1).expand(B, H, T, 1)
        prob = torch.softmax(torch.cat(parts + [sink], -1), -1)[..., :-1]
        o = torch.einsum("bhts,bsd->bthd", prob, torch.cat(vals, 1))
        o = rope(o, cos_all, sin_all, inverse=True)
        G, R = c["o_groups"], c["o_lora_rank"]
        wo_a = self.P(a + "wo_a.weight").view(G, R, -1)
        z = torch.einsum("btgi,gri->btgr", o.reshape(B, T, G, -1), wo_a).reshape(B, T, G * R)
        return z @ self.P(a + "wo_b.weight").t()

    def moe(self, p, l, x, ids, loads):
        c = self.cfg
        B, T, D = x.shape
        E, k = c["n_routed_experts"], c["num_experts_per_tok"]
        f = p + "ffn."
        xt = x.reshape(-1, D)
        s = torch.sqrt(F.softplus(xt @ self.P(f + "gate.weight").t()))  # [N, E]
        hashed = l < c["num_hidden_layers"] and l < c["num_hash_layers"]
        if hashed:
            sel = getattr(self, f"tid2eid_{l}")[ids.reshape(-1)]
        else:
            sel = (s + self.P(f + "gate.bias")).detach().topk(k, -1).indices
            if loads is not None:
                loads[p] = torch.bincount(sel.reshape(-1), minlength=E).float()
        w = s.gather(-1, sel)
        w = w / (w.sum(-1, keepdim=True) + self.router_eps) * c["routed_scaling_factor"]
        cw = torch.zeros_like(s).scatter(-1, sel, w)  # [N, E]
        W1 = torch.stack([self.P(f + f"experts.{e}.w1.weight") for e in range(E)])
        W3 = torch.stack([self.P(f + f"experts.{e}.w3.weight") for e in range(E)])
        W2 = torch.stack([self.P(f + f"experts.{e}.w2.weight") for e in range(E)])
        lim = c["swiglu_limit"]
        hid = swiglu(torch.einsum("nd,eid->nei", xt, W1), torch.einsum("nd,eid->nei", xt, W3), lim)
        y = torch.einsum("nei,edi->nd", hid * cw.unsqueeze(-1), W2)
        sh = f + "shared_experts."
        hs = swiglu(xt @ self.P(sh + "w1.weight").t(), xt @ self.P(sh + "w3.weight").t(),
                    lim if self.shared_clamp else 0.0)
        y = y + hs @ self.P(sh + "w2.weight").t()
        return y.view(B, T, D)

    def block(self, p, l, X, hash_ids, rope_tabs, aux, loads):
        c = self.cfg
        eps = c["rms_norm_eps"]
        T = X.shape[1]
        cos_all, sin_all, cos_c, sin_c = (t[:T] for t in rope_tabs[l])
        u, post, C = self.hc_pre(p + "hc_attn", X)
        o = self.attention(p, l, rms(u, self.P(p + "attn_norm.weight"), eps), cos_all, sin_all,
                           cos_c, sin_c, aux)
        X = self.hc_post(self.drop(o), X, post, C)
        u, post, C = self.hc_pre(p + "hc_ffn", X)
        o = self.moe(p, l, rms(u, self.P(p + "ffn_norm.weight"), eps), hash_ids, loads)
        return self.hc_post(self.drop(o), X, post, C)

    def drop(self, o):
        if self.dropout > 0 and torch.is_grad_enabled():
            return F.dropout(o, self.dropout, training=True)
        return o

    def rope_tables(self, T, device):
        tabs = []
        pos = torch.arange(T, device=device, dtype=torch.float32)
        for l in range(len(self.cfg["compress_ratios"])):
            inv = getattr(self, f"inv_freq_{l}")
            ang = (pos[:, None] * inv[None, :]).double()
            cs, sn = torch.cos(ang).float(), torch.sin(ang).float()
            tabs.append((cs, sn, cs, sn))
        return tabs

    def logits_from(self, y):
        return y @ self.P("head.weight").t()

    def forward(self, ids, want_mtp=True, aux=None, loads=None, hash_ids=None):
        """ids [B, T] (model vocabulary); hash_ids [B, T] the tokenizer ids for hash routing
        (default: ids). Returns (main logits [B, T, V], mtp logits [B, T-1, V]
        or None); mtp row t predicts ids[t + 2]."""
        c = self.cfg
        B, T = ids.shape
        eps = c["rms_norm_eps"]
        hc, L = c["hc_mult"], c["num_hidden_layers"]
        tabs = self.rope_tables(T, ids.device)
        e = F.embedding(ids, self.P("embed.weight"))
        X = e.unsqueeze(-2).expand(B, T, hc, e.shape[-1]).contiguous()
        for l in range(L):
            X = self.block(f"layers.{l}.", l, X, ids if hash_ids is None else hash_ids, tabs, aux,
                           loads)
        y = rms(self.hc_head("", X), self.P("norm.weight"), eps)
        logits = self.logits_from(y)
        if not want_mtp or c["num_nextn_predict_layers"] == 0:
            return logits, None
        p = "mtp.0."
        en = rms(F.embedding(ids[:, 1:], self.P("embed.weight")), self.P(p + "enorm.weight"), eps)
        ep = en @ self.P(p + "e_proj.weight").t()
        hp = rms(X[:, :-1], self.P(p + "hnorm.weight"), eps) @ self.P(p + "h_proj.weight").t()
        Xm = ep.unsqueeze(-2) + hp
        Xm = self.block(p, L, Xm, None, tabs, aux, loads)  # the MTP layer never hashes
        ym = rms(self.hc_head(p, Xm), self.P(p + "norm.weight"), eps)
        return logits, self.logits_from(ym)

    def nll(self, logits, targets):
        """Per-token negative log-likelihood over the full vocabulary. With a vocabulary subset
        the last model row is the shared row of every other id (`unused_vocab` more copies of
        its logit join the softmax), as the exported checkpoint stores it."""
        lf = logits.float()
        if self.unused_vocab > 0:
            extra = lf[..., -1:] + math.log(self.unused_vocab)
            lse = torch.logsumexp(torch.cat([lf, extra], -1), -1)
        else:
            lse = torch.logsumexp(lf, -1)
        return lse - lf.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
