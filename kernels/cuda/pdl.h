/* pdl — programmatic dependent launch (Hopper): a kernel may start while the one before it on the stream is
 * still finishing, so its launch latency and its first loads of immutable data (weights) overlap the previous
 * kernel's tail. C++/CUDA only.
 *
 * The rule every kernel launched with pdl_launch() follows: it calls pdl_wait() before it reads or writes any
 * memory that an earlier kernel of the stream writes or reads (activations, the KV cache, workspaces), and it
 * calls it in every block, before any early return. Only data that no kernel writes (weights, norm weights,
 * frequency tables) may be touched before. pdl_wait() returns once the previous grid has completed and its
 * writes are visible; since that grid waited for its own predecessor the same way, the order of the whole
 * stream is kept. A kernel launched without the attribute (cuBLAS, a plain <<<>>> launch) runs after its
 * predecessor as usual, and pdl_wait() in it returns at once.
 * pdl_trigger() lets the next kernel be scheduled once every block of this one has called it (or exited); the
 * next kernel still waits for this one to complete in its own pdl_wait().
 * FERRY_CUDA_PDL=0 in the environment turns the attribute off (for measurements: same kernels, plain launches);
 * on cards older than sm_90 it is always off.
 */
#ifndef FERRY_KERN_CUDA_PDL_H
#define FERRY_KERN_CUDA_PDL_H

#include <stdlib.h>

#include <cuda_runtime.h>

__device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* On when the current device has compute capability 9.0 or newer (PDL is a Hopper feature; before it, the
 * kernels' griddepcontrol instructions are compiled out) and FERRY_CUDA_PDL is not 0. Decided once. */
static inline bool pdl_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("FERRY_CUDA_PDL");
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
            (void)cudaGetLastError();
        on = major >= 9 && !(e && e[0] == '0');
    }
    return on != 0;
}

/* kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed. */
template <typename... KArgs, typename... Args>
static inline cudaError_t pdl_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t stream, Args... args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

#endif
