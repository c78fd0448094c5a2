/* forward_cuda — see forward_cuda.h for the contract.
 *
 * Sections: state, init (plan, arena, uploads), streaming (the ring of pieces), the layer program on the
 * device, the backend table, cost-model probes. Pinned host memory and the link's rates: runtime/pinned.c.
 */
#include "runtime/forward_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/cuda_check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/deltanet.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/ops.h"
#include "runtime/draw_cuda.h"
#include "runtime/forward_cuda_deltanet.h"
#include "runtime/forward_cuda_moe.h"
#include "runtime/pinned.h"
#include "runtime/ring.h"
#include "runtime/step_plan.h"

/* CUDA runtime calls go through CK (runtime/cuda_check.h); a status from our own calls through RC. */
#define RC(call)                                                                                             \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_) return rc_;                                                                                 \
    } while (0)

#define ALIGN            256
#define GRAPH_MAX_TOKENS 16 /* decode batches up to this size replay graphs */
#define GRAPH_LENS       8  /* max_len buckets 256 .. 32768 */
#define GRAPH_KINDS                                                                                          \
    2 /* the step downloads its logits (head), or leaves them for the GPU sampler (head_draw) */
#define GRAPH_SLOTS (GRAPH_MAX_TOKENS * GRAPH_LENS * GRAPH_KINDS)
static size_t align_up(size_t x)
{
    return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

/* Shapes that differ by layer (Gemma 4; the same for every layer elsewhere, model_file.h): the largest query
 * row, the KV pool's row (the widest layer's K or V row: a narrower layer packs its rows at the front of its
 * plane, the kernels addressing them by its own shape) and planes (one per layer with K/V of its own), the
 * largest FFN and head sizes, and the local layers' rotary pairs. */
static size_t q_row_max(const struct llm_hparams *hp)
{
    int q, kv;
    llm_max_dims(hp, &q, &kv);
    return (size_t)q;
}
static size_t kv_row(const struct llm_hparams *hp)
{
    int q, kv;
    llm_max_dims(hp, &q, &kv);
    return (size_t)kv;
}
static int kv_planes(const struct llm_hparams *hp)
{
    return llm_kv_cache_layers(hp);
}
/* The main pool's planes: every KV-cache layer's, less the sliding-window layers' when they keep a pool of
 * their own (forward_cuda_params.kv_swa). */
static int main_planes(const struct llm_hparams *hp, const struct kv_cache *kv_swa)
{
    return kv_planes(hp) - (kv_swa ? kv_swa->n_layers : 0);
}
/* Device bytes of a pool of `elems` K (or V) elements: K and V in f16, or their Q8_0 codes and scales, each
 * region carved ALIGN-aligned. */
static size_t pool_bytes(size_t elems, int q8)
{
    return q8 ? 2 * (align_up(elems) + align_up(elems / 32 * sizeof(uint16_t)))
              : 2 * align_up(elems * sizeof(uint16_t));
}
static int ffn_max(const struct llm_hparams *hp)
{
    return hp->ffn_dim_shared > hp->ffn_dim ? hp->ffn_dim_shared : hp->ffn_dim;
}
static int head_dim_max(const struct llm_hparams *hp)
{
    return hp->head_dim_swa > hp->head_dim ? hp->head_dim_swa : hp->head_dim;
}
static int rope_pairs_local(const struct llm_hparams *hp)
{
    return (hp->rope_dim_swa > 0 ? hp->rope_dim_swa : hp->rope_dim) / 2;
}
static int rope_pairs_max(const struct llm_hparams *hp)
{
    const int l = rope_pairs_local(hp);
    return hp->rope_dim / 2 > l ? hp->rope_dim / 2 : l;
}

/* Qwen3.5's layer kinds (forward_cpu.c is the reference): the gated DeltaNet layers' rows between their
 * products (runtime/forward_cuda_deltanet.h), the gated attention's and the shared expert's. Each region is
 * present only in a model that has the kind; hyb_bytes is their sum (ALIGN-aligned each). A recurrent
 * layer's state and small tensors are not in it: the planner counts them with the layer (device_map_input
 * state_bytes, plan_sizes.dn_layer_bytes), on the device whether the layer is resident or streamed, and not
 * at all when the host's cores compute it (its state is then in host memory); hyb_bytes keeps the state
 * region's alignment. The DeltaNet matrices are part of the layer blocks: block_layout_of. */
static int has_recurrent(const struct llm_hparams *hp)
{
    return hp->full_attn_interval > 0;
}
static size_t dn_in_row(const struct llm_hparams *hp) /* q|k|v, z, b, a side by side */
{
    return (size_t)llm_ssm_conv_dim(hp) + (size_t)hp->ssm_inner + 2 * (size_t)hp->ssm_n_v_heads;
}
static int has_shared_expert(const struct model *m)
{
    for (int l = 0; l < m->hp.n_layers; l++)
        if (layer_program_has(layer_program_of_layer(&m->hp, l), LOP_MOE_SHARED)) return 1;
    return 0;
}
static size_t hyb_bytes(const struct model *m, int T)
{
    const struct llm_hparams *hp = &m->hp;
    const size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    size_t b = 0;
    if (has_recurrent(hp))
        b += align_up(cuda_deltanet_scratch_bytes(m, T)) + 2 * ALIGN +
             align_up((size_t)T * dn_in_row(hp) * sizeof(float)) +
             align_up((size_t)T * hp->ssm_inner * sizeof(float)) +
             (hp->ssm_grouped ? align_up((size_t)T * dn_in_row(hp) * sizeof(float)) : 0);
    if (hp->attn_out_gate)
        b += align_up((size_t)T * (2 * qd + 2 * kvd) * sizeof(float)) +
             align_up((size_t)T * qd * sizeof(float));
    if (has_shared_expert(m))
        b += align_up((size_t)T * hp->dim * sizeof(float)) +
             align_up((size_t)hp->n_layers * hp->dim * sizeof(float));
    return b;
}

/* Per-layer inputs (hp.ple_dim > 0; Gemma 4 E2B/E4B): their matrices and norms stay on the device whatever
 * the layer's placement, in one region of the arena: the model's projection (n_layers * ple_dim, dim) and
 * its norm (ple_dim), then each layer's gate (ple_dim, dim), projection (dim, ple_dim) and norm (dim), each
 * ALIGN-aligned. ple_piece gives piece i's view (i = 0, 1 the model's; 2 + 3l + j layer l's j-th); the
 * region's bytes are the sum over i < ple_pieces. */
static int ple_pieces(const struct model *m)
{
    return m->hp.ple_dim > 0 ? 2 + 3 * m->hp.n_layers : 0;
}
static struct wview ple_piece(const struct model *m, int i)
{
    const struct llm_hparams *hp = &m->hp;
    if (i == 0) return m->ple_mproj;
    if (i == 1)
        return (struct wview){.data = m->ple_proj_norm, .type = DTYPE_F32, .rows = 1, .cols = hp->ple_dim};
    const struct model_layer *L = &m->layers[(i - 2) / 3];
    const int j = (i - 2) % 3;
    if (j == 0) return L->ple_gate;
    if (j == 1) return L->ple_proj;
    return (struct wview){.data = L->ple_norm, .type = DTYPE_F32, .rows = 1, .cols = hp->dim};
}
static size_t ple_weight_bytes(const struct model *m)
{
    size_t b = 0;
    for (int i = 0; i < ple_pieces(m); i++) {
        const struct wview w = ple_piece(m, i);
        b += align_up(dtype_row_size(w.type, w.cols) * (size_t)w.rows);
    }
    return b;
}

/* The type a matrix has in a packed block (on the device and in host memory): as stored. Every type a model
 * file can hold is one the CUDA products read (checked at init: nothing is inflated behind the user's back).
 */
static enum dtype packed_type(enum dtype t)
{
    return t;
}

/* Layer l's packed block: layer.h's layout, and in a recurrent layer its DeltaNet matrices between the matrix
 * groups and the tail (the tail's offsets move up by their bytes; forward_cuda_deltanet.h struct
 * cuda_dn_block), so that a parked layer's bytes (the block up to its tail) hold them too and a host layer's
 * tail on the device stays the same. */
static void block_layout_of(const struct model *m, int l, struct layer_layout *lay, struct cuda_dn_block *dnb)
{
    layer_layout_of(&m->layers[l], &m->hp, packed_type, lay);
    cuda_deltanet_block_of(m, l, lay->norm_off[0], dnb);
    if (!dnb->bytes) return;
    for (int i = 0; i < LAYER_N_NORMS; i++) lay->norm_off[i] += dnb->bytes;
    if (lay->bias_off != SIZE_MAX) lay->bias_off += dnb->bytes;
    if (lay->bias_o_off != SIZE_MAX) lay->bias_o_off += dnb->bytes;
    lay->bytes += dnb->bytes;
}

/* Piece g of a layer's block, [*off, *off + *bytes): matrix group g; in a recurrent layer, which has no q|k|v
 * or o group, its DeltaNet in-products stand in the q|k|v group's place and its out-product in the o group's
 * (they are used where those would be: before the FFN, the in-products first). */
static void block_piece(const struct layer_layout *lay, const struct cuda_dn_block *dnb, int g, size_t *off,
                        size_t *bytes)
{
    if (dnb->bytes && (g == LAYER_QKV || g == LAYER_O)) {
        *off = g == LAYER_QKV ? dnb->in_off : dnb->out_off;
        *bytes = g == LAYER_QKV ? dnb->in_bytes : dnb->out_bytes;
        return;
    }
    layer_piece(lay, g, off, bytes);
}

/* The pieces program p uses, in order (LOP_LINEAR's group; LOP_DELTANET's in-products then out-product, the
 * pieces LAYER_QKV and LAYER_O of block_piece): their indices into g, their count returned. */
static int program_pieces(const struct layer_program *p, int g[LAYER_N_MATS])
{
    int n = 0;
    for (int i = 0; i < p->n_ops && n < LAYER_N_MATS; i++)
        if (p->ops[i].kind == LOP_LINEAR) {
            g[n++] = p->ops[i].arg;
        } else if (p->ops[i].kind == LOP_DELTANET && n + 2 <= LAYER_N_MATS) {
            g[n++] = LAYER_QKV;
            g[n++] = LAYER_O;
        }
    return n;
}

/* FERRY_ERR_UNSUPPORTED, naming the tensor's type, when the CUDA products cannot read a matrix of the model.
 */
static int check_types(const struct model *m, char err[256])
{
    for (int l = 0; l < m->hp.n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct wview *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (!kern_cuda_matmul_supports(w[i]->type)) {
                snprintf(err, 256,
                         "layer %d has a %s matrix, a type the CUDA backend cannot read (use --backend cpu)",
                         l, dtype_name(w[i]->type));
                return FERRY_ERR_UNSUPPORTED;
            }
    }
    for (int i = 0; i < ple_pieces(m); i++) {
        const struct wview w = ple_piece(m, i);
        if (!w.data || (w.rows > 1 && !kern_cuda_matmul_supports(w.type))) {
            snprintf(err, 256,
                     "a per-layer input matrix is %s, a type the CUDA backend cannot read (use "
                     "--backend cpu)",
                     w.data ? dtype_name(w.type) : "missing");
            return FERRY_ERR_UNSUPPORTED;
        }
    }
    if (!kern_cuda_matmul_supports(m->output.type)) {
        snprintf(err, 256, "the output matrix is %s, a type the CUDA backend cannot read (use --backend cpu)",
                 dtype_name(m->output.type));
        return FERRY_ERR_UNSUPPORTED;
    }
    return FERRY_OK;
}

int forward_cuda_devices(void)
{
    return kern_cuda_device_count();
}

/* 1 when this device's attention kernels take every head size of hp. */
static int heads_supported(const struct llm_hparams *hp)
{
    return kern_cuda_attention_supports(hp->head_dim) == FERRY_OK &&
           (hp->head_dim_swa <= 0 || kern_cuda_attention_supports(hp->head_dim_swa) == FERRY_OK);
}

const char *forward_cuda_device_lacks(const struct llm_hparams *hp)
{
    if (forward_cuda_devices() <= 0) return NULL;
    if (hp->full_attn_interval > 0 &&
        (hp->ssm_head_k > KERN_CUDA_DN_MAX_HEAD_K || hp->ssm_conv_kernel > KERN_CUDA_DN_MAX_WIDTH))
        return "linear-attention key heads wider than 256 dims or convolutions wider than 8 taps";
    if (heads_supported(hp)) return NULL;
    return "attention heads of this size on this GPU (multiples of 8 up to 256 dims, up to 512 where a block "
           "may have 166 KB of shared memory: H100, H200, B200)";
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* State */

struct forward_cuda {
    struct backend be;
    const struct model *m;
    const struct kv_cache *kv; /* the engine's tables (block table, sizes) */
    const struct layer_program *prog;
    struct device_map map;
    /* What the map was planned from, for forward_cuda_map_variant. */
    struct forward_cuda_params params;
    uint64_t plan_budget;   /* the budget the map was planned in */
    uint64_t plan_overhead; /* of it, the CUDA runtime's and cuBLAS's own memory (an explicit budget's) */
    int max_tokens;
    int n_layers;
    struct layer_layout *layouts;    /* (n_layers) block_layout_of's */
    struct cuda_dn_block *dn_blocks; /* (n_layers) a recurrent layer's DeltaNet matrices in its block */
    uint64_t *layer_sizes;           /* (n_layers) bytes of each layer's block */
    void *arena;                     /* the one device allocation */
    size_t arena_bytes;
    struct kern_cuda_ctx *kctx;
    cudaStream_t compute, copy;

    /* Weights. */
    void **resident;          /* (n_layers) device block of a resident layer, else NULL */
    void **host_block;        /* (n_layers) pinned block of a host layer, else NULL */
    struct pinned_block host; /* one allocation holding every host block */
    void **tail;              /* (n_layers) a host layer's tail (norms, biases) on the device, else NULL */
    /* The ring (runtime/ring.h): a streamed layer's pieces are its matrix groups (block_piece) in the
     * program's order of use; item l * LAYER_N_MATS + g is layer l's piece g. */
    char *ring_buf; /* (map.ring_bytes) device */
    struct ring ring;
    int *step_items;                /* (n_layers * LAYER_N_MATS) scratch: the step's streamed pieces */
    uint64_t *step_bytes;           /* (n_layers * LAYER_N_MATS) their sizes */
    cudaEvent_t *copy_done;         /* (RING_HISTORY) copy c's arrival at c mod RING_HISTORY */
    cudaEvent_t *use_done;          /* (RING_HISTORY) the end of copy c's use at c mod RING_HISTORY */
    cudaEvent_t *copy_t0, *copy_t1; /* (n_copy_ev) timing of copy c at c mod n_copy_ev */
    int n_copy_ev;
    cudaEvent_t *wait_t0,
        *wait_t1; /* (n_wait_ev) compute-stream stall around the wait of the step's i-th use */
    int n_wait_ev;
    uint64_t *step_copy; /* (n_layers * LAYER_N_MATS) copy number of the step's i-th use */
    int step_uses;
    /* Parked layers (runtime/step_plan.h): a step whose plan parks host layers streams through the ring's
     * start and keeps them at its end (step_plan_park_layout), where they stay while no copy writes there. */
    uint64_t *parked;      /* (n_layers) the offset of layer l's groups in the ring, UINT64_MAX: not parked */
    uint64_t *park_want;   /* (n_layers) scratch: this step's layout */
    uint64_t park_lo;      /* the lowest offset of a parked layer (UINT64_MAX: none) */
    cudaEvent_t park_done; /* the last parking copy (copy stream) */
    cudaEvent_t park_used; /* the last use of a parked layer (compute stream) */
    void *head;            /* output head (n_vocab, dim) in head_type */
    enum dtype head_type;
    float *out_norm;       /* (dim) */
    float *inv_freq;       /* (rope_dim/2) device */
    float *inv_freq_local; /* (rope_pairs_local) device, the sliding-window layers' (model.h), or NULL */

    /* KV pool (f16, or Q8_0 codes and scales: kernels/cuda/attention.h) and its block table mirror; the
     * pool's last n_ext blocks are its extension in pinned, mapped host memory (device_map.h), in the same
     * element type (ext_layer says where each layer's planes are). */
    void *k_cache, *v_cache;     /* (kv_planes, n_blocks - n_ext, block_size, kv_row) f16 or int8 */
    uint16_t *k_scale, *v_scale; /* Q8_0: (n_layers, n_blocks - n_ext, block_size, kvd / 32) f16; else NULL */
    char *kv_ext;                /* K, V[, K scales, V scales], each (n_layers, n_ext, ...) (host), or NULL */
    char *kv_ext_dev;            /* its device address */
    int32_t *d_block_table;      /* (n_seqs, max_blocks) */
    /* The sliding-window layers' own pool (forward_cuda_params.kv_swa; NULL, all four: their planes are in
     * the pool above): each slot's window of positions, in the same element type and row, with its own block
     * table. No extension: a window's positions are few, and every step reads all of them. */
    const struct kv_cache *kv_swa;
    void *k_swa, *v_swa; /* (kv_swa->n_layers, kv_swa->n_blocks, block_size, kv_row) f16 or int8 */
    uint16_t *k_swa_scale, *v_swa_scale; /* Q8_0: (kv_swa->n_layers, n_blocks, block_size, kv_row / 32) f16 */
    int32_t *d_block_table_swa;          /* (n_seqs, max_blocks) */
    /* Attention over the extension's positions on the host's cores (runtime/NOTES.md, 2026-12-02d). Each
     * step, a row whose sequence ends in a run of extension blocks gives the positions of that run (from
     * ext_lo[i], at least 1) to the host: the device attends to the rest (positions clamped, d_pos_att) and
     * writes each row's log-sum-exp; per layer q's rows [ext_r0, ext_r1) go down, the CPU attends to its
     * positions where the K/V live (ext_attention_host, a CUDA host function on the compute stream), and a
     * kernel merges its partial outputs, read from mapped memory, into the device's. */
    int ext_host;             /* on: a pool with an extension, FERRY_KV_EXT_ATTN not "device" */
    struct tpool *ext_pool;   /* the host's threads for it */
    int ext_r0, ext_r1;       /* this step's rows with host positions; none when equal */
    int32_t *h_pos_att;       /* (T) pinned: each row's last device position */
    int32_t *h_ext_lo;        /* (T) each row's first host position */
    int32_t *d_pos_att;       /* (T) device copy of h_pos_att */
    float *h_ext_q, *h_ext_o; /* (T, q_dim) pinned: the rows' queries; the host's partial outputs (mapped) */
    float *h_ext_lse;         /* (T, n_heads) pinned, mapped: the host's log-sum-exps */
    struct ext_job *ext_jobs; /* (n_layers) each layer's host-function argument */
    int ext_rc;               /* the first failure of a host function (reported at the step's end) */

    /* Activations. */
    /* Sizes are the largest layer's where they differ by layer (q_row_max, kv_row, ffn_max); a layer's rows
     * are its own size, back to back. */
    float *x;       /* (T, dim) residual stream */
    float *xn;      /* (T, dim) */
    float *tmp;     /* (T, dim) the pending delta D */
    float *qkv;     /* (T, q_dim + 2 kv_dim) stacked rows */
    float *q, *att; /* (T, q_dim) */
    float *gu;      /* (T, 2 ffn) gate | up rows */
    float *h;       /* (T, ffn) */
    /* Per-layer inputs (hp.ple_dim > 0, else NULL): their weights (ple_piece's region), every row's inputs
     * of every layer (T, n_layers * ple_dim), the projection's share of them (same), a work row (T, ple_dim),
     * and pinned (mapped) staging for the embedding rows gathered on the host (T, n_layers * ple_dim). */
    void *ple_w;
    float *ple, *ple_p, *ple_t;
    float *h_ple;
    float *logits; /* (logit_rows, n_vocab) */
    int logit_rows;
    struct draw_cuda *draw; /* the GPU sampler's buffers (engine_step_draw), for logit_rows rows */
    int32_t *d_ints;        /* tokens | pos | seq, (3, T) */
    int32_t *d_iota;        /* (T) 0, 1, 2, ...: row indices for the x gather */
    void *attn_ws;
    size_t attn_ws_bytes;
    int pending; /* tmp holds a delta not yet added to x */

    /* Pinned staging (mapped). */
    float *h_x;           /* (T, dim) embeddings gathered on the host */
    const float *h_x_dev; /* its device address */
    int32_t *h_ints;      /* (3 T + n_tables n_seqs max_blocks): tokens | pos | seq, the block table(s) */
    float *h_logits;      /* (T, n_vocab) */

    /* Decode steps of a fully resident model replay captured graphs: (GRAPH_MAX_TOKENS, GRAPH_LENS,
     * GRAPH_KINDS), or NULL. */
    cudaGraphExec_t *graphs;
    int graph_step; /* this step ran whole as a graph from begin */
    int max_len;    /* this step's attention length bucket */
    int n_decode;   /* leading rows that are single tokens of their sequence (the decode attention's) */

    /* The link-load probe. */
    cudaEvent_t load_t0, load_t1;
    uint64_t load_bytes;

    /* Expert layers (runtime/forward_cuda_moe.h), or NULL: their routers, scratch and resident experts are
     * carved from the arena; the first cpu_moe layers keep their experts in host memory. */
    struct cuda_moe *moe;
    void **moe_experts; /* (n_layers) each layer's resident experts on the device, or NULL */
    int cpu_moe;

    /* Qwen3.5's layer kinds (hyb_bytes), NULL where the model has none. */
    struct cuda_deltanet *dn; /* recurrent layers: each slot's state, the matrices, the rows' scratch */
    float *dn_in;             /* (T, dn_in_row) the in-products: q|k|v, z, b, a */
    float *dn_out;            /* (T, ssm_inner) the rule's gated, normed output */
    float *dn_pack;           /* (T, dn_in_row) Qwen3-Next's packed in-products (hp.ssm_grouped), or NULL */
    float *qg;                /* (T, 2 q_dim + 2 kv_dim) the gated attention's q|k|v product */
    float *gate;              /* (T, q_dim) its output gates (LACT_GATE) */
    float *sh;                /* (T, dim) the shared expert's output */
    float *shexp_gate;        /* (n_layers, dim) each layer's shared-expert gate (zeros where none) */

    struct backend_stats stats;
};

static const struct backend_ops cuda_ops;

struct ext_job {
    struct forward_cuda *f;
    int l;
};

static int ext_attn_on_host(void);

/* The program layer l runs (a recurrent layer's differs from the others'). */
static const struct layer_program *layer_prog(const struct forward_cuda *f, int l)
{
    return layer_program_of_layer(&f->m->hp, l);
}

/* The host side of attention over the pool's extension (see struct forward_cuda): off when
 * FERRY_KV_EXT_ATTN=device (every position read by the device over the link, as before), or when the layer
 * program's attention would share the scratch it uses (the device's log-sum-exps go to h, which the FFN
 * alone uses). */
static int ext_host_init(struct forward_cuda *f, int T, char err[256])
{
    const struct llm_hparams *hp = &f->m->hp;
    if (!ext_attn_on_host()) return FERRY_OK;
    for (int i = 0; i < f->prog->n_ops; i++) {
        const struct layer_op *op = &f->prog->ops[i];
        if (op->kind == LOP_ATTENTION && (op->in == LACT_H || op->out == LACT_H)) return FERRY_OK;
    }
    if (hp->ffn_dim < hp->n_heads) return FERRY_OK;
    const size_t qd = (size_t)hp->n_heads * hp->head_dim;
    f->h_pos_att = pinned_mapped_alloc((size_t)T * sizeof(int32_t));
    f->h_ext_q = pinned_mapped_alloc((size_t)T * qd * sizeof(float));
    f->h_ext_o = pinned_mapped_alloc((size_t)T * qd * sizeof(float));
    f->h_ext_lse = pinned_mapped_alloc((size_t)T * hp->n_heads * sizeof(float));
    f->h_ext_lo = malloc((size_t)T * sizeof(int32_t));
    f->ext_jobs = calloc((size_t)f->n_layers, sizeof *f->ext_jobs);
    if (!f->h_pos_att || !f->h_ext_q || !f->h_ext_o || !f->h_ext_lse || !f->h_ext_lo || !f->ext_jobs ||
        tpool_init(&f->ext_pool, 0) != FERRY_OK) {
        snprintf(err, 256, "cannot set up the host's attention over the KV pool's extension");
        return FERRY_ERR_NOMEM;
    }
    FLOG_INFO("the KV pool's extension: its positions' attention runs on %d host threads",
              tpool_size(f->ext_pool));
    f->ext_host = 1;
    return FERRY_OK;
}

const struct device_map *forward_cuda_map(const struct backend *be)
{
    return &((const struct forward_cuda *)be)->map;
}

void *forward_cuda_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return pinned_mapped_alloc(bytes);
}

void forward_cuda_host_free(void *ctx, void *p)
{
    (void)ctx;
    pinned_mapped_free(p);
}

void forward_cuda_measure_bandwidth(double *h2d, double *d2d)
{
    pinned_measure_link(h2d, d2d);
}

/* Slot seq's recurrent state to the host (down) or from it, then a wait for the compute stream. */
static int state_copy(struct backend *be, int seq, float *host, int down)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    if (!f->dn) return FERRY_OK;
    if (seq < 0 || seq >= f->kv->n_seqs || !host) return FERRY_ERR_INVALID;
    RC(down ? cuda_deltanet_download(f->dn, seq, host, f->compute)
            : cuda_deltanet_upload(f->dn, seq, host, f->compute));
    CK(cudaStreamSynchronize(f->compute));
    return FERRY_OK;
}

