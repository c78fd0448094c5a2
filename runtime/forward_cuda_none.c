/* forward_cuda_none — the CUDA backend's entry points in a build without CUDA: no device, every call refused
 * (see forward_cuda.h). Keeps the engine free of build conditionals. */
#include "runtime/forward_cuda.h"

#include <stdio.h>

#include "kernels/core/status.h"

int forward_cuda_devices(void)
{
    return 0;
}

const char *forward_cuda_device_lacks(const struct llm_hparams *hp)
{
    (void)hp;
    return NULL;
}

int forward_cuda_init(struct backend **out, const struct model *m, struct kv_cache *kv,
                      const struct forward_cuda_params *p, char err[256])
{
    (void)m, (void)kv, (void)p;
    *out = NULL;
    snprintf(err, 256, "this build of ferry has no CUDA backend (nvcc was not found at build time)");
    return FERRY_ERR_UNSUPPORTED;
}

const struct device_map *forward_cuda_map(const struct backend *be)
{
    (void)be;
    return NULL;
}

uint64_t forward_cuda_layer_bytes(const struct backend *be, int l)
{
    (void)be, (void)l;
    return 0;
}

void forward_cuda_layer_pieces(const struct backend *be, int l, uint64_t out[LAYER_N_MATS])
{
    (void)be, (void)l;
    for (int i = 0; i < LAYER_N_MATS; i++) out[i] = 0;
}

int forward_cuda_host_weights(const struct backend *be, int l, struct layer_weights *w)
{
    (void)be, (void)l, (void)w;
    return 0;
}

void *forward_cuda_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx, (void)bytes;
    return NULL;
}

void forward_cuda_host_free(void *ctx, void *p)
{
    (void)ctx, (void)p;
}

int forward_cuda_state_get(struct backend *be, int seq, float *host)
{
    (void)be, (void)seq, (void)host;
    return FERRY_ERR_UNSUPPORTED;
}

int forward_cuda_state_put(struct backend *be, int seq, const float *host)
{
    (void)be, (void)seq, (void)host;
    return FERRY_ERR_UNSUPPORTED;
}

int forward_cuda_time_layer(struct backend *be, int l, int n_tokens, double *seconds)
{
    (void)be, (void)l, (void)n_tokens;
    *seconds = 0;
    return FERRY_ERR_UNSUPPORTED;
}

int forward_cuda_time_exchange(struct backend *be, int n_tokens, double *seconds)
{
    (void)be, (void)n_tokens;
    *seconds = 0;
    return FERRY_ERR_UNSUPPORTED;
}

int forward_cuda_link_load_begin(struct backend *be, double seconds)
{
    (void)be, (void)seconds;
    return FERRY_ERR_UNSUPPORTED;
}

double forward_cuda_link_load_end(struct backend *be)
{
    (void)be;
    return 0;
}

int forward_cuda_map_variant(const struct backend *be, int no_ring, int fewer_resident,
                             struct device_map *out, char err[256])
{
    (void)be, (void)no_ring, (void)fewer_resident, (void)out;
    snprintf(err, 256, "this build has no CUDA backend");
    return FERRY_ERR_UNSUPPORTED;
}

int forward_cuda_plan_offline(const struct model *m, const struct kv_cache *kv,
                              const struct forward_cuda_params *p, double h2d, double hbm,
                              struct device_map *out, char err[256])
{
    (void)m, (void)kv, (void)p, (void)h2d, (void)hbm, (void)out;
    snprintf(err, 256, "this build has no CUDA backend");
    return FERRY_ERR_UNSUPPORTED;
}

int forward_cuda_plan_input(const struct model *m, const struct kv_cache *kv,
                            const struct forward_cuda_params *p, double h2d, double hbm,
                            uint64_t *layer_sizes, uint64_t *expert_bytes, uint64_t *stage_bytes,
                            struct device_map_input *out, char err[256])
{
    (void)m, (void)kv, (void)p, (void)h2d, (void)hbm, (void)layer_sizes, (void)expert_bytes,
        (void)stage_bytes;
    (void)out;
    snprintf(err, 256, "this build has no CUDA backend");
    return FERRY_ERR_UNSUPPORTED;
}

void forward_cuda_measure_bandwidth(double *h2d, double *d2d)
{
    *h2d = *d2d = 0;
}
