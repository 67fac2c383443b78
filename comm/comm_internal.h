/* comm_internal.h — the communicator's state, shared by the schedules (comm.c), the host rendezvous
 * (sync.c) and the GPU backend (comm_gpu.c). Not a public header.
 *
 * Ordering: the k-th collective of every rank uses slot k % QT_COMM_SLOTS. A rank publishes its
 * pointers in the slot and records its events, then posts phase A; peers wait for A before they
 * enqueue waits on those events (so cudaStreamWaitEvent never sees a stale record). After enqueueing
 * its reads a rank records its done event and posts B; after waiting for every B it makes its stream
 * wait on every done event and posts C. A slot (and its events) is reused only once every rank posted
 * C for the collective that used it QT_COMM_SLOTS earlier. Counters are monotonic 64-bit. */
#ifndef QT_COMM_INTERNAL_H
#define QT_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "oneshot.h"
#include "qt_comm.h"

#define QT_COMM_SLOTS 4
#define QT_COMM_MAX_CHUNKS 64 /* chunk events per rank and slot: the most ring slots of a host collective and
                                 the most chunks of a broadcast chain */
/* Host collectives: the ring slots of all regions together hold about this much. A small footprint is
 * what 4 x H200 rewards (host all-gather busbw at 256 MiB: 47.4 GB/s with 32 MiB of slots, 41.7 with 48,
 * 39.3 with 64, ~36-37 with the whole piece staged); 2 x H200 is flat from 3 slots per owner up. */
#define QT_COMM_RING_BYTES ((size_t)32 << 20)
#define QT_COMM_AR_FUSED_MAX ((size_t)64 << 20) /* peer_load all-reduce: one fused kernel up to this many bytes */
/* Peer broadcast on 3+ ranks: every rank pulls from the root up to this many bytes, a chain above
 * (4 x H200: 1 MiB 23.5 vs 18.2 GB/s, 4 MiB 60.6 vs 51.3; 16 MiB 100.4 vs 107.5, 64 MiB 123 vs 198). */
#define QT_COMM_BC_DIRECT_MAX ((size_t)4 << 20)
/* Default one-kernel limits (the whole tensor's bytes; oneshot.h), from comm_bench --oneshot-sweep on
 * 4 x H200 (one kernel vs the copy-engine schedules, bench/archive/RESULTS-history.md). 4 ranks: peer 1.3-3.7x faster up
 * to 4 MiB, 1.03-1.30x at 16 MiB, 0.6-0.7x for all-gather and broadcast at 64 MiB; host kinds 1.1-4.4x
 * up to 1 MiB, 0.8-1.3x at 4 MiB (SM loads from pinned memory are slower than the copy engines).
 * 2 ranks: peer 0.9-1.8x up to 4 MiB (its copy-engine reduce-scatter and all-reduce are one kernel too),
 * 1.05-1.16x at 16 MiB; host 1.1-2.9x up to 1 MiB but broadcast (0.8-1.0x from 64 KiB). */
#define QT_COMM_ONESHOT_PEER_MAX ((size_t)16 << 20)
#define QT_COMM_ONESHOT_HOST_MAX ((size_t)1 << 20)
#define QT_COMM_LANES QT_COMM_MAX_RANKS /* internal streams per rank (>= max(2, N-1)) */
/* Lanes QT_COMM_LANES + 1 .. 2 x QT_COMM_LANES: the pulls of qt_comm_all_gather_host, whose sources sit in
 * pinned host memory and need no staging: on streams of their own they do not queue behind a staged
 * collective's copies (a ZeRO-3 weight gather behind the previous layer's gradient reduce-scatter). */
#define QT_COMM_ALL_LANES (2 * QT_COMM_LANES)

/* Phases A, B, C count collectives; W and R count the chunk steps of a host ring
 * (collective seq << QT_COMM_STEP_BITS | step + 1), posted after a rank enqueued its write / reads. */
enum { QT_PH_A = 0, QT_PH_B = 1, QT_PH_C = 2, QT_PH_W = 3, QT_PH_R = 4, QT_PH_N = 5 };
#define QT_COMM_STEP_BITS 24
enum { QT_OP_AG = 1, QT_OP_AG_HOST, QT_OP_RS, QT_OP_AR, QT_OP_BC, QT_OP_SCAL, QT_OP_BARRIER };

typedef struct {
    int op, dt, root, red;
    size_t count;
} qt_comm_desc;

