/* qt_rendezvous.h — the start-up meeting of the nodes of a multi-node run, over TCP.
 *
 * Node 0 listens on port (every IPv4 address of its host); every other node connects to host:port
 * (retrying until node 0 listens), says who it is (node rank, node count, GPU count, config hash), and
 * receives node 0's blob (the NCCL unique ids). Node 0 refuses a node whose node count, GPU count or
 * config hash differs from its own, or whose rank is out of range or taken, and then every node fails
 * with that node named. A barrier ends it: qt_rdzv_run returns 0 on every node, or -1 on every node.
 * Every socket operation has a deadline (timeout_s after the call, node 0's judgement 2 s later for the
 * others), so a node that never arrives or dies makes the others fail with its rank, never hang. */
#ifndef QT_RENDEZVOUS_H
#define QT_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#define QT_RDZV_MAX_NODES 64
#define QT_RDZV_BLOB 1024 /* bytes node 0 hands every node: room for 8 NCCL unique ids of 128 bytes */

typedef struct {
    const char *host;     /* node 0's host name or IPv4 address (the others connect to it) */
    int port;             /* node 0 listens on it (1..65535) */
    int node_rank, nodes; /* this node, of nodes (1..QT_RDZV_MAX_NODES; 1 returns at once) */
    int gpus;             /* this node's GPU count: every node must have node 0's */
    uint64_t config_hash; /* what must agree between nodes (the run's config) */
    double timeout_s;     /* the whole rendezvous, > 0 */
} qt_rdzv_opts;

/* Meets the other nodes. blob: node 0's QT_RDZV_BLOB bytes are sent; every other node's are overwritten
 * with them. Returns 0, or -1 with a message in err (the node at fault named: "node 2: config hash ...",
 * "node 3 never arrived", "node 1 closed its connection", "port 29500 is in use"). */
int qt_rdzv_run(const qt_rdzv_opts *o, unsigned char *blob, char *err, size_t errlen);

#endif
