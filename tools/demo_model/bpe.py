"""A byte-level BPE tokenizer in the Hugging Face tokenizer.json format, laid out as the
fixtures' tokenizers: ids 0-255 are the bytes (id = byte value), then the learned merges in
order, then the 16 DeepSeek V4 special tokens at the top ids (bos = vocab-16, eos = vocab-15).
The pre-tokenizer, decoder and added-token flags are those of the DeepSeek V3/V4 tokenizer.json.

Merges are learned on words split by an ASCII transcription of the V3 pre-tokenizer regex (the
corpus is ASCII). Encoding for training is done by the engine's own tokenizer (`dsv4 tokenize`),
which is tested against Hugging Face tokenizers, so the ids the model is trained on are exactly
the ids the engine and the npm oracle produce.
"""
import collections
import json
import re

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
            "</think>", "｜DSML｜", "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>",
            "<｜title｜>", "<｜extracted_url｜>", "<｜read_url｜>"]

# The DeepSeek V3/V4 pre-tokenizer (tokenizer.json "pre_tokenizer"), verbatim.
PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[一-龥\u3040-ゟ゠-ヿ]+"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}
DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}

# ASCII transcription of the third Split (for ASCII, \p{L} = [A-Za-z], \p{P}\p{S} = the 32
# ASCII punctuation and symbol characters, \p{M} is empty); digits are isolated first.
_P = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]"""
_WORD = re.compile(_P + r"[A-Za-z]+|[^\r\nA-Za-z!-/:-@\[-`{-~]?[A-Za-z]+| ?" + _P + r"+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DIGITS = re.compile(r"[0-9]{1,3}")


def _isolated(pattern, text):
    pieces, last = [], 0
    for m in pattern.finditer(text):
        if m.start() > last:
            pieces.append(text[last:m.start()])
        if m.end() > m.start():
            pieces.append(m.group())
        last = m.end()
    if last < len(text):
        pieces.append(text[last:])
    return pieces


def pre_tokenize(text):
    out = []
    for piece in _isolated(_DIGITS, text):
        out.extend(_isolated(_WORD, piece))
    return out


def byte_to_unicode():
    """GPT-2's reversible byte -> printable character table (ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train(texts, n_merges):
    """Learns n_merges merges over the words of `texts` (strings without special tokens)."""
    b2u = byte_to_unicode()
    counts = collections.Counter()
    for t in texts:
        counts.update(pre_tokenize(t))
    words = [[b2u[b] for b in w.encode("utf-8")] for w in counts]
    freq = list(counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    merges = []
    for _ in range(n_merges):
        if not pairs:
            break
        # Most frequent pair; ties broken by the pair itself so the result is deterministic.
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] <= 0:
            break
        merges.append(best)
        a, b = best
        joined = a + b
        for i in list(where[best]):
            w = words[i]
            f = freq[i]
            for x, y in zip(w, w[1:]):
                pairs[(x, y)] -= f
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(joined)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for x, y in zip(out, out[1:]):
                pairs[(x, y)] += f
                where[(x, y)].add(i)
        for p in [p for p, c in pairs.items() if c <= 0]:
            del pairs[p]
            where.pop(p, None)
    return merges


def tokenizer_json(merges):
    b2u = byte_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    for i, (a, b) in enumerate(merges):
        vocab[a + b] = 256 + i
    n = 256 + len(merges)
    added = [{"id": n + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
              "special": True} for i, s in enumerate(SPECIALS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": []}, "pre_tokenizer": PRE_TOKENIZER, "post_processor": None,
        "decoder": DECODER,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
    }


def tokenizer_config_json():
    def tok(s):
        return {"__type": "AddedToken", "content": s, "lstrip": False, "normalized": True, "rstrip": False,
                "single_word": False}
    return {"add_bos_token": False, "add_eos_token": False, "bos_token": tok(SPECIALS[0]),
            "clean_up_tokenization_spaces": False, "eos_token": tok(SPECIALS[1]), "legacy": True,
            "model_max_length": 1048576, "pad_token": tok(SPECIALS[1]), "sp_model_kwargs": {}, "unk_token": None,
            "tokenizer_class": "PreTrainedTokenizerFast"}


def write(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")