typedef struct {
    const void *src[QT_COMM_MAX_RANKS];
    void *dst[QT_COMM_MAX_RANKS]; /* only the fused all-reduce publishes it (peers store into it) */
    qt_comm_desc desc[QT_COMM_MAX_RANKS];
} qt_comm_slot;

typedef struct qt_comm_gpu qt_comm_gpu; /* per-rank GPU state, comm_gpu.c */

struct qt_comm {
    int n, gpu, ring;
    int all_peer;   /* GPU peer kind: every pair of distinct devices has peer access enabled */
    int rs_load;    /* peer reduce-scatter through peer-pointer loads (QT_COMM_RS_LOAD resolved) */
    int chunk_auto; /* host kinds without opts->chunk_bytes: chunk sized per collective, chunk_bytes = max */
    int chunk_given; /* opts->chunk_bytes was set (the peer broadcast chain sizes its chunks otherwise) */
    int oneshot_on;     /* GPU comms, one rank per device: collectives up to oneshot_max bytes run as one
                           kernel per rank */
    size_t oneshot_max;
    qt_comm_kind kind;
    int devices[QT_COMM_MAX_RANKS];
    size_t chunk_bytes;
    double timeout_s;
    char name[32];

    unsigned char *arena;   /* shared staging: [scalars: n*MAX_SCALARS floats][main: arena_bytes] */
    size_t arena_bytes;     /* main part */
    float *scal;            /* start of the arena */

    _Atomic int64_t posted[QT_PH_N][QT_COMM_MAX_RANKS];
    _Atomic int aborted;
    int *abort_word;               /* GPU comms: pinned host copy of aborted, polled by one-shot kernels */
    unsigned long long *hflags;    /* GPU host kinds: one-shot flag cells, QT_COMM_MAX_RANKS per rank (pinned) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qt_comm_slot slot[QT_COMM_SLOTS];
    int64_t seq[QT_COMM_MAX_RANKS]; /* written only by rank r's thread */

    qt_comm_gpu *g[QT_COMM_MAX_RANKS];
    void *stage[QT_COMM_MAX_RANKS];      /* reduce-scatter staging, 2*(n-1)*chunk_bytes (device or host) */
    float *scal_stage[QT_COMM_MAX_RANKS]; /* n*QT_COMM_MAX_SCALARS floats (device or host) */
    size_t stage_bytes;
};

qt_comm *qt_comm_alloc(int n, qt_comm_kind kind, size_t arena_bytes, const qt_comm_opts *opts, int gpu);
/* Sets c->rs_load (opts->peer_rs, AUTO resolved from probe when not NULL) and the name. */
void qt_comm_set_rs(qt_comm *c, const qt_comm_opts *opts, const qt_comm_probe_result *probe);

/* sync.c: post / wait on phase counters; wait returns -1 when aborted (fails after timeout_s). */
void qt_comm_post(qt_comm *c, int ph, int r, int64_t seq);
int qt_comm_wait_all(qt_comm *c, int ph, int r, int64_t seq);
int qt_comm_wait_one(qt_comm *c, int ph, int r, int j, int64_t seq); /* rank j only (all when j < 0) */
void qt_comm_register(qt_comm *c);
void qt_comm_unregister(qt_comm *c);

/* comm_gpu.c: the GPU backend. Lane 0 is the caller's stream, lanes 1.. are the rank's own streams. */
void qt_commg_init(qt_comm *c, size_t arena_total, int wc);
void qt_commg_free(qt_comm *c);
void qt_commg_enter(qt_comm *c, int r);
void qt_commg_copy(qt_comm *c, int r, int lane, cudaStream_t s, void *dst, const void *src, size_t bytes);
void qt_commg_dep(qt_comm *c, int r, int from, int to, cudaStream_t s); /* to waits from's current point */
void qt_commg_mark(qt_comm *c, int r, int lane, cudaStream_t s, int which, int slot, int chunk);
void qt_commg_wait_peer(qt_comm *c, int r, int lane, cudaStream_t s, int j, int which, int slot, int chunk);
void qt_commg_record_pulled(qt_comm *c, int r, int lane, cudaStream_t s, int buf);
void qt_commg_wait_pulled(qt_comm *c, int r, int lane, cudaStream_t s, int buf);
/* Fills a's flags, abort word, counters and grid cap for rank r and launches it on s. */
void qt_commg_oneshot(qt_comm *c, int r, qt_oneshot *a, cudaStream_t s);
enum { QT_EV_READY = 0, QT_EV_DONE = 1, QT_EV_CHUNK = 2, QT_EV_PULL = 3 };

#endif