int forward_cuda_state_get(struct backend *be, int seq, float *host)
{
    return state_copy(be, seq, host, 1);
}

int forward_cuda_state_put(struct backend *be, int seq, const float *host)
{
    return state_copy(be, seq, (float *)host, 0); /* (only read: the upload's source) */
}

uint64_t forward_cuda_layer_bytes(const struct backend *be, int l)
{
    const struct forward_cuda *f = (const struct forward_cuda *)be;
    return l >= 0 && l < f->n_layers ? f->layer_sizes[l] : 0;
}

void forward_cuda_layer_pieces(const struct backend *be, int l, uint64_t out[LAYER_N_MATS])
{
    const struct forward_cuda *f = (const struct forward_cuda *)be;
    int g[LAYER_N_MATS], n = l >= 0 && l < f->n_layers ? program_pieces(layer_prog(f, l), g) : 0;
    for (int i = 0; i < n; i++) {
        size_t off, bytes;
        block_piece(&f->layouts[l], &f->dn_blocks[l], g[i], &off, &bytes);
        out[i] = bytes;
    }
    while (n < LAYER_N_MATS) out[n++] = 0;
}

static void destroy_events(cudaEvent_t *ev, int n)
{
    if (!ev) return;
    for (int i = 0; i < n; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    free(ev);
}

static void cuda_free(struct backend *be)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    if (!f) return;
    if (f->compute) cudaStreamSynchronize(f->compute);
    if (f->copy) cudaStreamSynchronize(f->copy);
    destroy_events(f->copy_done, f->ring_buf ? RING_HISTORY : 0);
    destroy_events(f->use_done, f->ring_buf ? RING_HISTORY : 0);
    destroy_events(f->copy_t0, f->n_copy_ev);
    destroy_events(f->copy_t1, f->n_copy_ev);
    destroy_events(f->wait_t0, f->n_wait_ev);
    destroy_events(f->wait_t1, f->n_wait_ev);
    if (f->park_done) cudaEventDestroy(f->park_done);
    if (f->park_used) cudaEventDestroy(f->park_used);
    if (f->load_t0) cudaEventDestroy(f->load_t0);
    if (f->load_t1) cudaEventDestroy(f->load_t1);
    if (f->graphs) {
        for (int i = 0; i < GRAPH_SLOTS; i++)
            if (f->graphs[i]) cudaGraphExecDestroy(f->graphs[i]);
        free(f->graphs);
    }
    cuda_moe_free(f->moe);
    free(f->moe_experts);
    cuda_deltanet_free(f->dn);
    kern_cuda_ctx_free(f->kctx);
    if (f->arena) cudaFree(f->arena);
    pinned_block_free(&f->host);
    pinned_mapped_free(f->kv_ext);
    tpool_free(f->ext_pool);
    pinned_mapped_free(f->h_pos_att);
    pinned_mapped_free(f->h_ext_q);
    pinned_mapped_free(f->h_ext_o);
    pinned_mapped_free(f->h_ext_lse);
    free(f->h_ext_lo);
    free(f->ext_jobs);
    if (f->h_x) cudaFreeHost(f->h_x);
    if (f->h_ple) cudaFreeHost(f->h_ple);
    if (f->h_ints) cudaFreeHost(f->h_ints);
    if (f->h_logits) cudaFreeHost(f->h_logits);
    draw_cuda_free(f->draw);
    if (f->compute) cudaStreamDestroy(f->compute);
    if (f->copy) cudaStreamDestroy(f->copy);
    ring_free(&f->ring);
    free(f->layouts);
    free(f->dn_blocks);
    free(f->layer_sizes);
    free(f->resident);
    free(f->host_block);
    free(f->tail);
    free(f->step_items);
    free(f->step_bytes);
    free(f->step_copy);
    free(f->parked);
    free(f->park_want);
    device_map_free(&f->map);
    free(f);
}

