#!/usr/bin/env node
// Which code points Hugging Face tokenizers (Oniguruma) puts in the general categories the
// DeepSeek pre-tokenizer regexes use: \p{L} \p{M} \p{N} \p{P} \p{S} (and \p{Nd}, \p{Z}).
//   node unicode_probe.js TOKENIZER_JSON all           every code point of planes 0-3 and 14
//   node unicode_probe.js TOKENIZER_JSON FILE.json     the code points listed in FILE.json
// Prints {"L": [code points...], ...}. Any tokenizer.json serves as a shell: its pre-tokenizer
// is replaced by one Split(\p{X}, Isolated). Used by gen_unicode_delta.py and by
// tests/tokenizer_oracle_test.cc (which compares all of them with PCRE2 + the delta table).
"use strict";
const fs = require("fs");
const { Tokenizer } = require("tokenizers");

const [shellPath, which] = process.argv.slice(2);
const shell = JSON.parse(fs.readFileSync(shellPath, "utf8"));
let candidates = [];
if (which === "all") {
  for (const [lo, hi] of [[0, 0x3ffff], [0xe0000, 0xeffff]])
    for (let c = lo; c <= hi; c++) if ((c < 0xd800 || c > 0xdfff) && c !== 1) candidates.push(c);
} else {
  candidates = JSON.parse(fs.readFileSync(which, "utf8"));
}
const out = {};
for (const category of ["L", "M", "N", "P", "S", "Nd", "Z"]) {
  const t = JSON.parse(JSON.stringify(shell));
  t.pre_tokenizer = { type: "Split", pattern: { Regex: `\\p{${category}}` }, behavior: "Isolated", invert: false };
  const pre = Tokenizer.fromString(JSON.stringify(t)).getPreTokenizer();
  const hits = [];
  const CHUNK = 20000;
  for (let i = 0; i < candidates.length; i += CHUNK) {
    // U+0001 (a control, in none of the categories) separates the candidates, so every piece
    // that is a single candidate character is a match.
    let s = "";
    for (const c of candidates.slice(i, i + CHUNK)) s += "\u0001" + String.fromCodePoint(c);
    for (const [piece] of pre.preTokenizeString(s)) {
      const cps = [...piece];
      if (cps.length === 1 && piece !== "\u0001") hits.push(cps[0].codePointAt(0));
    }
  }
  out[category] = hits;
}
process.stdout.write(JSON.stringify(out) + "\n");
