/* engine_cuda_params — the CUDA backend's parameters for an engine's (runtime/engine.h). In a file of its own
 * so that planners beside the engine (runtime/device_split_model.c) take them without the engine's code. */
#include <string.h>

#include "runtime/engine.h"

/* Where a GPU engine's recurrent host layers run (forward_cuda_params.recurrent_stream): on the host's cores
 * only where asked for (--placement cpu, or a forced plan that computes layers on the CPU); streamed
 * otherwise, --placement auto included: the host's cores computing them has passed its CPU tests
 * (tests/runtime/test_dn_checkpoints.c) but not yet its GPU ones (tests/runtime/test_gpu_dn_stream.c), where
 * streaming them has. */
static int recurrent_stream_of(const struct engine_params *p)
{
    return p->plan_override ? strchr(p->plan_override, 'c') == NULL : p->placement != ENGINE_PLACEMENT_CPU;
}

/* kv_auto: the KV pool is sized to the budget, keeping room for n_seqs sequences of up to 1024 positions
 * before layers are made resident, and never less than one full-length sequence unless the host's cores
 * attend to its extension (device_map.h: KV_DEVICE_POSITIONS). */
struct forward_cuda_params engine_cuda_params(const struct engine_params *p, int kv_auto)
{
    const int64_t ctx = p->ctx_size, short_ctx = ctx < 1024 ? ctx : 1024;
    return (struct forward_cuda_params){.max_tokens = p->max_batch_tokens,
                                        .gpu_memory = p->gpu_memory,
                                        .reserve_vram = p->reserve_vram,
                                        .gpu_layers = p->gpu_layers,
                                        .cpu_moe = p->cpu_moe,
                                        .expert_cache = p->expert_cache,
                                        .cpu_int8 = p->cpu_int8 > 0,
                                        .ring_layers = p->ring_layers,
                                        .no_ring = p->placement == ENGINE_PLACEMENT_CPU,
                                        .force_where = p->plan_override,
                                        .kv_auto = kv_auto,
                                        .kv_tokens_max = (int64_t)p->n_seqs * ctx,
                                        .kv_tokens_floor = (int64_t)p->n_seqs * short_ctx,
                                        .kv_tokens_min = ctx,
                                        .kv_q8 = p->kv_type == KV_Q8_0,
                                        .recurrent_stream = recurrent_stream_of(p)};
}