static int create_events(cudaEvent_t **out, int n, unsigned flags)
{
    *out = calloc((size_t)(n > 0 ? n : 1), sizeof **out);
    if (!*out) return FERRY_ERR_NOMEM;
    for (int i = 0; i < n; i++) CK(cudaEventCreateWithFlags(&(*out)[i], flags));
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Init */

struct carve {
    char *base;
    size_t off, cap;
};

static void *carve(struct carve *c, size_t bytes)
{
    size_t at = align_up(c->off);
    if (at + bytes > c->cap) return NULL;
    c->off = at + bytes;
    return c->base + at;
}

/* Rows of the device logits buffer: a step rarely wants more than one row per sequence (the last prompt
 * position, or a decode token); more are projected in chunks of this many rows. At least a decode graph's
 * batch, so graph steps project in one go. */
static int logit_rows(int T, int n_seqs)
{
    const int r = n_seqs > GRAPH_MAX_TOKENS ? n_seqs : GRAPH_MAX_TOKENS;
    return r < T ? r : T;
}

/* Device bytes of the activations for max_tokens rows. */
static size_t activation_bytes(const struct llm_hparams *hp, int T, int n_seqs, int max_blocks)
{
    const size_t qd = q_row_max(hp), kvd = kv_row(hp);
    /* x, xn, tmp (dim); qkv; q, att (qd); gate|up (2 ffn); h (ffn); then the logits' rows. */
    size_t floats = (size_t)T * (3 * (size_t)hp->dim + 3 * qd + 2 * kvd + 3 * (size_t)ffn_max(hp)) +
                    (size_t)logit_rows(T, n_seqs) * hp->n_vocab;
    /* Per-layer inputs: two (T, n_layers * ple_dim) and a (T, ple_dim). */
    const size_t ple = hp->ple_dim > 0 ? (size_t)T * hp->ple_dim * (2 * (size_t)hp->n_layers + 1) : 0;
    return (floats + ple) * sizeof(float) + (ple ? 3 * ALIGN : 0) + 15 * ALIGN +
           (size_t)5 * T * sizeof(int32_t) + (size_t)n_seqs * max_blocks * sizeof(int32_t) +
           (size_t)rope_pairs_max(hp) * sizeof(float) * (hp->sliding_window > 0 ? 2 : 1) +
           (hp->sliding_window > 0 ? ALIGN : 0) + draw_cuda_device_bytes(logit_rows(T, n_seqs), hp->n_vocab);
}

static int upload_layers(struct forward_cuda *f, const struct model *m)
{
    const struct llm_hparams *hp = &m->hp;
    size_t max_bytes = 0;
    for (int l = 0; l < f->n_layers; l++)
        if (f->layouts[l].bytes > max_bytes) max_bytes = f->layouts[l].bytes;
    int64_t max_cols = hp->dim > ffn_max(hp) ? hp->dim : ffn_max(hp);
    if ((int64_t)q_row_max(hp) > max_cols) max_cols = (int64_t)q_row_max(hp);
    float *row_tmp = malloc((size_t)max_cols * sizeof(float));
    void *staging[2] = {NULL, NULL};
    cudaEvent_t staged[2] = {NULL, NULL};
    int rc = FERRY_ERR_NOMEM;
    if (!row_tmp) goto out;
    rc = FERRY_ERR_CUDA;
    for (int i = 0; i < 2; i++)
        if (cudaHostAlloc(&staging[i], max_bytes, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&staged[i], cudaEventDisableTiming) != cudaSuccess)
            goto out;
    int n_up = 0;
    for (int l = 0; l < f->n_layers; l++) {
        void *dst;
        if (f->resident[l]) {
            /* Double-buffered: pack layer l while the copy of layer l-1 runs. */
            int s = n_up++ & 1;
            if (cudaEventSynchronize(staged[s]) != cudaSuccess) goto out;
            dst = staging[s];
            if ((rc = layer_pack(&m->layers[l], hp, &f->layouts[l], dst, row_tmp))) goto out;
            cuda_deltanet_block_pack(m, l, &f->dn_blocks[l], dst);
            rc = FERRY_ERR_CUDA;
            if (cudaMemcpyAsync(f->resident[l], dst, f->layouts[l].bytes, cudaMemcpyHostToDevice, f->copy) !=
                    cudaSuccess ||
                cudaEventRecord(staged[s], f->copy) != cudaSuccess)
                goto out;
        } else {
            const struct layer_layout *lay = &f->layouts[l];
            if ((rc = layer_pack(&m->layers[l], hp, lay, f->host_block[l], row_tmp))) goto out;
            cuda_deltanet_block_pack(m, l, &f->dn_blocks[l], f->host_block[l]);
            rc = FERRY_ERR_CUDA;
            if (cudaMemcpy(f->tail[l], (const char *)f->host_block[l] + lay->norm_off[0],
                           lay->bytes - lay->norm_off[0], cudaMemcpyHostToDevice) != cudaSuccess)
                goto out;
        }
        if ((l + 1) % 8 == 0 || l + 1 == f->n_layers)
            FLOG_INFO("uploading weights: %d/%d layers (%d resident so far)", l + 1, f->n_layers, n_up);
    }
    rc = cudaStreamSynchronize(f->copy) == cudaSuccess ? FERRY_OK : FERRY_ERR_CUDA;
out:
    for (int i = 0; i < 2; i++) {
        if (staged[i]) cudaEventDestroy(staged[i]);
        if (staging[i]) cudaFreeHost(staging[i]);
    }
    free(row_tmp);
    return rc;
}

/* Each layer's shared-expert gate (dim) into shexp_gate, zeros for a layer without one; nothing without the
 * region. */
static int upload_shexp_gates(struct forward_cuda *f)
{
    const struct llm_hparams *hp = &f->m->hp;
    const size_t row = (size_t)hp->dim * sizeof(float);
    if (!f->shexp_gate) return FERRY_OK;
    CK(cudaMemset(f->shexp_gate, 0, (size_t)hp->n_layers * row));
    for (int l = 0; l < hp->n_layers; l++)
        if (f->m->layers[l].shexp_gate)
            CK(cudaMemcpy((char *)f->shexp_gate + l * row, f->m->layers[l].shexp_gate, row,
                          cudaMemcpyHostToDevice));
    return FERRY_OK;
}

static int upload_head(struct forward_cuda *f, const struct model *m)
{
    const struct wview *w = &m->output;
    size_t bytes = dtype_row_size(f->head_type, w->cols) * (size_t)w->rows;
    void *h = malloc(bytes);
    float *row = malloc((size_t)w->cols * sizeof(float));
    int rc = FERRY_ERR_NOMEM;
    if (h && row && !(rc = layer_pack_matrix(w, f->head_type, h, row))) {
        rc = cudaMemcpy(f->head, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? FERRY_OK : FERRY_ERR_CUDA;
        if (!rc)
            rc = cudaMemcpy(f->out_norm, m->output_norm, (size_t)m->hp.dim * sizeof(float),
                            cudaMemcpyHostToDevice) == cudaSuccess
                     ? FERRY_OK
                     : FERRY_ERR_CUDA;
    }
    free(h);
    free(row);
    return rc;
}

/* What a plan has to fit, from the model's shapes and the KV pool's geometry (no device needed). */
struct plan_sizes {
    size_t layer_bytes;    /* the largest layer block */
    size_t piece_bytes;    /* the largest piece (matrix group) of any layer */
    uint64_t *layer_sizes; /* (n_layers) each layer block's bytes (caller-owned) */
    size_t head_bytes;     /* output head + final norm */
    size_t fixed_bytes; /* activations, attention workspace; cuBLAS's context and the KV pool not included */
    size_t kv_bytes;    /* the KV pool (f16) at kv's size */
    size_t kv_token_bytes; /* K and V of one position over the main pool's planes (f16) */
    size_t kv_swa_bytes;   /* the sliding-window layers' own pool (0: none) */
    int64_t kv_swa_tokens; /* its positions */
    size_t attn_ws_bytes;
    size_t max_x; /* largest x of a GEMM, in elements (sizes the cuBLAS context) */
    size_t w16;   /* the context's buffer for block-type W decoded to f16 (kern_cuda_w16_bytes) */
    /* Expert models: (n_layers) caller-owned, each layer's block plus its experts where they are resident
     * (plan_experts); what the planner places. NULL for a dense model. */
    uint64_t *with_experts;
    uint64_t with_experts_max;
    size_t dn_layer_bytes; /* a recurrent layer's state (all slots) and small tensors (not in fixed) */
    /* Device memory the plan counts that the arena does not hold (DEVICE_PAGE, HOST_MAP_DIV): the arena's
     * rounding to a whole page, the page tables of the pinned staging buffers in whole pages, and one page
     * for the host layers' entries (device_map's host_map_bytes) ending inside a page. */
    size_t outside_bytes;
};

/* The device hands out memory in pages of DEVICE_PAGE (cudaMalloc and the driver's own page tables both
 * round up to them), and every pinned host byte is mapped into the device's address space at 8 bytes of
 * page-table entry per 4 KiB page (HOST_MAP_DIV). Measured on the H100 (2026-12-07, ferry_vram_used_bytes
 * against --gpu-memory before these were counted): 2 MiB over with 1.51 GiB of host layers pinned, 4 with
 * 2.1, 18 with 9.05, 19 with 8.67: the arena's page plus 2 MiB per GiB pinned. */
#define DEVICE_PAGE  ((size_t)2 << 20)
#define HOST_MAP_DIV 512u

/* layouts and dn_blocks (n_layers each) receive the blocks' layouts when not NULL. */
static void plan_sizes_of(const struct model *m, const struct kv_cache *kv, const struct kv_cache *kv_swa,
                          int T, int kv_q8, struct layer_layout *layouts, struct cuda_dn_block *dn_blocks,
                          uint64_t *layer_sizes, struct plan_sizes *ps)
{
    const struct llm_hparams *hp = &m->hp;
    memset(ps, 0, sizeof *ps);
    ps->layer_sizes = layer_sizes;
    size_t w16_elems = dtype_block_size(m->output.type) > 1 ? (size_t)m->output.rows * m->output.cols : 0;
    size_t tails = 0; /* every layer's tail, kept on the device when the layer lives on the host */
    for (int l = 0; l < hp->n_layers; l++) {
        struct layer_layout tmp, *lay = layouts ? &layouts[l] : &tmp;
        struct cuda_dn_block dtmp, *dnb = dn_blocks ? &dn_blocks[l] : &dtmp;
        block_layout_of(m, l, lay, dnb);
        layer_sizes[l] = lay->bytes;
        if (lay->bytes > ps->layer_bytes) ps->layer_bytes = lay->bytes;
        for (int i = 0; i < LAYER_N_MATS; i++) {
            size_t off, bytes;
            block_piece(lay, dnb, i, &off, &bytes);
            if (bytes > ps->piece_bytes) ps->piece_bytes = bytes;
        }
        tails += align_up(lay->bytes - lay->norm_off[0]);
        for (int i = 0; i < LAYER_N_MATS; i++)
            for (int p = 0; p < lay->n_parts[i]; p++) {
                const int64_t rows = lay->uniform[i] ? lay->rows[i] : lay->part[i][p].rows; /* one product */
                const size_t e = (size_t)rows * (size_t)lay->cols[i];
                if (dtype_block_size(lay->part[i][p].type) > 1 && e > w16_elems) w16_elems = e;
            }
    }
    for (int i = 0; i < ple_pieces(m); i++) {
        const struct wview w = ple_piece(m, i);
        if (dtype_block_size(w.type) > 1 && (size_t)w.rows * (size_t)w.cols > w16_elems)
            w16_elems = (size_t)w.rows * (size_t)w.cols;
    }
    for (int l = 0; l < hp->n_layers; l++) /* the DeltaNet products */
        if (llm_layer_is_recurrent(hp, l)) {
            const struct model_layer *L = &m->layers[l];
            const struct wview *dw[] = {&L->ssm_qkv, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha, &L->ssm_out};
            for (size_t i = 0; i < sizeof dw / sizeof dw[0]; i++)
                if (dtype_block_size(dw[i]->type) > 1 &&
                    (size_t)dw[i]->rows * (size_t)dw[i]->cols > w16_elems)
                    w16_elems = (size_t)dw[i]->rows * (size_t)dw[i]->cols;
        }
    size_t moe_x, moe_w16;
    cuda_moe_ctx_needs(m, T, &moe_x, &moe_w16);
    if (moe_w16 > w16_elems) w16_elems = moe_w16;
    ps->w16 = kern_cuda_w16_bytes(T, w16_elems);
    ps->head_bytes =
        align_up(dtype_row_size(packed_type(m->output.type), m->output.cols) * (size_t)m->output.rows) +
        align_up((size_t)hp->dim * sizeof(float));
    const size_t kv_elems = (size_t)main_planes(hp, kv_swa) * kv->n_blocks * kv->block_size * kv_row(hp);
    ps->attn_ws_bytes = kern_cuda_attention_ws_size(T, hp->n_heads, hp->head_dim, kv->ctx_size);
    if (hp->head_dim_swa > 0) { /* the local layers' head size: whichever needs more */
        const size_t ws = kern_cuda_attention_ws_size(T, hp->n_heads, hp->head_dim_swa, kv->ctx_size);
        if (ws > ps->attn_ws_bytes) ps->attn_ws_bytes = ws;
    }
    /* one position's K (or V), all the main pool's planes */
    const size_t kv_tok = (size_t)main_planes(hp, kv_swa) * kv_row(hp);
    ps->kv_bytes = pool_bytes(kv_elems, kv_q8);
    size_t swa_fixed = 0; /* the window pool's block table and the carve's alignment around its regions */
    if (kv_swa) {
        ps->kv_swa_tokens = (int64_t)kv_swa->n_blocks * kv_swa->block_size;
        ps->kv_swa_bytes = pool_bytes((size_t)kv_swa->n_layers * ps->kv_swa_tokens * kv_row(hp), kv_q8);
        swa_fixed = align_up((size_t)kv->n_seqs * kv->max_blocks * sizeof(int32_t)) + (kv_q8 ? 5 : 3) * ALIGN;
    }
    ps->kv_token_bytes =
        kv_q8 ? 2 * (kv_tok + kv_tok / 32 * sizeof(uint16_t)) : 2 * kv_tok * sizeof(uint16_t);
    /* (2 * ALIGN per plane: the K/V arrays' alignment when the planner sizes the pool) */
    ps->fixed_bytes = activation_bytes(hp, T, kv->n_seqs, kv->max_blocks) + align_up(ps->attn_ws_bytes) +
                      (kv_q8 ? 4 : 2) * ALIGN + tails + cuda_moe_fixed_bytes(m, T) + ple_weight_bytes(m) +
                      hyb_bytes(m, T) + swa_fixed;
    /* Pinned staging (forward_cuda_init, ext_host_init, the expert stage's output): inputs, token ids and
     * block tables, logits, per-layer inputs, the extension's q/o/lse; the host backend's activations and the
     * sampler's staging counted as the device's activations. */
    const size_t ple_all = (size_t)hp->n_layers * hp->ple_dim, qd = q_row_max(hp);
    const size_t staging =
        (size_t)T * (2 * (size_t)hp->dim + (size_t)hp->n_vocab + ple_all + 2 * qd + (size_t)hp->n_heads + 4) *
            sizeof(float) +
        2 * (size_t)kv->n_seqs * kv->max_blocks * sizeof(int32_t) +
        activation_bytes(hp, T, kv->n_seqs, kv->max_blocks);
    const size_t staging_map = (staging + HOST_MAP_DIV - 1) / HOST_MAP_DIV;
    /* (in whole pages: a plan's bytes move with its shapes only where a page is crossed) */
    ps->outside_bytes = 2 * DEVICE_PAGE + (staging_map + DEVICE_PAGE - 1) / DEVICE_PAGE * DEVICE_PAGE;
    ps->dn_layer_bytes = cuda_deltanet_layer_bytes(m, kv->n_seqs);
    ps->max_x = (size_t)T * (size_t)(ffn_max(hp) > hp->dim ? ffn_max(hp) : hp->dim);
    if ((size_t)T * q_row_max(hp) > ps->max_x) ps->max_x = (size_t)T * q_row_max(hp);
    if (moe_x > ps->max_x) ps->max_x = moe_x;
    if (has_recurrent(hp) && (size_t)T * hp->ssm_inner > ps->max_x) ps->max_x = (size_t)T * hp->ssm_inner;
}

/* The sizes the planner places when the experts of layers [0, cpu_moe) stay in host memory. */
static void plan_experts(const struct model *m, struct plan_sizes *ps, int cpu_moe)
{
    ps->with_experts_max = 0;
    for (int l = 0; l < m->hp.n_layers && ps->with_experts; l++) {
        ps->with_experts[l] = ps->layer_sizes[l] + (l >= cpu_moe ? cuda_moe_expert_bytes(m, l) : 0);
        if (ps->with_experts[l] > ps->with_experts_max) ps->with_experts_max = ps->with_experts[l];
    }
}

/* The host's cores attend to the KV pool's extension (the default), or the device reads it over the link
 * (FERRY_KV_EXT_ATTN=device, for comparison). */
static int ext_attn_on_host(void)
{
    const char *mode = getenv("FERRY_KV_EXT_ATTN");
    return !(mode && strcmp(mode, "device") == 0);
}

/* Positions the KV pool's extension may take in host memory: half of what the host has available
 * (/proc/meminfo), less the model's layers (an upper bound of the host layers' pinned blocks). */
static int64_t kv_ext_cap(const struct plan_sizes *ps, int n_layers)
{
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(fp);
    uint64_t layers = 0;
    for (int l = 0; l < n_layers; l++) layers += ps->layer_sizes[l];
    const uint64_t half = (uint64_t)kib * 1024 / 2;
    return half > layers && ps->kv_token_bytes ? (int64_t)((half - layers) / ps->kv_token_bytes) : 0;
}

/* Whether the main pool may have an extension in host memory: not where sliding-window layers keep their
 * K/V in it (the host's part of a split attention has no window: their rows would see positions outside it),
 * nor where the layers have attention sinks (the host's part has none). The window pool never has one. */
static int ext_allowed(const struct llm_hparams *hp, const struct kv_cache *kv_swa)
{
    if (!kv_swa && hp->sliding_window > 0 && kv_cache_swa_layers(hp) > 0) return 0;
    for (int l = 0; l < hp->n_layers; l++)
        if (layer_program_has(layer_program_of_layer(hp, l), LOP_ATTENTION_SINKS)) return 0;
    return 1;
}

/* Bytes of plan_input's scratch for n layers (malloc'd, so aligned for its uint64_t part). */
static size_t plan_scratch_bytes(int n)
{
    return (size_t)n * (sizeof(uint64_t) + 2);
}

/* The planner's input for these sizes: the KV pool fixed at kv's size, or sized by the planner (p->kv_auto).
 * scratch: plan_scratch_bytes(n_layers), for p->force_where, the recurrent layers' mask and their device
 * state. A model's recurrent layers in host memory are CPU-only (their state in host memory, the host's
 * cores compute them on every step) or, with p->recurrent_stream, stream-only (their state on the device,
 * where the host's cores cannot reach it); its other layers are placed step by step like any model's. */
static struct device_map_input plan_input(const struct model *m, const struct plan_sizes *ps,
                                          const struct forward_cuda_params *p, size_t other_fixed,
                                          uint64_t budget, int kv_block, double h2d, double hbm,
                                          void *scratch)
{
    const int L = m->hp.n_layers;
    uint64_t *state = scratch;
    uint8_t *mask = (uint8_t *)(state + L);
    struct device_map_input in = {.n_layers = m->hp.n_layers,
                                  .layer_bytes = ps->with_experts ? ps->with_experts_max : ps->layer_bytes,
                                  .layer_sizes = ps->with_experts ? ps->with_experts : ps->layer_sizes,
                                  .piece_bytes = ps->piece_bytes,
                                  .head_bytes = ps->head_bytes,
                                  .fixed_bytes = ps->fixed_bytes + ps->outside_bytes + other_fixed,
                                  .kv_swa_bytes = ps->kv_swa_bytes,
                                  .kv_swa_tokens = ps->kv_swa_tokens,
                                  .budget = budget,
                                  .gpu_layers = p->gpu_layers,
                                  .ring_layers = p->ring_layers,
                                  .no_ring = p->no_ring,
                                  .fewer_resident = p->fewer_resident,
                                  .h2d_bytes_per_s = h2d,
                                  .hbm_bytes_per_s = hbm,
                                  .host_map_div = HOST_MAP_DIV};
    if (p->force_where && (int)strlen(p->force_where) >= m->hp.n_layers) {
        for (int l = 0; l < m->hp.n_layers; l++) mask[l] = p->force_where[l] == 'g';
        in.resident_mask = mask;
    }
    if (has_recurrent(&m->hp)) {
        uint8_t *rec = mask + L;
        for (int l = 0; l < L; l++) {
            rec[l] = (uint8_t)llm_layer_is_recurrent(&m->hp, l);
            state[l] = rec[l] ? ps->dn_layer_bytes : 0;
        }
        if (p->recurrent_stream)
            in.stream_only = rec;
        else
            in.cpu_only = rec;
        in.state_bytes = state;
    }
    if (p->kv_auto) {
        in.kv_token_bytes = ps->kv_token_bytes;
        in.kv_tokens_max = p->kv_tokens_max;
        in.kv_tokens_floor = p->kv_tokens_floor;
        in.kv_tokens_min = p->kv_tokens_min;
        in.kv_block = kv_block;
        in.kv_ext_max = ext_allowed(&m->hp, p->kv_swa) ? kv_ext_cap(ps, m->hp.n_layers) : 0;
        in.kv_ext_host = ext_attn_on_host();
    } else {
        in.fixed_bytes += ps->kv_bytes;
    }
    return in;
}

/* The map. For an expert model every layer's block is resident (the host's cores run no expert layer of
 * their own) and the experts of the first cpu_moe layers stay in host memory: cpu_moe_req of them, or (-1)
 * the fewest with which the plan fits the budget; with any there, the staging area they stream through
 * (runtime/forward_cuda_moe.h) is part of the plan. A budget that cannot hold the blocks with every expert in
 * host memory is refused with the minimum. With host experts the device expert cache (cache_req bytes, taken
 * before the experts of more layers are made resident; -1: what the plan leaves of the budget, when the
 * planner chose cpu_moe) is part of the plan too (runtime/forward_cuda_moe.h cuda_moe_cache_plan).
 * A dense model with recurrent layers is planned like any other, its layers stream-only (plan_input): the
 * DeltaNet matrices are part of the blocks, their state and small tensors stay on the device. Without a ring
 * (--placement cpu) no layer of it may live in host memory. */
static int plan_map(const struct model *m, struct plan_sizes *ps, struct device_map_input *in,
                    int cpu_moe_req, int64_t cache_req, int *cpu_moe, struct device_map *out, char err[256])
{
    const int L = m->hp.n_layers;
    *cpu_moe = 0;
    if (m->hp.n_expert <= 0) {
        const int rc = device_map_plan(in, out, err);
        if (rc == FERRY_ERR_UNSUPPORTED && in->no_ring && in->stream_only)
            snprintf(err, 256,
                     "--placement cpu with linear-attention layers streamed (their state on the device): "
                     "all %d layers must fit the budget; with their state in host memory the host's cores "
                     "compute them",
                     L);
        return rc;
    }
    int host = in->gpu_layers >= 0 && in->gpu_layers < L;
    for (int l = 0; l < L && in->resident_mask; l++) host |= !in->resident_mask[l];
    if (host) {
        snprintf(err, 256,
                 "the layers of an expert model stay on the device (their experts may not: --cpu-moe N keeps "
                 "those of the first N layers in host memory)");
        return FERRY_ERR_UNSUPPORTED;
    }
    in->gpu_layers = L;
    in->resident_mask = NULL;
    if (!ps->with_experts) return FERRY_ERR_NOMEM;
    const uint64_t fixed = in->fixed_bytes, stage = cuda_moe_stage_bytes(m);
    for (int c = cpu_moe_req < 0 ? 0 : (cpu_moe_req > L ? L : cpu_moe_req);; c++) {
        plan_experts(m, ps, c);
        in->layer_bytes = ps->with_experts_max;
        const uint64_t cache = cache_req > 0 ? cuda_moe_cache_plan(m, c, (uint64_t)cache_req) : 0;
        uint64_t experts_map = 0; /* the page tables of the host experts' pinned copy */
        for (int l = 0; l < c; l++)
            experts_map += (cuda_moe_expert_bytes(m, l) + HOST_MAP_DIV - 1) / HOST_MAP_DIV;
        /* host experts stream through the staging area */
        in->fixed_bytes = fixed + (c ? stage : 0) + cache + experts_map;
        const int rc = device_map_plan(in, out, err);
        if (!rc) out->host_map_bytes += experts_map;
        if (rc != FERRY_ERR_DEVICE_MEM || cpu_moe_req >= 0 || c >= L) {
            *cpu_moe = c;
            if (!rc) {
                out->moe_layers = L, out->cpu_moe = c, out->expert_cache_bytes = cache;
                if (cache_req < 0 && cpu_moe_req < 0 && in->budget > out->bytes_total) {
                    out->expert_cache_bytes = cuda_moe_cache_plan(m, c, in->budget - out->bytes_total);
                    out->bytes_total += out->expert_cache_bytes;
                }
            }
            if (rc == FERRY_ERR_DEVICE_MEM) { /* name the minimum of this plan: the KV pool at its least */
                struct device_map_input least = *in;
                struct device_map need;
                char e2[256];
                least.budget = UINT64_MAX / 4;
                if (least.kv_token_bytes) least.kv_tokens_max = least.kv_tokens_min, least.kv_ext_max = 0;
                if (device_map_plan(&least, &need, e2) == FERRY_OK) {
                    char detail[160];
                    snprintf(detail, sizeof detail,
                             "an expert model: every layer's attention, norms and router on the device, the "
                             "experts of %d of its %d layers in host memory",
                             c, L);
                    device_map_too_small(err, in->budget, need.bytes_total, detail);
                }
                device_map_free(&need);
            }
            return rc;
        }
        device_map_free(out);
    }
}

int forward_cuda_plan_offline(const struct model *m, const struct kv_cache *kv,
                              const struct forward_cuda_params *p, double h2d, double hbm,
                              struct device_map *out, char err[256])
{
    struct plan_sizes ps;
    uint64_t *sizes = malloc((size_t)m->hp.n_layers * sizeof *sizes);
    void *mask = malloc(plan_scratch_bytes(m->hp.n_layers));
    uint64_t *with_experts = malloc((size_t)m->hp.n_layers * sizeof *with_experts);
    int rc = FERRY_ERR_NOMEM, cpu_moe;
    if (!sizes || !mask || !with_experts) goto out;
    plan_sizes_of(m, kv, p->kv_swa, p->max_tokens, p->kv_q8, NULL, NULL, sizes, &ps);
    ps.with_experts = m->hp.n_expert > 0 ? with_experts : NULL;
    const size_t ctx_bytes = kern_cuda_ctx_size(ps.max_x, ps.w16); /* cuBLAS and the products' workspaces */
    rc = FERRY_ERR_INVALID;
    if (p->gpu_memory <= 0) {
        snprintf(err, 256, "give --gpu-memory SIZE to plan without a device");
    } else {
        struct device_map_input in =
            plan_input(m, &ps, p, ctx_bytes, (uint64_t)p->gpu_memory, kv->block_size, h2d, hbm, mask);
        rc = plan_map(m, &ps, &in, p->cpu_moe, p->expert_cache, &cpu_moe, out, err);
    }
out:
    free(sizes);
    free(mask);
    free(with_experts);
    return rc;
}

int forward_cuda_plan_input(const struct model *m, const struct kv_cache *kv,
                            const struct forward_cuda_params *p, double h2d, double hbm,
                            uint64_t *layer_sizes, uint64_t *expert_bytes, uint64_t *stage_bytes,
                            struct device_map_input *out, char err[256])
{
    if (has_recurrent(&m->hp) || p->force_where || p->gpu_memory <= 0) {
        snprintf(err, 256, "the planner's input is given for a budget, without recurrent layers or a mask");
        return FERRY_ERR_UNSUPPORTED;
    }
    void *scratch = malloc(plan_scratch_bytes(m->hp.n_layers)); /* (unused: no mask, no recurrent state) */
    if (!scratch) return FERRY_ERR_NOMEM;
    struct plan_sizes ps;
    plan_sizes_of(m, kv, p->kv_swa, p->max_tokens, p->kv_q8, NULL, NULL, layer_sizes, &ps);
    *out = plan_input(m, &ps, p, kern_cuda_ctx_size(ps.max_x, ps.w16), (uint64_t)p->gpu_memory,
                      kv->block_size, h2d, hbm, scratch);
    free(scratch);
    *stage_bytes = m->hp.n_expert > 0 ? cuda_moe_stage_bytes(m) : 0;
    for (int l = 0; l < m->hp.n_layers && m->hp.n_expert > 0; l++)
        expert_bytes[l] = cuda_moe_expert_bytes(m, l);
    return FERRY_OK;
}

int forward_cuda_map_variant(const struct backend *be, int no_ring, int fewer_resident,
                             struct device_map *out, char err[256])
{
    const struct forward_cuda *f = (const struct forward_cuda *)be;
    const struct model *m = f->m;
    struct forward_cuda_params p = f->params;
    p.no_ring = no_ring;
    p.fewer_resident = fewer_resident;
    struct plan_sizes ps;
    uint64_t *sizes = malloc((size_t)m->hp.n_layers * sizeof *sizes);
    void *mask = malloc(plan_scratch_bytes(m->hp.n_layers));
    uint64_t *with_experts = malloc((size_t)m->hp.n_layers * sizeof *with_experts);
    int rc = FERRY_ERR_NOMEM, cpu_moe;
    if (sizes && mask && with_experts) {
        plan_sizes_of(m, f->kv, f->kv_swa, p.max_tokens, p.kv_q8, NULL, NULL, sizes, &ps);
        ps.with_experts = m->hp.n_expert > 0 ? with_experts : NULL;
        struct device_map_input in =
            plan_input(m, &ps, &p, kern_cuda_ctx_bytes(f->kctx) + f->plan_overhead, f->plan_budget,
                       f->kv->block_size, f->stats.h2d_bytes_per_s, f->stats.hbm_bytes_per_s, mask);
        rc = plan_map(m, &ps, &in, f->cpu_moe, p.expert_cache, &cpu_moe, out, err);
    }
    free(sizes);
    free(mask);
    free(with_experts);
    return rc;
}

int forward_cuda_init(struct backend **out, const struct model *m, struct kv_cache *kv,
                      const struct forward_cuda_params *p, char err[256])
{
    *out = NULL;
    const struct llm_hparams *hp = &m->hp;
    if (kern_cuda_device_count() <= 0) {
        snprintf(err, 256, "no CUDA device");
        return FERRY_ERR_UNSUPPORTED;
    }
    if (hp->head_dim % 8 || hp->head_dim > 256) {
        snprintf(err, 256, "head_dim %d is not supported by the CUDA attention (multiple of 8, <= 256)",
                 hp->head_dim);
        return FERRY_ERR_UNSUPPORTED;
    }
    if (!layer_program_of(hp)) {
        snprintf(err, 256, "architecture '%.31s' has no layer program", hp->arch);
        return FERRY_ERR_UNSUPPORTED;
    }
    if (hp->sliding_window > 0 && kv->n_ext > 0) {
        snprintf(err, 256, "sliding-window layers with the KV pool's host extension are not supported");
        return FERRY_ERR_UNSUPPORTED;
    }
    const struct kv_cache *ksw = p->kv_swa;
    if (ksw && (ksw->n_layers != kv_cache_swa_layers(hp) || ksw->n_layers > kv_planes(hp) || ksw->n_ext ||
                ksw->n_seqs != kv->n_seqs || ksw->max_blocks != kv->max_blocks ||
                ksw->block_size != kv->block_size)) {
        snprintf(err, 256,
                 "internal: the sliding-window layers' pool does not match the model or the KV pool");
        return FERRY_ERR_INVALID;
    }
    if (!heads_supported(hp)) {
        snprintf(
            err, 256,
            "attention heads of %d dims: this GPU's attention kernels take multiples of 8 up to 256, and "
            "up to 512 where a block may have 166 KB of shared memory (H100, B200); use --backend cpu",
            head_dim_max(hp));
        return FERRY_ERR_UNSUPPORTED;
    }
    int rc = check_types(m, err);
    if (!rc) rc = cuda_moe_check_types(m, err);
    if (!rc) rc = cuda_deltanet_check(m, err); /* (before the blocks are packed from its matrices) */
    if (rc) return rc;
    struct forward_cuda *f = calloc(1, sizeof *f);
    if (!f) return FERRY_ERR_NOMEM;
    f->be.ops = &cuda_ops;
    f->m = m;
    f->kv = kv;
    f->kv_swa = p->kv_swa;
    f->prog = layer_program_of(hp);
    rc = FERRY_ERR_NOMEM;
    const int L = hp->n_layers, T = p->max_tokens;
    /* Device memory free before this backend takes any (the CUDA context itself is created here). */
    size_t free_start = 0, total_start = 0;
    cudaFree(0);
    cudaMemGetInfo(&free_start, &total_start);
    f->n_layers = L;
    f->max_tokens = T;
    f->layouts = calloc((size_t)L, sizeof *f->layouts);
    f->dn_blocks = calloc((size_t)L, sizeof *f->dn_blocks);
    f->layer_sizes = calloc((size_t)L, sizeof *f->layer_sizes);
    f->resident = calloc((size_t)L, sizeof *f->resident);
    f->host_block = calloc((size_t)L, sizeof *f->host_block);
    f->tail = calloc((size_t)L, sizeof *f->tail);
    f->step_items = calloc((size_t)L * LAYER_N_MATS, sizeof *f->step_items);
    f->step_bytes = calloc((size_t)L * LAYER_N_MATS, sizeof *f->step_bytes);
    f->step_copy = calloc((size_t)L * LAYER_N_MATS, sizeof *f->step_copy);
    f->parked = malloc((size_t)L * sizeof *f->parked);
    f->park_want = malloc((size_t)L * sizeof *f->park_want);
    f->moe_experts = calloc((size_t)L, sizeof *f->moe_experts);
    void *mask = malloc(plan_scratch_bytes(L));
    uint64_t *with_experts = malloc((size_t)L * sizeof *with_experts);
    if (!f->layouts || !f->dn_blocks || !f->layer_sizes || !f->resident || !f->host_block || !f->tail ||
        !f->step_items || !f->step_bytes || !f->step_copy || !f->parked || !f->park_want || !f->moe_experts ||
        !mask || !with_experts)
        goto fail;
    for (int l = 0; l < L; l++) f->parked[l] = UINT64_MAX;
    f->park_lo = UINT64_MAX;
    struct plan_sizes ps;
    plan_sizes_of(m, kv, p->kv_swa, T, p->kv_q8, f->layouts, f->dn_blocks, f->layer_sizes, &ps);
    ps.with_experts = hp->n_expert > 0 ? with_experts : NULL;
    const size_t kvd = kv_row(hp), qd = q_row_max(hp);
    const int KL = main_planes(hp, p->kv_swa);
    f->head_type = packed_type(m->output.type);
    f->attn_ws_bytes = ps.attn_ws_bytes;

    rc = FERRY_ERR_CUDA;
    if (cudaStreamCreateWithFlags(&f->compute, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&f->copy, cudaStreamNonBlocking) != cudaSuccess) {
        snprintf(err, 256, "cannot create CUDA streams");
        goto fail;
    }
    if ((rc = kern_cuda_ctx_init(&f->kctx, ps.max_x, ps.w16))) {
        snprintf(err, 256, "cannot create the cuBLAS context");
        goto fail;
    }

    /* Budget: explicit, or what the card has free minus the reserve. Device memory the CUDA runtime and
     * cuBLAS took for themselves since init began (handles, module images) counts against an explicit budget
     * too: it is measured here, not guessed (bounded, in case other processes change the free figure
     * meanwhile), and planned as fixed bytes, so that the minimum a refusal names is a budget that works. */
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const size_t ctx_bytes = kern_cuda_ctx_bytes(f->kctx);
    size_t overhead = free_start > free_b + ctx_bytes ? free_start - free_b - ctx_bytes : 0;
    if (overhead > ((size_t)512 << 20)) overhead = (size_t)512 << 20;
    uint64_t budget = p->gpu_memory > 0 ? (uint64_t)p->gpu_memory
                                        : (free_b + ctx_bytes > (size_t)p->reserve_vram
                                               ? free_b + ctx_bytes - (uint64_t)p->reserve_vram
                                               : 0);
    const uint64_t plan_overhead = p->gpu_memory > 0 ? overhead : 0;
    double h2d = 0, d2d = 0;
    pinned_measure_link(&h2d, &d2d);
    f->stats.h2d_bytes_per_s = h2d;
    f->stats.hbm_bytes_per_s = d2d;
    f->params = *p;
    f->params.force_where = NULL; /* (the caller's string; a variant is only asked for without one) */
    f->plan_budget = budget;
    f->plan_overhead = plan_overhead;
    struct device_map_input in = plan_input(m, &ps, p, kern_cuda_ctx_bytes(f->kctx) + plan_overhead, budget,
                                            kv->block_size, h2d, d2d, mask);
    if ((rc = plan_map(m, &ps, &in, p->cpu_moe, p->expert_cache, &f->cpu_moe, &f->map, err))) {
        if (rc == FERRY_ERR_DEVICE_MEM && plan_overhead)
            FLOG_ERROR(
                "(the minimum counts the %.0f MiB that the CUDA runtime and cuBLAS took for themselves)",
                plan_overhead / 1048576.0);
        goto fail;
    }
    if (f->map
            .kv_tokens) { /* the planner sized the KV pool (and its extension): the engine's tables follow */
        struct kv_cache sized;
        const int64_t all = f->map.kv_tokens + f->map.kv_ext_tokens;
        if ((rc = kv_cache_init(&sized, kv->n_layers, kv->n_kv_heads, kv->head_dim, kv->n_seqs, kv->ctx_size,
                                (int)all, kv->block_size, KV_NO_HOST)) ||
            (rc = kv_cache_set_ext(&sized, (int)(f->map.kv_ext_tokens / kv->block_size)))) {
            kv_cache_free(&sized);
            snprintf(err, 256, "cannot allocate the KV tables (%lld positions)", (long long)all);
            goto fail;
        }
        kv_cache_free(kv);
        *kv = sized;
    }
    const size_t kv_elems = (size_t)KL * (kv->n_blocks - kv->n_ext) * kv->block_size * kvd;
    f->stats.vram_budget = budget;
    f->stats.vram_planned = f->map.bytes_total - plan_overhead;
    f->stats.kv_host_bytes = f->map.kv_ext_bytes;
    f->stats.n_resident = f->map.n_resident;
    f->stats.n_host = f->map.n_streamed;
    f->stats.ring_bytes = f->map.ring_bytes;
    char desc[2048];
    device_map_format(&f->map, desc, sizeof desc);
    FLOG_INFO("measured host->device %.1f GB/s, device memory %.0f GB/s; budget %.2f GiB (%.0f MiB of it "
              "taken by the "
              "CUDA runtime and cuBLAS themselves)",
              h2d / 1e9, d2d / 1e9, budget / 1073741824.0, overhead / 1048576.0);
    FLOG_INFO("%s", desc);
    if (hp->n_expert > 0)
        FLOG_INFO("experts: those of %d of the %d layers on the device, of %d in host memory (--cpu-moe %d)",
                  L - f->cpu_moe, L, f->cpu_moe, f->cpu_moe);

    /* The arena: everything except cuBLAS's own workspace (already allocated by kern_cuda_ctx_init) and what
     * the CUDA runtime and cuBLAS took for themselves. */
    f->arena_bytes = f->map.bytes_total - kern_cuda_ctx_bytes(f->kctx) - plan_overhead - ps.outside_bytes -
                     f->map.host_map_bytes;
    if (cudaMalloc(&f->arena, f->arena_bytes) != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, 256, "cudaMalloc of %.2f GiB failed (the card has %.2f GiB free)",
                 f->arena_bytes / 1073741824.0, free_b / 1073741824.0);
        rc = FERRY_ERR_DEVICE_MEM;
        goto fail;
    }
    struct carve c = {.base = f->arena, .off = 0, .cap = f->arena_bytes};
    const size_t kv_el = p->kv_q8 ? 1 : sizeof(uint16_t);
    f->k_cache = carve(&c, kv_elems * kv_el);
    f->v_cache = carve(&c, kv_elems * kv_el);
    if (p->kv_q8) {
        f->k_scale = carve(&c, kv_elems / 32 * sizeof(uint16_t));
        f->v_scale = carve(&c, kv_elems / 32 * sizeof(uint16_t));
    }
    const size_t swa_elems = ksw ? (size_t)ksw->n_layers * ksw->n_blocks * ksw->block_size * kvd : 0;
    int swa_ok = 1;
    if (ksw) {
        swa_ok &= (f->k_swa = carve(&c, swa_elems * kv_el)) && (f->v_swa = carve(&c, swa_elems * kv_el)) &&
                  (f->d_block_table_swa = carve(&c, (size_t)kv->n_seqs * kv->max_blocks * sizeof(int32_t)));
        if (p->kv_q8)
            swa_ok &= (f->k_swa_scale = carve(&c, swa_elems / 32 * sizeof(uint16_t))) &&
                      (f->v_swa_scale = carve(&c, swa_elems / 32 * sizeof(uint16_t)));
    }
    f->x = carve(&c, (size_t)T * hp->dim * sizeof(float));
    f->xn = carve(&c, (size_t)T * hp->dim * sizeof(float));
    f->tmp = carve(&c, (size_t)T * hp->dim * sizeof(float));
    f->q = carve(&c, (size_t)T * qd * sizeof(float));
    f->att = carve(&c, (size_t)T * qd * sizeof(float));
    f->qkv = carve(&c, (size_t)T * (qd + 2 * kvd) * sizeof(float));
    f->gu = carve(&c, (size_t)T * 2 * ffn_max(hp) * sizeof(float));
    f->h = carve(&c, (size_t)T * ffn_max(hp) * sizeof(float));
    const size_t ple_all = (size_t)hp->n_layers * hp->ple_dim; /* one row's inputs of every layer */
    if (hp->ple_dim > 0) {
        f->ple = carve(&c, (size_t)T * ple_all * sizeof(float));
        f->ple_p = carve(&c, (size_t)T * ple_all * sizeof(float));
        f->ple_t = carve(&c, (size_t)T * hp->ple_dim * sizeof(float));
        f->ple_w = carve(&c, ple_weight_bytes(m));
    }
    f->logit_rows = logit_rows(T, kv->n_seqs);
    f->logits = carve(&c, (size_t)f->logit_rows * hp->n_vocab * sizeof(float));
    void *draw_dev = carve(&c, draw_cuda_device_bytes(f->logit_rows, hp->n_vocab));
    f->d_ints = carve(&c, (size_t)3 * T * sizeof(int32_t));
    f->d_iota = carve(&c, (size_t)T * sizeof(int32_t));
    f->d_pos_att = carve(&c, (size_t)T * sizeof(int32_t));
    f->d_block_table = carve(&c, (size_t)kv->n_seqs * kv->max_blocks * sizeof(int32_t));
    f->attn_ws = carve(&c, f->attn_ws_bytes ? f->attn_ws_bytes : 1);
    f->inv_freq = carve(&c, (size_t)(hp->rope_dim / 2) * sizeof(float));
    if (m->inv_freq_local) f->inv_freq_local = carve(&c, (size_t)rope_pairs_local(hp) * sizeof(float));
    f->head = carve(&c, dtype_row_size(f->head_type, m->output.cols) * (size_t)m->output.rows);
    f->out_norm = carve(&c, (size_t)hp->dim * sizeof(float));
    const int S = f->map.n_streamed;
    const uint64_t ring_bytes = f->map.ring_bytes;
    if (ring_bytes && (rc = ring_init(&f->ring, ring_bytes, S * LAYER_N_MATS))) goto fail;
    int tails_ok = 1;
    for (int l = 0; l < L; l++) {
        if (f->map.where[l] == PLACEMENT_GPU)
            f->resident[l] = carve(&c, f->layer_sizes[l]);
        else
            tails_ok &= (f->tail[l] = carve(&c, f->layouts[l].bytes - f->layouts[l].norm_off[0])) != NULL;
    }
    if (ring_bytes) f->ring_buf = carve(&c, ring_bytes);
    void *moe_fixed = hp->n_expert > 0 ? carve(&c, cuda_moe_fixed_bytes(m, T)) : NULL;
    const uint64_t stage_bytes = f->cpu_moe > 0 ? cuda_moe_stage_bytes(m) : 0;
    void *moe_stage = stage_bytes ? carve(&c, stage_bytes) : NULL;
    tails_ok &= !stage_bytes || moe_stage != NULL;
    void *moe_cache = f->map.expert_cache_bytes ? carve(&c, f->map.expert_cache_bytes) : NULL;
    tails_ok &= !f->map.expert_cache_bytes || moe_cache != NULL;
    for (int l = f->cpu_moe; l < L && hp->n_expert > 0; l++)
        tails_ok &= (f->moe_experts[l] = carve(&c, cuda_moe_expert_bytes(m, l))) != NULL;
    tails_ok &= hp->n_expert <= 0 || moe_fixed != NULL;
    void *dn_mem = NULL;
    if (has_recurrent(hp)) {
        /* (the state of the recurrent layers the host's cores compute lives in host memory) */
        uint8_t *dn_host = (uint8_t *)mask; /* (the planner's scratch, free again) */
        for (int l = 0; l < L; l++)
            dn_host[l] = f->map.cpu_only && f->map.cpu_only[l] && f->map.where[l] != PLACEMENT_GPU;
        dn_mem = carve(&c, cuda_deltanet_bytes_host(m, T, kv->n_seqs, dn_host));
        f->dn_in = carve(&c, (size_t)T * dn_in_row(hp) * sizeof(float));
        f->dn_out = carve(&c, (size_t)T * hp->ssm_inner * sizeof(float));
        if (hp->ssm_grouped) f->dn_pack = carve(&c, (size_t)T * dn_in_row(hp) * sizeof(float));
        tails_ok &= dn_mem && f->dn_in && f->dn_out && (!hp->ssm_grouped || f->dn_pack);
    }
    if (hp->attn_out_gate) {
        const size_t qd1 = (size_t)hp->n_heads * hp->head_dim, kvd1 = (size_t)hp->n_kv_heads * hp->head_dim;
        f->qg = carve(&c, (size_t)T * (2 * qd1 + 2 * kvd1) * sizeof(float));
        f->gate = carve(&c, (size_t)T * qd1 * sizeof(float));
        tails_ok &= f->qg && f->gate;
    }
    if (has_shared_expert(m)) {
        f->sh = carve(&c, (size_t)T * hp->dim * sizeof(float));
        f->shexp_gate = carve(&c, (size_t)L * hp->dim * sizeof(float));
        tails_ok &= f->sh && f->shexp_gate;
    }
    if (!f->k_cache || !f->v_cache || !f->x || !f->xn || !f->tmp || !f->q || !f->att || !f->qkv || !f->gu ||
        !f->h || !f->logits || !draw_dev || !f->d_ints || !f->d_iota || !f->d_pos_att || !f->d_block_table ||
        !f->attn_ws || !f->inv_freq || !f->head || !f->out_norm || !tails_ok || !swa_ok ||
        (m->inv_freq_local && !f->inv_freq_local) || (ring_bytes && !f->ring_buf) ||
        (hp->ple_dim > 0 && (!f->ple || !f->ple_p || !f->ple_t || !f->ple_w))) {
        snprintf(err, 256, "internal: the device arena of %zu bytes is too small for its plan",
                 f->arena_bytes);
        rc = FERRY_ERR_INTERNAL;
        goto fail;
    }
    rc = FERRY_ERR_CUDA;
    if (cudaMemcpy(f->inv_freq, m->inv_freq, (size_t)(hp->rope_dim / 2) * sizeof(float),
                   cudaMemcpyHostToDevice) != cudaSuccess)
        goto fail;
    if (m->inv_freq_local &&
        cudaMemcpy(f->inv_freq_local, m->inv_freq_local, (size_t)rope_pairs_local(hp) * sizeof(float),
                   cudaMemcpyHostToDevice) != cudaSuccess)
        goto fail;
    size_t ple_at = 0; /* the per-layer inputs' weights, as stored */
    for (int i = 0; i < ple_pieces(m); i++) {
        const struct wview w = ple_piece(m, i);
        const size_t bytes = dtype_row_size(w.type, w.cols) * (size_t)w.rows;
        if (cudaMemcpy((char *)f->ple_w + ple_at, w.data, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            goto fail;
        ple_at += align_up(bytes);
    }

    /* Pinned host memory: staging (mapped: kernels read the embeddings from it), and the host layers' blocks.
     */
    if ((f->h_x = forward_cuda_host_alloc(f, (size_t)T * hp->dim * sizeof(float))) == NULL ||
        (f->h_ints = forward_cuda_host_alloc(
             f, ((size_t)3 * T + (ksw ? 2 : 1) * (size_t)kv->n_seqs * kv->max_blocks) * sizeof(int32_t))) ==
            NULL ||
        (f->h_logits = forward_cuda_host_alloc(f, (size_t)T * hp->n_vocab * sizeof(float))) == NULL ||
        (hp->ple_dim > 0 &&
         (f->h_ple = forward_cuda_host_alloc(f, (size_t)T * ple_all * sizeof(float))) == NULL)) {
        snprintf(err, 256, "cannot pin host staging memory");
        goto fail;
    }
    if ((rc = draw_cuda_init(&f->draw, draw_dev, f->logit_rows, hp->n_vocab))) {
        snprintf(err, 256, "cannot set up the GPU sampler's staging (%s)", ferry_status_str(rc));
        goto fail;
    }
    rc = FERRY_ERR_CUDA;
    f->h_x_dev = pinned_device_ptr(f->h_x);
    for (int i = 0; i < T; i++) f->h_ints[i] = i;
    if (cudaMemcpy(f->d_iota, f->h_ints, (size_t)T * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess)
        goto fail;
    if (S) {
        size_t pinned = 0;
        for (int l = 0; l < L; l++)
            if (!f->resident[l]) pinned += align_up(f->layer_sizes[l]);
        FLOG_INFO("pinning %.2f GiB of host memory for %d host layers", pinned / 1073741824.0, S);
        if (pinned_block_alloc(&f->host, pinned) != FERRY_OK) {
            cudaGetLastError();
            snprintf(err, 256, "cannot pin %.2f GiB of host memory for the host layers",
                     pinned / 1073741824.0);
            rc = FERRY_ERR_NOMEM;
            goto fail;
        }
        size_t at = 0;
        for (int l = 0; l < L; l++)
            if (!f->resident[l]) {
                f->host_block[l] = (char *)f->host.p + at;
                at += align_up(f->layer_sizes[l]);
            }
    }
    if (kv->n_ext) {
        const size_t ext_el = (size_t)KL * kv->n_ext * kv->block_size * kvd; /* elements of K (or V) */
        const size_t ext_bytes = 2 * kv_elem_bytes(p->kv_q8 ? KV_Q8_0 : KV_F16, ext_el); /* both planes */
        FLOG_INFO("pinning %.2f GiB of host memory for the KV pool's extension (%lld positions)",
                  ext_bytes / 1073741824.0, (long long)f->map.kv_ext_tokens);
        if ((f->kv_ext = pinned_mapped_alloc(ext_bytes)) == NULL) {
            snprintf(err, 256, "cannot pin %.2f GiB of host memory for the KV pool's extension",
                     ext_bytes / 1073741824.0);
            rc = FERRY_ERR_NOMEM;
            goto fail;
        }
        memset(f->kv_ext, 0, ext_bytes); /* (no step reads uninitialised halves as NaN: as the pool below) */
        f->kv_ext_dev = (char *)pinned_device_ptr(f->kv_ext);
        if ((rc = ext_host_init(f, T, err))) goto fail;
    }
    const int ring_ev = f->ring_buf ? RING_HISTORY : 0;
    f->n_copy_ev = f->ring_buf ? L * LAYER_N_MATS + RING_HISTORY : 0;
    f->n_wait_ev = f->ring_buf ? L * LAYER_N_MATS : 0;
    if ((rc = create_events(&f->copy_done, ring_ev, cudaEventDisableTiming)) ||
        (rc = create_events(&f->use_done, ring_ev, cudaEventDisableTiming)) ||
        (rc = create_events(&f->copy_t0, f->n_copy_ev, cudaEventDefault)) ||
        (rc = create_events(&f->copy_t1, f->n_copy_ev, cudaEventDefault)) ||
        (rc = create_events(&f->wait_t0, f->n_wait_ev, cudaEventDefault)) ||
        (rc = create_events(&f->wait_t1, f->n_wait_ev, cudaEventDefault))) {
        snprintf(err, 256, "cannot create CUDA events");
        goto fail;
    }
    rc = FERRY_ERR_CUDA;
    if (cudaEventCreate(&f->load_t0) != cudaSuccess || cudaEventCreate(&f->load_t1) != cudaSuccess ||
        cudaEventCreateWithFlags(&f->park_done, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&f->park_used, cudaEventDisableTiming) != cudaSuccess)
        goto fail;
    if ((rc = upload_layers(f, m)) || (rc = upload_head(f, m))) {
        snprintf(err, 256, "uploading the weights failed (%s)", ferry_status_str(rc));
        goto fail;
    }
    if (hp->n_expert > 0) {
        const struct cuda_moe_params mp = {.T = T,
                                           .fixed = moe_fixed,
                                           .experts = f->moe_experts,
                                           .stage = moe_stage,
                                           .h2d_bytes_per_s = h2d,
                                           .hbm_bytes_per_s = d2d,
                                           .cache = moe_cache,
                                           .cache_bytes = f->map.expert_cache_bytes,
                                           .cpu_int8 = p->cpu_int8};
        if ((rc = cuda_moe_init(&f->moe, m, &mp, err))) goto fail;
    }
    if (has_recurrent(hp) &&
        (rc = cuda_deltanet_init_host(&f->dn, m, T, kv->n_seqs, (uint8_t *)mask, dn_mem, err)))
        goto fail;
    if ((rc = upload_shexp_gates(f))) {
        snprintf(err, 256, "uploading the shared experts' gates failed (%s)", ferry_status_str(rc));
        goto fail;
    }
    /* Zero the KV pool once so that no step can ever read uninitialised halves as NaN, and the attention
     * workspace, whose split-arrival counters must start at zero (kernels/cuda/attention.h). */
    rc = FERRY_ERR_CUDA;
    if (cudaMemset(f->k_cache, 0, kv_elems * kv_el) != cudaSuccess ||
        cudaMemset(f->v_cache, 0, kv_elems * kv_el) != cudaSuccess ||
        (f->k_scale && cudaMemset(f->k_scale, 0, kv_elems / 32 * sizeof(uint16_t)) != cudaSuccess) ||
        (f->v_scale && cudaMemset(f->v_scale, 0, kv_elems / 32 * sizeof(uint16_t)) != cudaSuccess) ||
        (ksw && (cudaMemset(f->k_swa, 0, swa_elems * kv_el) != cudaSuccess ||
                 cudaMemset(f->v_swa, 0, swa_elems * kv_el) != cudaSuccess)) ||
        (f->k_swa_scale &&
         (cudaMemset(f->k_swa_scale, 0, swa_elems / 32 * sizeof(uint16_t)) != cudaSuccess ||
          cudaMemset(f->v_swa_scale, 0, swa_elems / 32 * sizeof(uint16_t)) != cudaSuccess)) ||
        cudaMemset(f->attn_ws, 0, f->attn_ws_bytes ? f->attn_ws_bytes : 1) != cudaSuccess)
        goto fail;
    /* Graphs need a fixed set of kernels and no cross-stream waits: only when every layer is resident (and
     * every expert: a host function's argument holds the step's rows). */
    if (S == 0 && !cuda_moe_n_host(f->moe) && !getenv("FERRY_NO_CUDA_GRAPHS"))
        f->graphs = calloc(GRAPH_SLOTS, sizeof *f->graphs);
    cudaMemGetInfo(&free_b, &total_b);
    f->stats.vram_used = free_start > free_b ? free_start - free_b : 0;
    free(mask);
    free(with_experts);
    *out = &f->be;
    return FERRY_OK;
fail:
    if (!err[0]) snprintf(err, 256, "CUDA backend initialisation failed (%s)", ferry_status_str(rc));
    free(mask);
    free(with_experts);
    cuda_free(&f->be);
    return rc;
}

int forward_cuda_host_weights(const struct backend *be, int l, struct layer_weights *w)
{
    const struct forward_cuda *f = (const struct forward_cuda *)be;
    if (l < 0 || l >= f->n_layers || !f->host_block[l]) return 0;
    const struct model_layer *L = &f->m->layers[l];
    struct layer_weights stored;
    layer_weights_of_model(&stored, L);
    const struct layer_layout *lay = &f->layouts[l];
    int same = 1;
    for (int i = 0; i < LAYER_N_MATS; i++)
        for (int j = 0; j < lay->n_parts[i]; j++) same &= lay->part[i][j].type == stored.mat[i].part[j].type;
    if (same)
        layer_weights_at(w, lay, f->host_block[l]);
    else
        *w = stored;
    /* A recurrent layer's mixer: its matrices in the block, its small tensors the model's. */
    if (llm_layer_is_recurrent(&f->m->hp, l)) {
        const struct cuda_dn_block *dnb = &f->dn_blocks[l];
        const char *b = f->host_block[l];
        w->dn = stored.dn;
        if (same) cuda_deltanet_block_place(f->m, l, dnb, b + dnb->in_off, b + dnb->out_off, &w->dn);
    }
    return 1;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Streaming */

/* The bytes a parked layer holds at the ring's end: its groups (the block up to its tail). */
static uint64_t parked_bytes(const struct forward_cuda *f, int l)
{
    return f->layouts[l].norm_off[0];
}

/* Forgets the parked layers that overlap [off, off + bytes), and the lowest parked offset again. */
static void unpark_over(struct forward_cuda *f, uint64_t off, uint64_t bytes)
{
    f->park_lo = UINT64_MAX;
    for (int l = 0; l < f->n_layers; l++) {
        if (f->parked[l] == UINT64_MAX) continue;
        if (f->parked[l] < off + bytes && off < f->parked[l] + parked_bytes(f, l))
            f->parked[l] = UINT64_MAX;
        else if (f->parked[l] < f->park_lo)
            f->park_lo = f->parked[l];
    }
}

/* Queues every copy the ring wants issued, each after the use of the newest copy whose bytes it overwrites
 * (and, over parked layers, after their last use).
 */
static int issue_copies(struct forward_cuda *f)
{
    struct ring_issue is;
    while (ring_next_copy(&f->ring, &is)) {
        const int l = is.item / LAYER_N_MATS, g = is.item % LAYER_N_MATS;
        size_t off, bytes;
        block_piece(&f->layouts[l], &f->dn_blocks[l], g, &off, &bytes);
        const int e = (int)(is.copy % (uint64_t)f->n_copy_ev);
        if (is.off + is.bytes > f->park_lo) {
            CK(cudaStreamWaitEvent(f->copy, f->park_used, 0));
            unpark_over(f, is.off, is.bytes);
        }
        if (is.after >= 0) CK(cudaStreamWaitEvent(f->copy, f->use_done[is.after % RING_HISTORY], 0));
        CK(cudaEventRecord(f->copy_t0[e], f->copy));
        CK(cudaMemcpyAsync(f->ring_buf + is.off, (const char *)f->host_block[l] + off, bytes,
                           cudaMemcpyHostToDevice, f->copy));
        CK(cudaEventRecord(f->copy_t1[e], f->copy));
        CK(cudaEventRecord(f->copy_done[is.copy % RING_HISTORY], f->copy));
    }
    return FERRY_OK;
}

/* Layer l's piece g (block_piece) at `piece` into w's views: group g's matrices, or a recurrent layer's
 * DeltaNet in-products (g = LAYER_QKV) or out-product (LAYER_O). */
static void piece_place(struct forward_cuda *f, int l, int g, struct layer_weights *w, const char *piece)
{
    const struct cuda_dn_block *dnb = &f->dn_blocks[l];
    if (dnb->bytes && (g == LAYER_QKV || g == LAYER_O))
        cuda_deltanet_block_place(f->m, l, dnb, g == LAYER_QKV ? piece : NULL, g == LAYER_O ? piece : NULL,
                                  &w->dn);
    else
        layer_group_at(w, &f->layouts[l], g, piece);
}

/* Every piece of layer l from its block at `block` (resident, or parked in the ring) into w. */
static void block_place(struct forward_cuda *f, int l, struct layer_weights *w, const char *block)
{
    for (int g = 0; g < LAYER_N_MATS; g++) {
        size_t off, bytes;
        block_piece(&f->layouts[l], &f->dn_blocks[l], g, &off, &bytes);
        piece_place(f, l, g, w, block + off);
    }
}

/* Piece g of streamed layer l into w: its use (the compute stream waits for the copy). */
static int piece_acquire(struct forward_cuda *f, int l, int g, struct layer_weights *w, uint64_t *copy)
{
    uint64_t off;
    RC(ring_use(&f->ring, l * LAYER_N_MATS + g, &off, copy));
    const int u = f->step_uses++;
    f->step_copy[u] = *copy;
    CK(cudaEventRecord(f->wait_t0[u], f->compute));
    CK(cudaStreamWaitEvent(f->compute, f->copy_done[*copy % RING_HISTORY], 0));
    CK(cudaEventRecord(f->wait_t1[u], f->compute));
    size_t poff, bytes;
    block_piece(&f->layouts[l], &f->dn_blocks[l], g, &poff, &bytes);
    f->stats.bytes_streamed += bytes;
    piece_place(f, l, g, w, f->ring_buf + off);
    return FERRY_OK;
}

/* Brings the step's parked layers (where[l] == PLACEMENT_PARK) to their places at the ring's end (park_want)
 * unless they are there already, after the work queued so far (the earlier uses of those bytes). */
static int park_layers(struct forward_cuda *f, const enum placement *where)
{
    int copied = 0;
    for (int l = 0; l < f->n_layers; l++) {
        if (where[l] != PLACEMENT_PARK || f->parked[l] == f->park_want[l]) continue;
        if (!f->host_block[l]) return FERRY_ERR_INVALID;
        const uint64_t at = f->park_want[l], bytes = parked_bytes(f, l);
        if (!copied) { /* (park_done marks the compute stream's work so far here; re-recorded below) */
            CK(cudaEventRecord(f->park_done, f->compute));
            CK(cudaStreamWaitEvent(f->copy, f->park_done, 0));
        }
        copied = 1;
        unpark_over(f, at, bytes);
        CK(cudaMemcpyAsync(f->ring_buf + at, f->host_block[l], bytes, cudaMemcpyHostToDevice, f->copy));
        f->parked[l] = at;
        if (at < f->park_lo) f->park_lo = at;
        f->stats.bytes_parked += bytes;
    }
    if (copied) CK(cudaEventRecord(f->park_done, f->copy));
    return FERRY_OK;
}

/* Ends a piece's use (after the work that reads it) and queues the copies that may now overwrite it. */
static int piece_release(struct forward_cuda *f, uint64_t copy)
{
    CK(cudaEventRecord(f->use_done[copy % RING_HISTORY], f->compute));
    return issue_copies(f);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The layer program on the device */

/* y (m, ldy): columns [0, rows) = x (m, cols) · Wᵀ (+ bias). */
static int linear(struct forward_cuda *f, float *y, int ldy, const float *x, const void *w, enum dtype t,
                  const float *bias, int m, int64_t rows, int64_t cols)
{
    return kern_cuda_matmul(f->kctx, y, ldy, x, w, t, bias, m, (int)rows, (int)cols, f->compute);
}

/* y (m, rows of the group) = x · the group's matrices (+ biases): one product when the parts share a type
 * (they are contiguous in the block), else one per run of neighbouring parts of one type that lie back to
 * back in the block (Q4_K_M's q|k beside its Q6_K v: two products, not three), into its column slice. */
static int linear_group(struct forward_cuda *f, float *y, const float *x, const struct layer_group *g, int m)
{
    const int ldy = (int)g->rows;
    if (g->uniform)
        return linear(f, y, ldy, x, g->part[0].data, g->part[0].type, g->part[0].bias, m, ldy, g->cols);
    for (int j = 0, e; j < g->n_parts; j = e) {
        const struct layer_part *p = &g->part[j];
        const size_t rb = dtype_row_size(p->type, g->cols);
        int64_t rows = p->rows;
        for (e = j + 1; e < g->n_parts; e++) {
            const struct layer_part *q = &g->part[e];
            if (q->type != p->type || (const char *)q->data != (const char *)p->data + rb * (size_t)rows ||
                q->row0 != p->row0 + rows || (p->bias != NULL) != (q->bias != NULL))
                break;
            rows += q->rows;
        }
        RC(linear(f, y + p->row0, ldy, x, p->data, p->type, p->bias, m, rows, g->cols));
    }
    return FERRY_OK;
}

static float *act(struct forward_cuda *f, enum layer_act a)
{
    switch (a) {
    case LACT_X:
        return f->x;
    case LACT_XN:
        return f->xn;
    case LACT_QKV:
        return f->qkv;
    case LACT_Q:
        return f->q;
    case LACT_ATT:
        return f->att;
    case LACT_D:
        return f->tmp;
    case LACT_GU:
        return f->gu;
    case LACT_H:
        return f->h;
    case LACT_GATE:
        return f->gate;
    }
    return NULL;
}

/* Main-pool plane l's part of the KV pool's extension, at the host's addresses (dev 0) or the device's: K and
 * V (f16, or Q8_0 codes) and, for Q8_0, their scales (NULL for f16). The allocation holds K (main_planes,
 * n_ext, block_size, kv_row), then V, then the K scales (main_planes, n_ext, block_size, kv_row / 32) f16,
 * then V's. */
struct ext_planes {
    void *k, *v;
    uint16_t *ks, *vs;
};

static struct ext_planes ext_layer(const struct forward_cuda *f, int l, int dev)
{
    char *base = dev ? f->kv_ext_dev : f->kv_ext;
    if (!base) return (struct ext_planes){0};
    const struct llm_hparams *hp = &f->m->hp;
    const size_t n = (size_t)f->kv->n_ext * f->kv->block_size * kv_row(hp); /* a plane's */
    const size_t L = (size_t)main_planes(hp, f->kv_swa), el = f->k_scale ? 1 : sizeof(uint16_t);
    struct ext_planes e = {.k = base + n * el * l, .v = base + n * el * (L + l)};
    if (f->k_scale) {
        uint16_t *sc = (uint16_t *)(base + 2 * L * n);
        e.ks = sc + n / 32 * l;
        e.vs = sc + n / 32 * (L + l);
    }
    return e;
}

/* Layer l's plane in its pool (kv_cache_layer_index: the main pool's, or with kv_swa the pool of its kind),
 * and *swa: 1 for the sliding-window layers' own pool. */
static int kv_plane(const struct forward_cuda *f, int l, int *swa)
{
    const int pl = kv_cache_layer_index(&f->m->hp, l, f->kv_swa != NULL, swa);
    return pl >= 0 ? pl : llm_kv_layer(&f->m->hp, l); /* (no source: refused at load) */
}

/* Layer l's view of its pool: the plane of the layer whose K/V it reads (its own, or a KV-sharing layer's
 * source), in its own head size and KV-head count; a sliding-window layer with a pool of its own reads that
 * one through its block table (the entries before its slots' windows are -1, never read: kv_cache_drop). */
static struct kern_cuda_kv_layer kv_view(const struct forward_cuda *f, int l)
{
    const struct llm_hparams *hp = &f->m->hp;
    int hd, n_kv, rd, swa;
    llm_layer_shape(hp, l, &hd, &n_kv, &rd);
    const int pl = kv_plane(f, l, &swa);
    const struct kv_cache *kv = swa ? f->kv_swa : f->kv;
    const int n_ext = swa ? 0 : kv->n_ext;
    void *k = swa ? f->k_swa : f->k_cache, *v = swa ? f->v_swa : f->v_cache;
    uint16_t *ks = swa ? f->k_swa_scale : f->k_scale, *vs = swa ? f->v_swa_scale : f->v_scale;
    const size_t row = (size_t)kv->block_size * kv_row(hp);
    const size_t per_layer = (size_t)(kv->n_blocks - n_ext) * row;
    const struct ext_planes ext = swa ? (struct ext_planes){0} : ext_layer(f, pl, 1);
    const size_t el = f->k_scale ? 1 : sizeof(uint16_t);
    return (struct kern_cuda_kv_layer){.k = (char *)k + per_layer * pl * el,
                                       .v = (char *)v + per_layer * pl * el,
                                       .q8 = f->k_scale != NULL,
                                       .k_scale = ks ? ks + per_layer / 32 * pl : NULL,
                                       .v_scale = vs ? vs + per_layer / 32 * pl : NULL,
                                       .k_ext = ext.k,
                                       .v_ext = ext.v,
                                       .k_ext_scale = ext.ks,
                                       .v_ext_scale = ext.vs,
                                       .n_ext = n_ext,
                                       .n_blocks = kv->n_blocks,
                                       .block_size = kv->block_size,
                                       .block_table = swa ? f->d_block_table_swa : f->d_block_table,
                                       .max_blocks = kv->max_blocks,
                                       .n_kv_heads = n_kv,
                                       .head_dim = hd,
                                       .window = llm_layer_is_local(hp, l) ? hp->sliding_window : 0};
}

/* Layer l's attention sinks (n_heads f32, device): from w, or without it (the KV ops of a host layer) from
 * the layer's block or the tail a host layer keeps on the device; NULL when the layer has none. */
static const float *layer_sinks(const struct forward_cuda *f, const struct layer_weights *w, int l)
{
    struct layer_weights tmp;
    if (!w) {
        if (f->resident[l])
            layer_weights_at(&tmp, &f->layouts[l], f->resident[l]);
        else if (f->tail[l])
            layer_weights_tail(&tmp, &f->layouts[l], f->tail[l]);
        else
            return NULL;
        w = &tmp;
    }
    return w->norm[LAYER_ATTN_SINKS];
}

/* Where op's output y (n rows of k) goes in int8 form when the next op is a block-type product reading it in
 * that form (decode steps of a quantized model): FERRY_OK with *xq, *xd to write beside y, so the product
 * skips its pre-pass; anything else: write y alone. */
static int x8_for_next(struct forward_cuda *f, const struct layer_op *op, const struct layer_weights *w,
                       int l, float *y, int n, int k, uint8_t **xq, float **xd)
{
    const struct layer_program *p = layer_prog(f, l);
    const struct layer_op *next = op + 1;
    if (op < p->ops || next >= p->ops + p->n_ops || next->kind != LOP_LINEAR || next->in != op->out)
        return FERRY_ERR_UNSUPPORTED;
    return kern_cuda_matmul_x8_target(f->kctx, y, w->mat[next->arg].part[0].type, n, k, xq, xd);
}

/* A layer norm (kern_cuda_norm_x8) or gated activation (kern_cuda_glu_x8) that writes its output's int8 form
 * for the product after it. FERRY_OK when it ran; anything else: run the plain op. */
static int op_x8(struct forward_cuda *f, const struct layer_op *op, const struct layer_weights *w, int l,
                 int n)
{
    const struct llm_hparams *hp = &f->m->hp;
    const int glu = op->kind == LOP_SILU_MUL || op->kind == LOP_GELU_MUL,
              k = glu ? llm_layer_ffn(hp, l) : hp->dim;
    float *y = act(f, op->out);
    uint8_t *xq;
    float *xd;
    int rc = x8_for_next(f, op, w, l, y, n, k, &xq, &xd);
    if (rc == FERRY_OK)
        rc = glu ? kern_cuda_glu_x8(y, act(f, op->in), n, k, op->kind == LOP_GELU_MUL, xq, xd, f->compute)
                 : kern_cuda_norm_x8(f->x, f->pending ? f->tmp : NULL, y, w->norm[op->arg], n, hp->dim,
                                     hp->norm_eps, xq, xd, f->compute);
    if (rc != FERRY_OK) /* the workspace was not written: forget the target */
        kern_cuda_matmul_x8_target(f->kctx, NULL, DTYPE_F32, 0, 0, NULL, NULL);
    return rc;
}

/* CUDA host function: the host's part of layer l's attention for the step's rows [ext_r0, ext_r1), from q's
 * rows in h_ext_q over the positions [ext_lo, pos] of each (all in the extension, in host memory), into
 * h_ext_o and h_ext_lse. The step's tables are the staged ones (h_ints), which stay put until it ends. */
static void CUDART_CB ext_attention_host(void *arg)
{
    const struct ext_job *j = arg;
    struct forward_cuda *f = j->f;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const struct llm_hparams *hp = &f->m->hp;
    const struct kv_cache *kv = f->kv;
    const int T = f->max_tokens, r0 = f->ext_r0, rows = f->ext_r1 - f->ext_r0;
    int swa;
    const struct ext_planes ext = ext_layer(f, kv_plane(f, j->l, &swa), 0); /* (a main-pool layer's) */
    const struct kv_layer_view view = {.k = ext.k,
                                       .v = ext.v,
                                       .k_scale = ext.ks,
                                       .v_scale = ext.vs,
                                       .n_blocks = kv->n_blocks,
                                       .block_size = kv->block_size,
                                       .block_table = f->h_ints + 3 * (size_t)T,
                                       .max_blocks = kv->max_blocks,
                                       .n_kv_heads = hp->n_kv_heads,
                                       .head_dim = hp->head_dim,
                                       .elem = f->k_scale ? KV_Q8_0_PLANES : KV_F16,
                                       .block_base = kv->n_blocks - kv->n_ext};
    const int rc = kern_cpu_attention_range(
        f->h_ext_o, f->h_ext_lse, f->h_ext_q, &view, f->h_ints + 2 * (size_t)T + r0, f->h_ext_lo + r0,
        f->h_ints + (size_t)T + r0, rows, hp->n_heads, llm_attn_scale(hp), f->ext_pool);
    if (rc && !f->ext_rc) f->ext_rc = rc;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    f->stats.kv_ext_host_seconds += (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
}

/* Layer l's attention with the host's part (see struct forward_cuda): the device's over the clamped
 * positions with its log-sum-exps in h, q's rows down, the host function, then the merge, which reads the
 * host's results from mapped memory (a copy could queue behind a layer copy on the copy engine). */
static int attention_split(struct forward_cuda *f, const struct layer_op *op,
                           const struct kern_cuda_kv_layer *view, int l, int n)
{
    const struct llm_hparams *hp = &f->m->hp;
    const size_t qd = (size_t)hp->n_heads * hp->head_dim;
    const int r0 = f->ext_r0, rows = f->ext_r1 - f->ext_r0;
    const int32_t *d_seq = f->d_ints + 2 * f->max_tokens;
    cudaStream_t cs = f->compute;
    float *out = act(f, op->out), *lse = f->h;
    const float *q = act(f, op->in);
    RC(kern_cuda_attention_mixed(out, lse, q, view, d_seq, f->d_pos_att, n, f->n_decode, hp->n_heads,
                                 llm_attn_scale(hp), f->max_len, f->attn_ws, f->attn_ws_bytes, cs));
    CK(cudaMemcpyAsync(f->h_ext_q, q + (size_t)r0 * qd, (size_t)rows * qd * sizeof(float),
                       cudaMemcpyDeviceToHost, cs));
    f->ext_jobs[l] = (struct ext_job){.f = f, .l = l};
    CK(cudaLaunchHostFunc(cs, ext_attention_host, &f->ext_jobs[l]));
    f->stats.kv_ext_host_rows += (uint64_t)rows;
    return kern_cuda_attention_merge(out + (size_t)r0 * qd, lse + (size_t)r0 * hp->n_heads,
                                     pinned_device_ptr(f->h_ext_o), pinned_device_ptr(f->h_ext_lse),
                                     rows * hp->n_heads, hp->head_dim, cs);
}

/* ---- Per-layer inputs (Gemma 4 E2B/E4B; forward_cpu.c is the reference) ---- */

/* Piece i of the per-layer inputs' weights on the device (see ple_piece). */
static const void *ple_at(const struct forward_cuda *f, int i)
{
    size_t at = 0;
    for (int j = 0; j < i; j++) {
        const struct wview w = ple_piece(f->m, j);
        at += align_up(dtype_row_size(w.type, w.cols) * (size_t)w.rows);
    }
    return (const char *)f->ple_w + at;
}

/* At embedding, after x: each row's inputs of every layer, (norm(proj(x) / sqrt(dim)) + the per-layer
 * embedding * sqrt(ple_dim)) / sqrt(2); the embedding rows were gathered on the host into h_ple. */
static int ple_inputs(struct forward_cuda *f, int n)
{
    const struct llm_hparams *hp = &f->m->hp;
    const int pd = hp->ple_dim, pl = hp->n_layers * pd;
    const struct wview proj = ple_piece(f->m, 0);
    cudaStream_t cs = f->compute;
    RC(kern_cuda_embed(f->ple, pinned_device_ptr(f->h_ple), DTYPE_F32, n, pl, f->d_iota, n, cs));
    RC(linear(f, f->ple_p, pl, f->x, ple_at(f, 0), proj.type, NULL, n, pl, hp->dim));
    RC(kern_cuda_axpby(f->ple_p, 1.0f / sqrtf((float)hp->dim), NULL, 1.0f, (int64_t)n * pl, cs));
    RC(kern_cuda_rmsnorm(f->ple_p, f->ple_p, ple_at(f, 1), n * hp->n_layers, pd, hp->norm_eps, cs));
    return kern_cuda_axpby(f->ple, sqrtf((float)pd), f->ple_p, 1.0f / sqrtf(2.0f), (int64_t)n * pl, cs);
}

/* Layer l's: x += D; x += norm(proj(gelu_tanh(gate(x)) * the layer's input)). */
static int ple_add(struct forward_cuda *f, int l, int n)
{
    const struct llm_hparams *hp = &f->m->hp;
    const int pd = hp->ple_dim, dim = hp->dim;
    const struct wview gate = ple_piece(f->m, 2 + 3 * l), proj = ple_piece(f->m, 3 + 3 * l);
    cudaStream_t cs = f->compute;
    RC(kern_cuda_add_scale(f->x, f->pending ? f->tmp : NULL, NULL, (int64_t)n * dim, cs));
    f->pending = 0;
    RC(linear(f, f->ple_t, pd, f->x, ple_at(f, 2 + 3 * l), gate.type, NULL, n, pd, dim));
    RC(kern_cuda_gelu_mul_rows(f->ple_t, f->ple_t, f->ple + (size_t)l * pd, hp->n_layers * pd, n, pd, cs));
    RC(linear(f, f->tmp, dim, f->ple_t, ple_at(f, 3 + 3 * l), proj.type, NULL, n, dim, pd));
    RC(kern_cuda_rmsnorm(f->tmp, f->tmp, ple_at(f, 4 + 3 * l), n, dim, hp->norm_eps, cs));
    return kern_cuda_add_scale(f->x, f->tmp, NULL, (int64_t)n * dim, cs);
}

/* ---- Qwen3.5's layer kinds (forward_cpu.c is the reference) ---- */

/* LOP_DELTANET of layer l on the rows in `in` (n, dim), its output in out (n, dim), in two halves, each
 * reading one of the layer's two DeltaNet pieces (w->dn, placed by the caller): deltanet_in runs the four
 * in-products side by side into dn_in's column slices and the rest up to the out-product's input (dn_out) by
 * forward_cuda_deltanet; deltanet_out the out-product. */
static int deltanet_in(struct forward_cuda *f, const struct layer_weights *w, int l, int n, const float *in)
{
    const struct llm_hparams *hp = &f->m->hp;
    const struct layer_deltanet *dn = &w->dn;
    if (!f->dn || !in || !dn->qkv.data) return FERRY_ERR_INTERNAL;
    const struct wview *mats[4] = {&dn->qkv, &dn->z, &dn->beta, &dn->alpha}; /* in dn_in's order */
    const int C = llm_ssm_conv_dim(hp), I = hp->ssm_inner, nv = hp->ssm_n_v_heads, ld = (int)dn_in_row(hp);
    const int col[4] = {0, C, C + I, C + I + nv};
    /* Qwen3-Next's packed products (no z, no a) go to dn_pack's same columns and are split from there. */
    const int qkvz = !dn->z.data, ba = !dn->alpha.data;
    if ((qkvz || ba) && !f->dn_pack) return FERRY_ERR_INTERNAL;
    for (int k = 0; k < 4; k++)
        if (mats[k]->data) {
            float *y = ((k == 0 && qkvz) || (k == 2 && ba) ? f->dn_pack : f->dn_in) + col[k];
            RC(linear(f, y, ld, in, mats[k]->data, mats[k]->type, NULL, n, mats[k]->rows, hp->dim));
        }
    if (qkvz || ba) RC(cuda_deltanet_unpack(f->dn, f->dn_in, ld, f->dn_pack, qkvz, ba, n, f->compute));
    const struct cuda_deltanet_in di = {.qkv = f->dn_in,
                                        .z = f->dn_in + C,
                                        .b = f->dn_in + C + I,
                                        .a = f->dn_in + C + I + nv,
                                        .ld_qkv = ld,
                                        .ld_z = ld,
                                        .ld_b = ld,
                                        .ld_a = ld};
    const int32_t *d_pos = f->d_ints + f->max_tokens, *d_seq = f->d_ints + 2 * f->max_tokens;
    return cuda_deltanet_run(f->dn, l, f->dn_out, &di, n, d_seq, d_pos, f->h_ints + 2 * f->max_tokens,
                             f->compute);
}

static int deltanet_out(struct forward_cuda *f, const struct layer_weights *w, int n, float *out)
{
    const struct llm_hparams *hp = &f->m->hp;
    const struct wview *o = &w->dn.out;
    if (!out || !o->data) return FERRY_ERR_INTERNAL;
    return linear(f, out, hp->dim, f->dn_out, o->data, o->type, NULL, n, hp->dim, hp->ssm_inner);
}

/* LOP_MOE_SHARED's shared expert, after the routed experts' sum is in y (n, dim): y += sigmoid(x · gate) *
 * down(silu(gate(x)) * up(x)), its FFN the layer's gate|up and down groups (w). */
static int moe_shared(struct forward_cuda *f, const struct layer_weights *w, int l, int n, float *y,
                      const float *x)
{
    const struct llm_hparams *hp = &f->m->hp;
    const struct layer_group *gu = &w->mat[LAYER_GU];
    if (!f->sh || !f->shexp_gate || gu->n_parts != 2 || gu->rows % 2 || gu->rows / 2 > ffn_max(hp))
        return FERRY_ERR_INTERNAL;
    const int ffn = (int)(gu->rows / 2);
    RC(linear_group(f, f->gu, x, gu, n));
    RC(kern_cuda_silu_mul(f->h, f->gu, n, ffn, f->compute));
    RC(linear_group(f, f->sh, f->h, &w->mat[LAYER_DOWN], n));
    return kern_cuda_gated_add(y, f->sh, x, f->shexp_gate + (size_t)l * hp->dim, n, hp->dim, f->compute);
}

/* One op of layer l over n rows; qkv_in: where LOP_ROPE_KV reads its rows (the device's, or a host layer's
 * mapped rows). */
static int run_op(struct forward_cuda *f, const struct layer_op *op, const struct layer_weights *w, int l,
                  int n, const float *qkv_in)
{
    const struct llm_hparams *hp = &f->m->hp;
    const int32_t *d_pos = f->d_ints + f->max_tokens, *d_seq = f->d_ints + 2 * f->max_tokens;
    cudaStream_t cs = f->compute;
    switch (op->kind) {
    case LOP_ADD_NORM:
        if (op_x8(f, op, w, l, n) == FERRY_OK) {
            f->pending = 0;
            return FERRY_OK;
        }
        if (f->pending)
            RC(kern_cuda_add_rmsnorm(f->x, f->tmp, act(f, op->out), w->norm[op->arg], n, hp->dim,
                                     hp->norm_eps, cs));
        else
            RC(kern_cuda_rmsnorm(act(f, op->out), f->x, w->norm[op->arg], n, hp->dim, hp->norm_eps, cs));
        f->pending = 0;
        return FERRY_OK;
    case LOP_LINEAR: {
        /* A gated attention's q|k|v product goes to qg, which LOP_Q_GATE splits into q|k|v and the gates. */
        float *y = op->arg == LAYER_QKV && hp->attn_out_gate ? f->qg : act(f, op->out);
        if (!y) return FERRY_ERR_INTERNAL;
        RC(linear_group(f, y, act(f, op->in), &w->mat[op->arg], n));
        if (op->out == LACT_D) f->pending = 1;
        return FERRY_OK;
    }
    case LOP_ROPE_KV: {
        const struct kern_cuda_kv_layer view = kv_view(f, l);
        int hd, n_kv, rd;
        llm_layer_shape(hp, l, &hd, &n_kv, &rd);
        const float *inv_freq = llm_layer_is_local(hp, l) ? f->inv_freq_local : f->inv_freq;
        const struct kern_cuda_q_scale qs = {llm_rope_q_scale(hp), hp->attn_temp_beta, hp->attn_temp_len};
        if (llm_layer_kv_shared(hp, l)) /* queries only: the rows hold no K/V, the source layer stored them */
            return kern_cuda_rope_q(act(f, op->out), qkv_in, d_pos, n, hp->n_heads, hd, rd, inv_freq,
                                    hp->rope_style, qs, cs);
        return kern_cuda_rope_kv_store(act(f, op->out), qkv_in, &view, d_seq, d_pos, n, hp->n_heads, rd,
                                       inv_freq, hp->rope_style, qs, cs);
    }
    case LOP_ATTENTION:
    case LOP_ATTENTION_SINKS: {
        struct kern_cuda_kv_layer view = kv_view(f, l);
        if (op->kind == LOP_ATTENTION_SINKS) {
            /* The sinks are in the layer's norm vectors (kv ops of a host layer come without w). */
            if (!(view.sinks = layer_sinks(f, w, l))) return FERRY_ERR_INTERNAL;
            /* The host's part of a split attention has no sinks (such models get no extension). */
            if (f->ext_r1 > f->ext_r0 && view.n_ext) return FERRY_ERR_UNSUPPORTED;
        }
        /* Only a view of the main pool has an extension (the window pool's layers attend on the device). */
        if (f->ext_r1 > f->ext_r0 && view.n_ext) return attention_split(f, op, &view, l, n);
        return kern_cuda_attention_mixed(act(f, op->out), NULL, act(f, op->in), &view, d_seq, d_pos, n,
                                         f->n_decode, hp->n_heads, llm_attn_scale(hp), f->max_len, f->attn_ws,
                                         f->attn_ws_bytes, cs);
    }
    case LOP_SILU_MUL:
        if (op_x8(f, op, w, l, n) == FERRY_OK) return FERRY_OK;
        return kern_cuda_silu_mul(act(f, op->out), act(f, op->in), n, llm_layer_ffn(hp, l), cs);
    case LOP_NORM:
        return kern_cuda_rmsnorm(act(f, op->out), act(f, op->in), w->norm[op->arg], n, hp->dim, hp->norm_eps,
                                 cs);
    case LOP_GELU_MUL:
        if (op_x8(f, op, w, l, n) == FERRY_OK) return FERRY_OK;
        return kern_cuda_gelu_mul(act(f, op->out), act(f, op->in), n, llm_layer_ffn(hp, l), cs);
    case LOP_QK_NORM: {
        int hd, n_kv, rd;
        llm_layer_shape(hp, l, &hd, &n_kv, &rd);
        if (llm_layer_kv_shared(hp, l)) /* a KV-sharing layer's rows are its queries alone */
            return kern_cuda_head_rmsnorm(act(f, op->in), hp->n_heads * hd, w->norm[LAYER_Q_NORM], n,
                                          hp->n_heads, hd, hp->norm_eps, cs);
        return kern_cuda_qk_norm(act(f, op->in), (hp->n_heads + 2 * n_kv) * hd, w->norm[LAYER_Q_NORM],
                                 w->norm[LAYER_K_NORM], n, hp->n_heads, n_kv, hd, hp->norm_eps, cs);
    }
    case LOP_V_NORM: { /* each value head normed, no weight (the values follow the queries and keys) */
        int hd, n_kv, rd;
        llm_layer_shape(hp, l, &hd, &n_kv, &rd);
        if (llm_layer_kv_shared(hp, l)) return FERRY_OK;
        return kern_cuda_head_rmsnorm(act(f, op->in) + (size_t)(hp->n_heads + n_kv) * hd,
                                      (hp->n_heads + 2 * n_kv) * hd, NULL, n, n_kv, hd, hp->norm_eps, cs);
    }
    case LOP_SCALE_X: /* x = (x + D) * the layer's output scalar */
        if (!w->norm[op->arg]) return FERRY_ERR_INTERNAL;
        RC(kern_cuda_add_scale(f->x, f->pending ? f->tmp : NULL, w->norm[op->arg], (int64_t)n * hp->dim, cs));
        f->pending = 0;
        return FERRY_OK;
    case LOP_PLE:
        return hp->ple_dim > 0 ? ple_add(f, l, n) : FERRY_OK;
    case LOP_MOE:
    case LOP_MOE_CLAMPED: /* the biases and the clamped SwiGLU: forward_cuda_moe.c, from the model's hparams
                           */
        RC(cuda_moe_run(f->moe, l, act(f, op->out), act(f, op->in), n, f->kctx, f->d_iota, cs));
        if (op->out == LACT_D) f->pending = 1;
        return FERRY_OK;
    case LOP_MOE_SHARED:
        RC(cuda_moe_run(f->moe, l, act(f, op->out), act(f, op->in), n, f->kctx, f->d_iota, cs));
        if (op->out == LACT_D) f->pending = 1;
        return moe_shared(f, w, l, n, act(f, op->out), act(f, op->in));
    case LOP_DELTANET:
        RC(deltanet_in(f, w, l, n, act(f, op->in)));
        RC(deltanet_out(f, w, n, act(f, op->out)));
        if (op->out == LACT_D) f->pending = 1;
        return FERRY_OK;
    case LOP_Q_GATE:
        if (!f->qg || !f->gate) return FERRY_ERR_INTERNAL;
        return kern_cuda_q_gate_split(act(f, op->out), f->gate, f->qg, n, hp->n_heads, hp->head_dim,
                                      hp->n_kv_heads * hp->head_dim, cs);
    case LOP_ATT_GATE:
        if (!f->gate) return FERRY_ERR_INTERNAL;
        return kern_cuda_sigmoid_mul(act(f, op->out), act(f, op->in), f->gate,
                                     (int64_t)n * hp->n_heads * hp->head_dim, cs);
    }
    return FERRY_ERR_INTERNAL;
}

/* Enqueues layer l (resident or streamed) on the compute stream; a streamed layer's products each wait for
 * their piece (a DeltaNet op's two halves, one piece each). */
static int layer_enqueue(struct forward_cuda *f, int l, enum placement where, int n)
{
    struct layer_weights w;
    const struct layer_program *p = layer_prog(f, l);
    const struct layer_layout *lay = &f->layouts[l];
    if (where == PLACEMENT_GPU) {
        if (!f->resident[l]) return FERRY_ERR_INVALID;
        layer_weights_tail(&w, lay, (const char *)f->resident[l] + lay->norm_off[0]);
        block_place(f, l, &w, f->resident[l]);
        for (int i = 0; i < p->n_ops; i++) RC(run_op(f, &p->ops[i], &w, l, n, f->qkv));
        return FERRY_OK;
    }
    if (where == PLACEMENT_PARK) {
        if (!f->ring_buf || f->parked[l] == UINT64_MAX) return FERRY_ERR_INVALID;
        CK(cudaStreamWaitEvent(f->compute, f->park_done, 0));
        layer_weights_tail(&w, lay, f->tail[l]);
        block_place(f, l, &w, f->ring_buf + f->parked[l]);
        for (int i = 0; i < p->n_ops; i++) RC(run_op(f, &p->ops[i], &w, l, n, f->qkv));
        CK(cudaEventRecord(f->park_used, f->compute));
        return FERRY_OK;
    }
    if (where != PLACEMENT_STREAM || !f->host_block[l] || !f->ring_buf) return FERRY_ERR_INVALID;
    layer_weights_tail(&w, lay, f->tail[l]);
    for (int i = 0; i < p->n_ops; i++) {
        const struct layer_op *op = &p->ops[i];
        uint64_t copy;
        if (op->kind == LOP_DELTANET) {
            RC(piece_acquire(f, l, LAYER_QKV, &w, &copy));
            RC(deltanet_in(f, &w, l, n, act(f, op->in)));
            RC(piece_release(f, copy));
            RC(piece_acquire(f, l, LAYER_O, &w, &copy));
            RC(deltanet_out(f, &w, n, act(f, op->out)));
            RC(piece_release(f, copy));
            if (op->out == LACT_D) f->pending = 1;
            continue;
        }
        if (op->kind == LOP_LINEAR) RC(piece_acquire(f, l, op->arg, &w, &copy));
        RC(run_op(f, op, &w, l, n, f->qkv));
        if (op->kind == LOP_LINEAR) RC(piece_release(f, copy));
    }
    return FERRY_OK;
}

/* x (n, dim) on the device = the rows of host x (mapped pinned memory; host_x_dev is its device address),
 * read by a gather kernel: a copy-engine transfer could queue behind a layer copy on the copy stream's
 * engine. */
static int x_gather(struct forward_cuda *f, const float *host_x_dev, int n)
{
    RC(kern_cuda_embed(f->x, host_x_dev, DTYPE_F32, n, f->m->hp.dim, f->d_iota, n, f->compute));
    f->pending = 0;
    return FERRY_OK;
}

/* Ids, positions, sequences and the block tables: staged on the host, copied on the compute stream. */
static int upload_inputs(struct forward_cuda *f)
{
    const size_t bt = (size_t)f->kv->n_seqs * f->kv->max_blocks;
    CK(cudaMemcpyAsync(f->d_ints, f->h_ints, (3 * (size_t)f->max_tokens) * sizeof(int32_t),
                       cudaMemcpyHostToDevice, f->compute));
    CK(cudaMemcpyAsync(f->d_block_table, f->h_ints + 3 * f->max_tokens, bt * sizeof(int32_t),
                       cudaMemcpyHostToDevice, f->compute));
    if (f->kv_swa)
        CK(cudaMemcpyAsync(f->d_block_table_swa, f->h_ints + 3 * f->max_tokens + bt, bt * sizeof(int32_t),
                           cudaMemcpyHostToDevice, f->compute));
    if (f->ext_r1 > f->ext_r0)
        CK(cudaMemcpyAsync(f->d_pos_att, f->h_pos_att, (size_t)f->max_tokens * sizeof(int32_t),
                           cudaMemcpyHostToDevice, f->compute));
    return FERRY_OK;
}

/* This step's host positions (see struct forward_cuda): for each decode row (the step's leading single
 * tokens), the trailing run of extension blocks of its sequence (from the staged table), never position 0,
 * which the device keeps so that every row has a position there. Prefill chunks stay on the device, which
 * reads their extension positions over the link: the host's attention takes one row at a time, and a chunk's
 * rows would each read the sequence's K/V again (measured: ~0.6 s a step of 16 clients, against ~80 ms). */
static void ext_plan(struct forward_cuda *f, const struct batch *b)
{
    f->ext_r0 = f->ext_r1 = 0;
    if (!f->ext_host) return;
    const struct kv_cache *kv = f->kv;
    const int n = b->n_tokens;
    int last_seq = -1, lo = 0, r0 = -1, r1 = 0;
    for (int i = 0; i < n; i++) {
        const int s = b->seq[i];
        if (i >= f->n_decode) {
            f->h_ext_lo[i] = INT32_MAX;
            f->h_pos_att[i] = b->pos[i];
            continue;
        }
        if (s != last_seq) { /* (the staged table is the cache's own) */
            const int j = kv_cache_ext_first(kv, s);
            lo = j < kv->n_held[s] ? (j > 0 ? j * kv->block_size : 1) : INT32_MAX;
            last_seq = s;
        }
        f->h_ext_lo[i] = lo;
        f->h_pos_att[i] = b->pos[i] >= lo ? lo - 1 : b->pos[i];
        if (b->pos[i] >= lo) {
            if (r0 < 0) r0 = i;
            r1 = i + 1;
        }
    }
    if (r0 >= 0) f->ext_r0 = r0, f->ext_r1 = r1;
}

/* The final norm (with the last delta), the rows that want logits gathered (device-to-device) and projected
 * in chunks of the device buffer's rows, each chunk downloaded before the next one's product; with `hidden`
 * (embeddings) the normed rows themselves are downloaded (h_logits holds T rows of n_vocab >= dim floats). */
static int head_enqueue(struct forward_cuda *f, const uint8_t *want, int n, int hidden, int download)
{
    const struct llm_hparams *hp = &f->m->hp;
    const int dim = hp->dim;
    cudaStream_t cs = f->compute;
    if (f->pending)
        RC(kern_cuda_add_rmsnorm(f->x, f->tmp, f->xn, f->out_norm, n, dim, hp->norm_eps, cs));
    else
        RC(kern_cuda_rmsnorm(f->xn, f->x, f->out_norm, n, dim, hp->norm_eps, cs));
    f->pending = 0;
    int n_out = 0;
    for (int i = 0; i < n; i++)
        if (want[i]) {
            if (n_out != i)
                CK(cudaMemcpyAsync(f->xn + (size_t)n_out * dim, f->xn + (size_t)i * dim, dim * sizeof(float),
                                   cudaMemcpyDeviceToDevice, cs));
            n_out++;
        }
    if (hidden) {
        if (n_out)
            CK(cudaMemcpyAsync(f->h_logits, f->xn, (size_t)n_out * dim * sizeof(float),
                               cudaMemcpyDeviceToHost, cs));
        return FERRY_OK;
    }
    for (int c = 0; c < n_out; c += f->logit_rows) {
        const int r = n_out - c < f->logit_rows ? n_out - c : f->logit_rows;
        RC(linear(f, f->logits, hp->n_vocab, f->xn + (size_t)c * dim, f->head, f->head_type, NULL, r,
                  hp->n_vocab, dim));
        if (hp->final_softcap > 0)
            RC(kern_cuda_softcap(f->logits, hp->final_softcap, (int64_t)r * hp->n_vocab, cs));
        if (download)
            CK(cudaMemcpyAsync(f->h_logits + (size_t)c * hp->n_vocab, f->logits,
                               (size_t)r * hp->n_vocab * sizeof(float), cudaMemcpyDeviceToHost, cs));
    }
    return FERRY_OK;
}

/* The step's embedding rows (scaled) into h_x and, with per-layer inputs, theirs into h_ple: on the host,
 * from the model's tables where they are. */
static int host_embed(struct forward_cuda *f, const int32_t *tokens, int n)
{
    const struct model *m = f->m;
    RC(kern_cpu_embed(f->h_x, m->tok_embd.data, m->tok_embd.type, (int)m->tok_embd.rows, m->hp.dim, tokens,
                      n));
    if (m->hp.embed_scale != 0.0f) kern_cpu_scale(f->h_x, m->hp.embed_scale, (int64_t)n * m->hp.dim);
    if (m->hp.ple_dim > 0)
        RC(kern_cpu_embed(f->h_ple, m->ple_embd.data, m->ple_embd.type, (int)m->ple_embd.rows,
                          m->hp.n_layers * m->hp.ple_dim, tokens, n));
    return FERRY_OK;
}

/* x from the staged rows, and the per-layer inputs where the model has them. */
static int embed_enqueue(struct forward_cuda *f, int n)
{
    RC(x_gather(f, f->h_x_dev, n));
    return f->m->hp.ple_dim > 0 ? ple_inputs(f, n) : FERRY_OK;
}

/* A whole step of a fully resident model, from the staged inputs to the logits' download (graph capture). */
static int enqueue_whole_step(struct forward_cuda *f, const struct step *st)
{
    const int n = st->b->n_tokens;
    RC(upload_inputs(f));
    RC(embed_enqueue(f, n));
    for (int l = 0; l < f->n_layers; l++) RC(layer_enqueue(f, l, PLACEMENT_GPU, n));
    return head_enqueue(f, st->b->want_logits, n, 0, st->draw == NULL);
}

/* max_len only sizes the attention's KV split; rounding it up to a power of two (>= 256) keeps the set of
 * launch shapes small enough to capture each once as a graph, and gives every placement the same splits
 * (so their results stay bitwise equal). */
static int bucket_len(int max_len, int cap)
{
    int b = 256;
    while (b < max_len) b *= 2;
    return b < cap ? b : cap;
}

/* The graph for a decode step of n tokens that all want logits, at the step's max_len bucket, downloading
 * the logits or (a drawing step) not; captured on first use. */
static int step_graph(struct forward_cuda *f, const struct step *st, cudaGraphExec_t *out)
{
    int li = 0;
    while ((256 << li) < f->max_len) li++;
    cudaGraphExec_t *slot =
        &f->graphs[((size_t)(st->b->n_tokens - 1) * GRAPH_LENS + (size_t)li) * GRAPH_KINDS +
                   (st->draw != NULL)];
    if (!*slot) {
        cudaGraph_t g = NULL;
        CK(cudaStreamBeginCapture(f->compute, cudaStreamCaptureModeThreadLocal));
        int rc = enqueue_whole_step(f, st);
        cudaError_t ce = cudaStreamEndCapture(f->compute, &g);
        if (rc || ce != cudaSuccess) {
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
            return rc ? rc : FERRY_ERR_CUDA;
        }
        ce = cudaGraphInstantiate(slot, g, 0);
        cudaGraphDestroy(g);
        if (ce != cudaSuccess) {
            *slot = NULL;
            cudaGetLastError();
            return FERRY_ERR_CUDA;
        }
    }
    *out = *slot;
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The backend table */

static int cuda_begin(struct backend *be, const struct step *st)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    const struct batch *b = st->b;
    const int n = b->n_tokens;
    if (n <= 0 || n > f->max_tokens) return FERRY_ERR_INVALID;
    /* A CPU-only host layer (its state in host memory) is never the device's to run. */
    for (int l = 0; l < f->n_layers && f->map.cpu_only; l++)
        if (f->map.cpu_only[l] && f->map.where[l] != PLACEMENT_GPU && st->where &&
            st->where[l] != PLACEMENT_CPU)
            return FERRY_ERR_INTERNAL;
    const struct kv_cache *kv = f->kv;
    int all_want = 1;
    for (int i = 0; i < n; i++) {
        f->h_ints[i] = b->tokens[i];
        f->h_ints[f->max_tokens + i] = b->pos[i];
        f->h_ints[2 * f->max_tokens + i] = b->seq[i];
        all_want &= b->want_logits[i] != 0;
    }
    const size_t bt = (size_t)kv->n_seqs * kv->max_blocks;
    memcpy(f->h_ints + 3 * f->max_tokens, kv->block_table, bt * sizeof(int32_t));
    if (f->kv_swa) /* (tables of kv's shape: runtime/engine.c) */
        memcpy(f->h_ints + 3 * f->max_tokens + bt, f->kv_swa->block_table, bt * sizeof(int32_t));
    f->max_len = bucket_len(st->max_len, kv->max_blocks * kv->block_size);
    /* Rows whose neighbours belong to other sequences are decode tokens; the scheduler puts them first and
     * the prefill chunks after (a decode-only step is all decode rows, captured graphs included). */
    f->n_decode = 0;
    while (f->n_decode < n && (f->n_decode == 0 || b->seq[f->n_decode - 1] != b->seq[f->n_decode]) &&
           (f->n_decode + 1 == n || b->seq[f->n_decode + 1] != b->seq[f->n_decode]))
        f->n_decode++;
    ext_plan(f, b); /* (none with graphs: those are for fully resident models, which have no extension) */
    f->step_uses = 0;
    f->graph_step = 0;
    f->pending = 0;
    if (b->hidden && f->m->hp.dim > f->m->hp.n_vocab) return FERRY_ERR_UNSUPPORTED; /* h_logits' rows */
    if (f->graphs && n <= GRAPH_MAX_TOKENS && all_want && !b->hidden &&
        f->max_len <= (256 << (GRAPH_LENS - 1))) {
        RC(host_embed(f, b->tokens, n));
        cudaGraphExec_t g;
        RC(step_graph(f, st, &g));
        CK(cudaGraphLaunch(g, f->compute));
        f->graph_step = 1;
        return FERRY_OK;
    }
    RC(upload_inputs(f));
    if (!f->ring_buf) return FERRY_OK;
    int n_list = 0;
    for (int l = 0; l < f->n_layers; l++) {
        int g[LAYER_N_MATS];
        const int np = st->where[l] == PLACEMENT_STREAM ? program_pieces(layer_prog(f, l), g) : 0;
        for (int i = 0; i < np; i++) {
            size_t off, bytes;
            block_piece(&f->layouts[l], &f->dn_blocks[l], g[i], &off, &bytes);
            f->step_items[n_list] = l * LAYER_N_MATS + g[i];
            f->step_bytes[n_list++] = bytes;
        }
    }
    const uint64_t cap =
        step_plan_park_layout(f->map.ring_bytes, f->layer_sizes, st->where, f->n_layers, f->park_want);
    if (cap == UINT64_MAX) return FERRY_ERR_INVALID;
    const int dropped = ring_begin(&f->ring, f->step_items, f->step_bytes, n_list, cap);
    if (dropped < 0) return dropped;
    if (dropped)
        FLOG_DEBUG("streaming: %d prefetched piece copies dropped (the step's plan changed)", dropped);
    RC(park_layers(f, st->where));
    return issue_copies(f);
}

static int cuda_embed(struct backend *be, const struct step *st)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    if (f->graph_step) return FERRY_OK;
    const int n = st->b->n_tokens;
    RC(host_embed(f, st->b->tokens, n));
    return embed_enqueue(f, n);
}

static int cuda_layer(struct backend *be, int l, const struct step *st)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    if (f->graph_step) return FERRY_OK;
    if (l < 0 || l >= f->n_layers) return FERRY_ERR_INVALID;
    f->stats.layers_run++;
    return layer_enqueue(f, l, st->where[l], st->b->n_tokens);
}

/* Once the step's work is complete: a host function's failure, reported once. */
static int ext_status(struct forward_cuda *f)
{
    const int rc = f->ext_rc, moe = cuda_moe_status(f->moe);
    f->ext_rc = 0;
    return rc ? rc : moe;
}

/* Once the step's work is complete: the streaming figures of its copies. */
static void step_figures(struct forward_cuda *f)
{
    for (int i = 0; i < f->step_uses; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, f->wait_t0[i], f->wait_t1[i]) == cudaSuccess)
            f->stats.stall_seconds += ms * 1e-3;
        const int e = (int)(f->step_copy[i] % (uint64_t)f->n_copy_ev);
        if (cudaEventElapsedTime(&ms, f->copy_t0[e], f->copy_t1[e]) == cudaSuccess)
            f->stats.copy_seconds += ms * 1e-3;
    }
    f->step_uses = 0;
    cudaGetLastError();
}

static int cuda_head(struct backend *be, const struct step *st, float *logits)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    const struct llm_hparams *hp = &f->m->hp;
    if (!f->graph_step) RC(head_enqueue(f, st->b->want_logits, st->b->n_tokens, st->b->hidden, 1));
    CK(cudaStreamSynchronize(f->compute));
    RC(ext_status(f));
    if (st->n_out)
        memcpy(logits, f->h_logits,
               (size_t)st->n_out * (st->b->hidden ? hp->dim : hp->n_vocab) * sizeof(float));
    step_figures(f);
    return FERRY_OK;
}

/* The rows' logits stay on the device (a graph step's capture for drawing has no copy either) and
 * the GPU sampler draws from them: they all fit logit_rows (engine_step_draw checks draw_caps). Returns with
 * the draw queued; cuda_draw_end waits for it. */
static int cuda_head_draw(struct backend *be, const struct step *st)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    if (st->b->hidden || st->n_out > f->logit_rows) return FERRY_ERR_INVALID;
    int rc = f->graph_step ? FERRY_OK : head_enqueue(f, st->b->want_logits, st->b->n_tokens, 0, 0);
    if (!rc) rc = draw_cuda_enqueue(f->draw, f->logits, st->draw, st->n_out, f->compute);
    if (rc) {
        cudaStreamSynchronize(f->compute); /* the step's work is complete before a failure returns */
        cudaGetLastError();
        ext_status(f);
    }
    return rc;
}

static int cuda_draw_end(struct backend *be, const struct step *st)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    int rc = draw_cuda_collect(f->draw, st->n_out, st->drawn, f->compute);
    const int ext = ext_status(f);
    if (!rc) rc = ext;
    if (rc) {
        cudaStreamSynchronize(f->compute);
        cudaGetLastError();
        return rc;
    }
    step_figures(f);
    return FERRY_OK;
}

