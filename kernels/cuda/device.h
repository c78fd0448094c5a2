/* device (CUDA) — what the CUDA runtime says about a GPU, for the start-up checks above the kernels. */
#ifndef FERRY_KERNELS_CUDA_DEVICE_H
#define FERRY_KERNELS_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

/* The name and compute capability (major * 10 + minor) of device dev. 0 on success; -1 when there is no such
 * device or no driver (name is then "", cc 0). */
int kern_cuda_device_info(int dev, char name[256], int *cc);

#ifdef __cplusplus
}
#endif

#endif
