// Load test through `deepserve serve` with the official `openai` client: a bounded run of N
// requests (default 2,000) at concurrency C (default 64) on the tiny CPU model, short prompts and
// small max_tokens. Passes with zero errors and no memory growth: once the allocator and the
// worker threads have reached their high-water mark, RSS stays flat. Checked as: RSS after the
// run is at most RSS after the first half of the measured run plus a small margin
// (DS_E2E_RSS_MARGIN_MIB, default 16: a leak of 16 KiB per request over the second half's 1,000
// requests fails), and at most RSS after the warm-up plus four margins. (A one-time step of
// ~30 MiB after the warm-up was seen on a loaded CI-like machine, then flat: malloc arenas
// reaching the largest batch shape, not a leak.)
// Usage: node load.mjs <repo root> <server command...>
import { loadOpenAI, check, summary, startServer, parseCommand } from "./harness.mjs";

const t0 = Date.now();
const { repoRoot, cmd } = parseCommand(process.argv.slice(2));
const OpenAI = await loadOpenAI(repoRoot);
const total = Number(process.env.DS_E2E_LOAD_REQUESTS ?? 2000);
const concurrency = Number(process.env.DS_E2E_LOAD_CONCURRENCY ?? 64);
const marginMiB = Number(process.env.DS_E2E_RSS_MARGIN_MIB ?? 16);
// HTTP threads = connections + a few: every worker thread's stack and malloc cache count in RSS
// once it has served a request, so the warm-up must have used them all before the baseline.
const server = await startServer(cmd, ["--max-num-seqs", String(concurrency), "--http-threads", String(concurrency + 8)]);
let code = 1;
try {
  const client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 120000 });
  const model = (await client.models.list()).data[0].id;
  let errors = 0;
  let firstError = "";
  const one = async (i) => {
    try {
      if (i % 2 === 0) {
        const r = await client.completions.create({ model, prompt: `Request ${i}: hello`, max_tokens: 4, temperature: 0, ignore_eos: true });
        if (r.usage.completion_tokens !== 4) throw new Error("usage " + JSON.stringify(r.usage));
      } else {
        const s = await client.chat.completions.create({ model, messages: [{ role: "user", content: `Hi ${i}` }], max_tokens: 4, stream: true });
        let n = 0;
        for await (const c of s) n += c.choices.length;
        if (n === 0) throw new Error("empty stream");
      }
    } catch (e) {
      errors++;
      if (!firstError) firstError = String(e?.message ?? e);
    }
  };
  const run = async (count, offset) => {
    let next = 0;
    await Promise.all(Array.from({ length: concurrency }, async () => {
      for (;;) {
        const i = next++;
        if (i >= count) return;
        await one(offset + i);
      }
    }));
  };
  const warm = Math.min(Number(process.env.DS_E2E_LOAD_WARMUP ?? 640), total);
  await run(warm, 0);
  const rssWarm = server.rssKiB();
  const t1 = Date.now();
  const step = 500;
  let rssHalf = rssWarm;  // RSS once half of the measured requests are done
  for (let done = 0; done < total; done += step) {
    await run(Math.min(step, total - done), warm + done);
    const now = server.rssKiB();
    if (done + step <= total / 2) rssHalf = now;
    console.log(`  ${done + Math.min(step, total - done)} requests: RSS ${(now / 1024).toFixed(1)} MiB`);
  }
  const secs = (Date.now() - t1) / 1000;
  // Let the keep-alive connections close and the engine go idle (within 5 s, reliability R4).
  let m = await server.metrics();
  for (let i = 0; i < 50; ++i) {
    if (m["deepserve:num_requests_running"] === 0 && m["deepserve:num_requests_waiting"] === 0) break;
    await new Promise((r) => setTimeout(r, 100));
    m = await server.metrics();
  }
  await new Promise((r) => setTimeout(r, 500));
  const rssAfter = server.rssKiB();
  console.log(`load: ${total} requests at concurrency ${concurrency} in ${secs.toFixed(1)} s ` +
              `(${(total / secs).toFixed(1)} req/s); RSS after warm-up ${(rssWarm / 1024).toFixed(1)} MiB, ` +
              `after the run ${(rssAfter / 1024).toFixed(1)} MiB`);
  check("load.zero_errors", errors === 0, `${errors} errors, first: ${firstError}`);
  check("load.no_memory_growth", rssAfter <= rssHalf + marginMiB * 1024,
        `second half: ${rssHalf} -> ${rssAfter} KiB`);
  check("load.bounded_memory", rssAfter <= rssWarm + 4 * marginMiB * 1024,
        `after warm-up ${rssWarm} -> ${rssAfter} KiB`);
  check("load.idle_after", m["deepserve:num_requests_running"] === 0 && m["deepserve:num_requests_waiting"] === 0);
  const r = await server.stop();
  check("load.exit0", r.code === 0, JSON.stringify(r));
  code = summary("load", t0);
} catch (e) {
  console.log("FAIL exception:", e?.stack ?? e);
  console.log(server.log().slice(-3000));
  await server.stop();
  code = 1;
}
process.exit(code);