static void cuda_draw_caps(const struct backend *be, int *rows, int *bias, int *hist)
{
    draw_cuda_caps(((const struct forward_cuda *)be)->draw, rows, bias, hist);
}

static float *cuda_x_host(struct backend *be)
{
    (void)be;
    return NULL;
}

static int cuda_x_out(struct backend *be, float *x, int n)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    const struct llm_hparams *hp = &f->m->hp;
    if (n <= 0 || n > f->max_tokens) return FERRY_ERR_INVALID;
    /* Fold the delta in (the norm's output goes to scratch). */
    if (f->pending)
        RC(kern_cuda_add_rmsnorm(f->x, f->tmp, f->xn, f->out_norm, n, hp->dim, hp->norm_eps, f->compute));
    f->pending = 0;
    CK(cudaMemcpyAsync(x, f->x, (size_t)n * hp->dim * sizeof(float), cudaMemcpyDeviceToHost, f->compute));
    CK(cudaStreamSynchronize(f->compute));
    return FERRY_OK;
}

static int cuda_x_in(struct backend *be, const float *x, int n)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    if (n <= 0 || n > f->max_tokens) return FERRY_ERR_INVALID;
    return x_gather(f, pinned_device_ptr(x), n);
}

static int cuda_attend(struct backend *be, int l, const struct step *st, const float *qkv, float *att)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    const struct llm_hparams *hp = &f->m->hp;
    const int n = st->b->n_tokens;
    if (n <= 0 || n > f->max_tokens || l < 0 || l >= f->n_layers) return FERRY_ERR_INVALID;
    const struct layer_program *p = f->prog;
    /* The program's KV ops, the first one reading the host's q|k|v rows in place. */
    for (int i = p->kv_first; i <= p->kv_last; i++)
        RC(run_op(f, &p->ops[i], NULL, l, n, pinned_device_ptr(qkv)));
    CK(cudaMemcpyAsync(att, act(f, p->ops[p->kv_last].out),
                       (size_t)n * hp->n_heads * hp->head_dim * sizeof(float), cudaMemcpyDeviceToHost,
                       f->compute));
    CK(cudaStreamSynchronize(f->compute));
    return FERRY_OK;
}

