/* engine — the runtime's seam: one call runs a forward pass over a batch of tokens from many sequences.
 *
 * The scheduler (server/) builds a `struct batch` each iteration (prefill chunks and decode tokens of many
 * sequences) and calls engine_step(); the engine owns the weights, the paged KV cache and its block tables,
 * the backends (runtime/backend.h: the CPU alone, or CUDA with a device_map of resident layers and layers in
 * pinned host memory, which each step streams or has the host's cores compute, as the step plan for its size
 * says: runtime/step_plan.h) and their threads. Sequences are
 * slots 0..n_seqs-1; a slot's KV blocks are taken as its positions grow and returned by engine_seq_free().
 * Positions of a sequence continue each other within a batch and start at most at the slot's length (a slot
 * may rewind to rewrite its tail). One thread calls the engine at a time.
 * Usage: engine_init → (engine_step ...; engine_seq_free ...)* → engine_free.
 */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H

#include <stdint.h>

#include "kernels/cpu/attention.h" /* enum kv_elem */
#include "runtime/batch.h"
#include "runtime/expert_cache.h"
#include "runtime/forward_cuda.h"
#include "runtime/kv_cache.h"
#include "weights/model_file.h"

enum engine_backend { ENGINE_BACKEND_AUTO = 0, ENGINE_BACKEND_CPU = 1, ENGINE_BACKEND_CUDA = 2 };
/* What a GPU engine does with its layers in host memory (--placement): per step, whichever the step plan
 * predicts faster; always stream them; always compute them on the host's cores. */
enum engine_placement { ENGINE_PLACEMENT_AUTO = 0, ENGINE_PLACEMENT_STREAM = 1, ENGINE_PLACEMENT_CPU = 2 };

/* Quantization of F32/F16/BF16 weights at load (--quant): INT8 is llama.cpp's Q8_0 mix, INT4 its Q4_K_M mix
 * (Q4_K; Q6_K for the head and some attn_v/ffn_down; Q5_0/Q8_0 for rows not a multiple of 256), the same
 * bytes `ferry quantize --type Q8_0 / Q4_K_M` writes (runtime/model.h model_quantize). */
enum engine_quant { ENGINE_QUANT_NONE = 0, ENGINE_QUANT_INT8 = 1, ENGINE_QUANT_INT4 = 2 };
/* "none" | "int8" | "int4" to its value, or -1. */
int engine_quant_parse(const char *s);
/* --kv-type "f16" | "f32" | "q8_0" to engine_params.kv_type (enum kv_elem), or -1. */
int engine_kv_type_parse(const char *s);
/* The llama.cpp file type (quant/mix.h) a quantization applies, or -1 for NONE. */
int engine_quant_ftype(enum engine_quant q);

/* Positions per block of the KV pool: a sequence holds whole blocks. */
#define ENGINE_KV_BLOCK 16
/* Positions a sliding-window pool keeps before a slot's window: a slot may go back this far (speculative
 * decoding's rejected drafts, a prompt cache's reuse) and still find its window's K/V. */
#define ENGINE_SWA_SLACK 64

