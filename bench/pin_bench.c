/* pin_bench.c — how fast pinned host memory can be had: the 14B box's start spent 83-120 s pinning
 * 209 GiB over four ranks (bench/RESULTS.md section 16). Compares, for --gib N GiB in all (default 16):
 *   alloc      cudaHostAlloc (portable, mapped) of the whole, then a memset by one thread (what
 *              param_store.c did per rank before qt_pinned);
 *   alloc x R  the same split over R threads at once (R ranks starting together);
 *   qt_pinned  qt_pinned_alloc (mapped): mmap, the pages first touched by OpenMP threads, cudaHostRegister;
 *   qt_pinned x R  the same split over R threads.
 * Each line gives the seconds of the allocation and of the zeroing (alloc) and GiB/s over both, then the
 * H2D copy rate from the buffer (1 GiB, pinned memory's rate confirms the pages are pinned). Needs a GPU. */
#include <cuda_runtime.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qt_device.h"
#include "qt_error.h"
#include "qt_pinned.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    int reg;           /* 0: cudaHostAlloc + memset; 1: qt_pinned_alloc */
    size_t bytes;
    void *p;
    double t_alloc, t_zero;
    int ok;
} job;

static void *run(void *arg) {
    job *j = arg;
    unsigned flags = cudaHostAllocPortable | cudaHostAllocMapped;
    double t0 = now_s();
    if (!j->reg) {
        j->ok = cudaHostAlloc(&j->p, j->bytes, flags) == cudaSuccess;
        j->t_alloc = now_s() - t0;
        if (!j->ok) return NULL;
        t0 = now_s();
        memset(j->p, 0, j->bytes);
        j->t_zero = now_s() - t0;
        return NULL;
    }
    j->ok = qt_pinned_alloc(&j->p, j->bytes, QT_PIN_MAPPED) == 0; /* zeroed as it is made */
    j->t_alloc = now_s() - t0;
    return NULL;
}

static void release(job *j) {
    if (!j->ok) (void)cudaGetLastError();
    if (j->reg) {
        qt_pinned_free(j->p);
    } else if (j->ok) {
        QT_CUDA(cudaFreeHost(j->p));
    }
}

/* H2D GB/s of a 1 GiB copy from p (the median of 5). */
static double h2d_rate(const void *p, void *dev, size_t n) {
    double t[5];
    for (int k = 0; k < 5; k++) {
        double t0 = now_s();
        QT_CUDA(cudaMemcpy(dev, p, n, cudaMemcpyHostToDevice));
        t[k] = now_s() - t0;
    }
    for (int a = 0; a < 5; a++)
        for (int b = a + 1; b < 5; b++)
            if (t[b] < t[a]) {
                double x = t[a];
                t[a] = t[b], t[b] = x;
            }
    return n / t[2] / 1e9;
}

int main(int argc, char **argv) {
    double gib = 16;
    int ranks = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gib") && i + 1 < argc) gib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: pin_bench [--gib N (16)] [--ranks R (4)]\n");
            return 2;
        }
    }
    if (qt_cuda_device_count() == 0) {
        printf("SKIP pin_bench: no CUDA device\n");
        return 0;
    }
    size_t total = (size_t)(gib * 1073741824.0) / 4096 * 4096, probe = (size_t)1 << 30;
    void *dev;
    QT_CUDA(cudaFree(0));
    QT_CUDA(cudaMalloc(&dev, probe));
    printf("pin_bench: %.1f GiB in all, %d OpenMP threads\n", total / 1073741824.0, omp_get_max_threads());
    for (int reg = 0; reg < 2; reg++)
        for (int r = 1; r <= ranks; r = r == 1 && ranks > 1 ? ranks : r + ranks) {
            job j[64];
            pthread_t th[64];
            double t0 = now_s();
            for (int k = 0; k < r; k++) {
                j[k] = (job){.reg = reg, .bytes = total / (size_t)r / 4096 * 4096};
                QT_CHECK(pthread_create(&th[k], NULL, run, &j[k]) == 0, "pthread_create");
            }
            for (int k = 0; k < r; k++) pthread_join(th[k], NULL);
            double wall = now_s() - t0, ta = 0, tz = 0;
            int ok = 1;
            for (int k = 0; k < r; k++) ok &= j[k].ok, ta = j[k].t_alloc > ta ? j[k].t_alloc : ta, tz = j[k].t_zero > tz ? j[k].t_zero : tz;
            double rate = ok && j[0].bytes >= probe ? h2d_rate(j[0].p, dev, probe) : 0;
            printf("  %-9s x %d: %s %6.2f s %s, %6.2f s zeroing; %6.2f s in all (%5.2f GiB/s); H2D from it %.1f GB/s\n",
                   reg ? "qt_pinned" : "alloc", r, ok ? "" : "FAILED", ta, reg ? "pinning" : "allocating", tz, wall,
                   total / 1073741824.0 / wall, rate);
            for (int k = 0; k < r; k++) release(&j[k]);
        }
    QT_CUDA(cudaFree(dev));
    return 0;
}