static void cuda_stats(const struct backend *be, struct backend_stats *st)
{
    const struct forward_cuda *f = (const struct forward_cuda *)be;
    *st = f->stats;
    uint64_t host_runs, stream_runs, stream_bytes; /* host experts streamed count as weights streamed */
    cuda_moe_counts(f->moe, &host_runs, &stream_runs, &stream_bytes);
    st->bytes_streamed += stream_bytes;
    cuda_moe_cache_stats(f->moe, &st->expert_cache);
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .free = cuda_free,
    .begin = cuda_begin,
    .embed = cuda_embed,
    .layer = cuda_layer,
    .head = cuda_head,
    .head_draw = cuda_head_draw,
    .draw_end = cuda_draw_end,
    .draw_caps = cuda_draw_caps,
    .x_host = cuda_x_host,
    .x_out = cuda_x_out,
    .x_in = cuda_x_in,
    .attend = cuda_attend,
    .stats = cuda_stats,
};

/* ----------------------------------------------------------------------------------------------------------
 */
/* Cost-model probes */

/* The inputs of a start-up probe of n rows: sequence 0 at position 0 with an empty block table, so the K/V
 * store skips every row and the attention reads zeros; the cache is left untouched. */
static int probe_inputs(struct forward_cuda *f, int n)
{
    const size_t bt = (size_t)f->kv->n_seqs * f->kv->max_blocks * (f->kv_swa ? 2 : 1); /* both tables */
    for (int i = 0; i < n; i++)
        f->h_ints[i] = 0, f->h_ints[f->max_tokens + i] = 0, f->h_ints[2 * f->max_tokens + i] = 0;
    for (size_t i = 0; i < bt; i++) f->h_ints[3 * f->max_tokens + i] = -1;
    f->ext_r0 = f->ext_r1 = 0;
    RC(upload_inputs(f));
    f->max_len = 256;
    return FERRY_OK;
}

