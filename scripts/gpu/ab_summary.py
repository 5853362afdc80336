#!/usr/bin/env python3
"""Summary JSON of an ab_switch.sh run: the step time of every profile in the extracted ab/
folder of OUT/ab_VAR.tgz, with the switch value and round from the file names.

  scripts/gpu/ab_summary.py AB_DIR VAR OUT_JSON "what was compared" [GPU]
"""
import glob
import json
import os
import re
import sys


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    ab_dir, var, out_path, what = sys.argv[1:5]
    gpu = sys.argv[5] if len(sys.argv) > 5 else "NVIDIA H200 (sm_90, 132 SMs)"
    pattern = re.compile(r"_b(\d+)_" + re.escape(var) + r"(\d)_r(\d+)\.json$")
    runs, commit = [], None
    for path in sorted(glob.glob(os.path.join(ab_dir, "profile*.json"))):
        m = pattern.search(path)
        if not m:
            continue
        d = json.load(open(path))
        commit = commit or d.get("commit")
        runs.append({"batch": int(m.group(1)), var: int(m.group(2)), "round": int(m.group(3)),
                     "step_ms": round(d["decode"]["step_s"] * 1e3, 4),
                     "floor_ms": round(d["decode"]["floor_s"] * 1e3, 4)})
    if not runs:
        sys.exit("no profiles for " + var + " in " + ab_dir)
    runs.sort(key=lambda r: (r["batch"], r["round"], -r[var]))
    out = {"what": what, "gpu": gpu, "binaries": commit, "runs": runs}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for r in runs:
        print(f"B={r['batch']:<3} {var}={r[var]} round {r['round']}: {r['step_ms']:.3f} ms")


if __name__ == "__main__":
    main()