struct engine_params {
    enum engine_backend backend;
    int n_threads;        /* CPU worker threads; 0 = online cores */
    int ctx_size;         /* max positions of one sequence; 0 = min(model's trained context, 4096) */
    int n_seqs;           /* sequence slots (the server's --parallel) */
    int kv_tokens;        /* KV pool capacity in positions over all sequences; 0 = n_seqs * ctx_size */
    int max_batch_tokens; /* largest n_tokens of one engine_step */
    int deterministic;    /* fixed reduction orders (both backends always are: no atomics in reductions); with
                           * placement AUTO, host layers stream (auto plans from start-up timings); the CPU
                           * engine's products are batch-invariant (kern_cpu_matmul_set_invariant: a row's logits
                           * do    not depend on the step's other rows, so a prompt cache's or a speculation's    steps
                           * give a plain run's tokens), at a cost in prefill */
    enum engine_quant quant; /* quantize F32/F16/BF16 weights at load (default NONE) */
    int cpu_int8; /* CPU products with block-type weights quantize x to int8 (llama.cpp's arithmetic,
                   * faster; kernels/cpu/matmul.h KERN_CPU_ACT_INT8) instead of keeping it in f32;
                   * -1 (the default): int8 for the host layers of a GPU engine (its own products with such
                   * weights take x in int8 too); on the CPU engine int8 when most of the
                   * layers' bytes are K-quants, else f32. Also F16/BF16 weights' products of many rows:
                   * bf16 AMX tiles where the CPU has them (KERN_CPU_PLAIN_BF16) with 1, and with -1 for a
                   * GPU engine's host layers; f32 with 0, and with -1 on the CPU engine */
    /* Sliding-window layers keep every position (llama.cpp's --swa-full), as global ones do; 0 (the
     * default): they keep a pool of their own holding each slot's window (and ENGINE_SWA_SLACK positions
     * before it, for rollbacks), whose blocks before it go back after each step, where that is less than the
     * context; on the GPU engine that pool is on the device, and its planner counts both pools. */
    int swa_full;
    int kv_type; /* the CPU engine's KV cache, enum kv_elem: KV_F16 (the default: half the bytes a
                  * long-context  step reads, as on the GPU and in llama.cpp), KV_F32 (closest to the
                  * references), KV_Q8_0  (llama.cpp's `-ctk q8_0 -ctv q8_0`: 17/32 of f16's bytes) */
    /* Models with recurrent layers: checkpoints of a slot's state kept for the prompt cache
     * (runtime/seq_state.h): at most ctx_checkpoints a slot (0: none), thinned to ckpt_step positions apart
     * when full; each the size of a slot's state, in host memory. */
    int ctx_checkpoints;
    int ckpt_step;
    /* CUDA placement (see runtime/device_map.h). */
    int64_t gpu_memory;   /* device budget in bytes; 0 = free VRAM minus reserve_vram */
    int64_t reserve_vram; /* bytes left free when gpu_memory is 0 (default 1 GiB) */
    int gpu_layers;       /* resident layers; -1 = as many as fit */
    int ring_layers;      /* streaming ring size in the largest streamed layers; 0 = the planner's choice */
    int cpu_moe; /* expert models: the experts of the first cpu_moe layers stay in host memory, computed by
                  * the host's cores beside the device's attention (llama.cpp's --n-cpu-moe); -1 = the fewest
                  * that let the plan fit the budget */
    int64_t expert_cache; /* expert models: bytes of the device expert cache for the host layers' experts;
                           * -1 = what the budget leaves (forward_cuda.h), 0 = none */
    enum engine_placement placement;
    int cpu_threads; /* host threads computing host layers of a GPU engine (pinned); 0 = n_threads, or all
                      * cores when that is 0 too */
    /* Tests: the step plan itself (step_plan.h `force`: 'g'/'s'/'c' per layer, '/' between step-size
     * buckets); its 'g's also fix the resident layers. NULL: planned. */
    const char *plan_override;
};

struct engine_params engine_default_params(void);

/* What the CUDA backend has no kernels for in a model of hp, or this machine's GPU cannot run (a phrase for
 * messages: "gated DeltaNet (linear-attention) layers", "shared-expert layers", heads too wide for its shared
 * memory, ...), or NULL when it runs every layer. --backend cuda refuses such a model; auto runs it on the
 * CPU. */
const char *engine_cuda_lacks(const struct llm_hparams *hp);

struct engine_stats {
    int kv_blocks_total;
    int kv_blocks_ext; /* of them, the extension in host memory (device_map.h): handed out last */
    int kv_blocks_used;
    int kv_block_size;   /* positions per block */
    uint64_t steps;      /* engine_step calls */
    uint64_t tokens;     /* tokens processed */
    double busy_seconds; /* wall time inside engine_step */
    const char *backend; /* "cpu" or "cuda" */
    /* CUDA backend only (zero on the CPU). */
    int n_resident, n_streamed; /* n_streamed: layers in host memory (streamed or host-computed) */
    uint64_t ring_bytes;        /* the streaming ring (0: none) */
    uint64_t bytes_streamed;    /* weight bytes copied host→device for the layers steps streamed */
    uint64_t bytes_parked;      /* and for the layers they parked (runtime/step_plan.h) */
    double copy_seconds;        /* copy-stream time for those bytes */
    double stall_seconds;       /* compute time spent waiting for copies */
    uint64_t vram_budget, vram_planned, vram_used;
    uint64_t kv_host_bytes;      /* the KV pool's extension in pinned host memory (device_map.h) */
    uint64_t kv_ext_host_rows;   /* rows x layers whose extension positions the host's cores attended to */
    double kv_ext_host_seconds;  /* wall time of that attention, on the compute stream's path */
    uint64_t ext_streamed_steps; /* steps that streamed CPU layers for that attention (engine.c step_where) */
    double h2d_bytes_per_s, hbm_bytes_per_s; /* ceilings measured at start-up */
    /* Host layers of a GPU engine computed on the CPU. */
    int cpu_threads;
    uint64_t cpu_layers_run;
    double cpu_layer_seconds;
    /* --placement auto: the host's pace against its start-up timing (0: not followed; step_plan.h) and the
     * times the step plan was made again for it. */
    double host_pace;
    int plan_revisions;
    struct expert_cache_stats expert_cache; /* the device expert cache (runtime/expert_cache.h; zero: none) */
};

