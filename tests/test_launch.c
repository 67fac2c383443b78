/* test_launch.c — the launcher variables of torchrun, NODE_RANK/NNODES, Slurm and OpenMPI read into a
 * qt_launch; malformed or inconsistent ones refused with the variable and its value named. */
#include "qt_launch.h"
#include "qt_test.h"

/* The getter over a NULL-terminated array of "NAME=value". */
static const char *from_list(void *ctx, const char *name) {
    size_t n = strlen(name);
    for (const char *const *v = ctx; *v; v++)
        if (!strncmp(*v, name, n) && (*v)[n] == '=') return *v + n + 1;
    return NULL;
}

static qt_launch L;
static char err[512];

static int resolve(int nodes, const char *const *vars) {
    err[0] = 0;
    return qt_launch_resolve(&L, nodes, from_list, (void *)vars, err, sizeof err);
}

static void test_one_node_ignores_launcher(void) {
    const char *v[] = {"SLURM_PROCID=0", "SLURM_NTASKS=4", NULL}; /* qtrain run directly in an sbatch script */
    QT_EXPECT(resolve(1, v) == 0 && L.nodes == 1 && L.node_rank == 0 && !strcmp(L.launcher, "none"), "%s", err);
}

static void test_torchrun(void) {
    const char *v[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=gpu07",
                       "MASTER_PORT=29400", "SLURM_PROCID=0", "SLURM_NTASKS=2", NULL};
    QT_REQUIRE(resolve(2, v) == 0, "%s", err);
    QT_EXPECT(L.node_rank == 1 && L.nodes == 2 && !strcmp(L.master_addr, "gpu07") && L.master_port == 29400 &&
              !strcmp(L.launcher, "torchrun"), "rank %d nodes %d addr %s port %d %s", L.node_rank, L.nodes,
              L.master_addr, L.master_port, L.launcher);
}

static void test_node_rank_nnodes(void) {
    const char *v[] = {"NODE_RANK=3", "NNODES=4", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=1234", NULL};
    QT_EXPECT(resolve(4, v) == 0 && L.node_rank == 3 && L.nodes == 4 && L.master_port == 1234 &&
              !strcmp(L.launcher, "env"), "%s", err);
}

static void test_slurm(void) {
    const char *v[] = {"SLURM_PROCID=2", "SLURM_NTASKS=3", "SLURM_NODEID=2", "SLURM_JOB_NODELIST=gpu[003-005,9],cpu1", NULL};
    QT_REQUIRE(resolve(3, v) == 0, "%s", err);
    QT_EXPECT(L.node_rank == 2 && !strcmp(L.master_addr, "gpu003") && L.master_port == QT_LAUNCH_DEFAULT_PORT &&
              !strcmp(L.launcher, "slurm"), "addr %s port %d", L.master_addr, L.master_port);
    const char *w[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=a1,a2", "MASTER_ADDR=head", "MASTER_PORT=7", NULL};
    QT_EXPECT(resolve(2, w) == 0 && !strcmp(L.master_addr, "head") && L.master_port == 7, "%s %s", err, L.master_addr);
    const char *x[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=solo7", NULL};
    QT_EXPECT(resolve(2, x) == 0 && !strcmp(L.master_addr, "solo7"), "%s %s", err, L.master_addr);
}

static void test_openmpi(void) {
    const char *v[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=1",
                       "MASTER_ADDR=n0", NULL};
    QT_EXPECT(resolve(2, v) == 0 && L.node_rank == 1 && !strcmp(L.launcher, "openmpi") &&
              L.master_port == QT_LAUNCH_DEFAULT_PORT, "%s", err);
}

/* resolve(nodes, vars) fails and err holds want. */
static void refused(int nodes, const char *const *vars, const char *want) {
    QT_EXPECT(resolve(nodes, vars) == -1 && strstr(err, want), "err \"%s\", expected \"%s\"", err, want);
}

static void test_refusals(void) {
    const char *none[] = {"HOME=/root", NULL};
    refused(2, none, "parallel.nodes 2: no launcher variables");
    const char *big[] = {"RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=1", NULL};
    refused(2, big, "RANK=2 is not below WORLD_SIZE=2");
    const char *noaddr[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=1", NULL};
    refused(2, noaddr, "MASTER_ADDR is not set");
    const char *port[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29x", NULL};
    refused(2, port, "MASTER_PORT=\"29x\": expected a whole number in [1, 65535]");
    const char *port0[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=70000", NULL};
    refused(2, port0, "MASTER_PORT=\"70000\"");
    const char *noport[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", NULL};
    refused(2, noport, "MASTER_PORT is not set");
    const char *rank[] = {"RANK=-1", "WORLD_SIZE=2", NULL};
    refused(2, rank, "RANK=\"-1\"");
    const char *size[] = {"RANK=0", "WORLD_SIZE=two", NULL};
    refused(2, size, "WORLD_SIZE=\"two\"");
    const char *perproc[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=1", NULL};
    refused(2, perproc, "LOCAL_WORLD_SIZE=2: qtrain runs one process per node");
    const char *count[] = {"NODE_RANK=0", "NNODES=3", "MASTER_ADDR=h", "MASTER_PORT=1", NULL};
    refused(2, count, "NNODES=3 processes but parallel.nodes 2");
    const char *slurm[] = {"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_NODEID=0", "SLURM_JOB_NODELIST=a[1-2]", NULL};
    refused(2, slurm, "SLURM_NODEID=0 differs from SLURM_PROCID=1");
    const char *list[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=gpu[x-y]", NULL};
    refused(2, list, "SLURM_JOB_NODELIST=\"gpu[x-y]\"");
    const char *mpi[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", NULL};
    refused(2, mpi, "MASTER_ADDR is not set: the openmpi launch (OMPI_COMM_WORLD_SIZE=2)");
    const char *mpil[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL};
    refused(2, mpil, "OMPI_COMM_WORLD_LOCAL_SIZE=2");
}

int main(void) {
    QT_RUN(test_one_node_ignores_launcher);
    QT_RUN(test_torchrun);
    QT_RUN(test_node_rank_nnodes);
    QT_RUN(test_slurm);
    QT_RUN(test_openmpi);
    QT_RUN(test_refusals);
    return qt_test_end();
}
