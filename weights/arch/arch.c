/* arch — the table of families and the lookups over it (see arch.h). */
#include "weights/arch/arch.h"

#include <stdio.h>
#include <string.h>

#include "weights/model_file.h"

extern const struct arch_family arch_llama, arch_mistral, arch_qwen2, arch_qwen3, arch_gemma3, arch_phi3,
    arch_qwen3moe, arch_mixtral, arch_qwen35, arch_gemma4, arch_qwen35moe;
extern const struct arch_family arch_gptoss;
extern const struct arch_family arch_mistral3;
extern const struct arch_family arch_qwen3next;

/* The table: one line per family, in the order messages list them. */
/* clang-format off */
static const struct arch_family *const families[] = {
    &arch_llama,
    &arch_mistral,
    &arch_qwen2,
    &arch_qwen3,
    &arch_gemma3,
    &arch_phi3,
    &arch_qwen3moe,
    &arch_mixtral,
    &arch_gptoss,
    &arch_qwen35,
    &arch_qwen35moe,
    &arch_qwen3next,
    &arch_gemma4,
    &arch_mistral3,
};
/* clang-format on */
#define N_FAMILIES (sizeof families / sizeof families[0])

const struct arch_global arch_globals[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
const int arch_n_globals = sizeof arch_globals / sizeof arch_globals[0];

static int in_list(const char *const *list, const char *s, size_t len)
{
    for (; list && *list; list++)
        if (strlen(*list) == len && memcmp(*list, s, len) == 0) return 1;
    return 0;
}

const struct arch_family *arch_find_gguf(const char *name, size_t len)
{
    for (size_t i = 0; name && i < N_FAMILIES; i++)
        if (in_list(families[i]->gguf_names, name, len)) return families[i];
    return NULL;
}

const struct arch_family *arch_find_hf(const char *cls, const char *model_type)
{
    for (size_t i = 0; i < N_FAMILIES; i++) {
        if (cls ? in_list(families[i]->hf_classes, cls, strlen(cls))
                : model_type && in_list(families[i]->hf_types, model_type, strlen(model_type)))
            return families[i];
    }
    return NULL;
}

const struct arch_family *arch_of(const struct llm_hparams *hp)
{
    if (hp->family) return hp->family;
    return arch_find_gguf(hp->arch, strnlen(hp->arch, sizeof hp->arch));
}

const struct arch_family *arch_family_at(int i)
{
    return i >= 0 && (size_t)i < N_FAMILIES ? families[i] : NULL;
}

const char *arch_supported(int hf, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const char *const *names = hf ? families[i]->hf_classes : families[i]->gguf_names;
        for (; *names && o < n; names++) o += (size_t)snprintf(buf + o, n - o, "%s%s", o ? ", " : "", *names);
    }
    return buf;
}

