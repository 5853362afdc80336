#!/usr/bin/env python3
"""Opcode histogram of the loops of selected kernels in `cuobjdump -sass` output (session 8).

usage: sass_hist.py SASS_FILE [NAME_SUBSTRING ...]
For every function whose (mangled) name contains all substrings: the total instruction count,
then each loop (a backward branch to a lower address) with >= 1 HMMA: its length and opcode
histogram, so the instructions per main-loop stage can be read off."""
import collections
import re
import sys

text = open(sys.argv[1], errors="replace").read()
subs = sys.argv[2:]
funcs = re.split(r"\n\s*Function : ", text)
ins_re = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:\{\s*)?(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)([.A-Z0-9_]*)\s*([^;]*);")
for f in funcs[1:]:
    name = f.split("\n", 1)[0].strip()
    if not all(s in name for s in subs):
        continue
    labels = {}
    ins = []
    for line in f.split("\n"):
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = ins_re.search(line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(3) + m.group(4), m.group(5)))
    addr_index = {a: i for i, (a, _, _, _) in enumerate(ins)}
    print("==== %s: %d instructions" % (name, len(ins)))
    loops = []
    for i, (a, op, full, args) in enumerate(ins):
        if op != "BRA":
            continue
        t = None
        m = re.search(r"0x([0-9a-f]+)", args)
        if m and int(m.group(1), 16) in addr_index:
            t = addr_index[int(m.group(1), 16)]
        m = re.search(r"(\.L_x_\d+)", args)
        if m and m.group(1) in labels:
            t = labels[m.group(1)]
        if t is not None and t <= i:
            loops.append((t, i))
    for t, i in loops:
        body = ins[t:i + 1]
        hist = collections.Counter(op for _, op, _, _ in body)
        if hist["HMMA"] == 0:
            continue
        full = collections.Counter(fo for _, _, fo, _ in body
                                   if fo.startswith(("HMMA", "F2FP", "QMMA")))
        print("  loop [%#x, %#x]: %d instructions, HMMA %d" % (body[0][0], body[-1][0], len(body),
                                                              hist["HMMA"]))
        print("    " + " ".join("%s:%d" % kv for kv in hist.most_common()))
        print("    " + " ".join("%s:%d" % kv for kv in full.most_common()))
