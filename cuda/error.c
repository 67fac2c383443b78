/* error.c — qt_fail and the CUDA/cuBLASLt/cuDNN status decoders behind the QT_* check macros. */
#include "qt_error.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local int g_rank = -1;
static void (*g_hooks[8])(void);
static int g_nhooks;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void qt_error_set_rank(int rank) { g_rank = rank; }

int qt_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void qt_error_add_abort_hook(void (*hook)(void)) {
    pthread_mutex_lock(&g_lock);
    if (g_nhooks < 8) g_hooks[g_nhooks++] = hook;
    pthread_mutex_unlock(&g_lock);
}

static void fail_end(void) {
    /* One thread reports and exits; a second failing thread waits here until the exit happens. */
    static int failing;
    pthread_mutex_lock(&g_lock);
    if (failing) {
        pthread_mutex_unlock(&g_lock);
        for (;;) pthread_exit(NULL);
    }
    failing = 1;
    int n = g_nhooks;
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < n; i++) g_hooks[i]();
    fflush(stdout);
    fflush(stderr);
    exit(1);
}

static void vreport(const char *file, int line, const char *call, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (g_rank >= 0)
        fprintf(stderr, "qtrain: [rank %d] %s:%d: %s: %s\n", g_rank, file, line, call, msg);
    else
        fprintf(stderr, "qtrain: %s:%d: %s: %s\n", file, line, call, msg);
}

static void report(const char *file, int line, const char *call, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(file, line, call, fmt, ap);
    va_end(ap);
}

void qt_fail(const char *file, int line, const char *call, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(file, line, call, fmt, ap);
    va_end(ap);
    fail_end();
    __builtin_unreachable();
}

void qt_fail_cuda(const char *file, int line, const char *call, int status) {
    cudaError_t e = (cudaError_t)status;
    const char *hint = e == cudaErrorMemoryAllocation
                           ? " (hint: lower data.micro_batch or raise memory.lmhead_chunks)"
                       : e == cudaErrorNoKernelImageForDevice
                           ? " (hint: rebuild with make CUDA_ARCH=<your sm>)"
                           : "";
    report(file, line, call, "CUDA error %d %s: %s%s", status, cudaGetErrorName(e),
           cudaGetErrorString(e), hint);
    fail_end();
    __builtin_unreachable();
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
    report(file, line, call, "cuBLAS status %d %s (cuBLASLt %zu)", status,
           cublas_status_name(status), cublasLtGetVersion());
    fail_end();
    __builtin_unreachable();
}

void qt_fail_cudnn(const char *file, int line, const char *call, int status) {
    char detail[512] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    report(file, line, call, "cuDNN status %d %s (cuDNN %zu)%s%s", status,
           cudnnGetErrorString((cudnnStatus_t)status), cudnnGetVersion(), detail[0] ? ": " : "",
           detail);
    fail_end();
    __builtin_unreachable();
}
