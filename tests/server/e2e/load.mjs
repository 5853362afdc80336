// Load test through `deepserve serve` with the official `openai` client: a bounded run of N
// requests (default 2,000) at concurrency C (default 64) on the tiny CPU model, short prompts and
// small max_tokens. Passes with zero errors and no memory growth, judged on the bytes the server's
// allocator holds for it (/metrics deepserve:heap_allocated_bytes, glibc's mallinfo2 over every
// arena): after the run, at idle, they are at most those after the first half of the measured run
// plus a small margin (DS_E2E_HEAP_MARGIN_MIB, default 8: a leak of 8 KiB per request over the
// second half's 1,000 requests fails), and at most those after the warm-up plus two margins.
// RSS is only bounded (DS_E2E_RSS_MARGIN_MIB, default 256, over the RSS after the warm-up): it
// also moves with the allocator's arenas and free lists, which reach their high-water mark only
// when the largest mix of batch shapes has occurred: a CI run grew 352 -> 438 MiB in the second
// half (first half 398 -> 352, down) with no leak to show for it.
// Usage: node load.mjs <repo root> <server command...>
import { loadOpenAI, check, summary, startServer, parseCommand } from "./harness.mjs";

const t0 = Date.now();
const { repoRoot, cmd } = parseCommand(process.argv.slice(2));
const OpenAI = await loadOpenAI(repoRoot);
const total = Number(process.env.DS_E2E_LOAD_REQUESTS ?? 2000);
const concurrency = Number(process.env.DS_E2E_LOAD_CONCURRENCY ?? 64);
const heapMarginMiB = Number(process.env.DS_E2E_HEAP_MARGIN_MIB ?? 8);
const rssMarginMiB = Number(process.env.DS_E2E_RSS_MARGIN_MIB ?? 256);
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
  // The allocator's bytes in use, KiB (scraped between batches: only keep-alive connections and
  // finished requests' leftovers are alive then).
  const heapKiB = async () => (await server.metrics())["deepserve:heap_allocated_bytes"] / 1024;
  const rssWarm = server.rssKiB();
  const heapWarm = await heapKiB();
  const t1 = Date.now();
  const step = 500;
  let heapHalf = heapWarm;  // heap once half of the measured requests are done
  for (let done = 0; done < total; done += step) {
    await run(Math.min(step, total - done), warm + done);
    const now = server.rssKiB();
    const heap = await heapKiB();
    if (done + step <= total / 2) heapHalf = heap;
    console.log(`  ${done + Math.min(step, total - done)} requests: RSS ${(now / 1024).toFixed(1)} MiB, ` +
                `heap ${(heap / 1024).toFixed(1)} MiB`);
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
  const heapAfter = await heapKiB();
  console.log(`load: ${total} requests at concurrency ${concurrency} in ${secs.toFixed(1)} s ` +
              `(${(total / secs).toFixed(1)} req/s); after warm-up / after the run: ` +
              `heap ${(heapWarm / 1024).toFixed(1)} / ${(heapAfter / 1024).toFixed(1)} MiB, ` +
              `RSS ${(rssWarm / 1024).toFixed(1)} / ${(rssAfter / 1024).toFixed(1)} MiB`);
  check("load.zero_errors", errors === 0, `${errors} errors, first: ${firstError}`);
  check("load.heap_reported", Number.isFinite(heapWarm) && heapWarm > 0, `heap ${heapWarm} KiB`);
  check("load.no_memory_growth", heapAfter <= heapHalf + heapMarginMiB * 1024,
        `heap in the second half: ${heapHalf} -> ${heapAfter} KiB`);
  check("load.bounded_heap", heapAfter <= heapWarm + 2 * heapMarginMiB * 1024,
        `heap after warm-up ${heapWarm} -> ${heapAfter} KiB`);
  check("load.bounded_rss", rssAfter <= rssWarm + rssMarginMiB * 1024,
        `RSS after warm-up ${rssWarm} -> ${rssAfter} KiB`);
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
