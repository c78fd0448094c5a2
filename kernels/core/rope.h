/* rope — how a model's rotary embedding is laid out and scaled (shared by weights/, kernels/ and runtime/).
 */
#ifndef FERRY_ROPE_H
#define FERRY_ROPE_H

#include <math.h>

/* INTERLEAVED rotates pairs (2i, 2i+1) (llama.cpp's permuted GGUF llama weights);
 * HALF rotates pairs (i, i + rope_dim/2) (HF checkpoints, GGUF qwen2). */
enum rope_style { ROPE_STYLE_INTERLEAVED = 0, ROPE_STYLE_HALF = 1 };
enum rope_scaling_type {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR = 1,
    ROPE_SCALING_LLAMA3 = 2,
    ROPE_SCALING_YARN = 3,
};

struct rope_scaling {
    enum rope_scaling_type type;
    float factor;           /* linear, llama3 and yarn */
    float low_freq_factor;  /* llama3 */
    float high_freq_factor; /* llama3 */
    int orig_ctx;           /* llama3 and yarn: original_max_position_embeddings */
    /* YaRN (transformers' _compute_yarn_parameters): the ramp between the rotations beta_fast and beta_slow
     * (defaults 32 and 1), the correction range rounded outwards when truncate (transformers' default;
     * gpt-oss says false), and the attention factor that scales cos and sin (0: 0.1 ln(factor) + 1). */
    float beta_fast, beta_slow;
    float attn_factor;
    int truncate;
};

/* The factor YaRN multiplies cos and sin by (1 for the other scalings): both q and k rotate with it, so the
 * attention's scores carry its square (llm_attn_scale). */
static inline float rope_scaling_attn_factor(const struct rope_scaling *sc)
{
    if (!sc || sc->type != ROPE_SCALING_YARN) return 1.0f;
    if (sc->attn_factor > 0) return sc->attn_factor;
    return sc->factor <= 1.0f ? 1.0f : (float)(0.1 * log((double)sc->factor) + 1.0);
}

#endif
