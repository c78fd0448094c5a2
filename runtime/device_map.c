/* device_map — the placement planner (see device_map.h). */
#include "runtime/device_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

int device_map_plan(const struct device_map_input *in, struct device_map *out, char err[256])
{
    memset(out, 0, sizeof *out);
    const int L = in->n_layers;
    if (L <= 0 || in->gpu_layers < -1 || in->gpu_layers > L || in->n_slots < 0) {
        snprintf(err, 256, "invalid placement request (layers %d, --gpu-layers %d)", L, in->gpu_layers);
        return FERRY_ERR_INVALID;
    }
    const uint64_t lb = in->layer_bytes, base = in->fixed_bytes + in->head_bytes;
    int k = in->n_slots ? in->n_slots : 2;
    if (k > L) k = L;
    if (k < 2 && L >= 2) k = 2;
    out->bytes_minimum = base + (uint64_t)k * lb;
    if (L == 1 || (uint64_t)L * lb <= (uint64_t)k * lb) out->bytes_minimum = base + (uint64_t)L * lb;

    int resident;
    if (in->gpu_layers >= 0) {
        resident = in->gpu_layers;
    } else if (in->budget >= base + (uint64_t)L * lb) {
        resident = L;
    } else {
        uint64_t avail = in->budget > base + (uint64_t)k * lb ? in->budget - base - (uint64_t)k * lb : 0;
        resident = (int)(avail / (lb ? lb : 1));
        if (resident > L - 1) resident = L - 1;
    }
    int streamed = L - resident;
    int slots = streamed ? (k < streamed ? k : streamed) : 0;
    if (streamed && slots < 2 && L >= 2) slots = 2;
    uint64_t total = base + (uint64_t)resident * lb + (uint64_t)slots * lb;
    if (total > in->budget) {
        snprintf(err, 256,
                 "GPU budget %.2f GiB is too small: this plan needs %.2f GiB (%d resident layers, %d slots of "
                 "%.1f MiB, %.2f GiB KV/activations/workspace, %.2f GiB output head); the minimum is %.2f GiB",
                 in->budget / GIB, total / GIB, resident, slots, lb / 1048576.0, in->fixed_bytes / GIB,
                 in->head_bytes / GIB, out->bytes_minimum / GIB);
        return FERRY_ERR_DEVICE_MEM;
    }
    out->where = malloc((size_t)L * sizeof *out->where);
    if (!out->where) return FERRY_ERR_NOMEM;
    /* Bresenham spread: layer i streams when the running share of streamed layers steps up at i. */
    for (int i = 0; i < L; i++)
        out->where[i] = ((int64_t)(i + 1) * streamed / L > (int64_t)i * streamed / L) ? PLACEMENT_STREAM
                                                                                       : PLACEMENT_GPU;
    out->n_layers = L;
    out->n_resident = resident;
    out->n_streamed = streamed;
    out->n_slots = slots;
    out->layer_bytes = lb;
    out->bytes_total = total;
    double t_link = in->h2d_bytes_per_s > 0 ? (double)streamed * lb / in->h2d_bytes_per_s : 0;
    double t_hbm = in->hbm_bytes_per_s > 0 ? ((double)L * lb + in->head_bytes) / in->hbm_bytes_per_s : 0;
    out->predicted_step_s = t_link > t_hbm ? t_link : t_hbm;
    return FERRY_OK;
}

void device_map_free(struct device_map *m)
{
    if (!m) return;
    free(m->where);
    memset(m, 0, sizeof *m);
}

int device_map_format(const struct device_map *m, char *buf, size_t cap)
{
    size_t n = 0;
#define EMIT(...)                                                                                            \
    do {                                                                                                     \
        int w_ = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, __VA_ARGS__);                    \
        if (w_ > 0) n += (size_t)w_;                                                                         \
    } while (0)
    EMIT("device_map: %d layers resident, %d streamed through %d slots of %.1f MiB; %.2f GiB in use "
         "(minimum %.2f GiB); predicted batch-1 step %.2f ms\n",
         m->n_resident, m->n_streamed, m->n_slots, m->layer_bytes / 1048576.0, m->bytes_total / GIB,
         m->bytes_minimum / GIB, m->predicted_step_s * 1e3);
    for (int i = 0; i < m->n_layers;) {
        int j = i;
        while (j + 1 < m->n_layers && m->where[j + 1] == m->where[i]) j++;
        EMIT("  layers %3d-%-3d %s\n", i, j, m->where[i] == PLACEMENT_GPU ? "gpu" : "stream");
        i = j + 1;
    }
#undef EMIT
    return (int)n;
}
