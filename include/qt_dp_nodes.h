/* qt_dp_nodes.h — the legs between nodes of a data-parallel step (docs/multi-node.md).
 *
 * One qtrain process per node; its GPU threads sum between themselves with comm/ as on one machine. With
 * parallel.zero >= 1 the optimizer state is sharded over the world (qt_partition.h: GPU g of node k holds world
 * piece g x nodes + k): after the in-node reduce-scatter each GPU thread reduce-scatters its local piece with
 * the same GPU of the other nodes (local GPU g's NCCL communicator, qt_internode.h), AdamW updates the world
 * piece, and the new bf16 weights are all-gathered back over the nodes, then inside the node (ZeRO-3: at each
 * gather of a bucket). With parallel.zero 0 the state is replicated per node: the in-node sum is all-reduced
 * over the nodes. The host values the step reports (the loss sums, the eval losses) and the trainer's
 * agreements (a checkpoint written, a stop) cross on local GPU 0's communicator. A watchdog thread polls
 * the communicators: a node that fails or vanishes aborts them and the node's comm, and the engine's next
 * call fails with the lost node named. A failure in this process (qt_fail's abort hook) aborts them too, so
 * no thread here or on another node waits for it.
 *
 * Built where NCCL is (the Makefile's NCCL_FOUND); elsewhere every entry point fails saying so. */
#ifndef QT_DP_NODES_H
#define QT_DP_NODES_H

#include <stddef.h>

#include "qt_comm.h"
#include "qt_cuda_types.h"
#include "qt_dtype.h"
#include "qt_internode.h"
#include "qt_partition.h"

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

/* Rank threads (GPU g of the node, its device current, stream s; each fails through qt_fail when a node is gone). */
/* The node's sum of a bucket over the nodes: local[n_local] (the whole bucket, or GPU g's local piece) summed
 * into mine[n_mine]. n_mine = n_local: all-reduced in place (the state replicated per node, parallel.zero 0);
 * else reduce-scattered, mine the node's world piece of it (in place: mine = local + node x n_mine). NCCL's
 * sum: with two nodes x + y, the order-free one. */
void qt_dp_nodes_sum(qt_internode *x, int g, void *local, void *mine, size_t n_local, size_t n_mine, qt_dtype dt,
                     cudaStream_t s);
/* local[nodes x per] = every node's mine[per] in node order (bits kept; in place: mine = local + node x per):
 * the world pieces of GPU g's local piece, or its world pieces' values (the norm's sums). */
void qt_dp_nodes_all_gather(qt_internode *x, int g, void *local, const void *mine, size_t per, qt_dtype dt,
                            cudaStream_t s);
/* vals[n] (fp32, device, in place) = the max over the nodes (ZeRO-3's e4m3 gathers: the weights' abs-maxes). */
void qt_dp_nodes_max(qt_internode *x, int g, float *vals, int n, cudaStream_t s);
/* ZeRO over the world, a checkpoint's or the weights' item: GPU g's world pieces of every bucket (sh's state
 * order, es bytes each, pieces[sh->len] in host or device memory) gathered over the nodes into out, the local
 * pieces back to back [sh->len x nodes] in host memory as one node's GPU g holds them with the state per node
 * (NULL: this node takes part only), through stage (device, stage_bytes) a chunk at a time. Synchronous on s. */
void qt_dp_nodes_widen(qt_internode *x, int g, const qt_shard *sh, const void *pieces, size_t es, void *out, void *stage,
                       size_t stage_bytes, cudaStream_t s);

#endif
