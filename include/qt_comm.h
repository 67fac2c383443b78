/* qt_comm.h — collectives between the GPU threads of one process, on our own copy schedules (no NCCL).
 *
 * A communicator is made once (main thread) for N ranks; each rank's thread then calls the
 * collectives with its rank and its own stream. Every rank must call the same collectives in the same
 * order with the same counts (checked: a mismatch fails with a message naming both calls). Work is
 * enqueued on the caller's stream and returns at once: ranks rendezvous on the host only to exchange
 * pointers and events (never to wait for GPU work), so a thread runs at most one collective ahead.
 * Small collectives on GPU comms with one rank per device (opts.oneshot_max) run as one kernel per rank
 * whose ranks meet through flags in memory; a rank must issue those in order on one stream (or order the
 * streams it uses).
 *
 * Shards are uneven when N does not divide count: rank r owns [off, off+len) from qt_comm_shard
 * (the first count%N ranks get one element more). Sizes are 64-bit. In-place use is allowed where
 * a function says so. Reductions accumulate in fp32 in ascending rank order (acc = x_0; acc += x_1;
 * ...) and round once to the output dtype, so every rank gets bitwise the same result.
 *
 * A CPU backend (qt_comm_create_cpu: host buffers, memcpy, the same schedules) lets CI test the
 * slot/ordering logic and lets the CPU trainer use the same API with stream = NULL.
 *
 * Every collective returns 0, or -1 after qt_comm_abort (the caller must then stop using the comm). */
#ifndef QT_COMM_H
#define QT_COMM_H

#include <stddef.h>
#include <stdio.h>

#include "qt_cuda_types.h"

#include "qt_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QT_COMM_MAX_RANKS 8

/* How the ranks move data: auto (from the link probe), peer copies/loads, or host staging (pinned,
 * optionally write-combined). */
typedef enum { QT_COMM_AUTO, QT_COMM_PEER, QT_COMM_HOST, QT_COMM_HOST_WC } qt_comm_kind;
#define QT_COMM_MAX_SCALARS 64

typedef struct qt_comm qt_comm;
typedef enum { QT_COMM_SUM = 0, QT_COMM_MAX = 1 } qt_comm_op;

/* What the start-up probe measured (GB/s = 1e9 B/s; 0 where not measured). */
typedef struct {
    int n;                                             /* GPUs probed */
    int devices[QT_COMM_MAX_RANKS];
    char name[128];                                    /* device 0's name */
    int driver, runtime;                               /* cudaDriverGetVersion / cudaRuntimeGetVersion */
    int can_access[QT_COMM_MAX_RANKS][QT_COMM_MAX_RANKS]; /* cudaDeviceCanAccessPeer */
    double h2d[QT_COMM_MAX_RANKS], d2h[QT_COMM_MAX_RANKS]; /* pinned, one GPU at a time */
    double bidir[QT_COMM_MAX_RANKS];                   /* H2D + D2H at once, one GPU at a time (sum) */
    double h2d_all, d2h_all;                           /* per GPU, all GPUs at once */
    double bidir_all;                                  /* per GPU, H2D + D2H at once on all GPUs (sum of both) */
    double peer[QT_COMM_MAX_RANKS][QT_COMM_MAX_RANKS]; /* i -> j alone, peer access enabled */
    double peer_bidir_min;                             /* min over pairs of i<->j both at once (sum) */
    double peer_min;                                   /* min over pairs of peer[i][j] */
    double peer_load_bidir_min;                        /* min over pairs of i<->j both at once (sum), SM
                                                          loads through peer pointers (a copy kernel) */
    double seconds;                                    /* how long the probe took */
    qt_comm_kind pick;                                 /* what AUTO resolves to */
    int pick_rs;                                       /* QT_COMM_RS_COPY or _LOAD for peer reduce-scatter */
} qt_comm_probe_result;

/* How the peer kind reduces: copy engines pull foreign pieces into device staging and a local kernel
 * reduces them (COPY), or the reduction kernel reads every rank's shard in place through peer pointers
 * (LOAD: NVLink loads, data crosses once, no staging, but it uses SMs). Same result bitwise. */
enum { QT_COMM_RS_AUTO = 0, QT_COMM_RS_COPY = 1, QT_COMM_RS_LOAD = 2 };

/* Optional knobs; zero-initialised means the defaults. */
typedef struct {
    int ring;                 /* peer: 1 = ring-ordered pulls (one peer per step), 0 = all peers at once */
    size_t chunk_bytes;       /* pipeline chunk; 0 = 16 MiB for peer, for host kinds sqrt(piece bytes
                                 x 300 KB) clamped to [256 KiB, 4 MiB], for the peer broadcast chain
                                 sqrt(bytes x 2 MB / (N-2)) (fill/drain vs per-chunk cost) */
    int peer_rs;              /* QT_COMM_RS_*: AUTO = the probe's pick_rs when a probe is at hand
                                 (kind AUTO or opts->probe), else COPY; LOAD falls back to COPY where a
                                 pair of devices lacks peer access */
    double timeout_s;         /* a rank waiting longer for a peer fails with a message; 0 = never */
    int no_oneshot;           /* 1: never run a collective as one kernel per rank (see oneshot_max) */
    size_t oneshot_max;       /* GPU comms: collectives of up to this many bytes (the whole tensor), barriers
                                 and scalar all-reduces run as one kernel per rank that meets its peers
                                 through flags (comm/oneshot.h); needs peer access between all devices for
                                 the peer kind, an arena of N x the bytes for host kinds, and one rank per
                                 device (ranks sharing a GPU always use the copy-engine schedules). 0 = 16
                                 MiB (peer), 1 MiB (host kinds). Each rank must then issue its collectives
                                 in order on one stream. */
    const qt_comm_probe_result *probe; /* AUTO decides from this; NULL = run the probe */
    FILE *probe_log;          /* where qt_comm_create prints the probe it runs (NULL = silent) */
} qt_comm_opts;

