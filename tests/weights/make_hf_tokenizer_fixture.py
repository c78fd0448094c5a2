#!/usr/bin/env python3
"""Writes fixtures/hf_bpe_tokenizer/{tokenizer.json, tokenizer_config.json}: a Llama-3-style byte-level BPE
tokenizer of exactly 311 tokens, the vocabulary size of tests/golden/models/llama3_gqa_f16, so that the two
together make a Hugging Face directory with a tokenizer for test_quantize_model.c (ferry quantize exports it as
llama.cpp's "gpt2" tokenizer; ferry must then encode text identically from the GGUF and from tokenizer.json).

Vocabulary and merges: the first 306 tokens of tests/tokenizer/tiny_llama3.gguf (the 256 byte tokens and the
first 50 merge results, trained by tokenizers' BpeTrainer there) and the merges among them, then its 5 special
tokens at ids 306-310. Settings as in Meta's Llama 3 tokenizer.json: Split(llama3 regex, Isolated) + ByteLevel
(no regex), ignore_merges, ByteLevel decoder, TemplateProcessing adding <|begin_of_text|>, and a
tokenizer_config.json naming bos/eos. Usage: python3 tests/weights/make_hf_tokenizer_fixture.py
"""
import json
import os

import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "tokenizer", "tiny_llama3.gguf")
OUT = os.path.join(HERE, "fixtures", "hf_bpe_tokenizer")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
N_BASE, SPECIALS = 306, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                          "<|eot_id|>"]


def main():
    f = gguf.GGUFReader(SRC).fields
    toks = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode() for i in f["tokenizer.ggml.tokens"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode() for i in f["tokenizer.ggml.merges"].data]
    vocab = {t: i for i, t in enumerate(toks[:N_BASE])}
    kept = [m for m in merges if all(p in vocab for p in m.split(" ")) and m.replace(" ", "") in vocab]
    added = [{"id": N_BASE + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                                    "ids": [N_BASE], "tokens": ["<|begin_of_text|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": kept},
    }
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "model_max_length": 2048,
           "tokenizer_class": "PreTrainedTokenizerFast"}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as fo:
        json.dump(tj, fo, ensure_ascii=False, indent=1)
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as fo:
        json.dump(cfg, fo, indent=1)
    print(f"{len(vocab)} base tokens, {len(kept)} merges, {len(added)} special tokens -> {OUT}")


if __name__ == "__main__":
    main()
