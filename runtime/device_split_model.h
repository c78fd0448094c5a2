/* device_split_model — the plan for several GPUs (device_split.h) of a model file, for `ferry inspect`.
 *
 * device_split takes the model as the CUDA backend's one-device planner does (a device_map_input, and for an
 * expert model each layer's experts and the staging area). Those sizes come from the backend's own plans,
 * computed without a device (forward_cuda_plan_offline): each layer's block is layer.h's layout of the layer
 * as stored (the backend packs matrices in their stored type), and plans with an unbounded budget give the
 * rest (every layer resident beside the whole KV pool: its bytes give one position's; the prediction at 1
 * byte/s gives the bytes a step reads, so the head's and, as the experts of one more layer move to host
 * memory, that layer's experts'; what the plan holds beyond them is the fixed bytes, and with the first
 * layer's experts in host memory, the staging area). That input is then checked against the backend: planned
 * for one device at each device's budget it must be the backend's plan exactly (resident layers, ring, KV
 * positions, bytes, host experts, or the same refusal), else the model is refused rather than planned from
 * sizes that are not the backend's. The expert cache is left out of these plans (--expert-cache 0: its slots
 * are the backend's arithmetic), and models with recurrent, sliding-window, K/V-sharing layers or per-layer
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
