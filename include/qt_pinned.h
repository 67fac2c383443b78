/* qt_pinned.h — large zeroed pinned host memory, fast.
 *
 * cudaHostAlloc pins at 1.2-2.2 GiB/s however many threads ask at once (32 GiB in 14.5-26 s on 4 x H200 hosts;
 * the 14B box's start pinned its 209 GiB in 83-120 s). Here: anonymous mmap, every page first touched
 * (zeroed) by OpenMP threads in parallel, then cudaHostRegister of the populated range: 32 GiB in 2.7-4.7 s on
 * the same hosts, and copies from it run at the same rate (bench/RESULTS.md, offload; bench/pin_bench).
 * Write-combined memory cannot be registered: QT_PIN_WC takes cudaHostAlloc's path.
 *
 * A page before the returned address records how the block was made, so qt_pinned_free needs only the
 * pointer. The memory is portable (every device) and, with QT_PIN_MAPPED, mapped: with unified addressing
 * kernels use the host address itself. */
#ifndef QT_PINNED_H
#define QT_PINNED_H

#include <stddef.h>

enum { QT_PIN_MAPPED = 1, QT_PIN_WC = 2 };

/* *p = `bytes` of zeroed pinned host memory (flags: QT_PIN_*). 0, or -1 with *p NULL (nothing held: the host
 * had not that much to give, or the driver refused; the CUDA error is cleared). */
int qt_pinned_alloc(void **p, size_t bytes, unsigned flags);
/* Frees what qt_pinned_alloc gave (NULL: nothing). */
void qt_pinned_free(void *p);

#endif
