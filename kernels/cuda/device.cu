/* device (CUDA) — what the CUDA runtime says about a GPU (see device.h). Asks for attributes only: nothing here
 * needs kernels built for the device, so it answers for GPUs the binary has no code for. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/cuda/device.h"

extern "C" int kern_cuda_device_info(int dev, char name[256], int *cc)
{
    name[0] = 0;
    *cc = 0;
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* a missing driver or device leaves a non-sticky error */
        return -1;
    }
    snprintf(name, 256, "%s", p.name);
    *cc = p.major * 10 + p.minor;
    return 0;
}
