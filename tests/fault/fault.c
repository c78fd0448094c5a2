/* fault — fault injection for the ferry_fault test binary: the N-th allocation, file operation or CUDA call
 * fails.
 *
 * Linked with -Wl,--wrap=SYMBOL for each call below, so the production code is untouched: its calls to
 * malloc, fopen, ... land in __wrap_malloc, ..., which count the call, remember its site (the first return
 * address inside the executable, so that calls made through jansson or libuv are charged to the ferry code
 * that asked), and either fail it the way the real call fails (NULL/-1/MAP_FAILED with errno) or pass it to
 * __real_SYMBOL. jansson allocates through api_json_alloc (server/api.c, installed by server/serve.c), so its allocations are counted
 * too, and charged to the ferry code that called jansson. libuv's internal allocations are not failed: libuv
 * aborts on some of them by design (the watcher table), which is its policy, not a ferry bug.
 *
 * Environment:
 *   FERRY_FAULT_CLASS   alloc | file | cuda    the class of calls counted and failed (default alloc)
 *   FERRY_FAULT_N       N                      fail the N-th call of the class (1-based); 0 or unset: count
 * only FERRY_FAULT_SITE    0xA[,0xB...]           instead: fail the first call made from each listed site (a
 * second site can be one that only the first failure's handling reaches) FERRY_FAULT_REPORT  PATH at exit,
 * write the counts: "calls N", then per site "site 0xOFFSET COUNT FIRST_N", and "failed N 0xOFFSET" per
 * failure Each armed failure happens once (sqlite's "fail once"): later calls succeed, so the test sees
 * whether the program recovers.
 */

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/api.h"
#include "tests/fault/fault.h"

#define MAX_SITES 8192 /* open addressing; a site beyond it is counted but not recorded */

#define MAX_ARMED 8

static int armed_class = FAULT_ALLOC;
static uint64_t fail_n;                 /* 0 = none */
static uintptr_t fail_sites[MAX_ARMED]; /* armed sites */
static int n_fail_sites;
static int site_fired[MAX_ARMED];
static uint64_t calls; /* of the armed class */
static int n_fired;
static uint64_t fired_n[MAX_ARMED + 1];
static uintptr_t fired_site[MAX_ARMED + 1];
static uintptr_t exe_lo, exe_hi; /* the executable's text */
static const char *report_path;
static __thread int in_hook; /* backtrace() may allocate on its first use */

static struct site {
    uintptr_t off; /* 0 = empty */
    uint64_t count, first;
} sites[MAX_SITES];

static int in_exe(uintptr_t pc)
{
    return pc >= exe_lo && pc < exe_hi;
}

/* A site is two return addresses, the call and its caller's call (a helper such as utf8_sanitize allocates
 * for many callers, whose handling of the failure differs): (caller offset << 32) | call offset. */
static uintptr_t caller_site(void *ret)
{
    uintptr_t pc = (uintptr_t)ret, shim = (uintptr_t)api_json_alloc;
    void *frames[48];
    int n = backtrace(frames, 48), i = 0;
    while (i < n && (uintptr_t)frames[i] != pc) i++; /* the hook's own frames */
    if (i == n) return in_exe(pc) ? pc - exe_lo : 1;
    if (!in_exe(pc) || (pc >= shim && pc < shim + 256)) {
        /* for jansson (through api_json_alloc): past the shim and jansson's frames, the first frame back
         * inside the executable is the ferry code that asked */
        while (i < n && in_exe((uintptr_t)frames[i])) i++;
        while (i < n && !in_exe((uintptr_t)frames[i])) i++;
        if (i == n) return 1;
    }
    uintptr_t a = (uintptr_t)frames[i] - exe_lo;
    uintptr_t b = i + 1 < n && in_exe((uintptr_t)frames[i + 1]) ? (uintptr_t)frames[i + 1] - exe_lo : 0;
    return b << 32 | a;
}

