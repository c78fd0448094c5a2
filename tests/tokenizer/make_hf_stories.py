#!/usr/bin/env python3
"""Writes two small Hugging Face tokenizer directories built from stories260K's SentencePiece vocabulary
(../shared/testdata/models/stories260K.gguf, 512 tokens) and the ids the `tokenizers` package gives for a
set of strings, to test ferry's tokenizer.json loader on the SentencePiece-style BPE setups:

  hf_stories_llama2/     Llama 2 style: normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer,
                         BPE with byte_fallback, decoder Replace/ByteFallback/Fuse/Strip, BOS by
                         TemplateProcessing, tokenizer_config.json (add_bos_token, bos/eos tokens)
  hf_stories_metaspace/  Mistral style: no normalizer, Metaspace(prepend_scheme "first", split false)
  hf_stories_cases.json  {"dirs": {...: [{"text", "ids"}]}} (ids without BOS; special tokens parsed)

The merges come from the GGUF's scores the way transformers' SentencePiece converter derives them (every
pair of tokens whose concatenation is a token, ordered by that token's score); both ferry and `tokenizers`
read the same file, so the check is of the BPE implementation, not of the derivation.
Usage: python3 tests/tokenizer/make_hf_stories.py
"""
import json
import os

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF = os.path.join(HERE, "..", "..", "..", "shared", "testdata", "models", "stories260K.gguf")

STRINGS = [
    "Hello world", "  two leading spaces", "trailing space ", "\n\n", "12345 and 3.14159", "café naïve résumé",
    "emoji 🙂🚀", "Привет мир", "<s>Hello</s>", " ", "ALL CAPS TEXT", "\r\n windows newline",
    "Once upon a time, there was a little girl named Lily.", "She said: \"I'm happy!\"", "", "a",
    "Lily<s> and </s>Tom", "x\ty", "日本", "   many   spaces   ",
]


def main():
    r = gguf.GGUFReader(GGUF)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    scores = r.fields["tokenizer.ggml.scores"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for t, i in vocab.items():
        if types[i] != 1:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in vocab and b in vocab and types[vocab[a]] == 1 and types[vocab[b]] == 1:
                merges.append((scores[i], i, a, b))
    merges.sort(key=lambda m: (-m[0], m[1]))
    merges = [(a, b) for _, _, a, b in merges]

    def build(style):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        if style == "llama2":
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
            tok.pre_tokenizer = None
            tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                             decoders.Strip(" ", 1, 0)])
        else:
            tok.normalizer = None
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
            tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i in range(len(tokens)) if types[i] in (2, 3)])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        return tok

    cases = {}
    for style in ("llama2", "metaspace"):
        tok = build(style)
        d = os.path.join(HERE, "hf_stories_" + style)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                       "unk_token": "<unk>"}, f, indent=1)
            f.write("\n")
        cases["hf_stories_" + style] = [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids}
                                        for s in STRINGS]
    with open(os.path.join(HERE, "hf_stories_cases.json"), "w", encoding="utf-8") as f:
        f.write('{"tool": "tokenizers %s", "dirs": {\n' % __import__("tokenizers").__version__)
        f.write(",\n".join('"%s": [\n%s]' % (k, ",\n".join(json.dumps(c, ensure_ascii=False) for c in v))
                           for k, v in cases.items()))
        f.write("\n}}\n")


if __name__ == "__main__":
    main()
