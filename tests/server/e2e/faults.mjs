// Fault tests through `deepserve serve` (reliability.md §5 R4, R5, R8 subsets):
//  ST1  a client that disconnects mid-stream frees its KV: the KV metrics return to the baseline;
//  KV2  KV exhaustion (a tiny --kv-cache-memory-gib) triggers preemption, not failure, and the
//       preempted requests' greedy output equals their solo output;
//  KV4  overload answers 503 with Retry-After, quickly, and the accepted requests succeed;
//  SH5  SIGTERM drains: new requests get 503, in-flight streams finish, exit code 0;
//  SH6  a second SIGTERM during the drain ends the streams with an error event and exits promptly;
//  SH10 a taken port exits non-zero before loading.
// Usage: node faults.mjs <repo root> <server command...>
import { loadOpenAI, check, summary, startServer, parseCommand, readSse, sleep } from "./harness.mjs";
import net from "node:net";
import { spawnSync } from "node:child_process";

const t0 = Date.now();
const { repoRoot, cmd } = parseCommand(process.argv.slice(2));
await loadOpenAI(repoRoot);  // skips (77) without node_modules, like the other e2e tests

const post = (url, path, body, signal) =>
  fetch(url + path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal });

async function waitFor(pred, ms = 5000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await pred()) return true;
    await sleep(25);
  }
  return await pred();
}

const KV_KEYS = (m) => Object.keys(m).filter((k) => k.startsWith("deepserve:kv_cache_pool_free") || k === "deepserve:kv_cache_usage_perc");

