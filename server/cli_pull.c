/* cli_pull — `ferry pull REPO[:QUANT]` downloads a GGUF model from a Hugging Face-compatible hub into the
 * cache; `ferry list` shows what the cache holds.
 *
 * The hub is $HF_ENDPOINT (default https://huggingface.co), with $HF_TOKEN as a bearer token when set. The
 * repository's file list (GET /api/models/REPO/tree/main) names each file's size and, for large files, its
 * SHA-256; the file whose name holds QUANT (default Q4_K_M; any case) is fetched from
 * /REPO/resolve/main/FILE, every part of it when it is split ("-00001-of-00003.gguf"). Each part goes to
 * FILE.part, resumed where an interrupted transfer stopped (up to PULL_TRIES attempts), and is renamed into
 * place only when its size and SHA-256 match the hub's. The transfers are curl's (a progress bar on a
 * terminal); the digest is sha256sum's. The cache is $FERRY_CACHE, else $XDG_CACHE_HOME/ferry, else
 * ~/.cache/ferry; a model lands in CACHE/OWNER--NAME/FILE, and the path printed last is what `ferry serve -m`
 * takes.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "server/cli.h"

extern char **environ;

#define PULL_TRIES     5
#define PULL_MAX_PARTS 64

struct pull_file {
    char path[512];
    long long size;
    char sha256[65]; /* "" when the hub gives none */
};

static const char *pull_endpoint(void)
{
    const char *e = getenv("HF_ENDPOINT");
    return e && *e ? e : "https://huggingface.co";
}

static int pull_cache_dir(char *out, size_t size)
{
    const char *c = getenv("FERRY_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int n = c && *c   ? snprintf(out, size, "%s", c)
            : x && *x ? snprintf(out, size, "%s/ferry", x)
            : h && *h ? snprintf(out, size, "%s/.cache/ferry", h)
                      : -1;
    return n > 0 && (size_t)n < size ? 0 : -1;
}

/* mkdir -p */
static int pull_mkdirs(const char *path)
{
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return -1;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) return -1;
            *s = '/';
        }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

