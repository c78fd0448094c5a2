/* gpu_arch — does this ferry have CUDA kernels for the GPU it found? (see gpu_arch.h) */
#include "server/gpu_arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#ifdef FERRY_CUDA
#include "kernels/cuda/device.h"
#endif

#ifndef FERRY_CUDA_ARCHS
#define FERRY_CUDA_ARCHS ""
#endif

const char *gpu_arch_built(void)
{
#ifdef FERRY_CUDA
    return FERRY_CUDA_ARCHS;
#else
    return "";
#endif
}

int gpu_arch_runs_on(const char *built, int cc)
{
    int newest = 0;
    for (const char *p = built; p && *p;) {
        char *end;
        long a = strtol(p, &end, 10);
        if (end == p) break;
        if (a / 10 == cc / 10 && a % 10 <= cc % 10) return 1; /* machine code of the same major */
        if (a > newest) newest = (int)a;
        p = *end == ',' ? end + 1 : end;
    }
    return newest > 0 && cc >= newest; /* the newest architecture's PTX */
}

void gpu_arch_message(const char *name, int cc, const char *built, char *out, int size)
{
    if (cc < 80) {
        snprintf(
            out, (size_t)size,
            "GPU 0, %s, has compute capability %d.%d: ferry's CUDA kernels need 8.0 or newer (A100, RTX 30xx "
            "and later); run on the CPU with --backend cpu",
            name, cc / 10, cc % 10);
        return;
    }
    char sm[160] = "";
    for (const char *p = built; *p && strlen(sm) < sizeof sm - 16;) {
        char *end;
        long a = strtol(p, &end, 10);
        if (end == p) break;
        snprintf(sm + strlen(sm), sizeof sm - strlen(sm), "%ssm_%ld", sm[0] ? ", " : "", a);
        p = *end == ',' ? end + 1 : end;
    }
    snprintf(out, (size_t)size,
             "this ferry has no CUDA kernels for GPU 0, %s (compute capability %d.%d): it was built for %s. "
             "Rebuild for it with FERRY_CUDA_ARCH=%d bash deploy/quickstart.sh (or meson configure BUILD_DIR "
             "-Dgpu_arch=%d, then ninja), or run on the CPU with --backend cpu",
             name, cc / 10, cc % 10, sm[0] ? sm : "no GPU", cc, cc);
}

/* Device 0's name and capability: the test hook, else the CUDA runtime. 0 when there is one. */
static int device0(char name[256], int *cc)
{
    const char *fake = getenv("FERRY_FAKE_GPU");
    if (fake && *fake) {
        const char *colon = strrchr(fake, ':');
        int major = 0, minor = 0;
        if (!colon || sscanf(colon + 1, "%d.%d", &major, &minor) != 2 || major < 1 || major > 99 ||
            minor < 0 || minor > 9)
            return -1;
        snprintf(name, 256, "%.*s", (int)(colon - fake), fake);
        *cc = major * 10 + minor;
        return 0;
    }
#ifdef FERRY_CUDA
    return kern_cuda_device_info(0, name, cc);
#else
    return -1;
#endif
}

int gpu_arch_check(const char *backend, char err[512])
{
    err[0] = 0;
    if (backend && !strcmp(backend, "cpu")) return 0;
    const char *built = gpu_arch_built();
    if (!built[0]) return 0; /* no CUDA in this build: the engine runs on the CPU */
    char name[256];
    int cc = 0;
    if (device0(name, &cc)) return 0; /* no GPU: the engine says so for --backend cuda */
    if (cc >= 80 && gpu_arch_runs_on(built, cc)) return 0;
    gpu_arch_message(name, cc, built, err, 512);
    return FERRY_ERR_UNSUPPORTED;
}
