/* test_gpu_vram — the device memory an engine takes stays within --gpu-memory.
 *
 * What the engine took is measured as the engine reports it (ferry_vram_used_bytes: free device memory when
 * its CUDA backend starts minus when it is ready, cudaMemGetInfo), against the budget with no tolerance: the
 * plan counts the CUDA runtime's and cuBLAS's own memory, the arena's rounding to whole device pages and the
 * page tables that map pinned host memory into the device (2 MiB per GiB of host layers; runtime/NOTES.md).
 * Skips without a CUDA device (CI).
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels/core/status.h"
#include "kernels/cuda/ops.h"
#include "runtime/engine.h"

/* A Llama of random f16 weights, 103 MB a layer (dim 2048, ffn 5632): 24 layers, 2.3 GiB. */
static struct llm_hparams wide_llama(void)
{
    struct llm_hparams hp = {.n_vocab = 1000,
                             .dim = 2048,
                             .n_layers = 24,
                             .n_heads = 16,
                             .n_kv_heads = 16,
                             .head_dim = 128,
                             .ffn_dim = 5632,
                             .ctx_train = 1024,
                             .norm_eps = 1e-5f,
                             .rope_theta = 10000.0f,
                             .rope_dim = 128,
                             .rope_style = ROPE_STYLE_HALF};
    snprintf(hp.arch, sizeof hp.arch, "llama");
    return hp;
}

/* Under budgets that leave most layers in host memory (2 GiB of them pinned), in every placement, and with
 * all of them resident: never a byte over. */
Test(gpu_vram, engine_stays_within_the_budget)
{
    if (kern_cuda_device_count() <= 0) cr_skip_test("no CUDA device: the device memory test needs one");
    const struct llm_hparams hp = wide_llama();
    const struct {
        int64_t budget;
        enum engine_placement placement;
    } runs[] = {{512ll << 20, ENGINE_PLACEMENT_AUTO},
                {512ll << 20, ENGINE_PLACEMENT_STREAM},
                {700ll << 20, ENGINE_PLACEMENT_CPU},
                {1536ll << 20, ENGINE_PLACEMENT_AUTO},
                {4096ll << 20, ENGINE_PLACEMENT_AUTO}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        struct engine_params p = engine_default_params();
        p.backend = ENGINE_BACKEND_CUDA;
        p.ctx_size = 512;
        p.n_seqs = 2;
        p.gpu_memory = runs[i].budget;
        p.placement = runs[i].placement;
        struct engine *e = NULL;
        char err[256] = "";
        cr_assert_eq(engine_init_synthetic(&e, &hp, DTYPE_F16, &p, err), FERRY_OK, "budget %lld MiB: %s",
                     (long long)(runs[i].budget >> 20), err);
        struct engine_stats st;
        engine_get_stats(e, &st);
        cr_log_info("budget %lld MiB, placement %d: %d resident, %d in host memory, planned %.1f MiB, took "
                    "%.1f MiB",
                    (long long)(runs[i].budget >> 20), (int)runs[i].placement, st.n_resident, st.n_streamed,
                    st.vram_planned / 1048576.0, st.vram_used / 1048576.0);
        cr_expect_leq(st.vram_planned, (uint64_t)p.gpu_memory);
        cr_expect_leq(st.vram_used, (uint64_t)p.gpu_memory, "took %.1f MiB for a budget of %lld MiB",
                      st.vram_used / 1048576.0, (long long)(runs[i].budget >> 20));
        engine_free(e);
    }
}
