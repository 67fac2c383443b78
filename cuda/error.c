/* error.c — the CUDA, cuBLASLt and cuDNN status decoders behind QT_CUDA, QT_CUBLAS and QT_CUDNN: each names
 * the status and fails through qt_fail_as (src/core/error.c, qt_error.h). */
#include "qt_error.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

void qt_fail_cuda(const char *file, int line, const char *call, int status) {
    cudaError_t e = (cudaError_t)status;
    const char *hint = e == cudaErrorNoKernelImageForDevice ? " (hint: rebuild with make CUDA_ARCH=<your sm>)" : "";
    qt_fail_as(e == cudaErrorMemoryAllocation ? QT_ERR_DEVICE_OOM : QT_ERR_DEVICE, file, line, call,
               "CUDA error %d %s: %s%s", status, cudaGetErrorName(e), cudaGetErrorString(e), hint);
}

static const char *cublas_status_name(int s) {
    switch ((cublasStatus_t)s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "unknown";
    }
}

void qt_fail_cublas(const char *file, int line, const char *call, int status) {
    qt_fail_as(status == CUBLAS_STATUS_ALLOC_FAILED ? QT_ERR_DEVICE_OOM : QT_ERR_DEVICE, file, line, call,
               "cuBLAS status %d %s (cuBLASLt %zu)", status, cublas_status_name(status), cublasLtGetVersion());
}

void qt_fail_cudnn(const char *file, int line, const char *call, int status) {
    char detail[512] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    qt_fail_as(status == CUDNN_STATUS_ALLOC_FAILED ? QT_ERR_DEVICE_OOM : QT_ERR_DEVICE, file, line, call,
               "cuDNN status %d %s (cuDNN %zu)%s%s", status, cudnnGetErrorString((cudnnStatus_t)status),
               cudnnGetVersion(), detail[0] ? ": " : "", detail);
}
