#!/usr/bin/env python3
"""Summarizes the loops of one kernel in `cuobjdump -sass` output: for every backward branch whose
body holds an HGMMA (a wgmma K loop), its length and its counts of HGMMA, LDL / STL (spills),
LDGSTS, S2R and uniform instructions. Session 23's check that the copy and descriptor changes
keep spills out of the K loops of expert_gemm_wg_kernel.
  cuobjdump -sass bench_moe | sass_loops.py 'expert_gemm_wg_kernelILb1ELi1ELi4E'"""
import re
import sys


def main() -> None:
    pattern = sys.argv[1]
    text = sys.stdin.read()
    for func in re.split(r"\n\s*Function : ", text)[1:]:
        name = func.split("\n", 1)[0]
        if not re.search(pattern, name):
            continue
        ins = []  # (address, opcode text)
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", func):
            ins.append((int(m.group(1), 16), m.group(2).strip()))
        index = {addr: i for i, (addr, _) in enumerate(ins)}
        spill_total = sum(1 for _, t in ins if re.search(r"\b(LDL|STL)\b", t))
        print(f"{name}: {len(ins)} instructions, {spill_total} LDL/STL")
        for i, (addr, t) in enumerate(ins):
            m = re.search(r"\bBRA\s+(?:`\()?[^0-9]*0x([0-9a-f]+)", t)
            if not m:
                continue
            target = int(m.group(1), 16)
            if target >= addr or target not in index:
                continue
            body = [x for _, x in ins[index[target]:i + 1]]
            hg = sum(1 for x in body if "HGMMA" in x)
            if hg == 0:
                continue
            def count(rx: str) -> int:
                return sum(1 for x in body if re.search(rx, x))
            n = re.search(r"HGMMA\.64x(\d+)", " ".join(body))
            c = {k: count(rx) for k, rx in (("LDL", r"\bLDL"), ("STL", r"\bSTL"),
                                             ("LDGSTS", "LDGSTS"), ("S2R", r"\bS2R"),
                                             ("uniform", r"^(@!?U?P\w+\s+)?U[A-Z]"),
                                             ("BAR", r"\bBAR\."))}
            print(f"  loop {target:#x}-{addr:#x}: {len(body)} instr, HGMMA {hg} (n{n.group(1)}), "
                  + ", ".join(f"{k} {v}" for k, v in c.items()))


if __name__ == "__main__":
    main()