int arch_role_shape(enum arch_role role, const struct llm_hparams *hp, long long ne[3])
{
    const long long dim = hp->dim, q = (long long)hp->n_heads * hp->head_dim,
                    kv = (long long)hp->n_kv_heads * hp->head_dim, ffn = hp->ffn_dim;
    ne[1] = ne[2] = 1;
    switch (role) {
    case ARCH_ROLE_ATTN_NORM:
    case ARCH_ROLE_FFN_NORM:
    case ARCH_ROLE_POST_ATTN_NORM:
    case ARCH_ROLE_POST_FFN_NORM:
    case ARCH_ROLE_BO:
        ne[0] = dim;
        return 1;
    case ARCH_ROLE_BQ:
        ne[0] = q;
        return 1;
    case ARCH_ROLE_BK:
    case ARCH_ROLE_BV:
        ne[0] = kv;
        return 1;
    case ARCH_ROLE_Q_NORM:
    case ARCH_ROLE_K_NORM:
        ne[0] = hp->head_dim;
        return 1;
    case ARCH_ROLE_WQ:
        ne[0] = dim, ne[1] = hp->attn_out_gate ? 2 * q : q;
        return 2;
    case ARCH_ROLE_WK:
    case ARCH_ROLE_WV:
        ne[0] = dim, ne[1] = kv;
        return 2;
    case ARCH_ROLE_WO:
        ne[0] = q, ne[1] = dim;
        return 2;
    case ARCH_ROLE_W_GATE:
    case ARCH_ROLE_W_UP:
        ne[0] = dim, ne[1] = ffn;
        return 2;
    case ARCH_ROLE_WQKV:
        ne[0] = dim, ne[1] = q + 2 * kv;
        return 2;
    case ARCH_ROLE_W_GATE_UP:
        ne[0] = dim, ne[1] = 2 * ffn;
        return 2;
    case ARCH_ROLE_ROUTER:
        ne[0] = dim, ne[1] = hp->n_expert;
        return 2;
    case ARCH_ROLE_EXP_GATE:
    case ARCH_ROLE_EXP_UP:
        ne[0] = dim, ne[1] = hp->expert_ffn_dim, ne[2] = hp->n_expert;
        return 3;
    case ARCH_ROLE_EXP_DOWN:
        ne[0] = hp->expert_ffn_dim, ne[1] = dim, ne[2] = hp->n_expert;
        return 3;
    case ARCH_ROLE_ATTN_SINKS:
        ne[0] = hp->n_heads;
        return 1;
    case ARCH_ROLE_ROUTER_BIAS:
        ne[0] = hp->n_expert;
        return 1;
    case ARCH_ROLE_EXP_GATE_BIAS:
    case ARCH_ROLE_EXP_UP_BIAS:
        ne[0] = hp->expert_ffn_dim, ne[1] = hp->n_expert;
        return 2;
    case ARCH_ROLE_EXP_DOWN_BIAS:
        ne[0] = dim, ne[1] = hp->n_expert;
        return 2;
    case ARCH_ROLE_SSM_QKV:
        ne[0] = dim, ne[1] = llm_ssm_conv_dim(hp);
        return 2;
    case ARCH_ROLE_SSM_Z:
        ne[0] = dim, ne[1] = hp->ssm_inner;
        return 2;
    case ARCH_ROLE_SSM_BETA:
    case ARCH_ROLE_SSM_ALPHA:
        ne[0] = dim, ne[1] = hp->ssm_n_v_heads;
        return 2;
    case ARCH_ROLE_SSM_CONV:
        ne[0] = hp->ssm_conv_kernel, ne[1] = llm_ssm_conv_dim(hp);
        return 2;
    case ARCH_ROLE_SSM_DT:
    case ARCH_ROLE_SSM_A:
        ne[0] = hp->ssm_n_v_heads;
        return 1;
    case ARCH_ROLE_SSM_NORM:
        ne[0] = llm_ssm_head_v(hp);
        return 1;
    case ARCH_ROLE_SSM_OUT:
        ne[0] = hp->ssm_inner, ne[1] = dim;
        return 2;
    case ARCH_ROLE_SSM_BA:
        ne[0] = dim, ne[1] = 2LL * hp->ssm_n_v_heads;
        return 2;
    case ARCH_ROLE_SSM_QKVZ:
        ne[0] = dim, ne[1] = llm_ssm_conv_dim(hp) + (long long)hp->ssm_inner;
        return 2;
    case ARCH_ROLE_OUT_SCALE:
        ne[0] = 1;
        return 1;
    case ARCH_ROLE_PLE_GATE:
        ne[0] = dim, ne[1] = hp->ple_dim;
        return 2;
    case ARCH_ROLE_PLE_PROJ:
        ne[0] = hp->ple_dim, ne[1] = dim;
        return 2;
    case ARCH_ROLE_PLE_NORM:
    case ARCH_ROLE_SHEXP_GATE:
        ne[0] = dim;
        return 1;
    case ARCH_ROLE_W_DOWN:
    case ARCH_N_ROLES:
        break;
    }
    ne[0] = ffn, ne[1] = dim;
    return 2;
}

int arch_need_in_layer(enum arch_need need, const struct llm_hparams *hp, int l)
{
    if (need == ARCH_NEED_ATTN) return !llm_layer_is_recurrent(hp, l);
    if (need == ARCH_NEED_RECURRENT) return llm_layer_is_recurrent(hp, l);
    return 1;
}

const struct arch_tensor *arch_tensor_of(const struct arch_family *f, enum arch_role role)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].role == role) return &f->tensors[i];
    return NULL;
}
