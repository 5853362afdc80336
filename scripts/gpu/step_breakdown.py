"""Where a serving run's engine steps went, from two /metrics snapshots (before and after the run):
steps, how many carried prefill rows, rows per step by kind, and the engine thread's time per
step by phase (deepserve:engine_step_seconds_total, EngineMetrics::step_*). The forward phase
includes the device's work; the others are host work on the engine thread.

  step_breakdown.py BEFORE.txt AFTER.txt [--json OUT.json]
"""
import json
import re
import sys


def parse(path):
    values = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("deepserve:"):
                continue
            name_labels, _, value = line.rstrip("\n").rpartition(" ")
            name = name_labels.split("{", 1)[0]
            m = re.search(r'(phase|kind)="([a-z]+)"', name_labels)
            key = f"{name}.{m.group(2)}" if m else name
            try:
                values[key] = float(value)
            except ValueError:
                pass
    return values


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    before, after = parse(sys.argv[1]), parse(sys.argv[2])
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = d.get("deepserve:engine_steps_total", 0.0)
    if steps <= 0:
        sys.exit("no engine steps between the two snapshots")
    phases = ["schedule", "forward", "sample", "emit", "speculate"]
    per_step_ms = {p: 1e3 * d.get(f"deepserve:engine_step_seconds_total.{p}", 0.0) / steps
                   for p in phases}
    out = {
        "steps": steps,
        "prefill_steps": d.get("deepserve:engine_prefill_steps_total", 0.0),
        "decode_rows_per_step": d.get("deepserve:engine_step_tokens_total.decode", 0.0) / steps,
        "prefill_rows_per_step": d.get("deepserve:engine_step_tokens_total.prefill", 0.0) / steps,
        "generated_tokens": d.get("deepserve:generation_tokens_total", 0.0),
        "ms_per_step": per_step_ms,
        "host_ms_per_step": sum(v for p, v in per_step_ms.items() if p != "forward"),
    }
    print(f"steps {steps:.0f} ({out['prefill_steps']:.0f} with prefill rows); rows/step: decode "
          f"{out['decode_rows_per_step']:.1f}, prefill {out['prefill_rows_per_step']:.1f}; "
          "ms/step: " + ", ".join(f"{p} {v:.2f}" for p, v in per_step_ms.items()) +
          f"; host {out['host_ms_per_step']:.2f}")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
