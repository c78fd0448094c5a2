/* gpu_arch — does this ferry have CUDA kernels for the GPU it found? Checked at start-up, before anything is
 * loaded, so that a GPU the build does not cover gets one clear message (the GPU, its compute capability, the
 * build option that fixes it, and --backend cpu) instead of a kernel launch failure deep in the load.
 *
 * Compute capabilities are major * 10 + minor (86 for 8.6). A build holds machine code for each architecture
 * of -Dgpu_arch (meson passes the list as FERRY_CUDA_ARCHS) and PTX of the newest: machine code for a.b runs
 * on a.c with c >= b, the PTX on any newer GPU (compiled by the driver at the first start).
 *
 * Test hook: FERRY_FAKE_GPU="NAME:MAJOR.MINOR" in the environment stands for device 0 (CI has no GPU).
 */
#ifndef FERRY_SERVER_GPU_ARCH_H
#define FERRY_SERVER_GPU_ARCH_H

/* The architectures this binary was built for ("80,86,89,90,100,120"), or "" for a build without CUDA. */
const char *gpu_arch_built(void);

/* 1 when a build for the comma-separated architectures `built` runs on a GPU of capability cc, else 0. */
int gpu_arch_runs_on(const char *built, int cc);

/* Writes the message for GPU `name` of capability cc that the build `built` does not cover. */
void gpu_arch_message(const char *name, int cc, const char *built, char *out, int size);

/* The start-up check for `backend` ("auto", "cpu", "cuda"): 0 when the CPU is asked for, when there is no
 * GPU (or no CUDA in this build), or when device 0 is covered; otherwise FERRY_ERR_UNSUPPORTED with the
 * message in err. */
int gpu_arch_check(const char *backend, char err[512]);

#endif