/* The median of the last 8 of a probe's 9 timings (the first warms up); sorts them. */
static double probe_median(double t[9])
{
    for (int i = 2; i < 9; i++)
        for (int j = i; j > 1 && t[j] < t[j - 1]; j--) {
            const double s = t[j];
            t[j] = t[j - 1], t[j - 1] = s;
        }
    return t[5]; /* (the upper of the two middle ones) */
}

int forward_cuda_time_exchange(struct backend *be, int n, double *seconds)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    const struct llm_hparams *hp = &f->m->hp;
    *seconds = 0;
    if (n <= 0 || n > f->max_tokens) return FERRY_ERR_INVALID;
    RC(probe_inputs(f, n));
    const size_t qd = (size_t)hp->n_heads * hp->head_dim,
                 row = qd + 2 * (size_t)hp->n_kv_heads * hp->head_dim;
    float *qkv = forward_cuda_host_alloc(f, (size_t)n * row * sizeof(float));
    float *att = forward_cuda_host_alloc(f, (size_t)n * qd * sizeof(float));
    int rc = FERRY_ERR_NOMEM;
    if (qkv && att) {
        memset(qkv, 0, (size_t)n * row * sizeof(float));
        memset(f->h_x, 0, (size_t)n * hp->dim * sizeof(float));
        struct batch b = {.n_tokens = n};
        struct step st = {.b = &b, .max_len = 1};
        double t[9];
        int la = 0; /* the first layer with K/V (a recurrent layer has none) */
        while (la + 1 < f->n_layers && llm_layer_is_recurrent(hp, la)) la++;
        rc = FERRY_OK;
        for (int r = 0; r < 9 && !rc; r++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            rc = x_gather(f, f->h_x_dev, n);
            if (!rc) rc = cuda_x_out(be, f->h_x, n);
            if (!rc) rc = cuda_attend(be, la, &st, qkv, att);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            t[r] = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        }
        if (!rc) *seconds = probe_median(t);
    }
    forward_cuda_host_free(f, qkv);
    forward_cuda_host_free(f, att);
    return rc;
}

