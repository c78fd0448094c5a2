/* cli_inspect — `ferry inspect --model PATH [--json]`: the model's metadata, its tensors by type, its
 * tokenizer and chat template, and the placement the engine would use. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/device_split_model.h"
#include "runtime/engine.h"
#include "quant/mix.h"
#include "runtime/seq_state.h"
#include "runtime/synthetic.h"
#include "runtime/tokenizer.h"
#include "server/cli.h"
#include "server/options.h"
#include "weights/arch/arch.h"

static void inspect_usage(FILE *f)
{
    fprintf(f,
            "usage: ferry inspect (--model PATH | --synthetic NAME) [--gpus N,N] [--gpu-memory SIZE "
            "[--gpu-layers N] "
            "[--ctx-size N] "
            "[--parallel N]\n"
            "                     [--kv-type f16|q8_0]] [--ctx-checkpoints N] [--json]\n\n"
            "  --model PATH        GGUF file or Hugging Face directory (env FERRY_MODEL)\n"
            "  --synthetic NAME    a shape of ferry bench --synthetic instead (no file, nothing allocated\n"
            "                      beyond its norms and routers): its tensors and the plan for --gpu-memory\n"
            "  --gpu-memory SIZE   show the device_map the CUDA backend would choose for this budget "
            "(e.g. 4GiB)\n"
            "                      (several devices: one size for all, or one per device of --gpus)\n"
            "  --gpus N,N          plan for these CUDA devices (ordinals): the layers split into one\n"
            "                      range per device, each planned under its budget, the KV positions the\n"
            "                      same on all (running across several GPUs is not implemented yet)\n"
            "  --gpu-layers N      resident layers (default: as many as fit)\n"
            "  --cpu-moe N         expert models: the experts of the first N layers in host memory\n"
            "  --expert-cache SIZE expert models: device memory for a cache of the host layers' most used\n"
            "                      experts (default auto: what the budget leaves; 0: none)\n"
            "  --ctx-size N        positions per sequence (default: the model's, at most 4096)\n"
            "  --parallel N        sequences (default 1)\n"
            "  --kv-type T         the KV pool's element type: f16 (default) or q8_0\n"
            "  --swa-full          sliding-window layers keep every position (KV bytes and the plan)\n"
            "  --ctx-checkpoints N recurrent (gated DeltaNet) models: checkpoints of its state a slot keeps\n"
            "                      for the prompt cache (default 32), counted in its memory\n"
            "  --json              machine-readable output\n"
            "  --families          list the supported model families (a Markdown table) and exit\n");
}

static const char *rope_style_name(enum rope_style s)
{
    return s == ROPE_STYLE_HALF ? "half" : "interleaved";
}
static const char *rope_scaling_name(enum rope_scaling_type t)
{
    return t == ROPE_SCALING_YARN       ? "yarn"
           : t == ROPE_SCALING_LLAMA3   ? "llama3"
           : t == ROPE_SCALING_LINEAR   ? "linear"
           : t == ROPE_SCALING_LONGROPE ? "longrope"
                                        : "none";
}

/* The registry (weights/arch/) as the README's table of families. */
static void print_families(void)
{
    printf("| family | GGUF `general.architecture` | Hugging Face class | sizes | what is special |\n");
    printf("|---|---|---|---|---|\n");
    for (int i = 0; arch_family_at(i); i++) {
        const struct arch_family *f = arch_family_at(i);
        printf("| %s | ", f->title);
        for (int j = 0; f->gguf_names[j]; j++) printf("%s`%s`", j ? ", " : "", f->gguf_names[j]);
        printf(" | ");
        for (int j = 0; f->hf_classes[j]; j++) printf("%s`%s`", j ? ", " : "", f->hf_classes[j]);
        printf(" | %s | %s |\n", f->sizes, f->notes);
    }
}

