/* device.c — how many CUDA devices this process can use (0 without a driver or a GPU), and their free memory. */
#include <cuda_runtime.h>

#include "qt_device.h"

int qt_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error so later probes start clean */
        return 0;
    }
    return n;
}

size_t qt_cuda_mem_free(const int *devs, int n) {
    int cur;
    size_t least = 0;
    if (cudaGetDevice(&cur) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    for (int i = 0; i < n; i++) {
        size_t f, t;
        if (cudaSetDevice(devs[i]) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
            (void)cudaGetLastError();
            least = 0;
            break;
        }
        if (i == 0 || f < least) least = f;
    }
    (void)cudaSetDevice(cur);
    return least;
}
