"""Builds the demo model's tokenizer and token data.

    /usr/bin/python3 tools/demo_model/prepare.py --dsv4 build/release/dsv4 --out models/demo --data scratch/demo_data

Writes OUT/tokenizer.json + tokenizer_config.json + heldout_sample.txt (the first three held-out
chapters), and into DATA: train.npy (the training
documents, shuffled raw chapters + chat examples, concatenated), heldout.json (the held-out
chapters: text and ids) and heldout.txt (their text, for xz). Ids come from the engine's own
tokenizer (`dsv4 tokenize --jsonl`).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402

VOCAB = 4096
N_CHAT = 8000
SEED = 14


def encode(dsv4, tokenizer, texts):
    lines = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts)
    r = subprocess.run([dsv4, "tokenize", "--jsonl", "-t", tokenizer], input=lines.encode(), capture_output=True,
                       check=True)
    out = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert len(out) == len(texts)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsv4", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.data, exist_ok=True)

    chapters = corpus.read_bible()
    train, held = corpus.split(chapters)
    raw = corpus.raw_documents(train)
    chats = corpus.chat_examples(train, SEED, N_CHAT)
    specials = re.compile("|".join(map(re.escape, bpe.SPECIALS)))
    merges = bpe.train([specials.sub("\n", d) for d in raw + chats], VOCAB - 256 - len(bpe.SPECIALS))
    tok_path = os.path.join(a.out, "tokenizer.json")
    bpe.write(tok_path, bpe.tokenizer_json(merges))
    bpe.write(os.path.join(a.out, "tokenizer_config.json"), bpe.tokenizer_config_json())

    docs = raw + chats
    random.Random(SEED).shuffle(docs)
    ids = encode(a.dsv4, tok_path, docs)
    stream = np.array([t for d in ids for t in d], dtype=np.int16)
    np.save(os.path.join(a.data, "train.npy"), stream)

    held_text = [corpus.chapter_text(c) for c in held]
    held_ids = encode(a.dsv4, tok_path, held_text)
    json.dump({"chapters": [f"{c[0]} {c[1]}" for c in held], "text": held_text, "ids": held_ids},
              open(os.path.join(a.data, "heldout.json"), "w"))
    with open(os.path.join(a.data, "heldout.txt"), "w") as f:
        f.write("".join(held_text))
    # A small held-out excerpt ships with the model for the engine-vs-torch test.
    with open(os.path.join(a.out, "heldout_sample.txt"), "w") as f:
        f.write("".join(held_text[:3]))
    n_raw = sum(len(d) for d, s in zip(ids, docs) if not s.startswith(corpus.BOS + corpus.USER))
    print(f"vocab {VOCAB}: {len(merges)} merges; train {len(stream)} tokens ({n_raw} raw-text, "
          f"{len(stream) - n_raw} chat) from {len(raw)} chapters + {len(chats)} chats; held out {len(held)} chapters, "
          f"{sum(map(len, held_ids))} tokens, {sum(len(t.encode()) for t in held_text)} bytes")


if __name__ == "__main__":
    main()