int cli_inspect_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},    {"synthetic", required_argument, 0, 's'},
        {"json", no_argument, 0, 'j'},           {"gpu-memory", required_argument, 0, 'g'},
        {"gpus", required_argument, 0, 'G'},     {"gpu-layers", required_argument, 0, 'l'},
        {"cpu-moe", required_argument, 0, 'E'},  {"expert-cache", required_argument, 0, 'X'},
        {"ctx-size", required_argument, 0, 'c'}, {"parallel", required_argument, 0, 'p'},
        {"kv-type", required_argument, 0, 'k'},  {"ctx-checkpoints", required_argument, 0, 'C'},
        {"families", no_argument, 0, 'F'},       {"swa-full", no_argument, 0, 'W'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    const char *model = getenv("FERRY_MODEL"), *synthetic = NULL;
    int as_json = 0, c;
    struct engine_params ep = engine_default_params();
    struct opt_gpus gpus = opt_gpus_default();
    char gerr[256] = "";
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:jh", longopts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 's':
            synthetic = optarg;
            break;
        case 'j':
            as_json = 1;
            break;
        case 'g': {
            const int list = strchr(optarg, ',') != NULL;
            int bad = opt_gpus_parse_memory(&gpus, optarg, gerr);
            for (int d = 0; !bad && d < gpus.n_memory; d++)
                if ((bad = gpus.memory[d] <= 0)) snprintf(gerr, sizeof gerr, "every size must be above 0");
            if (bad) {
                fprintf(stderr, "ferry inspect: invalid --gpu-memory '%s'%s%s\n", optarg,
                        list && *gerr ? ": " : "", list ? gerr : "");
                return 2;
            }
            ep.gpu_memory = gpus.memory[0];
            break;
        }
        case 'G':
            if (opt_gpus_parse(&gpus, optarg, gerr)) {
                fprintf(stderr, "ferry inspect: --gpus: %s\n", gerr);
                return 2;
            }
            break;
        case 'l':
            ep.gpu_layers = atoi(optarg);
            break;
        case 'E':
            ep.cpu_moe = atoi(optarg);
            break;
        case 'X':
            if (opt_parse_size_auto(optarg, &ep.expert_cache)) {
                fprintf(stderr, "ferry inspect: invalid --expert-cache '%s'\n", optarg);
                return 2;
            }
            break;
        case 'c':
            ep.ctx_size = atoi(optarg);
            break;
        case 'p':
            ep.n_seqs = atoi(optarg);
            break;
        case 'k':
            if ((ep.kv_type = engine_kv_type_parse(optarg)) < 0) {
                fprintf(stderr, "ferry inspect: --kv-type must be one of f16|f32|q8_0\n");
                return 2;
            }
            break;
        case 'C':
            ep.ctx_checkpoints = atoi(optarg);
            if (ep.ctx_checkpoints < 0 || ep.ctx_checkpoints > 4096) {
                fprintf(stderr, "ferry inspect: --ctx-checkpoints must be in [0, 4096]\n");
                return 2;
            }
            break;
        case 'W':
            ep.swa_full = 1;
            break;
        case 'F':
            print_families();
            return 0;
        case 'h':
            inspect_usage(stdout);
            return 0;
        default:
            inspect_usage(stderr);
            return 2;
        }
    }
    if ((!model && !synthetic) || optind < argc) {
        inspect_usage(stderr);
        return 2;
    }
    if (opt_gpus_check(&gpus, gerr)) {
        fprintf(stderr, "ferry inspect: %s\n", gerr);
        return 2;
    }
    if (gpus.n > 1 && ep.gpu_memory <= 0) {
        fprintf(
            stderr,
            "ferry inspect: --gpus names %d devices: give --gpu-memory, one size for every device or one per "
            "device\n",
            gpus.n);
        return 2;
    }
    cli_log_init(LOG_LEVEL_WARN);
    struct model_file *mf = NULL;
    if (synthetic) {
        const struct synthetic_shape *sh = synthetic_shape_find(synthetic);
        if (!sh) {
            fprintf(stderr, "ferry inspect: unknown synthetic model '%s' (%s)\n", synthetic,
                    synthetic_shape_names());
            return 2;
        }
        struct llm_hparams shp;
        int ftype;
        synthetic_hparams(sh, &shp, &ftype);
        char serr[256] = "";
        const int rc = synthetic_model_file(&shp, DTYPE_F16, ftype < 0 ? QUANT_FTYPE_F16 : ftype, 1, 0, 0,
                                            &mf, serr); /* dense shapes as bench's default --dtype f16 */
        if (rc) {
            fprintf(stderr, "ferry inspect: %s (%s)\n", serr, ferry_status_str(rc));
            return 1;
        }
        model = synthetic;
    } else if (cli_open_model(model, &mf)) {
        return 1;
    }
    const struct llm_hparams *hp = &mf->hp;

    uint64_t bytes_by_type[DTYPE_COUNT] = {0};
    int count_by_type[DTYPE_COUNT] = {0};
    uint64_t total = 0;
    for (int i = 0; i < mf->n_tensors; i++) {
        bytes_by_type[mf->tensors[i].type] += mf->tensors[i].nbytes;
        count_by_type[mf->tensors[i].type]++;
        total += mf->tensors[i].nbytes;
    }
    struct tokenizer *tok = NULL;
    char err[256] = "";
    int tok_rc = tokenizer_init(&tok, mf, err);

    json_t *root = json_object();
    json_object_set_new(root, "path", json_string(model));
    json_object_set_new(root, "format",
                        json_string(synthetic                         ? "synthetic"
                                    : mf->format == MODEL_FORMAT_GGUF ? "gguf"
                                                                      : "hf"));
    json_object_set_new(root, "arch", json_string(hp->arch));
    json_t *h = json_object();
    json_object_set_new(h, "n_vocab", json_integer(hp->n_vocab));
    json_object_set_new(h, "dim", json_integer(hp->dim));
    json_object_set_new(h, "n_layers", json_integer(hp->n_layers));
    json_object_set_new(h, "n_heads", json_integer(hp->n_heads));
    json_object_set_new(h, "n_kv_heads", json_integer(hp->n_kv_heads));
    json_object_set_new(h, "head_dim", json_integer(hp->head_dim));
    json_object_set_new(h, "ffn_dim", json_integer(hp->ffn_dim));
    if (hp->n_expert > 0) {
        json_object_set_new(h, "n_expert", json_integer(hp->n_expert));
        json_object_set_new(h, "n_expert_used", json_integer(hp->n_expert_used));
        json_object_set_new(h, "expert_ffn_dim", json_integer(hp->expert_ffn_dim));
    }
    if (hp->full_attn_interval > 0) { /* gated DeltaNet layers and their per-slot state */
        json_object_set_new(h, "full_attention_interval", json_integer(hp->full_attn_interval));
        json_object_set_new(h, "ssm_n_k_heads", json_integer(hp->ssm_n_k_heads));
        json_object_set_new(h, "ssm_n_v_heads", json_integer(hp->ssm_n_v_heads));
        json_object_set_new(h, "ssm_head_k", json_integer(hp->ssm_head_k));
        json_object_set_new(h, "ssm_head_v", json_integer(llm_ssm_head_v(hp)));
        json_object_set_new(h, "ssm_conv_kernel", json_integer(hp->ssm_conv_kernel));
        /* the live state, and its checkpoints in host memory when all are taken */
        const uint64_t one = seq_state_bytes(hp, 1, 0);
        json_object_set_new(root, "state_bytes_per_slot", json_integer((json_int_t)one));
        json_object_set_new(root, "ctx_checkpoints", json_integer(ep.ctx_checkpoints));
        json_object_set_new(root, "checkpoint_bytes_per_slot",
                            json_integer((json_int_t)(seq_state_bytes(hp, 1, ep.ctx_checkpoints) - one)));
    }
    json_object_set_new(h, "ctx_train", json_integer(hp->ctx_train));
    json_object_set_new(h, "norm_eps", json_real(hp->norm_eps));
    json_object_set_new(h, "rope_theta", json_real(hp->rope_theta));
    json_object_set_new(h, "rope_dim", json_integer(hp->rope_dim));
    json_object_set_new(h, "rope_style", json_string(rope_style_name(hp->rope_style)));
    json_object_set_new(h, "rope_scaling", json_string(rope_scaling_name(hp->rope_scaling.type)));
    json_object_set_new(h, "tied_embeddings", json_boolean(hp->tied_embeddings));
    json_object_set_new(h, "qkv_bias", json_boolean(hp->qkv_bias));
    json_object_set_new(root, "hparams", h);
    json_t *types = json_object();
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (count_by_type[t]) {
            json_t *e = json_object();
            json_object_set_new(e, "tensors", json_integer(count_by_type[t]));
            json_object_set_new(e, "bytes", json_integer((json_int_t)bytes_by_type[t]));
            json_object_set_new(types, dtype_name((enum dtype)t), e);
        }
    json_object_set_new(root, "n_tensors", json_integer(mf->n_tensors));
    json_object_set_new(root, "tensor_bytes", json_integer((json_int_t)total));
    json_object_set_new(root, "types", types);
    json_t *tk = json_object();
    if (tok_rc == 0) {
        json_object_set_new(tk, "n_vocab", json_integer(tokenizer_n_vocab(tok)));
        json_object_set_new(tk, "bos", json_integer(tokenizer_bos(tok)));
        json_object_set_new(tk, "eos", json_integer(tokenizer_eos(tok)));
        json_object_set_new(tk, "add_bos", json_boolean(tokenizer_add_bos(tok)));
    } else {
        json_object_set_new(tk, "error", json_string(err));
    }
    json_object_set_new(root, "tokenizer", tk);
    json_object_set_new(root, "chat_template",
                        mf->chat_template ? json_string(mf->chat_template) : json_null());
    /* Placement: on the CPU every layer is computed from host memory; with a GPU budget, the planner's map.
     */
    char plan[16384] = "cpu: all layers";
    int plan_rc = 0;
    const char *cuda_lacks = engine_cuda_lacks(hp);
    if (ep.gpu_memory > 0 && cuda_lacks) {
        snprintf(plan, sizeof plan, "cpu: all layers (the CUDA backend has no kernels for %s)", cuda_lacks);
    } else if (gpus.n > 1) {
        char perr[256] = "";
        uint64_t budget[OPT_MAX_GPUS];
        for (int d = 0; d < gpus.n; d++) budget[d] = (uint64_t)opt_gpus_memory(&gpus, d);
        plan_rc = device_split_model_plan(mf, &ep, gpus.n, gpus.ordinal, budget, plan, sizeof plan, perr);
        if (plan_rc) snprintf(plan, sizeof plan, "no plan: %s", perr);
    } else if (ep.gpu_memory > 0) {
        char perr[256] = "";
        plan_rc = engine_plan(mf, &ep, plan, sizeof plan, perr);
        if (plan_rc) snprintf(plan, sizeof plan, "no plan: %s", perr);
    }
    json_object_set_new(root, "placement", json_string(plan));

    if (as_json) {
        char *s = json_dumps(root, JSON_INDENT(2));
        if (s) puts(s);
        free(s);
    } else {
        printf("model        %s (%s, arch %s)\n", model,
               synthetic                         ? "synthetic"
               : mf->format == MODEL_FORMAT_GGUF ? "GGUF"
                                                 : "Hugging Face",
               hp->arch);
        printf("shape        %d layers, dim %d, ffn %d, heads %d (kv %d, head_dim %d), vocab %d\n",
               hp->n_layers, hp->dim, hp->ffn_dim, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->n_vocab);
        if (hp->n_expert > 0)
            printf("experts      %d per layer, %d per token, expert ffn %d%s\n", hp->n_expert,
                   hp->n_expert_used, hp->expert_ffn_dim,
                   hp->expert_norm_topk ? ", top-k weights normalised" : "");
        if (hp->full_attn_interval > 0)
            printf(
                "linear attn  %d of %d layers gated DeltaNet (%d key / %d value heads of %d / %d, conv %d); "
                "state %.2f MiB per slot, and up to %d checkpoints of it (%.2f MiB) in host memory; KV cache "
                "in "
                "the other %d\n",
                hp->n_layers - llm_kv_layers(hp), hp->n_layers, hp->ssm_n_k_heads, hp->ssm_n_v_heads,
                hp->ssm_head_k, llm_ssm_head_v(hp), hp->ssm_conv_kernel,
                seq_state_bytes(hp, 1, 0) / 1048576.0, ep.ctx_checkpoints,
                (seq_state_bytes(hp, 1, ep.ctx_checkpoints) - seq_state_bytes(hp, 1, 0)) / 1048576.0,
                llm_kv_layers(hp));
        printf("context      %d trained; rope theta %g, %d dims, %s pairs, scaling %s\n", hp->ctx_train,
               hp->rope_theta, hp->rope_dim, rope_style_name(hp->rope_style),
               rope_scaling_name(hp->rope_scaling.type));
        if (hp->sliding_window > 0 && hp->swa_pattern > 0)
            printf("attention    window of %d positions on %d of every %d layers; their rope theta %g\n",
                   hp->sliding_window, hp->swa_pattern - 1, hp->swa_pattern, hp->rope_theta_swa);
        else if (hp->sliding_window > 0)
            printf("attention    window of %d positions on every layer; rope theta %g\n", hp->sliding_window,
                   hp->rope_theta_swa);
        printf("norm eps     %g; tied embeddings %s; qkv bias %s\n", hp->norm_eps,
               hp->tied_embeddings ? "yes" : "no", hp->qkv_bias ? "yes" : "no");
        printf("tensors      %d, %.1f MiB\n", mf->n_tensors, total / 1048576.0);
        for (int t = 0; t < DTYPE_COUNT; t++)
            if (count_by_type[t])
                printf("  %-6s     %4d tensors, %.1f MiB\n", dtype_name((enum dtype)t), count_by_type[t],
                       bytes_by_type[t] / 1048576.0);
        if (tok_rc == 0)
            printf("tokenizer    %d tokens, bos %d, eos %d, add_bos %s\n", tokenizer_n_vocab(tok),
                   tokenizer_bos(tok), tokenizer_eos(tok), tokenizer_add_bos(tok) ? "yes" : "no");
        else
            printf("tokenizer    unavailable: %s\n", err);
        printf("chat template %s\n",
               mf->chat_template ? "yes (the model's own)" : "none (use --chat-template)");
        printf("placement    %s%s", plan, plan[strlen(plan) - 1] == '\n' ? "" : "\n");
        if (ep.gpu_memory <= 0 && (ep.kv_type == KV_F16 || ep.kv_type == KV_F32 || ep.kv_type == KV_Q8_0)) {
            uint64_t all, swa;
            engine_kv_bytes(hp, &ep, &all, &swa);
            if (swa)
                printf("kv cache     %.1f MiB (%d slots): %.1f MiB for the global layers, %.1f MiB for the "
                       "sliding-window layers' windows (--swa-full: every position)\n",
                       (all + swa) / 1048576.0, ep.n_seqs, all / 1048576.0, swa / 1048576.0);
            else
                printf("kv cache     %.1f MiB (%d slots)\n", all / 1048576.0, ep.n_seqs);
        }
    }
    json_decref(root);
    tokenizer_free(tok);
    model_file_close(mf);
    return plan_rc ? 1 : 0;
}
