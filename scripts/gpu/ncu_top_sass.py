"""The SASS instructions with the most warp-stall samples in an ncu report's source page, with
their stall reasons, after every reason's share of the kernel's samples:
`ncu --import R.ncu-rep --page source --csv --print-source sass` piped in.

  ncu --import R.ncu-rep --page source --csv --print-source sass | ncu_top_sass.py [N]
"""
import csv
import sys


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    rows = list(csv.reader(line for line in sys.stdin if line.startswith('"')))
    header, kernel = None, ""
    tables = []
    for r in rows:
        if r and r[0] == "Kernel Name":
            kernel = r[1] if len(r) > 1 else ""
            continue
        if "Source" in r and any("Stall" in c for c in r):
            header = r
            tables.append((kernel, []))
            continue
        if header is None or len(r) != len(header):
            continue
        tables[-1][1].append(dict(zip(header, r)))
    for kernel, table in tables:
        key = next((c for c in header if c.startswith("Warp Stall Sampling (All")), None)
        if key is None:
            print("no stall sampling column")
            return
        def num(v):
            try:
                return float(v.replace(",", ""))
            except ValueError:
                return 0.0
        total = sum(num(t[key]) for t in table) or 1.0
        print(f"== {kernel[:100]} ({len(table)} instructions, {total:.0f} samples)")
        # Every stall reason summed over the kernel (no_instruction: instruction fetch).
        sums = {c: sum(num(t[c]) for t in table) for c in header
                if c.startswith("stall_") and "Not Issued" not in c}
        print("  stall reasons: " + ", ".join(
            f"{c[6:]} {100 * v / total:.1f}%" for c, v in sorted(sums.items(), key=lambda x: -x[1])
            if v > 0))
        for t in sorted(table, key=lambda t: -num(t[key]))[:n]:
            reasons = sorted(((num(v), c) for c, v in t.items()
                              if c.startswith("stall_") or "Stall" in c and c != key),
                             reverse=True)[:2]
            why = ", ".join(f"{c.replace('Warp Stall Sampling ', '')}={v:.0f}"
                            for v, c in reasons if v > 0)
            print(f"{100 * num(t[key]) / total:5.1f}%  {t.get('Address', '')[:8]:8s} "
                  f"{t.get('Source', '')[:60]:60s} {why[:60]}")


main()
