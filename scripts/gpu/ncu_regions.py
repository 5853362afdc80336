"""Warp-stall samples of an ncu report's SASS listing summed by region, in address order: a region
ends at each block barrier (BAR.SYNC / BAR.RED), wgmma wait, memory fence, global atomic or EXIT,
so the prologue, a loop's body, a select's steps and an epilogue show up as separate rows with
their share of the samples and, below each, the region's three largest stall reasons as shares of
its own samples. Regions under MIN percent (default 1) are folded into the next row.

  ncu --import R.ncu-rep --page source --csv --print-source sass | ncu_regions.py [MIN]
"""
import csv
import sys

ENDS = ("BAR.SYNC", "BAR.RED", "WARPGROUP.DEPBAR", "MEMBAR", "ATOMG", "EXIT")


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def tables(lines):
    """(kernel, header, rows) per kernel of the source page."""
    out, kernel, header = [], "", None
    for r in csv.reader(line for line in lines if line.startswith('"')):
        if r and r[0] == "Kernel Name":
            kernel = r[1] if len(r) > 1 else ""
        elif "Source" in r and any("Stall" in c for c in r):
            header = r
            out.append((kernel, header, []))
        elif header is not None and len(r) == len(header):
            out[-1][2].append(dict(zip(header, r)))
    return out


def main():
    floor = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    for kernel, header, rows in tables(sys.stdin):
        key = next((c for c in header if c.startswith("Warp Stall Sampling (All")), None)
        if key is None or not rows:
            print("no stall sampling column")
            continue
        total = sum(num(r[key]) for r in rows) or 1.0
        print(f"== {kernel[:100]} ({len(rows)} instructions, {total:.0f} samples)")
        print("   first  last  share  cumul  end of region / its busiest instruction")
        reasons = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
        start, acc, cumul, top = 0, 0.0, 0.0, (0.0, "")
        why = dict.fromkeys(reasons, 0.0)
        for i, r in enumerate(rows):
            s, src = num(r[key]), r.get("Source", "").strip()
            acc += s
            top = max(top, (s, src))
            for c in reasons:
                why[c] += num(r[c])
            last = i == len(rows) - 1
            if not (last or any(src.split(" ")[-1].startswith(e) or e in src for e in ENDS)):
                continue
            if 100 * acc / total < floor and not last:
                continue
            cumul += acc
            print(f"  {start:6d} {i:5d} {100 * acc / total:5.1f}% {100 * cumul / total:5.1f}%  "
                  f"{src[:40]:40s} / {top[1][:40]} ({100 * top[0] / total:.1f}%)")
            if acc > 0:
                print("                              " + ", ".join(
                    f"{c[6:]} {100 * v / acc:.0f}%"
                    for v, c in sorted(((v, c) for c, v in why.items()), reverse=True)[:3] if v > 0))
            start, acc, top = i + 1, 0.0, (0.0, "")
            why = dict.fromkeys(reasons, 0.0)


main()
