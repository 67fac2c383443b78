/* qt_launch.h — where this process stands in a multi-node run, read from its launcher's variables.
 *
 * One qtrain process runs per node (the node's GPUs are its threads). The launcher says which node this
 * is and where node 0 listens; this module turns its variables into a qt_launch value. It never reads the
 * environment itself: the caller (the CLI) passes a getter, so every launcher's story is a unit test.
 *
 * Launchers, first match wins:
 *   torchrun          RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (--nproc_per_node=1: LOCAL_WORLD_SIZE 1,
 *                     LOCAL_RANK 0, so RANK is the node rank)
 *   env               NODE_RANK, NNODES, MASTER_ADDR, MASTER_PORT (any launcher, or set by hand)
 *   Slurm             SLURM_PROCID, SLURM_NTASKS (srun --ntasks-per-node=1: SLURM_NODEID = SLURM_PROCID),
 *                     the first host of SLURM_JOB_NODELIST (MASTER_ADDR wins when set), MASTER_PORT
 *   OpenMPI           OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE (OMPI_COMM_WORLD_LOCAL_SIZE 1),
 *                     MASTER_ADDR (mpirun -x MASTER_ADDR=host), MASTER_PORT
 * MASTER_PORT defaults to QT_LAUNCH_DEFAULT_PORT for Slurm and OpenMPI (torchrun always sets it). */
#ifndef QT_LAUNCH_H
#define QT_LAUNCH_H

#include <stddef.h>

#define QT_LAUNCH_DEFAULT_PORT 29500
#define QT_LAUNCH_HOST_MAX 256

typedef struct {
    int node_rank;                       /* 0 .. nodes-1 */
    int nodes;                           /* 1: one machine, no rendezvous */
    char master_addr[QT_LAUNCH_HOST_MAX]; /* node 0's host name or address ("" with one node) */
    int master_port;                     /* node 0 listens here */
    const char *launcher;                /* "torchrun", "env", "slurm", "openmpi" or "none" (static) */
} qt_launch;

/* The value of the launcher variable name, or NULL when it is not set. */
typedef const char *(*qt_launch_getter)(void *ctx, const char *name);

/* Fills out from the launcher variables get returns. want_nodes is parallel.nodes: 1 accepts no
 * launcher (one node) and then ignores the variables; > 1 needs a launcher whose world size equals it.
 * Returns 0, or -1 with a message in err naming the variable and its value (malformed numbers, rank >=
 * size, a missing MASTER_ADDR, several processes on one node, a world size other than want_nodes). */
int qt_launch_resolve(qt_launch *out, int want_nodes, qt_launch_getter get, void *ctx, char *err, size_t errlen);

/* The first host of a Slurm node list ("gpu[03-05,9],cpu1" -> "gpu03"), in out (cap bytes).
 * Returns 0, or -1 with a message when list is empty or malformed. */
int qt_launch_first_host(const char *list, char *out, size_t cap, char *err, size_t errlen);

#endif
