/* launch.c — the launcher variables (torchrun, env, Slurm, OpenMPI) turned into a qt_launch value.
 *
 * Pure: the variables come through the caller's getter (qt_launch.h), so the CLI owns the environment. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "qt_error.h"
#include "qt_launch.h"

/* One launcher: its rank and size variables and what else it must satisfy. */
typedef struct {
    const char *name, *rank, *size;
    const char *local_size;  /* processes on this node (must be 1), or NULL */
    int default_port;        /* 1: MASTER_PORT may be left out */
} launcher;

static const launcher LAUNCHERS[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", 0},
    {"env", "NODE_RANK", "NNODES", NULL, 0},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", NULL, 1},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", 1},
};

/* A whole decimal number in [lo, hi] from variable name; -1 with a message naming it otherwise. */
static int get_int(qt_launch_getter get, void *ctx, const char *name, long lo, long hi, long *out, char *err,
                   size_t errlen) {
    const char *s = get(ctx, name);
    if (!s) return qt_errf(err, errlen, "%s is not set", name);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno == ERANGE || v < lo || v > hi)
        return qt_errf(err, errlen, "%s=\"%s\": expected a whole number in [%ld, %ld]", name, s, lo, hi);
    *out = v;
    return 0;
}

int qt_launch_first_host(const char *list, char *out, size_t cap, char *err, size_t errlen) {
    size_t n = strcspn(list, ",[");
    if (n == 0) return qt_errf(err, errlen, "SLURM_JOB_NODELIST=\"%s\": expected host names", list);
    if (n + 1 > cap) return qt_errf(err, errlen, "SLURM_JOB_NODELIST=\"%s\": first host name too long", list);
    memcpy(out, list, n);
    out[n] = 0;
    if (list[n] != '[') return 0;
    const char *r = list + n + 1; /* the first range's start: digits, their zeros kept ("03") */
    size_t d = strspn(r, "0123456789");
    if (d == 0 || !strchr(",-]", r[d]) || !strchr(r, ']'))
        return qt_errf(err, errlen, "SLURM_JOB_NODELIST=\"%s\": expected host[a-b,c,...] after \"%.*s\"", list,
                       (int)n, list);
    if (n + d + 1 > cap) return qt_errf(err, errlen, "SLURM_JOB_NODELIST=\"%s\": first host name too long", list);
    memcpy(out + n, r, d);
    out[n + d] = 0;
    return 0;
}

/* MASTER_ADDR (else Slurm's first host) and MASTER_PORT into out. */
static int master(qt_launch *out, const launcher *l, qt_launch_getter get, void *ctx, char *err, size_t errlen) {
    const char *addr = get(ctx, "MASTER_ADDR");
    const char *list = get(ctx, "SLURM_JOB_NODELIST");
    if (addr && *addr) {
        if (strlen(addr) >= sizeof out->master_addr)
            return qt_errf(err, errlen, "MASTER_ADDR=\"%.40s...\": host name too long", addr);
        strcpy(out->master_addr, addr);
    } else if (!strcmp(l->name, "slurm") && list) {
        if (qt_launch_first_host(list, out->master_addr, sizeof out->master_addr, err, errlen)) return -1;
    } else {
        return qt_errf(err, errlen, "MASTER_ADDR is not set: the %s launch (%s=%s) needs node 0's host name%s",
                       l->name, l->size, get(ctx, l->size),
                       !strcmp(l->name, "openmpi") ? " (mpirun -x MASTER_ADDR=host)" : "");
    }
    long port = QT_LAUNCH_DEFAULT_PORT;
    if ((get(ctx, "MASTER_PORT") || !l->default_port) &&
        get_int(get, ctx, "MASTER_PORT", 1, 65535, &port, err, errlen))
        return -1;
    out->master_port = (int)port;
    return 0;
}

int qt_launch_resolve(qt_launch *out, int want_nodes, qt_launch_getter get, void *ctx, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    out->nodes = 1;
    out->launcher = "none";
    if (want_nodes <= 1) return 0;
    const launcher *l = NULL;
    for (size_t i = 0; i < sizeof LAUNCHERS / sizeof LAUNCHERS[0] && !l; i++)
        if (get(ctx, LAUNCHERS[i].rank) || get(ctx, LAUNCHERS[i].size)) l = &LAUNCHERS[i];
    if (!l)
        return qt_errf(err, errlen, "parallel.nodes %d: no launcher variables (RANK/WORLD_SIZE of torchrun, "
                       "NODE_RANK/NNODES, SLURM_PROCID/SLURM_NTASKS of srun, OMPI_COMM_WORLD_RANK/SIZE of "
                       "mpirun); start one qtrain per node with one of them (docs/multi-node.md)", want_nodes);
    long size, rank, local = 1;
    if (get_int(get, ctx, l->size, 1, INT_MAX, &size, err, errlen) ||
        get_int(get, ctx, l->rank, 0, INT_MAX, &rank, err, errlen))
        return -1;
    if (rank >= size)
        return qt_errf(err, errlen, "%s=%ld is not below %s=%ld", l->rank, rank, l->size, size);
    if (l->local_size && get(ctx, l->local_size) &&
        get_int(get, ctx, l->local_size, 1, INT_MAX, &local, err, errlen))
        return -1;
    if (local != 1)
        return qt_errf(err, errlen, "%s=%ld: qtrain runs one process per node (its GPUs are threads); start "
                       "it with %s", l->local_size, local,
                       !strcmp(l->name, "torchrun") ? "torchrun --nproc_per_node=1" : "mpirun --npernode 1");
    if (!strcmp(l->name, "slurm")) {
        long node;
        if (get(ctx, "SLURM_NODEID") && get_int(get, ctx, "SLURM_NODEID", 0, INT_MAX, &node, err, errlen))
            return -1;
        if (get(ctx, "SLURM_NODEID") && node != rank)
            return qt_errf(err, errlen, "SLURM_NODEID=%ld differs from SLURM_PROCID=%ld: qtrain runs one task "
                           "per node (srun --ntasks-per-node=1)", node, rank);
    }
    if (size != want_nodes)
        return qt_errf(err, errlen, "%s=%ld processes but parallel.nodes %d: they must agree (one qtrain "
                       "per node)", l->size, size, want_nodes);
    out->node_rank = (int)rank;
    out->nodes = (int)size;
    out->launcher = l->name;
    return master(out, l, get, ctx, err, errlen);
}
