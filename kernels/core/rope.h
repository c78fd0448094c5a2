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
    ROPE_SCALING_LONGROPE = 4,
};

/* Rotary frequencies a LongRoPE factor list can hold: rope_dim up to 512. */
#define ROPE_MAX_FACTORS 256

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
    /* YaRN: transformers' mscale_all_dim when mscale is 1 (GGUF rope.scaling.yarn_log_multiplier, from
     * which llama.cpp derives the attention factor); 0: none. */
    float yarn_log_mul;
    /* LongRoPE (transformers' _compute_longrope_parameters; Phi-3.5, Phi-4-mini): frequency i is divided by
     * short_factor[i] for a context within orig_ctx and by long_factor[i] beyond it (runtime/model.h says
     * which context decides); attn_factor scales cos and sin, as YaRN's does; factor is the context's
     * extension (max_position_embeddings / orig_ctx), from which a missing attn_factor is derived. */
    int n_factors; /* rope_dim / 2 */
    float short_factor[ROPE_MAX_FACTORS], long_factor[ROPE_MAX_FACTORS];
};

/* YaRN's mscale: 0.1 · m · ln(factor) + 1 (1 when factor <= 1); the attention factor of transformers'
 * mscale / mscale_all_dim pair (and of llama.cpp's log multiplier, mscale 1) is the ratio of two. */
static inline double rope_yarn_mscale(double factor, double m)
{
    return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0;
}

/* LongRoPE's default attention factor: sqrt(1 + ln(factor) / ln(orig_ctx)) (1 when factor <= 1). */
static inline double rope_longrope_attn_factor(double factor, int orig_ctx)
{
    return factor <= 1 || orig_ctx < 2 ? 1.0 : sqrt(1 + log(factor) / log((double)orig_ctx));
}

/* The factor YaRN and LongRoPE multiply cos and sin by (1 for the other scalings): both q and k rotate with
 * it, so the scores of the rotated dims carry its square (llm_attn_scale, llm_rope_q_scale). */
static inline float rope_scaling_attn_factor(const struct rope_scaling *sc)
{
    if (sc && sc->type == ROPE_SCALING_LONGROPE) return sc->attn_factor > 0 ? sc->attn_factor : 1.0f;
    if (!sc || sc->type != ROPE_SCALING_YARN) return 1.0f;
    if (sc->attn_factor > 0) return sc->attn_factor;
    return (float)rope_yarn_mscale(sc->factor, 1);
}

#endif
