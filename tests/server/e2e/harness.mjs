// Shared helpers of the Node end-to-end tests: start `deepserve serve` (or any command printing
// "listening on http://HOST:PORT") as a child on 127.0.0.1 with a free port, wait for /health,
// read /metrics and the child's RSS, check results, and stop it with SIGTERM (SIGKILL after 10 s).
// Loopback only (reliability.md §5.1).
import { spawn } from "node:child_process";
import { readFileSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

export const SKIP = 77;

// The `openai` package from the repository's node_modules, or exit 77 (ctest SKIP_RETURN_CODE).
export async function loadOpenAI(repoRoot) {
  const dir = path.join(repoRoot, "node_modules", "openai");
  if (!existsSync(dir)) {
    console.log("SKIP: node_modules/openai is missing (run scripts/install_deps.sh)");
    process.exit(SKIP);
  }
  const require = createRequire(path.join(repoRoot, "package.json"));
  const mod = await import(require.resolve("openai"));
  return mod.default ?? mod.OpenAI;
}

let failures = 0;
let passes = 0;
export function check(name, cond, detail = "") {
  if (cond) {
    passes++;
  } else {
    failures++;
    console.log(`FAIL ${name}${detail ? ": " + detail : ""}`);
  }
}
export function summary(label, t0) {
  const s = ((Date.now() - t0) / 1000).toFixed(1);
  console.log(`${label}: ${passes} checks passed, ${failures} failed, ${s} s`);
  return failures === 0 ? 0 : 1;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts the server; resolves once /health is 200 (deadline `readyMs`).
export async function startServer(cmd, args, { readyMs = 120000, env = {} } = {}) {
  const child = spawn(cmd[0], [...cmd.slice(1), "--host", "127.0.0.1", "--port", "0", ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, OMP_WAIT_POLICY: "passive", ...env },
  });
  let out = "";
  let log = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (log += d));
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  const t0 = Date.now();
  let url = null;
  let sawLoading503 = false;
  while (Date.now() - t0 < readyMs) {
    if (child.exitCode !== null) throw new Error(`server exited early (${child.exitCode}):\n${log}`);
    const m = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
    if (m) {
      url = m[1];
      try {
        const r = await fetch(url + "/health");
        if (r.status === 200) break;
        if (r.status === 503) sawLoading503 = true;
      } catch {}
    }
    await sleep(50);
  }
  if (!url) throw new Error("server printed no URL:\n" + out + log);
  const server = {
    url,
    child,
    exited,
    sawLoading503,
    log: () => log,
    stdout: () => out,
    async metrics() {
      const r = await fetch(url + "/metrics", { headers: server.headers });
      const text = await r.text();
      const m = {};
      for (const line of text.split("\n")) {
        if (!line || line.startsWith("#")) continue;
        const sp = line.lastIndexOf(" ");
        const key = line.slice(0, sp).replace(/\{model_name="[^"]*"\}$/, "").replace(/model_name="[^"]*",?/, "");
        m[key] = Number(line.slice(sp + 1));
      }
      return m;
    },
    rssKiB() {
      const s = readFileSync(`/proc/${child.pid}/status`, "utf8");
      return Number(s.match(/VmRSS:\s+(\d+)/)[1]);
    },
    headers: {},
    async stop(timeoutMs = 10000) {
      if (child.exitCode !== null) return exited;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
      const r = await exited;
      clearTimeout(timer);
      return r;
    },
  };
  return server;
}

// Reads an SSE response body into its `data:` payloads.
export async function readSse(response, onEvent = null) {
  const reader = response.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  const events = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (line.startsWith("data: ")) {
        events.push(line.slice(6));
        if (onEvent && (await onEvent(line.slice(6), events.length)) === false) {
          await reader.cancel();
          return events;
        }
      }
    }
  }
  return events;
}

export function parseCommand(argv) {
  // argv: <repo root> <server command...>
  return { repoRoot: argv[0], cmd: argv.slice(1) };
}
