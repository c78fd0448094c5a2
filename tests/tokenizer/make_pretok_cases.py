#!/usr/bin/env python3
"""Writes pretok_cases.json: how the Hugging Face `tokenizers` package (Oniguruma regexes, Split with
behaviour "isolated") splits strings under each pre-tokenizer that ferry implements natively
(runtime/tok/pretok.c). This checks the Llama 3 and Qwen2 splits, whose vocabularies are not in
../shared, and every GGUF tokenizer.ggml.pre family, piece by piece.

Strings: the 46 test strings of llama.cpp's vocab tests (../shared/testdata/vocab/*.inp) when present, a
list of hard strings, and seeded random ones.
Usage: python3 tests/tokenizer/make_pretok_cases.py   (writes tests/tokenizer/pretok_cases.json)
"""
import json
import os
import random

from tokenizers import Regex, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_LLM_LETTERS = (
    "[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝ"
    "Ὗ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿ"
    "ﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+")

# name -> (GGUF tokenizer.ggml.pre or None, list of regexes applied in sequence; llama.cpp's lists)
FAMILIES = {
    "gpt-2": ("gpt-2", [GPT2]),
    "llama3": ("llama-bpe", [LLAMA3]),
    "qwen2": ("qwen2", [QWEN2]),
    "starcoder": ("starcoder", [r"\p{N}", GPT2]),
    "falcon": ("falcon", [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
    "default": ("default", [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
    "deepseek-coder": ("deepseek-coder", ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"]),
    "deepseek-llm": ("deepseek-llm", ["[\r\n]", r"\s?" + DEEPSEEK_LLM_LETTERS, r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
                                      r"\s+$", "[一-龥ࠀ-一가-퟿]+", r"\p{N}+"]),
}

HARD = [
    "Hello World", "I'M DONE, YOU'RE 'RE 'Ll it's", "  \n\n  \r\n\t x", "abc123456789def 1234567",
    "٣٤٥ ½ ² Ⅻ 𝟘𝟙", "日本語のテキスト 中文 한국어", "   ", "a  b   c    ", "\n", "\r\n\r\n", "x\u00a0y\u3000z",
    "!!!???...", " ;; -- ++ $$ ^^ || `` <<>>", "emoji 🙂🚀 👨‍👩‍👧", "tab\tsep\tvalues\n", "'s'S'T're'RE",
    "Ωhm Kelvin ώ ΐ Ί", "café naïve", "    def f(x):\n        return x\n", "end  ",
]


def split(regexes, text):
    pt = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes])
    return [piece for piece, _ in pt.pre_tokenize_str(text)]


def random_strings(n, seed):
    rng = random.Random(seed)
    pools = ["abcXYZ", "0123456789", " ", "\n\r\t", "'\"!?.,;:-_()[]{}<>$+^~|`", "éüßñçÀÖ", "日本語中文",
             "🙂🚀", "\u00a0\u2009\u3000", "٣½²"]
    out = []
    for _ in range(n):
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 30))))
    return out


def main():
    strings = []
    inp = os.path.join(HERE, "..", "..", "..", "shared", "testdata", "vocab", "ggml-vocab-llama-spm.gguf.inp")
    if os.path.exists(inp):
        with open(inp, encoding="utf-8", newline="") as f:
            strings += f.read().split("\n__ggml_vocab_test__\n")[:-1]
    strings += HARD + random_strings(60, 1234)
    doc = {"tool": "tokenizers %s pre_tokenizers.Split(Regex, isolated)" % __import__("tokenizers").__version__,
           "strings": strings, "families": {}}
    for name, (pre, regexes) in FAMILIES.items():
        doc["families"][name] = {"gguf_pre": pre, "regexes": regexes, "pieces": [split(regexes, s) for s in strings]}
    with open(os.path.join(HERE, "pretok_cases.json"), "w", encoding="utf-8") as fo:
        json.dump(doc, fo, ensure_ascii=False, separators=(",", ":"))
        fo.write("\n")


if __name__ == "__main__":
    main()
