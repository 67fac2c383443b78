/* qt_device.h — CUDA device discovery shared by the trainer, tests and benchmarks. */
#ifndef QT_DEVICE_H
#define QT_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices (0 when the driver or a GPU is missing). */
int qt_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
