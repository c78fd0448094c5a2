/* device_split — the plan for several GPUs of one host: the model's layers, in order, split into contiguous
 * ranges, one per device (a pipeline: a step's rows run through device 0's layers, then their hidden state,
 * hidden_bytes a row, crosses to device 1 by a peer copy, and so on; the last device holds the output head,
 * and the embedding rows, gathered on the host as on one device, cross to the first). Pure arithmetic over
 * byte counts, like device_map (device_map.h): each device gets a device_map of its own range under its own
 * budget, made by device_map_plan from a device_map_input of that range, so every device's budget is fixed
 * (its own activations and workspaces: each runs every row of a step) + its layers' KV + head (the last only)
 * + its resident layers + its ring + the page tables of its host layers. A host layer (one that fits nowhere)
 * lives in pinned host memory and is streamed to, or computed by the host's cores for, the device whose range
 * holds it. Each layer's K/V lives with its layer; every sequence spans every layer, so every device's pool
 * holds the same positions: kv_tokens, what the tightest device allows (each device is planned with the
 * model's KV bounds, the least of their pools is taken, and the devices that had more are planned again with
 * the pool held at it, their spare bytes going to layers). Expert models are split the same way: every
 * layer's block resident on its device, and on each device the experts of the first of its layers in host
 * memory as few as its budget needs (or those of the model's first cpu_moe layers), with the staging area and
 * the expert cache on each device that has host experts (forward_cuda.c's plan for one device, per range).
 * The split: a first guess gives each device layers in proportion to what its budget holds beside its fixed
 * bytes, then each boundary in turn moves to its best place until none moves; a split is better when every
 * device fits (else: less missing), then when fewer layer bytes live in host memory, then with more KV
 * positions, then with the fullest device less full. With one device the result is device_map_plan's for the
 * input and that budget, byte for byte (expert models: the one-device loop above). Several devices keep no KV
 * extension in host memory (every position on the devices) and take gpu_layers -1 only.
 * Not built yet: running across devices (the peer copies, one backend per device); this plans and reports.
 * Usage: in = {.model = <the one-device input>, .n_devices = 2, .budget = {20 GiB, 12 GiB}, ...};
 * device_split_plan(&in, &s, err); device_split_format(&s, buf, cap); device_split_free(&s).
 */
#ifndef FERRY_DEVICE_SPLIT_H
#define FERRY_DEVICE_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/device_map.h"

#define DEVICE_SPLIT_MAX 16 /* devices of one host a plan may name */

struct device_split_input {
    /* The whole model as device_map_plan takes it for one device (its budget unused). When its KV pool is
     * sized by the caller (kv_token_bytes 0), kv_fixed_bytes of its fixed_bytes are that pool. */
    struct device_map_input model;
    uint64_t kv_fixed_bytes;
    const uint8_t *kv_layer;  /* (n_layers) 1: the layer has planes in the main KV pool; NULL: every layer */
    const uint8_t *swa_layer; /* (n_layers) 1: its planes are in the window pool (kv_swa_bytes); NULL: even */
    /* Expert models (NULL: dense): each layer's experts' device bytes, resident with their layer;
     * model.layer_sizes then holds the blocks without them. */
    const uint64_t *expert_bytes;
    uint64_t expert_stage_bytes; /* staging area host experts stream through (per device that has some) */
    int cpu_moe;                 /* experts of the model's first N layers in host memory; -1: as few as fit */
    int64_t expert_cache;       /* device bytes of the expert cache per device with host experts; -1: what the
                                   budget leaves (with cpu_moe -1); 0: none */
    uint64_t expert_slot_bytes; /* the cache is whole slots of this many bytes (0: any size) */
    int n_devices;
    int ordinal[DEVICE_SPLIT_MAX];     /* CUDA ordinals, for messages and reports */
    uint64_t budget[DEVICE_SPLIT_MAX]; /* device bytes each may use */
    uint64_t hidden_bytes;             /* one row's hidden state crossing to the next device (dim x 4) */
    double peer_bytes_per_s;           /* device→device peer copies (0: not predicted) */
};

struct device_split_part {
    int ordinal;
    uint64_t budget;
    int first, end;        /* its layers: [first, end) of the model's */
    struct device_map map; /* its range's plan; map.where[i] is layer first + i's */
    int cpu_moe;           /* expert models: of its layers, the first cpu_moe's experts in host memory */
    uint64_t host_bytes;   /* its layers' bytes in host memory (experts included) */
};

struct device_split {
    int n_devices;
    struct device_split_part part[DEVICE_SPLIT_MAX];
    int64_t kv_tokens;       /* every device's pool's positions (0: the pool was sized by the caller) */
    double peer_s;           /* batch-1: the hidden state's copies between devices */
    double predicted_step_s; /* batch-1 decode step: the devices' own predictions in turn, plus peer_s */
};

/* Fills out (free with device_split_free). FERRY_ERR_INVALID for a bad request (no device, more than
 * DEVICE_SPLIT_MAX or than layers, a zero budget, gpu_layers with several devices); FERRY_ERR_DEVICE_MEM when
 * no split fits, err naming the device (its ordinal), its layers and its minimum; device_map_plan's other
 * errors. */
int device_split_plan(const struct device_split_input *in, struct device_split *out, char err[256]);
void device_split_free(struct device_split *s);
/* A summary line, then per device its range, resident and host layers, KV positions and bytes, ring, head,
 * bytes against its budget and its predicted step, and the runs of layers (model numbering). Returns the
 * length written (snprintf semantics). */
int device_split_format(const struct device_split *s, char *buf, size_t cap);

#endif
