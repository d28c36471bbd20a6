"""The demo model's training text: the King James Bible from Debian's bible-kjv-text.

Provenance: Debian package `bible-kjv-text` (read with the `bible` program of `bible-kjv`).
The KJV text (1611) is in the public domain (its copyright expired; see
/usr/share/doc/bible-kjv-text/copyright). The Debian packaging is GPL-2+, which does not cover
the text itself.

Split: every chapter whose running index is 7 mod 20 (5 % of the chapters, spread evenly over
the whole book) is held out and never trained on. The raw-text documents are whole chapters
(one verse per line); the chat documents are built from training chapters only, in the V4
chat encoding (spec §5.2, non-thinking mode):
    <bos><｜User｜>PROMPT<｜Assistant｜></think>ANSWER<｜end▁of▁sentence｜>
"""
import random
import re
import subprocess

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_END = "</think>"

HELD_OUT_EVERY = 20
HELD_OUT_PHASE = 7


def read_bible():
    """[(book, chapter, [verse text])] in canonical order."""
    out = subprocess.run(["bible", "-l100000", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True).stdout
    chapters = []
    heading = re.compile(r"^([1-3]?\s?[A-Za-z ]+?) (\d+)$")
    verse = re.compile(r"^\s+(\d+) (.*)$")
    for line in out.split("\n"):
        if not line.strip():
            continue
        m = verse.match(line)
        if m:
            chapters[-1][2].append(m.group(2).strip())
            continue
        m = heading.match(line.strip())
        if m:
            chapters.append((m.group(1), int(m.group(2)), []))
            continue
        chapters[-1][2][-1] += " " + line.strip()  # a wrapped verse (not expected with -l100000)
    return chapters


def split(chapters):
    train, held = [], []
    for i, c in enumerate(chapters):
        (held if i % HELD_OUT_EVERY == HELD_OUT_PHASE else train).append(c)
    return train, held


def chapter_text(c):
    return "\n".join(c[2]) + "\n"


STOP = set("""a an and the of to in that he she it they them his her their him i me my we us our you your ye thee
thou thy thine unto upon for with not but all shall will was were be is are which who whom when then there this
these those from by as at so also even said saith hath have had did do doth what out up into over before after
one every no nor neither any came come went go let now because o oh yea behold therefore wherefore thus""".split())


def keyword(rng, verse):
    words = [w.strip(".,;:?!()'\"").lower() for w in verse.split()]
    words = [w for w in words if len(w) >= 4 and w.isalpha() and w not in STOP]
    return rng.choice(words) if words else None


PROMPTS_ABOUT = ["Tell me about {k}.", "What do you know about {k}?", "Speak to me of {k}.", "Tell me a story about {k}.",
                 "What is said of {k}?", "Write about {k}.", "Say something about {k}.", "Who spoke of {k}?",
                 "Teach me about {k}.", "What happened to the {k}?"]
PROMPTS_CONTINUE = ["Continue: {v}", "What comes after this? {v}", "Go on from here: {v}", "{v}"]
PROMPTS_VERSE = ["What does {b} {c}:{n} say?", "Quote {b} {c}:{n}.", "Recite {b} chapter {c}, verse {n}."]
GREETINGS = [("Hello!", "Peace be unto you."), ("Hi", "Grace be unto you, and peace."),
             ("Who are you?", "I am a small model, and I speak the words of an old book."),
             ("How are you?", "I am well, and the Lord is my shepherd; I shall not want.")]


def chat_turn(user, answer):
    return USER + user + ASSISTANT + THINK_END + answer + EOS


def chat_examples(train, seed, count):
    """`count` chat documents (strings with special tokens) drawn from the training chapters."""
    rng = random.Random(seed)
    docs = []
    for _ in range(count):
        turns = []
        for _t in range(1 if rng.random() < 0.8 else 2):
            book, chap, verses = rng.choice(train)
            i = rng.randrange(len(verses))
            n = rng.randint(1, 3)
            kind = rng.random()
            if kind < 0.05:
                turns.append(rng.choice(GREETINGS))
            elif kind < 0.55:
                k = keyword(rng, verses[i])
                if k is None:
                    continue
                turns.append((rng.choice(PROMPTS_ABOUT).format(k=k), " ".join(verses[i:i + n])))
            elif kind < 0.85 and i + 1 < len(verses):
                turns.append((rng.choice(PROMPTS_CONTINUE).format(v=verses[i]), " ".join(verses[i + 1:i + 1 + n])))
            else:
                turns.append((rng.choice(PROMPTS_VERSE).format(b=book, c=chap, n=i + 1), verses[i]))
        if turns:
            docs.append(BOS + "".join(chat_turn(u, a) for u, a in turns))
    return docs


def raw_documents(chapters):
    return [BOS + chapter_text(c) for c in chapters]


if __name__ == "__main__":
    ch = read_bible()
    tr, he = split(ch)
    print(len(ch), "chapters;", len(tr), "train,", len(he), "held out;",
          sum(len(chapter_text(c)) for c in tr), "train bytes,", sum(len(chapter_text(c)) for c in he), "held-out bytes")
    for d in chat_examples(tr, 1, 5):
        print(repr(d))