int forward_cuda_time_layer(struct backend *be, int l, int n, double *seconds)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    const struct llm_hparams *hp = &f->m->hp;
    *seconds = 0;
    if (n <= 0 || n > f->max_tokens || l < 0 || l >= f->n_layers || !f->resident[l]) return FERRY_ERR_INVALID;
    RC(probe_inputs(f, n));
    memset(f->h_x, 0, (size_t)n * hp->dim * sizeof(float));
    RC(x_gather(f, f->h_x_dev, n));
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = FERRY_ERR_CUDA;
    double t[9];
    if (cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
        rc = FERRY_OK;
        for (int r = 0; r < 9 && !rc; r++) {
            float ms = 0;
            if (cudaEventRecord(e0, f->compute) != cudaSuccess) rc = FERRY_ERR_CUDA;
            if (!rc) rc = layer_enqueue(f, l, PLACEMENT_GPU, n);
            if (!rc &&
                (cudaEventRecord(e1, f->compute) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
                 cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess))
                rc = FERRY_ERR_CUDA;
            t[r] = ms * 1e-3;
        }
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaStreamSynchronize(f->compute);
    cudaGetLastError();
    f->pending = 0;
    if (rc) return rc;
    *seconds = probe_median(t);
    return FERRY_OK;
}

