#!/usr/bin/env python3
"""Writes pretok_cases.json: how the Hugging Face `tokenizers` package (Oniguruma regexes, Split with
behaviour "isolated") splits strings under each pre-tokenizer that ferry implements natively
(runtime/tok/pretok.c). This checks the Llama 3 and Qwen2 splits, whose vocabularies are not in
../shared, and every GGUF tokenizer.ggml.pre family, piece by piece. For gpt-4o (o200k) and Tekken the
reference is the pattern of the models' tokenizer.json with its real case classes (\\p{Lu}\\p{Lt}... and
\\p{Ll}...), not llama.cpp's std::regex rewrite of it, which treats every non-ASCII letter as both cases;
for kimi-k2 it is the tokenizer's regex with \\p{Han} (llama.cpp's own Kimi scanner does not split at case
changes).

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

# The models' own tokenizer.json patterns (Hugging Face tokenizers runs them as written).
CONTR = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
SEED_CODER = (CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
CASE_U = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
CASE_W = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
CASE_PRE = r"[^\r\n\p{L}\p{N}]?"


def case_re(contr, digits):
    return (CASE_PRE + CASE_U + "*" + CASE_W + "+" + contr + "|" + CASE_PRE + CASE_U + "+" + CASE_W + "*" + contr +
            r"|\p{N}" + digits + r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# llama.cpp's string, byte for byte (CR and LF as raw characters).
DSV3 = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
        " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
KIMI_U = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
KIMI_W = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
KIMI_C = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
KIMI = (r"[\p{Han}]+|" + CASE_PRE + KIMI_U + "*" + KIMI_W + "+" + KIMI_C + "|" + CASE_PRE + KIMI_U + "+" + KIMI_W +
        "*" + KIMI_C + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MINICPM5 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")
BAILING = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|"
           r"\s+(?!\S)|\s+")
UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
EXAONE_MOE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
JAIS2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
         r"\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|"
         r"\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
GPT4O = case_re(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?", "{1,3}")
TEKKEN = case_re("", "")

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
    "gpt-4o": ("gpt-4o", [GPT4O]),
    "tekken": ("tekken", [TEKKEN]),
    "qwen35": ("qwen35", [QWEN35]),
    "seed-coder": ("seed-coder", [SEED_CODER]),
    "gemma4": ("gemma4", [r"[^\n]+|[\n]+"]),
    "kimi-k2": ("kimi-k2", [KIMI]),
    "minicpm5": ("minicpm5", [r"\p{N}{1,3}", MINICPM5]),
    "bailingmoe2": ("bailingmoe2", [BAILING]),
    "ufakzeka": ("ufakzeka", [UFAKZEKA]),
    "exaone-moe": ("exaone-moe", [EXAONE_MOE]),
    "jais-2": ("jais-2", [JAIS2]),
    "laguna": ("laguna", [r"[^\n]+|[\n]+", QWEN2]),
    "deepseek-v3": ("deepseek-v3", [r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DSV3]),
    # the same with CR and LF written as escapes, as a tokenizer.json may have them
    "deepseek-v3-esc": ("deepseek-v3", [r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
                                        DSV3.replace("\r", r"\r").replace("\n", r"\n")]),
}

HARD = [
    "Hello World", "I'M DONE, YOU'RE 'RE 'Ll it's", "  \n\n  \r\n\t x", "abc123456789def 1234567",
    "٣٤٥ ½ ² Ⅻ 𝟘𝟙", "日本語のテキスト 中文 한국어", "   ", "a  b   c    ", "\n", "\r\n\r\n", "x\u00a0y\u3000z",
    "!!!???...", " ;; -- ++ $$ ^^ || `` <<>>", "emoji 🙂🚀 👨‍👩‍👧", "tab\tsep\tvalues\n", "'s'S'T're'RE",
    "Ωhm Kelvin ώ ΐ Ί", "café naïve", "    def f(x):\n        return x\n", "end  ",
    # case changes and contractions (o200k, Tekken)
    "HelloWORLD", "helloWorld HTTPServer getHTTPResponse XMLHttpRequest", "I'M I'm YOU'RE they'Ve WE'LL it'S",
    "ABCdef ABC'def aBC'S Élan ÉLAN éLAN ǅemal ǈ ǋ", "McDonald's O'Neil DON'T don't", "x'sY'S'll",
    # combining marks, decomposed accents, Indic and Arabic scripts
    "cafe\u0301 nai\u0308ve E\u0301COLE \u0301start a\u0301\u0302b", "\u0300\u0301\u0302 marks",
    "हिन्दी में लिखा गया पाठ", "नमस्ते दुनिया123", "العربية: مَرْحَبًا بِالعالم ١٢٣", "ไทย ภาษาไทย",
    "Ελληνικά ΑΘΗΝΑ Αθήνα", "Русский ТЕКСТ текст", "日本語とEnglishの混在テキスト", "ʰʲ ʰello ᵃbc",
    "x+=1; a->b .foo(bar) $HOME @user #tag ~/x `cmd` {key: [1, 2]} a==b!=c <tag/>", "€5 £3 ¥7 ©® ™ ±×÷ ∑∫ → ⇒ ★",
    "我想在apple工作1314151天～ 漢字Kanji かな 々〇 ⺀⼀ 𠀀𪜀 中文English混合 Hello世界", " 工作 /工\n作",
    # digits, emoji, whitespace, punctuation with slashes and newlines
    "1234567890 12.5 3,000,000 v1.2.3", "emoji👍🏽 ❤️ 🇫🇷 🏳️‍🌈 ok", "path/to/file.txt // c:\\dir\\x\r\n",
    "a/\n\nb //\r\n x", "\t\t\tindent\n\n\n   \n", "  leading and trailing  ", "a\u2028b\u2029c\u0085d",
    " " * 1100 + "x", "\t" * 600, " " * 37 + "!" + " " * 4 + "y" + " " * 8, "  \u3000 \u00a0  z",
    " \u0301x", "\n\u0301", "'s", "x\u00a0\u00a0y", "ǅ", "Ⅻmm", "ᾈᾀ",
]


def split(regexes, text):
    pt = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes])
    return [piece for piece, _ in pt.pre_tokenize_str(text)]


def random_strings(n, seed):
    rng = random.Random(seed)
    pools = ["abcXYZ", "0123456789", " ", "\n\r\t", "'\"!?.,;:-_()[]{}<>$+^~|`", "éüßñçÀÖ", "日本語中文",
             "🙂🚀", "\u00a0\u2009\u3000", "٣½²", "sStTmMdD'", "\u0301\u0308\u093f\u064e", "ǅʰᾈΣσ/", "\n\n/", "中文々"]
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
    strings += HARD + random_strings(60, 1234) + random_strings(150, 99)
    doc = {"tool": "tokenizers %s pre_tokenizers.Split(Regex, isolated)" % __import__("tokenizers").__version__,
           "strings": strings, "families": {}}
    for name, (pre, regexes) in FAMILIES.items():
        doc["families"][name] = {"gguf_pre": pre, "regexes": regexes, "pieces": [split(regexes, s) for s in strings]}
    with open(os.path.join(HERE, "pretok_cases.json"), "w", encoding="utf-8") as fo:
        json.dump(doc, fo, ensure_ascii=False, separators=(",", ":"))
        fo.write("\n")


if __name__ == "__main__":
    main()
