/* pinned.c — zeroed pinned host memory: parallel first touch + cudaHostRegister (qt_pinned.h). */
#include "qt_pinned.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "qt_error.h"

#define PIN_MAGIC 0x71746e6970ull /* "qtpin" */

typedef struct {
    uint64_t magic, bytes; /* bytes: the whole block, this header page included */
    int registered;        /* 1: mmap + cudaHostRegister; 0: cudaHostAlloc */
} pin_header;

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

int qt_pinned_alloc(void **p, size_t bytes, unsigned flags) {
    size_t pg = page_size(), total = pg + (bytes + pg - 1) / pg * pg;
    char *base = NULL;
    int registered = !(flags & QT_PIN_WC);
    *p = NULL;
    if (!registered) {
        unsigned f = cudaHostAllocPortable | cudaHostAllocWriteCombined | (flags & QT_PIN_MAPPED ? cudaHostAllocMapped : 0);
        if (cudaHostAlloc((void **)&base, total, f) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
        memset(base, 0, total); /* write-combined: the CPU's writes stream; nobody reads them back here */
    } else {
        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return -1;
        /* first touch in parallel: the kernel zeroes each page as it faults in, on every core at once */
        long pages = (long)(total / pg);
#pragma omp parallel for schedule(static)
        for (long i = 0; i < pages; i++) base[(size_t)i * pg] = 0;
        unsigned f = cudaHostRegisterPortable | (flags & QT_PIN_MAPPED ? cudaHostRegisterMapped : 0);
        if (cudaHostRegister(base, total, f) != cudaSuccess) {
            (void)cudaGetLastError();
            munmap(base, total);
            return -1;
        }
    }
    *(pin_header *)base = (pin_header){PIN_MAGIC, total, registered};
    *p = base + pg;
    return 0;
}

void qt_pinned_free(void *p) {
    if (!p) return;
    char *base = (char *)p - page_size();
    pin_header h = *(pin_header *)base;
    QT_CHECK(h.magic == PIN_MAGIC, "qt_pinned_free: %p was not made by qt_pinned_alloc", p);
    if (!h.registered) {
        QT_CUDA(cudaFreeHost(base));
        return;
    }
    QT_CUDA(cudaHostUnregister(base));
    munmap(base, h.bytes);
}
