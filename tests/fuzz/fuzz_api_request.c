// SOURCES: server/api.c server/api_chat.c server/api_render.c server/responses.c server/embeddings.c
// SOURCES: server/scheduler.c server/sched_engine.c server/metrics.c server/sched_policy.c server/seq_output.c
// SOURCES: server/prompt_cache.c server/anthropic.c server/llama_api.c runtime/spec.c runtime/draft_model.c runtime/mtp.c runtime/synthetic.c weights/arch/*.c
// SOURCES: server/row_pool.c server/sreq.c runtime/seq_state.c runtime/engine_cuda_params.c
// SOURCES: runtime/model.c runtime/kv_cache.c runtime/device_map.c runtime/layer.c runtime/ring.c
// SOURCES: runtime/step_plan.c runtime/forward_cpu.c runtime/forward_cuda_none.c runtime/engine.c
// SOURCES: runtime/sampler.c runtime/regex.c runtime/grammar*.c runtime/json_schema.c runtime/tool_call.c
// SOURCES: runtime/reasoning.c runtime/harmony.c runtime/tok/*.c runtime/chat/*.c
// SOURCES: kernels/core/*.c kernels/cpu/*.c quant/*.c weights/*.c
// LIBS: -ljansson -lm -lpthread
// CFLAGS: -march=native
// MAXLEN: 16384
/* fuzz_api_request — libFuzzer target for the OpenAI request parser (server/api.c) on arbitrary bodies: the
 * first byte picks the entry point (completions, chat completions, /v1/responses, /v1/embeddings, /tokenize,
 * /detokenize) and the API context (context size 64 or 2048, --any-model or not, reasoning split or not), the
 * rest is the body. The tokenizer is stories260K's
 * ($FERRY_FUZZ_MODEL, else $FERRY_TESTDATA/models/stories260K.gguf); chat goes through the builtin chatml and
 * llama3 templates. Checks: no crash or sanitizer report (UBSan: any overflow in a size or count); an
 * accepted request is consistent (choices = prompts × n, token ids in range, prompt + max_tokens within the
 * context); a refused one carries a status that maps to a 4xx or 5xx and a message; the whole answer and the
 * SSE stream of a request can be rendered with no output yet.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "runtime/tokenizer.h"
#include "runtime/tool_call.h"
#include "server/api.h"
#include "weights/gguf.h"

static struct tokenizer *tok;
static int loaded = -1;

static void load(void)
{
    loaded = 0;
    const char *path = getenv("FERRY_FUZZ_MODEL");
    char buf[4096];
    if (!path || !*path) {
        const char *root = getenv("FERRY_TESTDATA");
        snprintf(buf, sizeof buf, "%s/models/stories260K.gguf", root ? root : "../shared/testdata");
        path = buf;
    }
    struct gguf *g = NULL;
    char err[256] = "";
    if (gguf_open(path, &g, err) || tokenizer_init_gguf(&tok, g, err)) {
        fprintf(stderr, "fuzz_api_request: cannot load a tokenizer from %s: %s; nothing is exercised\n", path,
                err);
        if (g) gguf_close(g);
        return;
    }
    gguf_close(g);
    loaded = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (loaded < 0) load();
    if (!loaded || size < 1) return 0;
    const unsigned sel = data[0];
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    struct api_ctx a = {0};
    a.tok = tok;
    a.model_name = "m";
    a.any_model = sel & 16;
    a.chat_tmpl = chat_template_builtin(sel & 32 ? "llama3" : "chatml");
    int32_t bos = tokenizer_bos(tok), eos = tokenizer_eos(tok);
    a.bos_str = bos >= 0 ? tokenizer_token_str(tok, bos) : "";
    a.eos_str = eos >= 0 ? tokenizer_token_str(tok, eos) : "";
    a.ctx_size = sel & 64 ? 64 : 2048;
    a.n_vocab = tokenizer_n_vocab(tok);
    a.default_seed = sel & 128 ? -1 : 7;
    a.timeout = 0;
    a.reasoning = (sel & 8) != 0;
    a.embd_dim = 64;
    a.tool_format = tool_format_of(a.chat_tmpl);
    struct api_err e;
    switch (sel & 3) {
    case 0:
    case 1: {
        struct sreq *r = NULL;
        const enum sreq_kind kind = sel & 4 ? ((sel & 3) ? SREQ_EMBED : SREQ_RESPONSES)
                                    : ((sel & 3) ? SREQ_CHAT : SREQ_COMPLETION);
        int rc = api_parse_request(&a, kind, body, len, &r, &e);
        if (rc) {
            int http = api_http_status(rc, NULL, NULL);
            if (r || rc != e.status || http < 400 || http > 599 || !e.msg[0] ||
                !memchr(e.msg, 0, sizeof e.msg))
                abort();
            return 0;
        }
        if (!r || r->n_choices != r->n_prompts * r->n || r->n < 1 || r->max_tokens < 0) abort();
        if (kind == SREQ_RESPONSES && r->n_choices != 1) abort();
        for (int i = 0; i < r->n_prompts; i++) {
            if (r->n_prompt_toks[i] < 1 || r->n_prompt_toks[i] + r->max_tokens > a.ctx_size) abort();
            for (int k = 0; k < r->n_prompt_toks[i]; k++)
                if (r->prompts[i][k] < 0 || r->prompts[i][k] >= a.n_vocab) abort();
        }
        if (kind == SREQ_EMBED) { /* nothing to render before the engine pooled the inputs */
            sched_release(NULL, r);
            return 0;
        }
        /* rendering with nothing generated yet: the stream's first chunks, and the whole (empty) answer */
        struct strbuf sb = {0};
        int done = 0;
        api_render_stream(&a, r, &sb, &done);
        strbuf_free(&sb);
        size_t bl = 0;
        free(api_render_full(&a, r, &bl));
        sched_release(NULL, r);
        return 0;
    }
    default: {
        char *out = NULL;
        size_t ol = 0;
        int rc = (sel & 3) == 2 ? api_tokenize(&a, body, len, &out, &ol, &e)
                                : api_detokenize(&a, body, len, &out, &ol, &e);
        if (rc ? (out != NULL || api_http_status(e.status ? e.status : rc, NULL, NULL) < 400)
               : (!out || strlen(out) != ol))
            abort();
        free(out);
        return 0;
    }
    }
}