/* The step plan for a step of n_tokens: where its layers run and the predicted step time. */
struct engine_step_info {
    int bucket_tokens; /* the largest step of n_tokens' bucket */
    int n_gpu, n_stream, n_cpu;
    int n_park;         /* of the streamed ones, parked at the ring's end (runtime/step_plan.h) */
    double predicted_s; /* steady-state step time (0: not predicted, e.g. the CPU engine) */
    double stream_s;    /* the same with every host layer streamed (0: no ring) */
};

struct engine;

int engine_init(struct engine **out, const struct model_file *mf, const struct engine_params *p,
                char err[256]);
/* An engine over a synthetic model of shape hp with random weights of type wt (benchmarks; see model.h). */
int engine_init_synthetic(struct engine **out, const struct llm_hparams *hp, enum dtype wt,
                          const struct engine_params *p, char err[256]);
/* The same with its matrices in the llama.cpp mix ftype when ftype >= 0 (expert shapes; runtime/synthetic.h). */
int engine_init_synthetic_mix(struct engine **out, const struct llm_hparams *hp, enum dtype wt, int ftype,
                              const struct engine_params *p, char err[256]);
void engine_free(struct engine *e);

const struct llm_hparams *engine_hparams(const struct engine *e);
int engine_ctx_size(const struct engine *e);
int engine_n_seqs(const struct engine *e);

/* Runs the batch. logits receives one row of n_vocab floats per token with want_logits set, in batch order;
 * b->hidden_out, when set, every row's final normed hidden state (FERRY_ERR_UNSUPPORTED, nothing run, when
 * the head is not on the CPU).
 * Errors: FERRY_ERR_INVALID (bad token id, seq or pos out of order, a position in a block shared with another
 * sequence), FERRY_ERR_RANGE (position past
 * ctx_size or KV pool exhausted: nothing of the batch is kept in that case). */
int engine_step(struct engine *e, const struct batch *b, float *logits);

/* engine_step for a batch whose output rows (want_logits) are next-token draws: each is drawn where its
 * logits are, with its sampler (struct draw_row, runtime/batch.h), and out[i] gets row i's token and the
 * logprobs asked for; on the GPU only those cross PCIe. The draw equals sampler_sample() on the same logits
 * (kernels/cuda/sample.h). FERRY_ERR_UNSUPPORTED, with nothing run, when the head's backend cannot draw
 * (the CPU), or the step has more rows, logit_bias or penalty history than its buffers: the caller then
 * runs engine_step and samples on the host. */
int engine_step_draw(struct engine *e, const struct batch *b, const struct draw_row *rows,
                     struct draw_out *out);
/* engine_step_draw in two halves, so that the host can work while the device runs the step: begin returns
 * once the step is on its way (b and rows are read by then; a host layer of the plan is computed in it),
 * end waits for it and writes out. Between them the engine takes no other step (FERRY_ERR_INVALID), and the
 * caller may free or keep sequences that are not in the step. A failed begin leaves nothing on its way. */
int engine_step_draw_begin(struct engine *e, const struct batch *b, const struct draw_row *rows);
int engine_step_draw_end(struct engine *e, struct draw_out *out);
/* 1 when engine_step_draw_begin of a step of n_tokens returns as soon as its work is queued: the head can
 * draw, and the plan for that size computes no layer on the host's cores. */