/* Runs argv (a program on PATH), stdout into out_path when given; the exit status, or -1. */
static int pull_spawn(char *const argv[], const char *out_path)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (out_path)
        posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) {
        fprintf(stderr, "ferry pull: cannot run %s: %s\n", argv[0], strerror(rc));
        return -1;
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* curl with the hub's token into out, appending from byte `from` when from >= 0 (a resumed transfer), with
 * curl's progress bar when progress; the HTTP status of the last response in *http_status. */
static int pull_curl(const char *url, const char *out, long long from, int progress, int *http_status)
{
    char auth[600] = "", code_file[PATH_MAX + 16];
    const char *tok = getenv("HF_TOKEN");
    if (tok && *tok) snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
    snprintf(code_file, sizeof code_file, "%s.status", out);
    const char *argv[32];
    int n = 0;
    argv[n++] = "curl";
    argv[n++] = "-L"; /* the hub redirects file downloads to its storage */
    argv[n++] = progress ? "-#" : "-sS";
    char offset[32];
    if (from >= 0) {
        snprintf(offset, sizeof offset, "%lld", from);
        argv[n++] = "-C";
        argv[n++] = offset;
    }
    argv[n++] = "--connect-timeout";
    argv[n++] = "20";
    argv[n++] = "-w";
    argv[n++] = "%{http_code}";
    argv[n++] = "-o";
    argv[n++] = out;
    if (auth[0]) {
        argv[n++] = "-H";
        argv[n++] = auth;
    }
    argv[n++] = url;
    argv[n] = NULL;
    int rc = pull_spawn((char *const *)argv, code_file);
    *http_status = 0;
    FILE *f = fopen(code_file, "r");
    if (f) {
        if (fscanf(f, "%d", http_status) != 1) *http_status = 0;
        fclose(f);
    }
    unlink(code_file);
    return rc;
}

static void pull_explain_status(const char *what, int status)
{
    if (status == 401 || status == 403)
        fprintf(stderr,
                "ferry pull: %s: HTTP %d: the hub wants a token with access (set HF_TOKEN; gated models need "
                "their terms accepted on the hub first)\n",
                what, status);
    else if (status == 404)
        fprintf(stderr, "ferry pull: %s: HTTP 404: no such repository or file on %s\n", what,
                pull_endpoint());
    else
        fprintf(stderr, "ferry pull: %s: HTTP %d\n", what, status);
}

static int pull_valid_repo(const char *r)
{
    const char *slash = strchr(r, '/');
    if (!slash || slash == r || !slash[1] || strchr(slash + 1, '/') || strlen(r) > 200) return 0;
    for (const char *p = r; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("/-_.", *p)) return 0;
    return !strstr(r, "..");
}

/* "NAME-00001-of-00003.gguf": the part number and count, or 0. */
static int pull_split(const char *name, int *part, int *of, size_t *stem_len)
{
    size_t n = strlen(name);
    if (n < 25 || strcmp(name + n - 5, ".gguf")) return 0;
    const char *s = name + n - 5 - 15; /* "-00001-of-00003" */
    if (s[0] != '-' || strncmp(s + 6, "-of-", 4)) return 0;
    for (int i = 1; i < 15; i++)
        if (i != 6 && i != 7 && i != 8 && i != 9 && !isdigit((unsigned char)s[i])) return 0;
    *part = atoi(s + 1);
    *of = atoi(s + 10);
    *stem_len = (size_t)(s - name);
    return *of > 0 && *part >= 1 && *part <= *of;
}

/* The files of the model: those .gguf files whose name holds quant, one model (all parts when split). */
static int pull_choose(json_t *tree, const char *quant, struct pull_file *out, int *n_out)
{
    *n_out = 0;
    size_t i;
    json_t *e;
    char first[512] = "";
    size_t stem = 0;
    int n_models = 0;
    json_array_foreach(tree, i, e)
    {
        const char *type = json_string_value(json_object_get(e, "type"));
        const char *path = json_string_value(json_object_get(e, "path"));
        if (!path || (type && strcmp(type, "file"))) continue;
        size_t pl = strlen(path);
        if (pl < 5 || pl >= sizeof out->path || strcasecmp(path + pl - 5, ".gguf")) continue;
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        if (!strcasestr(base, quant)) continue;
        int part, of;
        size_t sl;
        int split = pull_split(path, &part, &of, &sl);
        if (first[0] && !(split && stem && sl == stem && !strncmp(path, first, sl))) {
            if (!split || !stem || strncmp(path, first, stem)) n_models++;
            continue;
        }
        if (!first[0]) {
            snprintf(first, sizeof first, "%s", path);
            stem = split ? sl : 0;
            n_models = 1;
        }
        if (*n_out >= PULL_MAX_PARTS) return FERRY_ERR_RANGE;
        struct pull_file *f = &out[(*n_out)++];
        snprintf(f->path, sizeof f->path, "%s", path);
        json_t *lfs = json_object_get(e, "lfs");
        json_t *size = json_object_get(lfs ? lfs : e, "size");
        f->size = json_is_integer(size) ? (long long)json_integer_value(size) : -1;
        const char *oid = lfs ? json_string_value(json_object_get(lfs, "oid")) : NULL;
        snprintf(f->sha256, sizeof f->sha256, "%s", oid && strlen(oid) == 64 ? oid : "");
    }
    if (n_models > 1) {
        fprintf(stderr, "ferry pull: several files match '%s':", quant);
        json_array_foreach(tree, i, e)
        {
            const char *path = json_string_value(json_object_get(e, "path"));
            if (path && strcasestr(path, quant) && strstr(path, ".gguf")) fprintf(stderr, " %s", path);
        }
        fprintf(stderr, "\n  name one of them more exactly: ferry pull REPO:NAME\n");
        return FERRY_ERR_INVALID;
    }
    return *n_out ? 0 : FERRY_ERR_NOT_FOUND;
}

static long long pull_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) ? -1 : (long long)st.st_size;
}

/* sha256sum's digest of path into hex (65 bytes). */
static int pull_sha256(const char *path, char hex[65])
{
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s.sha256", path);
    char *argv[] = {"sha256sum", "-b", (char *)path, NULL};
    int rc = pull_spawn(argv, out);
    hex[0] = 0;
    FILE *f = fopen(out, "r");
    if (f) {
        if (fscanf(f, "%64s", hex) != 1) hex[0] = 0;
        fclose(f);
    }
    unlink(out);
    return rc == 0 && strlen(hex) == 64 ? 0 : -1;
}

