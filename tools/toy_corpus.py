#!/usr/bin/env python3
"""toy_corpus.py — a deterministic stand-in for tinyshakespeare: a play of speeches drawn from a small
grammar (speaker names, verse lines, punctuation), the same bytes on every machine and Python version
(its own xorshift64* generator, no `random`). `make quickstart` trains on it when
../shared/data/tinyshakespeare.txt is absent.

    tools/toy_corpus.py out.txt [--bytes 1000000] [--seed 1234]
"""
import argparse
import hashlib
import sys

SPEAKERS = ["DUKE ORSINO", "LADY MARGARET", "FIRST CITIZEN", "SECOND CITIZEN", "KING HENRY", "QUEEN ISABEL",
            "MERCUTIO", "NURSE", "FRIAR LAURENCE", "GLOUCESTER", "PORTIA", "BRUTUS", "MESSENGER", "SERVANT"]
NOUNS = ["king", "queen", "lord", "lady", "crown", "sword", "heart", "night", "day", "blood", "love", "grief",
         "honour", "father", "son", "brother", "city", "field", "throne", "tongue", "hand", "eye", "soul",
         "death", "life", "house", "friend", "enemy", "heaven", "earth", "fortune", "war", "peace", "word"]
ADJS = ["noble", "gentle", "cruel", "sweet", "fair", "dark", "proud", "poor", "true", "false", "old",
        "young", "bloody", "heavy", "happy", "wretched", "good", "brave", "cold", "high"]
VERBS = ["love", "hate", "seek", "fear", "serve", "know", "find", "keep", "lose", "take", "give", "bear",
         "hear", "see", "kill", "save", "call", "follow", "leave", "swear by"]
SUBJ = ["I", "we", "you", "they", "my lord", "the king", "your grace", "this man", "our friends"]
ADVS = ["now", "here", "yet", "still", "tonight", "no more", "for ever", "in haste", "again"]
OPEN = ["O", "Alas,", "Nay,", "Ay,", "Good", "Come,", "Hark!", "Fie,", "Why,", "Well,"]
TEMPLATES = [
    "{S} {v} the {a} {n} {adv}{p}",
    "{O} {s} must {v} thy {n}{p}",
    "the {n} of {a} {n2} {vs} {adv}{p}",
    "what {n} is this, that {s} should {v} it{q}",
    "{O} {a} {n}, {s} {v} thee {adv}{p}",
    "{S} shall not {v} my {n} while I have {n2}{p}",
    "thou art {a} as the {n} of {n2}{p}",
    "if {s} {v} the {n}, the {n2} will {v2} us{p}",
    "go, {v} the {n}, and {v2} the {a} {n2}{p}",
    "my {n} is {a}, my {n2} is {a2}{p}",
]


class Rng:
    """xorshift64*: identical sequences everywhere, unlike `random`, whose algorithms may change."""

    def __init__(self, seed):
        self.s = (seed * 0x9E3779B97F4A7C15 + 1) & (2**64 - 1) or 1

    def below(self, n):
        s = self.s
        s ^= s >> 12
        s ^= (s << 25) & (2**64 - 1)
        s ^= s >> 27
        self.s = s
        return (((s * 0x2545F4914F6CDD1D) & (2**64 - 1)) >> 33) % n

    def pick(self, xs):
        return xs[self.below(len(xs))]


def line(r):
    t = r.pick(TEMPLATES)
    v = r.pick(VERBS)
    txt = t.format(S=r.pick(SUBJ), s=r.pick(SUBJ), v=v, v2=r.pick(VERBS), vs=v.split()[0] + "s",
                   a=r.pick(ADJS), a2=r.pick(ADJS), n=r.pick(NOUNS), n2=r.pick(NOUNS), adv=r.pick(ADVS),
                   O=r.pick(OPEN), p=r.pick([".", ",", ";", "!", ".", ":"]), q=r.pick(["?", "?", "!"]))
    return txt[0].upper() + txt[1:]


def corpus(nbytes, seed):
    r, parts, n = Rng(seed), [], 0
    while n < nbytes:
        speech = r.pick(SPEAKERS) + ":\n" + "\n".join(line(r) for _ in range(1 + r.below(4))) + "\n\n"
        parts.append(speech)
        n += len(speech)
    return "".join(parts).encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    data = corpus(a.bytes, a.seed)
    with open(a.out, "wb") as f:
        f.write(data)
    print(f"toy_corpus: {a.out}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}", file=sys.stderr)


if __name__ == "__main__":
    main()
