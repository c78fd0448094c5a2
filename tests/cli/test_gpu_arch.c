/* test_gpu_arch — the start-up check that the GPU found has kernels in this build (server/gpu_arch.c),
 * against NVIDIA's compatibility rules: machine code for compute capability a.b runs on a.c for c >= b and on
 * no other major; PTX runs on the capability it was built for and every newer one. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "server/gpu_arch.h"

Test(gpu_arch, machine_code_runs_within_its_major_only)
{
    cr_assert(gpu_arch_runs_on("80", 80));
    cr_assert(gpu_arch_runs_on("80", 86)); /* sm_80 code on an RTX 3060 */
    cr_assert(gpu_arch_runs_on("80", 89));
    cr_assert(!gpu_arch_runs_on("86", 80)); /* newer minor code on an older minor: no */
    cr_assert(!gpu_arch_runs_on("90,100", 89));
    cr_assert(gpu_arch_runs_on("90,100", 103)); /* B300 runs sm_100 code */
    cr_assert(!gpu_arch_runs_on("80,86,89", 75));
}

Test(gpu_arch, the_newest_ptx_runs_on_later_gpus)
{
    cr_assert(gpu_arch_runs_on("90", 100)); /* the PTX of sm_90 is compiled by the driver for a B200 */
    cr_assert(gpu_arch_runs_on("90", 120));
    cr_assert(!gpu_arch_runs_on("90", 86)); /* the old default: no kernels for an RTX 3060 */
    cr_assert(!gpu_arch_runs_on("90", 89));
    cr_assert(gpu_arch_runs_on("80,86,89,90,100,120", 121));
    cr_assert(!gpu_arch_runs_on("", 90));
    cr_assert(!gpu_arch_runs_on("junk", 90));
}

Test(gpu_arch, message_names_the_gpu_its_capability_and_the_fixes)
{
    char m[512];
    gpu_arch_message("NVIDIA GeForce RTX 3060", 86, "90", m, sizeof m);
    cr_assert(strstr(m, "NVIDIA GeForce RTX 3060"), "%s", m);
    cr_assert(strstr(m, "compute capability 8.6"), "%s", m);
    cr_assert(strstr(m, "built for sm_90"), "%s", m);
    cr_assert(strstr(m, "FERRY_CUDA_ARCH=86"), "%s", m);
    cr_assert(strstr(m, "-Dgpu_arch=86"), "%s", m);
    cr_assert(strstr(m, "--backend cpu"), "%s", m);
    gpu_arch_message("Tesla T4", 75, "80,86", m, sizeof m);
    cr_assert(strstr(m, "Tesla T4") && strstr(m, "7.5") && strstr(m, "8.0 or newer") &&
                  strstr(m, "--backend cpu"),
              "%s", m);
    gpu_arch_message("x", 89, "80,86,90", m, 40); /* truncated, still terminated */
    cr_assert_lt(strlen(m), 40);
}

Test(gpu_arch, check_uses_the_fake_gpu_and_spares_the_cpu_backend)
{
    char err[512];
    setenv("FERRY_FAKE_GPU", "NVIDIA GeForce GTX 1080: 6.1", 1);
    cr_assert_eq(gpu_arch_check("cpu", err), 0);
    int rc = gpu_arch_check("auto", err);
    if (gpu_arch_built()[0]) { /* a CUDA build refuses a GPU older than 8.0 */
        cr_assert_neq(rc, 0);
        cr_assert(strstr(err, "GTX 1080") && strstr(err, "6.1"), "%s", err);
    } else {
        cr_assert_eq(rc, 0); /* a CPU-only build runs on the CPU whatever GPU is there */
    }
    setenv("FERRY_FAKE_GPU", "no capability here", 1);
    cr_assert_eq(gpu_arch_check("auto", err), 0); /* a malformed hook is no GPU */
    unsetenv("FERRY_FAKE_GPU");
}
