/* oneshot.h — small collectives as one kernel per rank (oneshot.cu), which comm.c uses up to a size
 * limit (qt_comm_opts.oneshot_max). The ranks' kernels meet through flags instead of cross-device
 * events: on 4 x H200, back to back, a round of cross-device events costs ~11 us and a copy-engine
 * all-gather of 4 KiB ~54 us; the kernel's flag round trip ~6 us and its 4 KiB all-gather ~9 us
 * (bench/archive/RESULTS-history.md, "Small collectives as one kernel per rank").
 *
 * Every rank has an array of flag cells, one per posting rank (device memory when every pair of devices
 * has peer access, else pinned host memory). For collective seq a rank's kernel
 *   1. publishes its input where peers read it: host kinds copy it into the rank's arena region; peer
 *      kinds read the rank's own buffer in place (nothing to do);
 *   2. stores 2*seq into its cell of every peer's flags, then waits until every peer's cell in its own
 *      flags reaches 2*seq: every peer's input is published and every peer's output is free;
 *   3. copies or reduces (from peers' buffers or arena regions; the peer all-reduce also stores into
 *      every rank's output);
 *   4. once all its blocks are done, stores 2*seq+1 to every peer and waits for every peer's 2*seq+1, so
 *      no rank's stream passes the collective while a peer may still read its buffers or write its output.
 * Cells only grow, and a rank is at most one collective ahead of a peer. The ranks' host threads meet
 * (phase A) before launching, so every rank's kernel is enqueued before any waits on it; a rank that fails
 * before launching aborts the comm, which sets *abort, and the waiting kernels return.
 * A rank's kernels must run in order: issue each rank's collectives on one stream (or order the streams). */
#ifndef QT_COMM_ONESHOT_H
#define QT_COMM_ONESHOT_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "qt_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A rank's kernel-private words (device memory, zero at creation). */
typedef struct {
    unsigned arrive[2];       /* blocks done publishing / done reading (reset by the last block) */
    unsigned long long go;    /* block 0 stores seq here once every peer's start flag arrived (~0: aborted) */
} qt_oneshot_local;

typedef struct {
    int n, r;                 /* ranks, my rank */
    int dt, red;              /* reduce: qt_dtype (fp32 or bf16), QT_COMM_SUM or QT_COMM_MAX */
    int reduce;               /* 0: copy the pieces; 1: dst[0..ndst) = reduction of src[0..nsrc) */
    int npiece, nsrc, ndst;
    unsigned long long seq;
    unsigned long long *flags[QT_COMM_MAX_RANKS]; /* rank j's cells, indexed by the posting rank */
    const int *abort;         /* pinned host word, nonzero once the comm is aborted */
    qt_oneshot_local *local;  /* mine */
    int max_blocks;           /* grid cap: the device's SMs (blocks spin on each other: all must be resident) */
    const void *pub_src;      /* step 1 (host kinds): pub_bytes from pub_src to pub_dst */
    void *pub_dst;
    size_t pub_bytes;
    const void *src[QT_COMM_MAX_RANKS]; /* copy: piece k moves bytes[k] from src[k] to dst[k] */
    void *dst[QT_COMM_MAX_RANKS];
    size_t bytes[QT_COMM_MAX_RANKS];
    size_t nelem;             /* reduce: elements */
} qt_oneshot;

/* Enqueues the kernel on s (current device = the rank's). */
void qt_comm_oneshot_launch(const qt_oneshot *a, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