let code = 1;
const servers = [];
try {
  console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ST1: disconnect mid-stream`);
  // ---- ST1: disconnect mid-stream ------------------------------------------------------------
  {
    const s = await startServer(cmd, ["--max-num-seqs", "8"]);
    servers.push(s);
    const base = await s.metrics();
    for (let round = 0; round < 3; round++) {
      const ac = new AbortController();
      const r = await post(s.url, "/v1/completions", { prompt: "Once upon a time", max_tokens: 400, ignore_eos: true, temperature: 0, stream: true }, ac.signal);
      let chunks = 0;
      try {
        await readSse(r, () => { if (++chunks >= 3) { ac.abort(); return false; } });
      } catch {}
      const back = await waitFor(async () => {
        const m = await s.metrics();
        return m["deepserve:num_requests_running"] === 0 && m["deepserve:num_requests_waiting"] === 0 &&
          KV_KEYS(base).every((k) => m[k] === base[k]);
      });
      const m = await s.metrics();
      check(`ST1.kv_back_to_baseline_round${round}`, back && chunks >= 3,
            JSON.stringify({ chunks, base: KV_KEYS(base).map((k) => [k, base[k], m[k]]) }));
    }
    // Same for a non-streaming client that leaves (ST2).
    const ac = new AbortController();
    const p = post(s.url, "/v1/completions", { prompt: "x", max_tokens: 400, ignore_eos: true }, ac.signal).catch(() => null);
    await waitFor(async () => (await s.metrics())["deepserve:num_requests_running"] > 0, 3000);
    ac.abort();
    await p;
    const back = await waitFor(async () => {
      const m = await s.metrics();
      return m["deepserve:num_requests_running"] === 0 && KV_KEYS(base).every((k) => m[k] === base[k]);
    });
    check("ST2.nonstream_disconnect_frees_kv", back);
    const r = await s.stop();
    check("ST1.exit0", r.code === 0, JSON.stringify(r));
  }

  console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] KV2: KV exhaustion -> preemption, output unchanged`);
  // ---- KV2: KV exhaustion -> preemption, output unchanged ------------------------------------
  // 4 sequences, a pool of 5 pages of 256 tokens: 4 prompts of 236 tokens fit (one page each), and
  // each needs a second page after 20 generated tokens, so the scheduler must preempt.
  {
    const s = await startServer(cmd, ["--max-num-seqs", "4", "--kv-cache-memory-gib", process.env.DS_E2E_TINY_KV_GIB ?? "0.00135"]);
    servers.push(s);
    const body = (i) => ({ prompt: Array.from({ length: 236 }, (_, k) => 1000 + 37 * i + k), max_tokens: 40, temperature: 0, ignore_eos: true });
    // Solo references, one at a time.
    const solo = [];
    for (let i = 0; i < 4; i++) {
      const r = await post(s.url, "/v1/completions", body(i));
      const j = await r.json();
      solo.push(r.status === 200 ? j.choices[0].text : `status ${r.status}: ${JSON.stringify(j)}`);
    }
    const before = (await s.metrics())["deepserve:num_preemptions_total"];
    const results = await Promise.all([0, 1, 2, 3].map(async (i) => {
      const r = await post(s.url, "/v1/completions", body(i));
      return { status: r.status, j: await r.json() };
    }));
    const after = (await s.metrics())["deepserve:num_preemptions_total"];
    check("KV2.all_succeed", results.every((r) => r.status === 200), JSON.stringify(results.map((r) => [r.status, r.j.error?.message])));
    check("KV2.preempted", after > before, `preemptions ${before} -> ${after}`);
    check("KV2.same_output_as_solo", results.every((r, i) => r.status === 200 && r.j.choices[0].text === solo[i] &&
          r.j.usage.completion_tokens === 40));
    await s.stop();
  }

  console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] KV4: overload -> 503 + Retry-After`);
  // ---- KV4: overload -> 503 + Retry-After ----------------------------------------------------
  {
    const s = await startServer(cmd, ["--max-num-seqs", "1", "--max-queued-requests", "1"]);
    servers.push(s);
    const results = await Promise.all(Array.from({ length: 12 }, async () => {
      const t = Date.now();
      const r = await post(s.url, "/v1/completions", { prompt: "hi", max_tokens: 16, ignore_eos: true });
      const j = await r.json();
      return { status: r.status, retry: r.headers.get("retry-after"), j, ms: Date.now() - t };
    }));
    const rejected = results.filter((r) => r.status === 503 || r.status === 429);
    const ok = results.filter((r) => r.status === 200);
    check("KV4.some_rejected", rejected.length >= 1, JSON.stringify(results.map((r) => r.status)));
    check("KV4.some_served", ok.length >= 1);
    check("KV4.only_200_or_503", ok.length + rejected.length === results.length);
    check("KV4.retry_after", rejected.every((r) => Number(r.retry) >= 1 && r.j.error && r.j.error.type));
    check("KV4.health_stays_200", (await fetch(s.url + "/health")).status === 200);
    await s.stop();
  }

  console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] SH5: SIGTERM drains in-flight streams`);
  // ---- SH5: SIGTERM drains in-flight streams -------------------------------------------------
  {
    const s = await startServer(cmd, ["--shutdown-timeout", "60"]);
    servers.push(s);
    const streams = Array.from({ length: 4 }, async () => {
      const r = await post(s.url, "/v1/completions", { prompt: "Count:", max_tokens: 48, ignore_eos: true, stream: true });
      const events = await readSse(r);
      return events;
    });
    await waitFor(async () => (await s.metrics())["deepserve:num_requests_running"] >= 4, 10000);
    s.child.kill("SIGTERM");
    await sleep(100);
    let refused = null;
    try {
      const r = await post(s.url, "/v1/completions", { prompt: "late", max_tokens: 2 });
      refused = { status: r.status, retry: r.headers.get("retry-after") };
    } catch (e) {
      refused = { status: "closed" };
    }
    check("SH5.new_requests_503", refused.status === 503 && refused.retry !== null, JSON.stringify(refused));
    const all = await Promise.all(streams);
    for (const events of all) {
      const last = JSON.parse(events[events.length - 2]);
      check("SH5.stream_finished", events[events.length - 1] === "[DONE]" && last.choices?.[0]?.finish_reason === "length",
            events.slice(-2).join(" | "));
    }
    const r = await s.exited;
    check("SH5.exit0", r.code === 0 && r.signal === null, JSON.stringify(r));
  }

  console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] SH6: a second SIGTERM aborts`);
  // ---- SH6: a second SIGTERM aborts ----------------------------------------------------------
  {
    const s = await startServer(cmd, ["--shutdown-timeout", "60"]);
    servers.push(s);
    const stream = (async () => {
      const r = await post(s.url, "/v1/completions", { prompt: "Count:", max_tokens: 3000, ignore_eos: true, stream: true });
      return await readSse(r);
    })();
    await waitFor(async () => (await s.metrics())["deepserve:num_requests_running"] >= 1, 10000);
    s.child.kill("SIGTERM");
    await sleep(200);
    const t = Date.now();
    s.child.kill("SIGTERM");
    const events = await stream;
    const r = await s.exited;
    check("SH6.exit_prompt", Date.now() - t < 5000, `${Date.now() - t} ms`);
    check("SH6.exit0", r.code === 0, JSON.stringify(r));
    check("SH6.error_event", events[events.length - 1] === "[DONE]" && JSON.parse(events[events.length - 2]).error !== undefined,
          events.slice(-2).join(" | "));
  }

  console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] SH10: a taken port fails before loading`);
  // ---- SH10: a taken port fails before loading -----------------------------------------------
  {
    const srv = net.createServer();
    await new Promise((r) => srv.listen(0, "127.0.0.1", r));
    const port = srv.address().port;
    const t = Date.now();
    const r = spawnSync(cmd[0], [...cmd.slice(1), "--host", "127.0.0.1", "--port", String(port)], { encoding: "utf8", timeout: 20000 });
    srv.close();
    check("SH10.port_in_use_exits_nonzero", r.status !== 0 && r.status !== null && /cannot listen/.test(r.stderr), `${r.status} ${r.stderr}`);
    check("SH10.before_loading", Date.now() - t < 5000, `${Date.now() - t} ms`);
    const bad = spawnSync(cmd[0], [...cmd.slice(1), "--model", "/nonexistent/dir", "--port", "0"], { encoding: "utf8", timeout: 20000 });
    check("SH10.bad_model_dir", bad.status === 2 && /not a readable directory/.test(bad.stderr), `${bad.status} ${bad.stderr}`);
    const flag = spawnSync(cmd[0], [...cmd.slice(1), "--max-num-seqs", "0"], { encoding: "utf8", timeout: 20000 });
    check("SH10.bad_flag", flag.status !== 0 && flag.status !== null, `${flag.status}`);
  }
  code = summary("faults", t0);
} catch (e) {
  console.log("FAIL exception:", e?.stack ?? e);
  for (const s of servers) console.log(s.log().slice(-2000));
  code = 1;
}
for (const s of servers) if (s.child.exitCode === null) await s.stop();
process.exit(code);
