#!/usr/bin/env python3
"""make_big_gguf.py SRC_GGUF OUT_GGUF [DIM LAYERS FFN] — a Llama GGUF with random f16 weights of a chosen size
and SRC_GGUF's tokenizer (stories260K's 512-token vocab), for serving a model larger than a GPU budget on a
machine where no real large model can be fetched. Defaults: dim 2048, 8 layers, ffn 5632 (~0.8 GB)."""
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter, TokenType


def main():
    src, out = sys.argv[1], sys.argv[2]
    dim, layers, ffn = (int(x) for x in sys.argv[3:6]) if len(sys.argv) > 5 else (2048, 8, 5632)
    heads = dim // 128
    r = GGUFReader(src)
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode() for i in f["tokenizer.ggml.tokens"].data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    vocab = len(tokens)
    w = GGUFWriter(out, "llama")
    w.add_context_length(2048)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(dim // heads)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types([TokenType(t) for t in types])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rng = np.random.default_rng(1)

    def mat(rows, cols):  # (rows, cols) row-major = GGUF ne (cols, rows)
        return (rng.standard_normal((rows, cols), dtype=np.float32) * (1.0 / cols**0.5)).astype(np.float16)

    w.add_tensor("token_embd.weight", mat(vocab, dim))
    w.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    w.add_tensor("output.weight", mat(vocab, dim))
    for l in range(layers):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", np.ones(dim, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(dim, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", mat(dim, dim))
        w.add_tensor(p + "ffn_gate.weight", mat(ffn, dim))
        w.add_tensor(p + "ffn_up.weight", mat(ffn, dim))
        w.add_tensor(p + "ffn_down.weight", mat(dim, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