/* Measures links between devices[0..n) (about a second) and picks a kind. 0 on success. */
int qt_comm_probe(int n, const int *devices, qt_comm_probe_result *out);
/* Prints the probe as text (fp) or as a markdown section (md = 1). */
void qt_comm_probe_print(const qt_comm_probe_result *p, FILE *fp, int md);

/* Makes a GPU communicator (main thread). Rank r runs on devices[r]; several ranks may share a
 * device. host_arena_bytes sizes the shared pinned staging arena of the host kinds (0 = 64 MiB, at
 * least one chunk per rank pair); host collectives stream through rings of arena slots (about 32 MiB),
 * so any size fits. opts may be NULL. Fails via qt_fail on CUDA errors.
 * The caller owns the result; free it with qt_comm_free once every rank has stopped. */
/* The bytes qt_comm_create (default options, no arena size given) allocates for n ranks: on each
 * rank's device (staging, scalars, flags) and pinned (the host kinds' arena, scalars, flags); kind
 * AUTO: the larger of peer and host. Without a GPU; allocates nothing lasting. */
void qt_comm_plan_bytes(int n, qt_comm_kind kind, size_t *dev_per_rank, size_t *pinned);
qt_comm *qt_comm_create(int n, const int *devices, qt_comm_kind kind, size_t host_arena_bytes,
                        const qt_comm_opts *opts);
/* The same schedules on host memory for CPU threads (stream arguments are ignored). */
qt_comm *qt_comm_create_cpu(int n, qt_comm_kind kind, size_t host_arena_bytes, const qt_comm_opts *opts);
void qt_comm_free(qt_comm *c);

int qt_comm_size(const qt_comm *c);
/* The kind in use (AUTO resolved) and a short name such as "peer", "peer_ring", "host_wc". */
qt_comm_kind qt_comm_kind_of(const qt_comm *c);
const char *qt_comm_name(const qt_comm *c);
/* Rank r's shard of count elements: [*off, *off + *len). */
void qt_comm_shard(size_t count, int n, int r, size_t *off, size_t *len);

/* dst[count] = concatenation of every rank's src[len_r]. In place when src == dst + off_r. */
int qt_comm_all_gather(qt_comm *c, int r, void *dst, const void *src, size_t count, qt_dtype dt,
                       cudaStream_t s);
/* The same when every rank's src is pinned host memory (offloaded shards): host->device only. */
int qt_comm_all_gather_host(qt_comm *c, int r, void *dst, const void *src, size_t count, qt_dtype dt,
                            cudaStream_t s);
/* dst[len_r] = sum over ranks of src[off_r .. off_r+len_r); fp32 or bf16. In place when
 * dst == src + off_r. The rest of src is left unchanged. */
int qt_comm_reduce_scatter(qt_comm *c, int r, void *dst, const void *src, size_t count, qt_dtype dt,
                           cudaStream_t s);
/* dst[count] = sum over ranks of src[count] (reduce-scatter then all-gather, or for peer_load up to
 * 64 MiB one kernel per rank that stores its reduced shard into every rank's dst); dst == src allowed,
 * otherwise dst and src must not overlap. */
int qt_comm_all_reduce(qt_comm *c, int r, void *dst, const void *src, size_t count, qt_dtype dt,
                       cudaStream_t s);
/* buf[count] on every rank = root's buf. Peer kinds with 3+ ranks pass it along a chain of ranks in
 * chunks above 4 MiB (every link carries it once); below, every rank pulls it from the root. */
int qt_comm_broadcast(qt_comm *c, int r, int root, void *buf, size_t count, qt_dtype dt, cudaStream_t s);
/* vals[n] (device memory on GPU comms, n <= QT_COMM_MAX_SCALARS, fp32) = sum or max over ranks, in
 * place. Max propagates NaN. Latency-bound: for loss, norm^2, abs-max. */
int qt_comm_all_reduce_scalars(qt_comm *c, int r, float *vals, int n, qt_comm_op op, cudaStream_t s);
/* Work after the barrier on any rank's stream starts after every rank's stream reached it. */
int qt_comm_barrier(qt_comm *c, int r, cudaStream_t s);

/* Makes every waiting and future call on c return -1 (also run for all live comms by qt_fail). */
void qt_comm_abort(qt_comm *c);

/* Reduction kernel (comm/reduce.cu): dsts[d][i] = op over srcs[0..nsrc) of src[k][i] in ascending k,
 * fp32 accumulation, rounded once to dt (fp32 or bf16), stored to each of dsts[0..ndst). A dst may
 * alias any src exactly (each element is read before it is written, by the same thread).
 * remote: how many of the sources are read through peer pointers (it sizes the grid). */
void qt_comm_reduce_launch(qt_dtype dt, void *const *dsts, int ndst, const void *const *srcs, int nsrc,
                           int remote, size_t n, qt_comm_op op, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