static void record(uintptr_t off, uint64_t n)
{
    uint64_t h = (off * 0x9e3779b97f4a7c15ull) >> 51; /* 13 bits */
    for (int k = 0; k < MAX_SITES; k++) {
        struct site *s = &sites[(h + (uint64_t)k) % MAX_SITES];
        uintptr_t cur = __atomic_load_n(&s->off, __ATOMIC_ACQUIRE);
        if (cur == 0) {
            uintptr_t zero = 0;
            if (__atomic_compare_exchange_n(&s->off, &zero, off, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                __atomic_store_n(&s->first, n, __ATOMIC_RELEASE);
                cur = off;
            } else {
                cur = zero;
            }
        }
        if (cur == off) {
            __atomic_add_fetch(&s->count, 1, __ATOMIC_RELAXED);
            return;
        }
    }
}

/* One call of class `cls` from the call site `ret`: 1 when it must fail. */
int fault_should_fail(int cls, void *ret)
{
    if (cls != armed_class || in_hook) return 0;
    in_hook = 1;
    uint64_t n = __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    uintptr_t site = caller_site(ret);
    record(site, n);
    int fail = 0, expect = 0;
    if (fail_n && n == fail_n) {
        static int n_fired_once;
        fail = __atomic_compare_exchange_n(&n_fired_once, &expect, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    for (int i = 0; i < n_fail_sites && !fail; i++)
        if (site == fail_sites[i])
            fail = __atomic_compare_exchange_n(&site_fired[i], &expect, 1, 0, __ATOMIC_ACQ_REL,
                                               __ATOMIC_ACQUIRE);
    if (fail) {
        int k = __atomic_fetch_add(&n_fired, 1, __ATOMIC_ACQ_REL);
        if (k <= MAX_ARMED) fired_n[k] = n, fired_site[k] = site;
        char msg[96];
        int l = snprintf(msg, sizeof msg, "fault: failing call %llu (site 0x%lx)\n", (unsigned long long)n,
                         (unsigned long)site);
        if (write(2, msg, (size_t)l) < 0) { /* nothing to do */
        }
    }
    in_hook = 0;
    return fail;
}

static void write_report(void)
{
    if (!report_path) return;
    FILE *f =
        fopen(report_path, "w"); /* through the wrapper: the armed class may be "file", so disarm first */
    if (!f) return;
    fprintf(f, "calls %llu\n", (unsigned long long)calls);
    for (int i = 0; i < MAX_SITES; i++)
        if (sites[i].off)
            fprintf(f, "site 0x%lx %llu %llu\n", (unsigned long)sites[i].off,
                    (unsigned long long)sites[i].count, (unsigned long long)sites[i].first);
    for (int i = 0; i < n_fired && i <= MAX_ARMED; i++)
        fprintf(f, "failed %llu 0x%lx\n", (unsigned long long)fired_n[i], (unsigned long)fired_site[i]);
    fclose(f);
}

static void at_exit(void)
{
    armed_class = -1; /* nothing fails or counts from here on */
    write_report();
}

/* ---- allocation
 * ------------------------------------------------------------------------------------------------ */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);

int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);

#define RET __builtin_return_address(0)

void *__wrap_malloc(size_t n)
{
    if (fault_should_fail(FAULT_ALLOC, RET)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    if (fault_should_fail(FAULT_ALLOC, RET)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
    if (fault_should_fail(FAULT_ALLOC, RET)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
    if (fault_should_fail(FAULT_ALLOC, RET)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
    if (fault_should_fail(FAULT_ALLOC, RET)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_strndup(s, n);
}

int __wrap_asprintf(char **out, const char *fmt, ...)
{
    if (fault_should_fail(FAULT_ALLOC, RET)) {
        errno = ENOMEM;
        return -1;
    }
    va_list ap;
    va_start(ap, fmt);
    int r = vasprintf(out, fmt, ap);
    va_end(ap);
    return r;
}

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
    if (fault_should_fail(FAULT_ALLOC, RET)) return EAGAIN;
    return __real_pthread_create(t, a, fn, arg);
}

/* ---- files
 * ----------------------------------------------------------------------------------------------------- */

FILE *__real_fopen64(const char *path, const char *mode);
size_t __real_fread(void *p, size_t n, size_t m, FILE *f);
int __real_open64(const char *path, int flags, ...);
void *__real_mmap64(void *a, size_t n, int prot, int flags, int fd, off_t off);
int __real_fstat64(int fd, void *st);

FILE *__wrap_fopen64(const char *path, const char *mode)
{
    if (fault_should_fail(FAULT_FILE, RET)) {
        errno = EIO;
        return NULL;
    }
    return __real_fopen64(path, mode);
}

size_t __wrap_fread(void *p, size_t n, size_t m, FILE *f)
{
    if (fault_should_fail(FAULT_FILE, RET)) {
        errno = EIO;
        return 0; /* a short read; ferror() is not set, as after a read error on some streams */
    }
    return __real_fread(p, n, m, f);
}

int __wrap_open64(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (fault_should_fail(FAULT_FILE, RET)) {
        errno = EIO;
        return -1;
    }
    return __real_open64(path, flags, mode);
}

void *__wrap_mmap64(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
    if (fault_should_fail(FAULT_FILE, RET)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return __real_mmap64(a, n, prot, flags, fd, off);
}

int __wrap_fstat64(int fd, void *st)
{
    if (fault_should_fail(FAULT_FILE, RET)) {
        errno = EIO;
        return -1;
    }
    return __real_fstat64(fd, st);
}

/* ---- setup
 * ----------------------------------------------------------------------------------------------------- */

static void find_exe_text(void)
{
    Dl_info di;
    if (!dladdr((void *)find_exe_text, &di)) return;
    FILE *m = __real_fopen64("/proc/self/maps", "r");
    if (!m) return;
    char line[512];
    uintptr_t base = (uintptr_t)di.dli_fbase, hi = 0;
    while (fgets(line, sizeof line, m)) {
        unsigned long lo, h;
        if (sscanf(line, "%lx-%lx", &lo, &h) != 2) continue;
        if (strstr(line, di.dli_fname) && h > hi && lo >= base) hi = h;
    }
    fclose(m);
    exe_lo = base;
    exe_hi = hi;
}

__attribute__((constructor)) static void fault_init(void)
{
    in_hook = 1;
    void *warm[2];
    backtrace(warm, 2); /* loads libgcc now, not inside a hook */
    find_exe_text();
    const char *c = getenv("FERRY_FAULT_CLASS");
    armed_class = !c || !strcmp(c, "alloc") ? FAULT_ALLOC : !strcmp(c, "file") ? FAULT_FILE : FAULT_CUDA;
    const char *v = getenv("FERRY_FAULT_N");
    fail_n = v ? strtoull(v, NULL, 0) : 0;
    v = getenv("FERRY_FAULT_SITE");
    for (char *end; v && *v && n_fail_sites < MAX_ARMED; v = *end == ',' ? end + 1 : end) {
        fail_sites[n_fail_sites++] = (uintptr_t)strtoull(v, &end, 0);
        if (end == v) break;
    }
    report_path = getenv("FERRY_FAULT_REPORT");
    atexit(at_exit);
    in_hook = 0;
}
