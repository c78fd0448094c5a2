#!/usr/bin/env python3
"""Writes nfc_cases.json: [input, NFC(input)] pairs from Python's unicodedata.normalize, for ferry's NFC
(runtime/tok/nfc.c, used by the Qwen2 tokenizer.json normalizer). Inputs: hand-picked hard cases
(reordering of combining marks, composition exclusions, singletons, Hangul jamo, blocked marks) and seeded
random mixes of base letters, combining marks, precomposed characters and Hangul.
Usage: python3 tests/tokenizer/make_nfc_cases.py
"""
import json
import os
import random
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
HARD = [
    "cafe\u0301", "e\u0323\u0301", "e\u0301\u0323", "A\u030a", "\u212b", "\u2126", "\u212a",
    "\u1100\u1161\u11a8", "\u1100\u1161", "\uac00\u11a8", "\u0958", "\u0f73", "a\u0308\u0304",
    "\u0041\u0301\u0301", "\u1e0a\u0323", "\u1e0c\u0307", "q\u0307\u0323", "\u00c5\u0301", "ﬁ", "x\u0345\u0301",
    "\u05d0\u05b7\u05bc", "\u0627\u0653", "\u09c7\u09be", "\u0b47\u0b56", "\u0cc6\u0cc2\u0cd5", "\U0001d15e",
    "日本語", "plain ascii", "",
]


def random_cases(n, seed):
    rng = random.Random(seed)
    bases = "aeiouAEIOUnNcCsSzZwWyY\u03b1\u03b5\u03b7\u0399\u0430\u0435\u0438\u05d0\u0627 "
    marks = [0x300, 0x301, 0x302, 0x303, 0x304, 0x306, 0x307, 0x308, 0x30a, 0x30b, 0x30c, 0x323, 0x327, 0x328,
             0x331, 0x345, 0x342, 0x5b7, 0x5bc, 0x653, 0x654, 0x655, 0x1dce, 0x20d7]
    out = []
    for _ in range(n):
        s = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.35:
                s.append(rng.choice(bases))
            elif r < 0.7:
                s.append(chr(rng.choice(marks)))
            elif r < 0.8:
                s.append(chr(rng.randint(0xC0, 0x17F)))
            elif r < 0.9:
                s.append(chr(rng.choice([0x1100 + rng.randint(0, 18), 0x1161 + rng.randint(0, 20),
                                         0x11a8 + rng.randint(0, 26), 0xAC00 + rng.randint(0, 11171)])))
            else:
                s.append(chr(rng.randint(0x1E00, 0x1FFF)))
        out.append("".join(s))
    return out


def main():
    cases = [[s, unicodedata.normalize("NFC", s)] for s in HARD + random_cases(400, 42)]
    with open(os.path.join(HERE, "nfc_cases.json"), "w", encoding="utf-8") as f:
        f.write('{"tool": "Python %s unicodedata %s", "cases": [\n' % (
            __import__("sys").version.split()[0], unicodedata.unidata_version))
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()
