/* qt_internode.h — the collectives between nodes, over NCCL (the only transport between machines).
 *
 * Each node runs one process whose GPU threads keep using comm/ between themselves; across nodes, local
 * GPU g of every node forms one NCCL communicator (NCCL rank = node rank), so the hierarchical sum is:
 * reduce-scatter inside the node (comm/), all-reduce of the rank's slice with its peers here, all-gather
 * inside the node. Node 0 makes one NCCL unique id per local GPU index (qt_internode_make_ids) and hands
 * them over with the rendezvous (qt_rendezvous.h). Built only where NCCL is (the Makefile's NCCL_FOUND).
 *
 * Communicators are non-blocking underneath: every wait is bounded by the timeout given at creation,
 * and qt_internode_abort (any thread) makes every pending or later call fail instead of hanging. */
#ifndef QT_INTERNODE_H
#define QT_INTERNODE_H

#include <stddef.h>

#include "qt_cuda_types.h"
#include "qt_dtype.h"

#define QT_INTERNODE_ID_BYTES 128 /* sizeof(ncclUniqueId) */
#define QT_INTERNODE_MAX_GPUS 8

typedef struct qt_internode qt_internode;

/* Node 0: writes gpus NCCL unique ids (id g at blob + g * QT_INTERNODE_ID_BYTES) into blob of cap bytes.
 * Returns 0, or -1 with a message (gpus out of 1..QT_INTERNODE_MAX_GPUS, too small a blob, NCCL). */
int qt_internode_make_ids(unsigned char *blob, size_t cap, int gpus, char *err, size_t errlen);

/* Every node, once, from one thread: the communicator of each local GPU g (CUDA device devices[g]) with
 * the GPUs g of the other nodes, this node being NCCL rank node_rank of nodes. Returns once every node
 * joined (0; *out owned by the caller, freed with qt_internode_free), or -1 with a message when NCCL
 * fails or timeout_s passes first (the communicators aborted). The thread's current device is kept. */
int qt_internode_create(qt_internode **out, const unsigned char *blob, int node_rank, int nodes, int gpus,
                        const int *devices, double timeout_s, char *err, size_t errlen);
/* Destroys the communicators (after an abort: frees what is left). */
void qt_internode_free(qt_internode *c);
/* From any thread: aborts every communicator (ncclCommAbort); calls pending on them return -1. */
void qt_internode_abort(qt_internode *c);
/* The first asynchronous NCCL error of any communicator (a node gone, the network): 0 none, -1 with a
 * message. For a watchdog thread that then calls qt_internode_abort. */
int qt_internode_check(qt_internode *c, char *err, size_t errlen);

/* Collectives of local GPU g on stream s (the caller's device is devices[g]); sums in dt (QT_DT_F32 or
 * QT_DT_BF16: NCCL's reduction order, not comm/'s fixed one). Enqueued, not waited for. Each returns 0,
 * or -1 once aborted; an NCCL error fails through qt_fail (QT_ERR_DEVICE) naming the call.
 * all_reduce: dst[count] = sum over nodes of src[count] (in place allowed).
 * reduce_scatter: dst[per_node] = the sum over nodes of src[node_rank * per_node, +per_node).
 * all_gather: dst[nodes * per_node] = every node's src[per_node], in node order. */
int qt_internode_all_reduce(qt_internode *c, int g, qt_dtype dt, const void *src, void *dst, size_t count,
                            cudaStream_t s);
int qt_internode_reduce_scatter(qt_internode *c, int g, qt_dtype dt, const void *src, void *dst, size_t per_node,
                                cudaStream_t s);
int qt_internode_all_gather(qt_internode *c, int g, qt_dtype dt, const void *src, void *dst, size_t per_node,
                            cudaStream_t s);
/* vals[count] (fp32, in place) = the max over nodes of every node's vals (ncclMax): the e4m3 weights' abs-maxes.
 * A NaN is NCCL's to order; a NaN weight is its own node's AdamW's finiteness failure first. */
int qt_internode_all_reduce_max(qt_internode *c, int g, float *vals, size_t count, cudaStream_t s);

#endif