/* Downloads one file into dir, resuming FILE.part; verified, then renamed. */
static int pull_one(const char *repo, const struct pull_file *f, const char *dir)
{
    const char *base = strrchr(f->path, '/') ? strrchr(f->path, '/') + 1 : f->path;
    char dst[PATH_MAX - 16], part[PATH_MAX], url[2048];
    snprintf(dst, sizeof dst, "%s/%s", dir, base);
    snprintf(part, sizeof part, "%s.part", dst);
    snprintf(url, sizeof url, "%s/%s/resolve/main/%s", pull_endpoint(), repo, f->path);
    if (f->size >= 0 && pull_file_size(dst) == f->size) {
        fprintf(stderr, "ferry pull: %s is in the cache\n", base);
        return 0;
    }
    int tty = isatty(STDERR_FILENO);
    fprintf(stderr, "ferry pull: %s (%.1f MiB) from %s\n", base, f->size >= 0 ? f->size / 1048576.0 : 0.0,
            pull_endpoint());
    int status = 0;
    for (int attempt = 1; attempt <= PULL_TRIES; attempt++) {
        long long have = pull_file_size(part);
        if (have > 0 && f->size >= 0 && have > f->size) unlink(part), have = -1;
        if (have > 0) fprintf(stderr, "ferry pull: resuming at %.1f MiB\n", have / 1048576.0);
        int rc = pull_curl(url, part, have > 0 ? have : 0, tty, &status);
        if (rc == 0 && (status == 200 || status == 206)) break;
        if (status == 416 && f->size >= 0 && pull_file_size(part) == f->size) break; /* already whole */
        if (status == 401 || status == 403 || status == 404) {
            unlink(part);
            pull_explain_status(base, status);
            return FERRY_ERR_IO;
        }
        fprintf(stderr, "ferry pull: %s: transfer interrupted (curl exit %d, HTTP %d), attempt %d of %d\n",
                base, rc, status, attempt, PULL_TRIES);
        if (attempt == PULL_TRIES) return FERRY_ERR_IO;
        sleep(attempt < 3 ? 1 : 3);
    }
    long long got = pull_file_size(part);
    if (f->size >= 0 && got != f->size) {
        fprintf(stderr, "ferry pull: %s: %lld bytes, the hub says %lld: removed, run ferry pull again\n",
                base, got, f->size);
        unlink(part);
        return FERRY_ERR_FORMAT;
    }
    if (f->sha256[0]) {
        char hex[65];
        if (pull_sha256(part, hex)) {
            fprintf(stderr, "ferry pull: cannot compute the SHA-256 of %s (sha256sum)\n", part);
            return FERRY_ERR_IO;
        }
        if (strcasecmp(hex, f->sha256)) {
            fprintf(stderr, "ferry pull: %s: SHA-256 %s, the hub says %s: removed, run ferry pull again\n",
                    base, hex, f->sha256);
            unlink(part);
            return FERRY_ERR_FORMAT;
        }
        fprintf(stderr, "ferry pull: %s: size and SHA-256 match the hub's\n", base);
    }
    if (rename(part, dst)) {
        fprintf(stderr, "ferry pull: cannot rename %s: %s\n", part, strerror(errno));
        return FERRY_ERR_IO;
    }
    return 0;
}