int forward_cuda_link_load_begin(struct backend *be, double seconds)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    f->load_bytes = 0;
    /* (layers that may stream: a CPU-only one's pieces may not fit the ring, which was not sized for them) */
#define MAY_STREAM(l) (f->host_block[l] && !(f->map.cpu_only && f->map.cpu_only[l]))
    int any = 0;
    for (int l = 0; l < f->n_layers; l++) any |= MAY_STREAM(l);
    if (!f->ring_buf || !any || seconds <= 0) return FERRY_OK;
    const double rate = f->stats.h2d_bytes_per_s > 0 ? f->stats.h2d_bytes_per_s : 50e9;
    /* The host layers' pieces straight into the ring's start, outside its bookkeeping: no step is running,
     * and the copy stream keeps order with the ring's later copies. */
    CK(cudaEventRecord(f->load_t0, f->copy));
    for (int i = 0, l = 0; f->load_bytes < rate * seconds && i < 100000; i++) {
        while (!MAY_STREAM(l)) l = (l + 1) % f->n_layers;
#undef MAY_STREAM
        size_t off, bytes;
        block_piece(&f->layouts[l], &f->dn_blocks[l], i % LAYER_N_MATS, &off, &bytes);
        CK(cudaMemcpyAsync(f->ring_buf, (const char *)f->host_block[l] + off, bytes, cudaMemcpyHostToDevice,
                           f->copy));
        f->load_bytes += bytes;
        if (i % LAYER_N_MATS == LAYER_N_MATS - 1) l = (l + 1) % f->n_layers;
    }
    CK(cudaEventRecord(f->load_t1, f->copy));
    return FERRY_OK;
}

double forward_cuda_link_load_end(struct backend *be)
{
    struct forward_cuda *f = (struct forward_cuda *)be;
    if (!f->load_bytes) return 0;
    float ms = 0;
    if (cudaEventSynchronize(f->load_t1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, f->load_t0, f->load_t1) != cudaSuccess || ms <= 0) {
        cudaGetLastError();
        return 0;
    }
    const double rate = (double)f->load_bytes / (ms * 1e-3);
    f->load_bytes = 0;
    return rate;
}
