/* cuda_mdwe_probe.cu: does CUDA (driver, cudart, cuBLAS, a kernel, a PTX JIT) work in a process that may not map
 * memory writable and executable? deploy/ferry.service sets MemoryDenyWriteExecute=yes; this probe checks the
 * same rule with the kernel's prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN) (Linux >= 6.3), which refuses every
 * W+X mapping and every mprotect that adds PROT_EXEC, as systemd's seccomp filter does. Needs a GPU; not run in CI.
 *   nvcc -O2 -gencode arch=compute_90,code=compute_90 -o probe cuda_mdwe_probe.cu -lcublas   # PTX only: JIT
 *   ./probe mdwe ; ./probe none
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

__global__ void add_one(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

#define CK(call)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            printf("FAIL %s: %s\n", #call, cudaGetErrorString(e_));                              \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "mdwe")) {
        if (prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0)) {
            perror("prctl(PR_SET_MDWE)");
            return 2;
        }
        /* The rule is on: a W+X mapping must now be refused. */
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        printf("W+X mmap under MDWE: %s\n", p == MAP_FAILED ? "refused (rule active)" : "ALLOWED (rule not active)");
        if (p != MAP_FAILED) return 2;
    }
    const int n = 1 << 20;
    float *d, *h;
    CK(cudaMallocHost(&h, n * sizeof(float)));
    for (int i = 0; i < n; i++) h[i] = (float)i;
    CK(cudaMalloc(&d, n * sizeof(float)));
    CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    add_one<<<(n + 255) / 256, 256>>>(d, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != (float)i + 1.0f;
    printf("kernel: %s\n", bad ? "WRONG" : "ok");
    cublasHandle_t hb;
    if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) { printf("FAIL cublasCreate\n"); return 1; }
    const int m = 512;
    float *a, *c, one = 1.0f, zero = 0.0f;
    CK(cudaMalloc(&a, m * m * sizeof(float)));
    CK(cudaMalloc(&c, m * m * sizeof(float)));
    CK(cudaMemset(a, 0, m * m * sizeof(float)));
    cublasStatus_t s = cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, a, m, a, m, &zero, c, m);
    CK(cudaDeviceSynchronize());
    printf("cublasSgemm: %s\n", s == CUBLAS_STATUS_SUCCESS ? "ok" : "FAIL");
    cublasDestroy(hb);
    return bad || s != CUBLAS_STATUS_SUCCESS;
}