int engine_step_overlaps(const struct engine *e, int n_tokens);
/* 1 when engine_step_draw can draw at all (the head's backend has a sampler: CUDA). */
int engine_draws(const struct engine *e);

/* Forgets the sequence and returns its KV blocks to the pool. Always succeeds for a valid slot. */
int engine_seq_free(struct engine *e, int seq);
/* Number of positions stored for the sequence (its next position). */
int engine_seq_len(const struct engine *e, int seq);
/* The engine's KV pools (read-only; for tests and reports): swa 0 the pool of the global layers (every
 * layer's, when the sliding-window layers have no pool of their own), 1 the sliding-window layers' own pool
 * (NULL when they have none: engine_params.swa_full, or no window smaller than the context). On the GPU
 * engine these are the tables of the device's pools (no host data). */
const struct kv_cache *engine_kv_cache(const struct engine *e, int swa);
/* The KV bytes of a model of hp under p (ctx_size and kv_tokens 0 as engine_init takes them, at p's kv_type;
 * the GPU engine's pools have these bytes at f16 and q8_0 when kv_tokens is given, its planner sizing the
 * main pool to the budget otherwise): *all of its pool of every layer (or of the global ones), *swa of the
 * sliding-window layers' own pool (0: none). */
void engine_kv_bytes(const struct llm_hparams *hp, const struct engine_params *p, uint64_t *all,
                     uint64_t *swa);
/* The positions engine_seq_keep(e, seq, n) would keep (n, or fewer for a model with recurrent layers),
 * without changing anything; 0 for an invalid slot or n. */
int engine_seq_reusable(const struct engine *e, int seq, int n);
/* Keeps the sequence's first n positions (0 <= n <= its length) and returns the blocks past them to the pool:
 * the next step may continue there, reusing what is kept (a prompt prefix). When position n falls in a block
 * another sequence shares, only the whole blocks before it are kept (a shared block is never written). A
 * model with recurrent layers keeps n < length positions only back to its latest checkpoint at or before n
 * (runtime/seq_state.h: one is saved where each prefill step ends), and none when there is no such one.
 * Returns the positions kept, or FERRY_ERR_INVALID. */
int engine_seq_keep(struct engine *e, int seq, int n);
/* Saves the slot's recurrent state where it stands (its length) as a checkpoint, so that engine_seq_keep can
 * come back to it after a step past it (speculative decoding's rejected drafts). FERRY_OK without recurrent
 * layers or positions; FERRY_ERR_NOMEM when no checkpoint could be kept (engine_params.ctx_checkpoints 0). */
int engine_seq_checkpoint(struct engine *e, int seq);
/* Empties dst and gives it the first n positions of src, as far as they fill whole KV blocks, without
 * copying: both then read those blocks; each writes only past them. Returns the positions dst now holds (a
 * multiple of the block size), or FERRY_ERR_INVALID. */
int engine_seq_share(struct engine *e, int src, int dst, int n);

void engine_get_stats(const struct engine *e, struct engine_stats *st);
/* FERRY_ERR_INVALID for n_tokens outside [1, max_batch_tokens]. */
int engine_step_info(const struct engine *e, int n_tokens, struct engine_step_info *info);

/* The CUDA backend's parameters for p (kv_auto: the planner sizes the KV pool to the budget), as engine_init
 * and engine_plan give them to forward_cuda; for planners beside them (runtime/device_split_model.c). */
struct forward_cuda_params engine_cuda_params(const struct engine_params *p, int kv_auto);

/* The placement engine_init would choose on a CUDA device for these parameters (p->gpu_memory must be set),
 * computed without touching a device; the prediction uses the reference H200's measured ceilings
 * (54.9 GB/s pinned host→device, 4.18 TB/s device copy). Writes device_map_format's text into buf.
 * FERRY_ERR_UNSUPPORTED in a build without CUDA; FERRY_ERR_DEVICE_MEM (err names the minimum) when too small.
 */
int engine_plan(const struct model_file *mf, const struct engine_params *p, char *buf, size_t cap,
                char err[256]);

/* Bytes of weights one forward pass reads (all matrices incl. the output head). */
uint64_t engine_weight_bytes(const struct engine *e);
/* A human-readable description of where the layers live and run (the device_map and the step plan), or
 * "cpu: all layers". */
const char *engine_placement(const struct engine *e);

#endif
