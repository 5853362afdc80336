#!/usr/bin/env python3
"""KV paging on the GPU through the server (issue 9): `deepserve serve --device cuda` on the
embedded tiny model three times with the same greedy requests (temperature 0, ignore_eos, a
100-word prompt + 300 tokens, so every request crosses a 256-token page boundary):
  - reference: room for every request (`--num-gpu-blocks-override 256`), all at once;
  - control: the same room, at a quarter of the concurrency (other batches, no preemption);
  - tight: too few pages (`--num-gpu-blocks-override PAGES`), all at once, so requests growing
    past a page boundary preempt others, which recompute later.
Checks:
  - every request succeeds on every server; the tight server preempted
    (deepserve:num_preemptions_total > 0); afterwards every server's KV usage is back to 0;
  - the tight run's texts agree with the reference about as well as the control's do. Not
    exactly: on the GPU a row's logits depend on the batch it runs in and on whether it is
    computed in a prefill chunk or a decode step (GEMM path and split choices follow the shapes),
    so a near-tie can flip a greedy token and two texts part from there; the control measures how
    much of that batch composition alone causes. A paging error (an entry read from a wrong page)
    corrupts every request from its first page boundary on: the tight run's identical texts fall
    to about none and their common prefixes to about the boundary. Bounds: identical texts at
    least the control's minus a quarter of the requests, mean common prefix at least the
    control's minus 0.15.
Writes a JSON summary and exits non-zero on a failed check.

  check_kv_paging.py DEEPSERVE_BIN OUT_JSON [--requests 48] [--concurrency 48] [--pages 24]
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request

WORDS = ("the of and to a in that is was he for it with as his on be at by i this had not are "
         "but from or have an they which one you were her all she there would their we him been "
         "has when who will more no if out so said what up its about into than them can only "
         "other new some could time these two may then do first any my now such like our over "
         "man me even most made after also did many before must through back years where much "
         "your way well down should because each just those people mr how too little state good "
         "very make world still own see men work long get here between both life being under "
         "never day same another know while last might us great old year off come since against "
         "go came right used take three").split()


def prompt(i):
    # A deterministic word sequence per request, about 100 tokens.
    return " ".join(WORDS[(i * 7 + j * j * 3 + j) % len(WORDS)] for j in range(100))


def post(port, body, timeout=300):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def run_server(ds, port, pages, max_tokens, args, log, concurrency):
    cmd = [ds, "serve", "--device", "cuda", "--port", str(port), "--max-num-seqs",
           str(args.concurrency), "--max-model-len", "1024", "--num-gpu-blocks-override",
           str(pages)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except Exception:
                if proc.poll() is not None:
                    raise RuntimeError(f"server with {pages} pages exited")
                time.sleep(1)
        t0 = time.time()

        def one(i):
            body = {"model": "deepseek-v4-tiny", "prompt": prompt(i), "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True}
            try:
                r = post(port, body)
                return {"ok": True, "text": r["choices"][0]["text"],
                        "tokens": r["usage"]["completion_tokens"]}
            except Exception as e:  # noqa: BLE001 - reported, then counted as a failure
                return {"ok": False, "error": str(e)}

        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(one, range(args.requests)))
        elapsed = time.time() - t0
        time.sleep(0.5)
        return {
            "pages": pages,
            "concurrency": concurrency,
            "results": results,
            "seconds": elapsed,
            "preemptions": metric(port, "deepserve:num_preemptions_total"),
            "kv_usage_after": metric(port, "deepserve:kv_cache_usage_perc"),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ds")
    ap.add_argument("out_json")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--pages", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=300)
    args = ap.parse_args()
    with open(args.out_json + ".log", "w") as log:
        ref = run_server(args.ds, 18095, 256, args.max_tokens, args, log, args.concurrency)
        control = run_server(args.ds, 18096, 256, args.max_tokens, args, log,
                             max(1, args.concurrency // 4))
        tight = run_server(args.ds, 18097, args.pages, args.max_tokens, args, log,
                           args.concurrency)

    def agreement(run):
        """Identical texts and the mean common prefix (fraction of the reference text)."""
        same, prefixes = 0, []
        for a, b in zip(ref["results"], run["results"]):
            if not (a["ok"] and b["ok"]):
                continue
            same += a["text"] == b["text"]
            n = 0
            while n < min(len(a["text"]), len(b["text"])) and a["text"][n] == b["text"][n]:
                n += 1
            prefixes.append(n / max(1, len(a["text"])))
        return same, sum(prefixes) / max(1, len(prefixes))

    failures = []
    runs = {"reference": ref, "control": control, "tight": tight}
    for name, run in runs.items():
        bad = [r.get("error") for r in run["results"] if not r["ok"]]
        if bad:
            failures.append(f"{name}: {len(bad)} failed requests: {bad[:3]}")
        if run["kv_usage_after"] is None or run["kv_usage_after"] > 0:
            failures.append(f"{name}: KV usage after the run: {run['kv_usage_after']}")
    if not tight["preemptions"]:
        failures.append("the tight server did not preempt")
    control_same, control_prefix = agreement(control)
    tight_same, tight_prefix = agreement(tight)
    if tight_same < control_same - args.requests / 4:
        failures.append(f"identical texts: tight {tight_same} vs control {control_same} of "
                        f"{args.requests}")
    if tight_prefix < control_prefix - 0.15:
        failures.append(f"mean common prefix: tight {tight_prefix:.3f} vs control "
                        f"{control_prefix:.3f}")
    summary = {
        "commit": os.environ.get("DS_COMMIT", "unknown"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "requests": args.requests, "concurrency": args.concurrency,
        "prompt_words": 100, "max_tokens": args.max_tokens,
        "runs": {name: {k: v for k, v in run.items() if k != "results"}
                 for name, run in runs.items()},
        "identical_texts": {"control": control_same, "tight": tight_same},
        "mean_common_prefix": {"control": control_prefix, "tight": tight_prefix},
        "failures": failures,
    }
    with open(args.out_json, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: summary[k] for k in ("runs", "identical_texts", "mean_common_prefix",
                                              "failures")}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
