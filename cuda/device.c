/* device.c — how many CUDA devices this process can use (0 without a driver or a GPU). */
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