int cli_pull_model(const char *spec, char *path, size_t path_size)
{
    char repo[256], quant[64] = "Q4_K_M";
    const char *colon = strchr(spec, ':');
    size_t rl = colon ? (size_t)(colon - spec) : strlen(spec);
    if (rl >= sizeof repo || (colon && (!colon[1] || strlen(colon + 1) >= sizeof quant))) {
        fprintf(stderr, "ferry pull: '%s' is too long or has an empty QUANT\n", spec);
        return FERRY_ERR_INVALID;
    }
    memcpy(repo, spec, rl);
    repo[rl] = 0;
    if (colon) snprintf(quant, sizeof quant, "%s", colon + 1);
    if (!pull_valid_repo(repo)) {
        fprintf(stderr, "ferry pull: '%s' is not OWNER/REPO\n", repo);
        return FERRY_ERR_INVALID;
    }
    char cache[PATH_MAX - 300], dir[PATH_MAX - 100], tree_path[PATH_MAX];
    if (pull_cache_dir(cache, sizeof cache)) {
        fprintf(stderr, "ferry pull: no cache directory: set FERRY_CACHE\n");
        return FERRY_ERR_IO;
    }
    const char *name = strchr(repo, '/') + 1; /* OWNER--NAME: one directory per repository */
    snprintf(dir, sizeof dir, "%s/%.*s--%s", cache, (int)(name - 1 - repo), repo, name);
    if (pull_mkdirs(dir)) {
        fprintf(stderr, "ferry pull: cannot create %s: %s\n", dir, strerror(errno));
        return FERRY_ERR_IO;
    }
    snprintf(tree_path, sizeof tree_path, "%s/.tree.json", dir);
    char url[1024];
    snprintf(url, sizeof url, "%s/api/models/%s/tree/main?recursive=true", pull_endpoint(), repo);
    int status = 0;
    int rc = pull_curl(url, tree_path, -1, 0, &status);
    if (rc || status != 200) {
        if (status)
            pull_explain_status(repo, status);
        else
            fprintf(stderr, "ferry pull: cannot reach %s (curl exit %d)\n", pull_endpoint(), rc);
        unlink(tree_path);
        return FERRY_ERR_IO;
    }
    json_error_t je;
    json_t *tree = json_load_file(tree_path, 0, &je);
    unlink(tree_path);
    if (!json_is_array(tree)) {
        fprintf(stderr, "ferry pull: the hub's file list for %s is not a JSON array (%s)\n", repo, je.text);
        json_decref(tree);
        return FERRY_ERR_FORMAT;
    }
    struct pull_file *files = calloc(PULL_MAX_PARTS, sizeof *files);
    int n = 0;
    rc = files ? pull_choose(tree, quant, files, &n) : FERRY_ERR_NOMEM;
    if (rc == FERRY_ERR_NOT_FOUND) {
        fprintf(stderr, "ferry pull: no .gguf file of %s matches '%s'; its GGUF files:", repo, quant);
        size_t i;
        json_t *e;
        json_array_foreach(tree, i, e)
        {
            const char *p = json_string_value(json_object_get(e, "path"));
            if (p && strlen(p) > 5 && !strcasecmp(p + strlen(p) - 5, ".gguf")) fprintf(stderr, " %s", p);
        }
        fputc('\n', stderr);
    }
    json_decref(tree);
    for (int i = 0; !rc && i < n; i++) rc = pull_one(repo, &files[i], dir);
    if (!rc) {
        const char *base = strrchr(files[0].path, '/') ? strrchr(files[0].path, '/') + 1 : files[0].path;
        if (snprintf(path, path_size, "%s/%s", dir, base) >= (int)path_size) rc = FERRY_ERR_RANGE;
    }
    free(files);
    return rc;
}

int cli_pull_main(int argc, char **argv)
{
    if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        FILE *f = argc == 2 ? stdout : stderr;
        fprintf(f, "usage: ferry pull OWNER/REPO[:QUANT]\n\n"
                   "Downloads a GGUF model (default QUANT: Q4_K_M) from $HF_ENDPOINT (default "
                   "https://huggingface.co;\n"
                   "$HF_TOKEN for private or gated repositories) into the cache ($FERRY_CACHE, else "
                   "~/.cache/ferry),\n"
                   "resuming interrupted transfers and checking size and SHA-256; prints the file's path.\n"
                   "example: ferry pull bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M\n");
        return argc == 2 ? 0 : 2;
    }
    char path[PATH_MAX];
    int rc = cli_pull_model(argv[1], path, sizeof path);
    if (rc == FERRY_ERR_INVALID) return 2;
    if (rc) return 1;
    printf("%s\n", path);
    return 0;
}

int cli_list_main(int argc, char **argv)
{
    (void)argv;
    char cache[PATH_MAX - 600];
    if (argc > 1 || pull_cache_dir(cache, sizeof cache)) {
        fprintf(stderr,
                "usage: ferry list      (the models `ferry pull` put in $FERRY_CACHE or ~/.cache/ferry)\n");
        return 2;
    }
    DIR *d = opendir(cache);
    int n = 0;
    struct dirent *e, *m;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !strstr(e->d_name, "--")) continue;
        char sub[PATH_MAX - 300];
        snprintf(sub, sizeof sub, "%s/%s", cache, e->d_name);
        DIR *s = opendir(sub);
        while (s && (m = readdir(s))) {
            size_t l = strlen(m->d_name);
            if (l < 5 || strcmp(m->d_name + l - 5, ".gguf")) continue;
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/%s", sub, m->d_name);
            long long sz = pull_file_size(p);
            char *dash = strstr(e->d_name, "--");
            printf("%.*s/%s  %s  %.1f MiB  %s\n", (int)(dash - e->d_name), e->d_name, dash + 2, m->d_name,
                   sz / 1048576.0, p);
            n++;
        }
        if (s) closedir(s);
    }
    if (d) closedir(d);
    if (!n) fprintf(stderr, "ferry list: no models in %s (ferry pull OWNER/REPO[:QUANT] adds one)\n", cache);
    return 0;
}
