/* qt_device.h — CUDA device discovery shared by the trainer, tests and benchmarks. */
#ifndef QT_DEVICE_H
#define QT_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices (0 when the driver or a GPU is missing). */
int qt_cuda_device_count(void);
/* The least free memory (cudaMemGetInfo, bytes) over devices devs[n]: what the busiest of them leaves to a
 * run starting now (each device's context is made by the query if it has none). 0 when a query fails or
 * n is 0. The current device is kept. */
size_t qt_cuda_mem_free(const int *devs, int n);

#ifdef __cplusplus
}
#endif
#endif
