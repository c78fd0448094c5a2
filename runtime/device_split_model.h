/* device_split_model — the plan for several GPUs (device_split.h) of a model file, for `ferry inspect`.
 *
 * device_split takes the model as the CUDA backend's one-device planner does: the backend's own planner input
 * (forward_cuda_plan_input: each layer's block, the head, the fixed bytes, one position's K/V, the KV bounds,
 * and for an expert model each layer's experts and the staging area), computed without a device. That input
 * is then checked against the backend: planned for one device at each device's budget it must be the
 * backend's plan exactly (resident layers, ring, KV positions and extension, bytes, host experts, or the same
 * refusal), else the model is refused rather than planned from sizes that are not the backend's. With one
 * device the plan is the backend's, KV extension included: the backend caps that at half the host memory
 * available now (/proc/meminfo), so a plan for one device, like the backend's, depends on the host it is made
 * on; several devices keep none. The expert cache is left out of these plans (--expert-cache 0: its slots are
 * the backend's arithmetic), and models with recurrent, sliding-window, K/V-sharing layers or per-layer
 * inputs are refused for now. FERRY_ERR_UNSUPPORTED in a build without CUDA (as engine_plan).
 */
#ifndef FERRY_DEVICE_SPLIT_MODEL_H
#define FERRY_DEVICE_SPLIT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/engine.h"
#include "weights/model_file.h"

/* The split of the model of mf under p (its gpu_memory unused) over n devices (ordinal[i], budget[i] bytes),
 * as device_split_format's text into buf. err says why not on failure. */
int device_split_model_plan(const struct model_file *mf, const struct engine_params *p, int n,
                            const int *ordinal, const uint64_t *budget, char *buf, size_t cap, char err[256]);

#endif
