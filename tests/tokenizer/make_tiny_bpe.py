#!/usr/bin/env python3
"""Writes tiny vocab-only GGUFs for this year's BPE tokenizer families and their expected ids:

  tiny_gpt4o.gguf   model gpt2,   pre gpt-4o  (o200k split, byte-level)
  tiny_tekken.gguf  model gpt2,   pre tekken  (o200k-like split without contractions, ignore_merges, BOS)
  tiny_qwen35.gguf  model gpt2,   pre qwen35  (Qwen2 split with \\p{M} in words, byte-level)
  tiny_kimik2.gguf  model gpt2,   pre kimi-k2 (Han runs, o200k words without Han)
  tiny_deepseekv3.gguf model gpt2, pre deepseek-v3 (digits by 3, kana/CJK runs, punctuation-led words)
  tiny_gemma4.gguf  model gemma4 (BPE on raw UTF-8, ' ' -> U+2581, lines split, <0xNN> byte fallback,
                    add_bos_token false in the file, which llama.cpp overrides to true)
  tiny_sarvammoe.gguf model gpt2, pre sarvam-moe (like Gemma 4's text handling, without the newline rule and
                    the BOS override)
  tiny_badpre.gguf  model gpt2,   pre afmoe   (a value ferry does not implement: must be refused by name)
  tiny_longpre.gguf model gpt2,   pre "qwen2-x-x-..." (85 characters: refused by name, not taken as default)
  tiny_bpe_cases.json

The merges are trained here by the Hugging Face `tokenizers` BpeTrainer on a small mixed-script text with
each family's own split, so that the split decides which merges apply. Expected ids come from `tokenizers`
with the family's tokenizer.json settings (Split(regex, isolated) + ByteLevel, BPE with ignore_merges for
Tekken). For Gemma 4 (and Sarvam, without the newline rule) the ids follow llama.cpp's rule on top of HF's
BPE: the text with spaces replaced by U+2581 is split into runs of newlines and runs of other characters, a
newline run that is a token is kept whole, every other piece is merged by HF's BPE model (byte_fallback); the
vocab has a "\\n\\n\\n\\n" token that no merge reaches, so the rule is exercised.
Usage: python3 tests/tokenizer/make_tiny_bpe.py   (needs tokenizers and gguf)
"""
import json
import os
import sys

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_pretok_cases import DSV3, GPT4O, HARD, KIMI, QWEN35, TEKKEN  # noqa: E402

CORPUS = [
    "Once upon a time there was a little girl named Lily. She loved to play outside in the park.",
    "HelloWorld getHTTPResponse XMLHttpRequest CamelCaseWords ALLCAPS lowercase MixedCASE",
    "I'm sure they're here; we've seen them. You'll see. He'd know. IT'S TRUE! DON'T",
    "def main():\n    print('hello world')\n    return 0\n\n\n", "我想在apple工作 中文English混合 漢字かなカナ",
    "12345 + 67890 = 80235, and 3.14159 is pi. path/to/file.txt\n//\n",
    "café naïve e\u0301cole nai\u0308ve Élan ÉCOLE", "हिन्दी में लिखा गया पाठ नमस्ते", "日本語のテキスト 中文 한국어",
    "العربية مرحبا بالعالم", "Русский текст ТЕКСТ", "\t\ttabs and    spaces\n\n",
] * 20
# Tokens no merge reaches: Tekken's ignore_merges emits the whole words, the others must not.
EXTRA = {"gpt-4o": ["xyzzy"], "tekken": ["ĠZebra", "xyzzy"], "qwen35": ["xyzzy"], "gemma4": ["\n\n\n\n"],
         "sarvam-moe": ["\n\n\n\n"],
         "kimi-k2": ["xyzzy"], "deepseek-v3": ["xyzzy"]}
STRINGS = HARD + [
    "HelloWorld getHTTPResponse", " ZebraCase xyzzy", "xyzzyQ", " café", "Lily loved the park",
    "\n\n\n\nx\n\n\n\n\n", "€100 and 🙂", "<bos>text<eos>", "<start_of_turn>user\nHi<end_of_turn>\n", "",
]
LINES = r"[^\n]+|[\n]+"
FAMILIES = {"gpt-4o": ([GPT4O], False, "gpt2"), "tekken": ([TEKKEN], True, "gpt2"), "qwen35": ([QWEN35], False, "gpt2"),
            "gemma4": ([LINES], False, "gemma4"), "sarvam-moe": ([LINES], False, "gpt2"),
            "kimi-k2": ([KIMI], False, "gpt2"),
            "deepseek-v3": ([r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DSV3], False, "gpt2")}
