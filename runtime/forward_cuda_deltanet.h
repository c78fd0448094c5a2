/* forward_cuda_deltanet — the gated DeltaNet layers (LOP_DELTANET) of the CUDA backend between their
 * products: every slot's state on the device, where each recurrent layer's matrices sit in its packed block,
 * and one layer's ops from the in-products to the out-product's input.
 *
 * Device memory (cuda_deltanet_bytes, carved by the caller from its arena): each slot's state of every
 * recurrent layer, laid out as runtime/seq_state.h lays out a slot on the host (n_seqs, n_rec_layers, conv
 * (conv_kernel - 1, conv_dim) | rule (n_v_heads, head_k, head_v)) f32, so a slot is one contiguous copy
 * either way; each recurrent layer's small f32 tensors (convolution weights, dt bias, A, norm), uploaded at
 * init; and a scratch for T rows (the convolution's output, the plan). These stay on the device whatever the
 * layer's placement. The five matrices (q|k|v, z, b, a in-products and the out-product) are part of the
 * layer's packed block instead (struct cuda_dn_block): resident with a resident layer, streamed through the
 * ring as two pieces with a host layer, so the caller hands them to the products as views. cuda_deltanet_run
 * is forward_cpu's deltanet() after its four products and before its out-product, on the device, for a
 * step's rows of any sequences (kernels/cuda/deltanet.h): gates, convolution with the slot's rolling state,
 * L2-normed q and k, the gated delta rule, the gated RMSNorm. A sequence whose first row in the step is
 * position 0 starts from a zero state. Steps of up to 16 rows run the rule token by token, larger ones by
 * chunks of 16 tokens (FERRY_DN_RULE=token or chunk, read at init, forces one). Everything is enqueued on the
 * caller's stream and allocates nothing after init. A recurrent layer the host's cores compute (a CPU-only
 * host layer, device_map.h) keeps its state in host memory (the engine's seq_state) instead: the _host forms
 * leave such layers out (no state, no small tensors here; run refuses them), and download and upload then
 * move only the device's layers, each into its place in seq_state's slot block, leaving the host's layers'
 * there as they are. Usage: cuda_deltanet_bytes[_host] → init[_host] → (run per recurrent layer and step;
 * reset, download, upload per slot)* → free.
 */
#ifndef FERRY_FORWARD_CUDA_DELTANET_H
#define FERRY_FORWARD_CUDA_DELTANET_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "runtime/layer.h"
#include "runtime/model.h"

struct cuda_deltanet;

/* Device bytes for n_seqs slots and steps of at most T rows; 0 for a model without recurrent layers. */
size_t cuda_deltanet_bytes(const struct model *m, int T, int n_seqs);

/* mem: cuda_deltanet_bytes(m, T, n_seqs) bytes of device memory, 256-byte aligned, owned by the caller.
 * Uploads the layers' small tensors and zeroes every state (synchronously). FERRY_ERR_UNSUPPORTED (naming the
 * limit) for a shape the kernels do not run, FERRY_ERR_INVALID for missing small tensors or bad sizes (the
 * matrices are the caller's: cuda_deltanet_check). A model without recurrent layers gives *out = NULL and
 * FERRY_OK. */
int cuda_deltanet_init(struct cuda_deltanet **out, const struct model *m, int T, int n_seqs, void *mem,
                       char err[256]);
/* The same without the state and small tensors of the recurrent layers marked in host ((n_layers), 1: its
 * state lives in host memory; NULL: none is), which cuda_deltanet_run then refuses. */
size_t cuda_deltanet_bytes_host(const struct model *m, int T, int n_seqs, const uint8_t *host);
int cuda_deltanet_init_host(struct cuda_deltanet **out, const struct model *m, int T, int n_seqs,
                            const uint8_t *host, void *mem, char err[256]);
/* What one recurrent layer adds to cuda_deltanet_bytes_host when its state is on the device: n_seqs slots'
 * state and its small tensors (0 without recurrent layers). The planner counts it with the layer. */
size_t cuda_deltanet_layer_bytes(const struct model *m, int n_seqs);
/* The rest: the rows' scratch for steps of T rows. cuda_deltanet_bytes_host is at most this, plus
 * cuda_deltanet_layer_bytes for each recurrent layer of the device, plus 255 (the state's alignment). */
size_t cuda_deltanet_scratch_bytes(const struct model *m, int T);
void cuda_deltanet_free(struct cuda_deltanet *dn); /* accepts NULL; the device memory stays the caller's */

/* FERRY_OK when the kernels run the model's linear-attention shape and every recurrent layer has its small
 * tensors and its five matrices, of the shapes hp gives (a grouped model's packed q|k|v|z and b|a included)
 * and of types the CUDA products read; else the reason in err (as cuda_deltanet_init). No device needed. */
