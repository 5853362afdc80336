"""Summarizes an ncu --csv run of `deepserve profile` (gpu__time_duration per kernel): the last
complete decode step (from one embedding kernel to the next), its kernels in order with their
durations, then the same kernels grouped by name.

  step_kernels_summary.py NCU.csv   (scripts/gpu/step_kernels.sh runs it)
"""
import csv
import re
import sys


def short(name):
    name = re.sub(r"\(.*$", "", name)          # parameters
    depth, out = 0, []
    for ch in name:                              # template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    name = "".join(out)
    name = re.sub(r"^.*::", "", name.replace("void ", ""))
    return name.strip()[:48]


def main():
    rows = []
    with open(sys.argv[1], newline="", encoding="utf-8", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    reader = csv.reader(lines)
    header = None
    for r in reader:
        if header is None:
            if "Kernel Name" in r and "Metric Value" in r:
                header = r
            continue
        d = dict(zip(header, r))
        if d.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            us = float(d["Metric Value"].replace(",", "")) / 1e3
        except ValueError:
            continue
        rows.append((short(d["Kernel Name"]), d.get("Grid Size", ""), d.get("Block Size", ""), us))
    if not rows:
        print("no kernel rows")
        return
    starts = [i for i, r in enumerate(rows) if "embed" in r[0].lower()]
    if len(starts) >= 2:
        seg = rows[starts[-2]:starts[-1]]
    elif starts:
        seg = rows[starts[-1]:]
    else:
        seg = rows[-200:]
    print(f"{len(rows)} kernels in the run; last step: {len(seg)} kernels, "
          f"{sum(r[3] for r in seg):.1f} us of kernel time")
    for i, (n, g, b, us) in enumerate(seg):
        print(f"{i:4d} {us:8.2f} {n:48s} {g:>14s} {b:>12s}")
    agg = {}
    for n, g, b, us in seg:
        a = agg.setdefault(n, [0, 0.0])
        a[0] += 1
        a[1] += us
    print("by kernel:")
    for n, (cnt, tot) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"  {tot:9.2f} us {cnt:4d}x  {n}")


main()
