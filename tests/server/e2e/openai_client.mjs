// End-to-end tests with the official `openai` Node client against `deepserve serve` on 127.0.0.1:
// chat and completions, streaming and not (stream text == non-stream text, ST4), stop strings
// across token boundaries (ST8), logprobs, seed reproducibility, usage, reasoning_content, error
// classes (400 / 404) and the /health 503-while-loading promise (SH1).
// Usage: node openai_client.mjs <repo root> <server command...>
import { loadOpenAI, check, summary, startServer, parseCommand } from "./harness.mjs";

const t0 = Date.now();
const { repoRoot, cmd } = parseCommand(process.argv.slice(2));
const OpenAI = await loadOpenAI(repoRoot);
const server = await startServer(cmd, []);
let code = 1;
try {
  const client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 60000 });

  const models = await client.models.list();
  const model = models.data[0].id;
  check("models.max_model_len", models.data[0].max_model_len > 0, JSON.stringify(models.data[0]));

  // ---- completions: stream == non-stream, usage --------------------------------------------------
  const prompt = "The capital of France is";
  const base = { model, prompt, max_tokens: 24, temperature: 0, ignore_eos: true };
  const plain = await client.completions.create({ ...base, logprobs: 2 });
  const text = plain.choices[0].text;
  check("completions.finish_length", plain.choices[0].finish_reason === "length", plain.choices[0].finish_reason);
  check("completions.usage", plain.usage.completion_tokens === 24 && plain.usage.prompt_tokens > 0 &&
        plain.usage.total_tokens === plain.usage.prompt_tokens + 24, JSON.stringify(plain.usage));
  const lp = plain.choices[0].logprobs;
  check("completions.logprobs_shape", lp.tokens.length === 24 && lp.token_logprobs.every((v) => v <= 0) &&
        lp.top_logprobs.every((m) => Object.keys(m).length >= 1 && Object.keys(m).length <= 2),
        JSON.stringify(lp).slice(0, 300));
  check("completions.logprobs_text", lp.tokens.join("") === text, JSON.stringify([lp.tokens.join(""), text]));
  // Greedy picks the most likely token: its logprob is the best of the alternatives.
  check("completions.greedy_is_argmax", lp.top_logprobs.every((m, i) =>
    Object.values(m).every((v) => v <= lp.token_logprobs[i] + 1e-4)));

  const stream = await client.completions.create({ ...base, stream: true, stream_options: { include_usage: true } });
  let joined = "";
  let usage = null;
  let ids = new Set();
  for await (const chunk of stream) {
    ids.add(chunk.id);
    if (chunk.choices.length) joined += chunk.choices[0].text;
    if (chunk.usage) usage = chunk.usage;
  }
  check("completions.stream_equals_plain", joined === text, JSON.stringify([joined, text]));
  check("completions.stream_one_id", ids.size === 1);
  check("completions.stream_usage", usage && usage.completion_tokens === 24 &&
        usage.prompt_tokens === plain.usage.prompt_tokens, JSON.stringify(usage));

  // ---- stop strings across token boundaries (ST8) ------------------------------------------------
  // Pick a stop string made of the end of one token and the start of the next.
  let stopCase = null;
  for (let i = 4; i + 1 < lp.tokens.length && !stopCase; i++) {
    const a = lp.tokens[i], b = lp.tokens[i + 1];
    if (a.length >= 1 && b.length >= 1) {
      const s = a.slice(-Math.min(2, a.length)) + b.slice(0, Math.min(2, b.length));
      const first = text.indexOf(s);
      const offset = lp.tokens.slice(0, i + 1).join("").length;  // end of token i
      // The first occurrence must be the one spanning the boundary (so the expected text is exact).
      if (first === offset - Math.min(2, a.length) && s.trim().length > 0) stopCase = { s, cut: first };
    }
  }
  check("stop.case_found", stopCase !== null, JSON.stringify(lp.tokens));
  if (stopCase) {
    const expected = text.slice(0, stopCase.cut);
    const r = await client.completions.create({ ...base, stop: [stopCase.s] });
    check("stop.plain", r.choices[0].text === expected && r.choices[0].finish_reason === "stop",
          JSON.stringify([r.choices[0].text, expected, r.choices[0].finish_reason]));
    const st = await client.completions.create({ ...base, stop: [stopCase.s], stream: true });
    let sj = "", fr = null;
    for await (const c of st) {
      if (c.choices.length) {
        sj += c.choices[0].text;
        if (c.choices[0].finish_reason) fr = c.choices[0].finish_reason;
      }
    }
    check("stop.stream", sj === expected && fr === "stop", JSON.stringify([sj, expected, fr]));
    check("stop.never_emitted", !sj.includes(stopCase.s));
  }

  // ---- chat: stream == non-stream, role first, usage, logprobs -----------------------------------
  const messages = [{ role: "user", content: "Say something about the sea." }];
  const chatBase = { model, messages, max_tokens: 20, temperature: 0 };
  const chat = await client.chat.completions.create({ ...chatBase, logprobs: true, top_logprobs: 3 });
  const content = chat.choices[0].message.content ?? "";
  check("chat.role", chat.choices[0].message.role === "assistant");
  check("chat.usage", chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens &&
        chat.usage.completion_tokens >= 1 && chat.usage.completion_tokens <= 20, JSON.stringify(chat.usage));
  check("chat.finish", ["stop", "length", "tool_calls"].includes(chat.choices[0].finish_reason));
  const clp = chat.choices[0].logprobs?.content ?? [];
  check("chat.logprobs", clp.length >= 1 && clp.every((t) => t.logprob <= 0 && t.top_logprobs.length === 3 &&
        t.top_logprobs.every((a) => a.logprob <= t.logprob + 1e-4)), JSON.stringify(clp[0]));
  const cs = await client.chat.completions.create({ ...chatBase, stream: true, stream_options: { include_usage: true } });
  let cj = "", first = null, cusage = null, cfinish = null;
  for await (const c of cs) {
    if (c.choices.length) {
      if (first === null) first = c.choices[0].delta.role;
      cj += c.choices[0].delta.content ?? "";
      if (c.choices[0].finish_reason) cfinish = c.choices[0].finish_reason;
    }
    if (c.usage) cusage = c.usage;
  }
  check("chat.stream_equals_plain", cj === content, JSON.stringify([cj, content]));
  check("chat.stream_role_first", first === "assistant");
  check("chat.stream_finish", cfinish === chat.choices[0].finish_reason, `${cfinish} vs ${chat.choices[0].finish_reason}`);
  check("chat.stream_usage", cusage && cusage.completion_tokens === chat.usage.completion_tokens, JSON.stringify(cusage));

  // Thinking mode: the output starts in reasoning_content (DeepSeek chat_template_kwargs).
  const think = await client.chat.completions.create({ ...chatBase, max_tokens: 12, chat_template_kwargs: { thinking: true } });
  check("chat.thinking_field", typeof think.choices[0].message.reasoning_content === "string",
        JSON.stringify(think.choices[0].message));

  // ---- seed reproducibility ----------------------------------------------------------------------
  const sampled = async (seed) => (await client.completions.create({ model, prompt, max_tokens: 16, temperature: 1.0, seed, ignore_eos: true })).choices[0].text;
  const a1 = await sampled(1234), a2 = await sampled(1234);
  check("seed.same_seed_same_text", a1 === a2, JSON.stringify([a1, a2]));
  const others = [await sampled(1), await sampled(2), await sampled(3)];
  check("seed.other_seeds_differ", others.some((t) => t !== a1), JSON.stringify([a1, ...others]));
  const cseed = async (seed) => (await client.chat.completions.create({ ...chatBase, temperature: 0.9, seed })).choices[0].message.content;
  check("seed.chat", (await cseed(7)) === (await cseed(7)));

  // ---- errors as the client library sees them ----------------------------------------------------
  try {
    await client.completions.create({ ...base, model: "no-such-model" });
    check("errors.404", false, "no error");
  } catch (e) {
    check("errors.404", e.status === 404 && e.code === "model_not_found", `${e.status} ${e.code}`);
  }
  try {
    await client.chat.completions.create({ ...chatBase, top_p: 0 });
    check("errors.400", false, "no error");
  } catch (e) {
    check("errors.400", e.status === 400 && e.param === "top_p" && e.type === "invalid_request_error",
          `${e.status} ${e.param} ${e.type}`);
  }
  try {
    await client.completions.create({ ...base, prompt: "x".repeat(200000), max_tokens: 1 });
    check("errors.context", false, "no error");
  } catch (e) {
    check("errors.context", e.status === 400 || e.status === 413, `${e.status} ${e.message}`);
  }
  // Still alive after the errors.
  const again = await client.completions.create(base);
  check("alive_after_errors", again.choices[0].text === text);

  const r = await server.stop();
  check("exit.sigterm_0", r.code === 0 && r.signal === null, JSON.stringify(r));
  check("log.one_line_per_request", (server.log().match(/request id=/g) || []).length >= 10);
  code = summary("openai_client", t0);
} catch (e) {
  console.log("FAIL exception:", e?.stack ?? e);
  console.log(server.log().slice(-3000));
  await server.stop();
  code = 1;
}
process.exit(code);