int cuda_deltanet_check(const struct model *m, char err[256]);

/* A recurrent layer's matrices in its packed block (runtime/layer.h; forward_cuda.c places them between the
 * matrix groups and the tail): the in-products q|k|v, z, b, a one after another, each 256-byte aligned, as
 * one piece, then the out-product, 256-byte aligned, as another. A grouped model's absent z or a takes no
 * bytes. Offsets count from the block's start; all 0 in a layer that is not recurrent. */
enum { CUDA_DN_QKV, CUDA_DN_Z, CUDA_DN_B, CUDA_DN_A, CUDA_DN_OUT, CUDA_DN_MATS };
struct cuda_dn_block {
    size_t off[CUDA_DN_MATS];  /* each matrix's offset */
    size_t in_off, in_bytes;   /* the in-products' piece (in_off = at) */
    size_t out_off, out_bytes; /* the out-product's piece */
    size_t bytes;              /* from at to the end of the out piece, rounded up to 256 */
};
/* Layer l's matrices laid out from offset `at` (256-byte aligned) of its block, from the model's shapes and
 * stored types (no data read). */
void cuda_deltanet_block_of(const struct model *m, int l, size_t at, struct cuda_dn_block *b);
/* Copies layer l's matrices, as stored, to block + their offsets (host memory; b from block_of). */
void cuda_deltanet_block_pack(const struct model *m, int l, const struct cuda_dn_block *b, void *block);
/* Points w's five matrix views at their bytes: the in-products' into the in piece at `in`, the out-product's
 * into the out piece at `out` (device or host addresses); a NULL piece leaves its views as they are, an
 * absent matrix gets a view with NULL data. Shapes and types are the model's. */
void cuda_deltanet_block_place(const struct model *m, int l, const struct cuda_dn_block *b, const void *in,
                               const void *out, struct layer_deltanet *w);

/* Bytes of one slot's state of all recurrent layers, the device's and the host's: seq_state's slot block (its
 * data or ckpt + seq * n_layers * (conv_floats + rec_floats)), 0 for NULL. */
size_t cuda_deltanet_slot_bytes(const struct cuda_deltanet *dn);
/* Zeroes slot seq's state in every recurrent layer of the device. */
int cuda_deltanet_reset(struct cuda_deltanet *dn, int seq, cudaStream_t cs);
/* Copies slot seq's state of the device's recurrent layers to their places in host (a slot block,
 * cuda_deltanet_slot_bytes) or from them; asynchronous on cs (the host memory must stay valid until cs
 * reaches the copy; pinned memory lets it overlap). */
int cuda_deltanet_download(const struct cuda_deltanet *dn, int seq, float *host, cudaStream_t cs);
int cuda_deltanet_upload(struct cuda_deltanet *dn, int seq, const float *host, cudaStream_t cs);

/* The in-products of n rows, device memory, each row i at its pointer + i * its ld: q|k|v (conv_dim), z
 * (inner), b and a (n_v_heads each), raw (before the gates). One stacked row with the four side by side is
 * the same with the three later pointers offset into it. */
struct cuda_deltanet_in {
    const float *qkv, *z, *b, *a;
    int ld_qkv, ld_z, ld_b, ld_a;
};

/* Qwen3-Next's packed in-products apart (a grouped model's; runtime/forward_cpu.c's dn_unpack): in and packed
 * hold n rows ld floats apart (ld >= conv_dim + inner + 2 n_v_heads) in the same columns, q|k|v (conv_dim),
 * z (inner), b, a (n_v_heads each); with qkvz, packed's first conv_dim + inner columns hold per key head its
 * q, k, its value heads' v, then their z, which go to in's q|k|v and z columns; with ba, packed's last 2
 * n_v_heads hold per key head its value heads' b then their a, which go to in's b and a. Matrices are packed
 * where cuda_deltanet_block_place gives no z (qkvz) or no a (ba). */
int cuda_deltanet_unpack(struct cuda_deltanet *dn, float *in, int ld, const float *packed, int qkvz, int ba,
                         int n, cudaStream_t cs);

/* out (n, inner) contiguous, device = rmsnorm(o) · norm · silu(z), o the gated delta rule's output of layer
 * l's rows over their slots' state (advanced by them), seq and pos (n) on the device (the step's rows: those
 * of one sequence are its consecutive positions, in row order). out must not overlap the inputs. h_seq: the
 * same seq on the host, checked (every one in [0, n_seqs)) when not NULL; a device seq outside that range
 * leaves its rows unwritten. */
int cuda_deltanet_run(struct cuda_deltanet *dn, int l, float *out, const struct cuda_deltanet_in *in, int n,
                      const int32_t *d_seq, const int32_t *d_pos, const int32_t *h_seq, cudaStream_t cs);

#endif
