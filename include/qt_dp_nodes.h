/* qt_dp_nodes.h — the legs between nodes of a data-parallel step (docs/multi-node.md).
 *
 * One qtrain process per node; its GPU threads sum between themselves with comm/ as on one machine, and
 * the optimizer state (ZeRO-1/2/3 over the node's GPUs) is replicated per node. After the in-node sum
 * each GPU thread all-reduces its own piece with the same piece of the other nodes (local GPU g's NCCL
 * communicator, qt_internode.h), so every node holds the same summed gradients, and the norm, AdamW, the
 * weight gathers and the e4m3 abs-maxes stay inside the node. The host values the step reports (the loss
 * sums, the eval losses) and the trainer's agreements (a checkpoint written, a stop) cross on local GPU
 * 0's communicator. A watchdog thread polls the communicators: a node that fails or vanishes aborts
 * them and the node's comm, and the engine's next call fails with the lost node named. A failure in this
 * process (qt_fail's abort hook) aborts them too, so no thread here or on another node waits for it.
 *
 * Built where NCCL is (the Makefile's NCCL_FOUND); elsewhere every entry point fails saying so. */
#ifndef QT_DP_NODES_H
#define QT_DP_NODES_H

#include <stddef.h>

#include "qt_comm.h"
#include "qt_cuda_types.h"
#include "qt_dtype.h"
#include "qt_internode.h"
#include "qt_param_store.h"

#define QT_NODES_MAX 64   /* parallel.nodes at most */
#define QT_NODES_IDS 1024 /* node 0's NCCL unique ids, one per local GPU (qt_internode_make_ids; = QT_RDZV_BLOB) */

/* Where this process stands in a multi-node run, as the rendezvous left it. */
typedef struct qt_nodes {
    int node, nodes;                 /* this node's index of nodes (nodes 1: one machine, nothing else read) */
    unsigned char ids[QT_NODES_IDS]; /* node 0's NCCL unique ids, the same bytes on every node */
} qt_nodes;

typedef struct qt_dp_nodes qt_dp_nodes;

/* Node 0, before the rendezvous: the ids of `gpus` communicators into ids. 0, or -1 with err. */
int qt_dp_nodes_ids(unsigned char *ids, int gpus, char *err, size_t errlen);

/* From the engine's thread (the thread's device is kept): the communicators of the node's gpus GPUs
 * devices[] with the other nodes (waits for every node, at most timeout_s), a small host-value buffer on
 * devices[0], and the watchdog, which aborts comm (borrowed; the node's) beside the communicators when a
 * node fails. NULL with err on failure. */
qt_dp_nodes *qt_dp_nodes_create(const qt_nodes *n, int gpus, const int *devices, qt_comm *comm, double timeout_s,
                                char *err, size_t errlen);
/* Stops the watchdog; aborts the communicators when abort (a failed engine), else finalizes them. Takes NULL. */
void qt_dp_nodes_free(qt_dp_nodes *x, int abort);
/* The communicators, for the ranks' sums (borrowed). */
qt_internode *qt_dp_nodes_link(qt_dp_nodes *x);
/* 1 with the watchdog's message in msg when a node failed (the communicators are aborted), else 0. */
int qt_dp_nodes_failed(qt_dp_nodes *x, char *msg, size_t cap);
/* Every node's `per` doubles mine[per] into all[nodes][per], in node order (bits kept: fp32 words over
 * NCCL's all-gather), on local GPU 0's communicator. Every node calls it at the same point; fails
 * (qt_fail) when a node is gone. */
void qt_dp_nodes_gather(qt_dp_nodes *x, const double *mine, int per, double *all);

/* Rank threads (GPU g of the node, its device current, stream s). */
/* buf[count] in dt summed over the nodes in place (NCCL's sum: with two nodes x + y, the order-free one). */
void qt_dp_nodes_sum(qt_internode *x, int g, void *buf, size_t count, qt_dtype dt, cudaStream_t s);
/* plan.parallel.world_pieces: the gradient norm and clip scale of local rank `rank` of the node's comm
 * into ps->norm / ps->clip, as one process with all nodes x n_ranks GPUs computes them: each local piece
 * of a bucket cut into `nodes` world pieces (the shard is cut for the world: qt_shard_init_world), a
 * sum of squares per world piece into sumsq[nodes x n_ranks][n_buckets] (device, in world-piece order),
 * gathered over the node's ranks, then qt_clip_from_sumsq over them in that order: the one process's bits. */
void qt_dp_nodes_norm(const qt_param_store *ps, qt_comm *comm, int rank, int nodes, double *sumsq,
                      float max_norm, void *ws, cudaStream_t s);

#endif
