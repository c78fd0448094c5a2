#!/usr/bin/env python3
"""Writes tiny_llama3.gguf (a vocab-only GGUF: tokenizer.ggml.model gpt2, pre llama-bpe, ~600 tokens) and
tiny_llama3_cases.json (ids from the Hugging Face `tokenizers` package for the same vocab with Llama 3's
tokenizer.json settings: Split(llama3 regex) + ByteLevel, ignore_merges, special added tokens).

It checks the GGUF side of the Llama 3 family, whose real vocab is not in ../shared: the llama-bpe
pre-tokenizer, ignore_merges, add_bos defaulting to true, <|begin_of_text|> as BOS, eot_token_id and
<|eot_id|> ending generations. The merges are trained here by tokenizers' BpeTrainer on a small text.
Usage: python3 tests/tokenizer/make_tiny_llama3.py
"""
import json
import os

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = [
    "Once upon a time there was a little girl named Lily. She loved to play outside in the park.",
    "The capital of France is Paris. What is the capital of Germany? It's Berlin, isn't it?",
    "def main():\n    print('hello world')\n    return 0\n",
    "I'm sure they're here; we've seen them. You'll see. He'd know. IT'S TRUE!",
    "12345 + 67890 = 80235, and 3.14159 is pi.",
] * 20
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
EXTRA = ["Ġzebra", "xyzzy", "Ġ123"]
STRINGS = [
    " zebra xyzzy zebra", "xyzzy", " 123 1234",
    "Hello world", " Hello world", "Once upon a time", "the capital of France", "It's THEY'RE we'VE",
    "12345678", "3.14159", "  leading\n\n  spaces\r\n", "\t\ttabs", "emoji 🙂 and café",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "print('hello world')",
    "", " ", "park.", "Lily loved the park",
]


def main():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    # Whole-word tokens that no merge sequence reaches: only ignore_merges emits them.
    tokens += EXTRA
    types = [1] * len(tokens)
    for s in SPECIALS:
        tokens.append(s)
        types.append(3)
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens) if types[i] == 1},
                               merges=[tuple(m.split(" ", 1)) for m in merges], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert all(tok.token_to_id(s) == tokens.index(s) for s in SPECIALS)

    w = gguf.GGUFWriter(os.path.join(HERE, "tiny_llama3.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|begin_of_text|>"))
    w.add_eos_token_id(tokens.index("<|end_of_text|>"))
    w.add_uint32("tokenizer.ggml.eot_token_id", tokens.index("<|eot_id|>"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    cases = [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids} for s in STRINGS]
    doc = {"tool": "tokenizers %s" % __import__("tokenizers").__version__, "n_vocab": len(tokens),
           "bos": tokens.index("<|begin_of_text|>"), "eos": tokens.index("<|end_of_text|>"),
           "eot": tokens.index("<|eot_id|>")}
    with open(os.path.join(HERE, "tiny_llama3_cases.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, ensure_ascii=False)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()
