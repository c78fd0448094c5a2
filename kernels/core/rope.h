/* rope — how a model's rotary embedding is laid out and scaled (shared by weights/, kernels/ and runtime/). */
#ifndef FERRY_ROPE_H
#define FERRY_ROPE_H

/* INTERLEAVED rotates pairs (2i, 2i+1) (llama.cpp's permuted GGUF llama weights);
 * HALF rotates pairs (i, i + rope_dim/2) (HF checkpoints, GGUF qwen2). */
enum rope_style { ROPE_STYLE_INTERLEAVED = 0, ROPE_STYLE_HALF = 1 };
enum rope_scaling_type { ROPE_SCALING_NONE = 0, ROPE_SCALING_LINEAR = 1, ROPE_SCALING_LLAMA3 = 2 };

struct rope_scaling {
    enum rope_scaling_type type;
    float factor;           /* linear and llama3 */
    float low_freq_factor;  /* llama3 */
    float high_freq_factor; /* llama3 */
    int orig_ctx;           /* llama3: original_max_position_embeddings */
};

#endif