SPECIALS_BL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SPECIALS_G4 = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


RAW = ("gemma4", "sarvam-moe")  # pre values of BPE on raw UTF-8 with spaces as U+2581


def build(pre, regexes, ignore_merges):
    byte_level = pre not in RAW
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in regexes]
    if byte_level:
        pt = pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                                        use_regex=False)])
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        pt = splits[0]
        alphabet = []
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pt
    if not byte_level:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=alphabet, special_tokens=[], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    j = json.loads(tok.to_str())
    merges = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    tokens = [None] * len(j["model"]["vocab"])
    for t, i in j["model"]["vocab"].items():
        tokens[i] = t
    types = [1] * len(tokens)
    if not byte_level:
        for b in range(256):
            tokens.append("<0x%02X>" % b)
            types.append(6)
    tokens += EXTRA[pre]
    types += [1] * len(EXTRA[pre])
    specials = SPECIALS_BL if byte_level else SPECIALS_G4
    for s in specials:
        tokens.append(s)
        types.append(3)
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (1, 6)}
    ref = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                               ignore_merges=ignore_merges, byte_fallback=not byte_level))
    ref.pre_tokenizer = pt
    ref.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tokens, types, merges, ref, specials


def raw_ids(ref, tokens, text, specials, whole_newlines):
    """llama.cpp's Gemma 4 / Sarvam encoding of raw text (no special tokens parsed inside text fragments here: the
    special tokens are cut out first, like tokenizer_st_partition)."""
    ids = []
    frags, pos = [], 0
    while pos <= len(text):
        hits = [(text.find(s, pos), -len(s), s) for s in specials if text.find(s, pos) >= 0]
        if not hits:
            frags.append(text[pos:])
            break
        at, _, s = min(hits)
        frags.append(text[pos:at])
        frags.append((s,))
        pos = at + len(s)
    for f in frags:
        if isinstance(f, tuple):
            ids.append(tokens.index(f[0]))
            continue
        norm = f.replace(" ", "\u2581")
        for piece, _ in pre_tokenizers.Split(Regex(LINES), behavior="isolated").pre_tokenize_str(norm):
            if whole_newlines and set(piece) == {"\n"} and piece in tokens:
                ids.append(tokens.index(piece))
            else:
                ids += [t.id for t in ref.model.tokenize(piece)]
    return ids


def main():
    doc = {"tool": "tokenizers %s BpeTrainer + BPE" % __import__("tokenizers").__version__, "families": {}}
    for pre, (regex, ignore_merges, model) in FAMILIES.items():
        tokens, types, merges, ref, specials = build(pre, regex, ignore_merges)
        name = "tiny_%s.gguf" % pre.replace("-", "")
        w = gguf.GGUFWriter(os.path.join(HERE, name), "llama")
        w.add_tokenizer_model(model)
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        bos = tokens.index(specials[0] if pre not in RAW else "<bos>")
        eos = tokens.index(specials[2] if pre not in RAW else "<eos>")
        w.add_bos_token_id(bos)
        w.add_eos_token_id(eos)
        if model == "gemma4":
            w.add_add_bos_token(False)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        cases = []
        for s in STRINGS:
            if pre in RAW:
                ids = raw_ids(ref, tokens, s, specials, pre == "gemma4")
            else:
                ids = ref.encode(s, add_special_tokens=False).ids
            cases.append({"text": s, "ids": ids})
        doc["families"][pre] = {"gguf": name, "n_vocab": len(tokens), "bos": bos, "eos": eos,
                                "add_bos": pre in ("tekken", "gemma4"), "cases": cases}
    for name, pre in (("tiny_badpre.gguf", "afmoe"), ("tiny_longpre.gguf", "qwen2" + "-x" * 40)):
        w = gguf.GGUFWriter(os.path.join(HERE, name), "llama")
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(["a", "b", "ab"])
        w.add_token_types([1, 1, 1])
        w.add_token_merges(["a b"])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    with open(os.path.join(HERE, "tiny_bpe_cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
