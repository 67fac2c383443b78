/* test_nodes_mutants.c — the planted bugs of ZeRO over the nodes (qt_mutant.h: QT_MUT_NODES_*) are seen.
 *
 * qt_test_run.h's tiny model (vocab 64) trains 4 steps as one qtrain process with 2 GPUs (the mutant build's
 * qtrain, no bug planted) and as 2 emulated nodes x 1 GPU, ZeRO-1 over the nodes: each node a child process of
 * this binary with its own GPU (CUDA_VISIBLE_DEVICES 0 and 1), NCCL on its socket transport over the loopback
 * (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo), the launcher's variables handed to
 * qt_train_meet_nodes directly; memory.plan manual everywhere (the config's keys as written, no CUDA graphs).
 * Without a planted bug the nodes' final checkpoint holds the one process's bits (the control:
 * tests/test_nodes_train.py holds the release build to it at every ZeRO level); with each planted bug a node
 * fails or the bits differ. Mutant build and 2 GPUs; skips otherwise.
 * Child mode: test_nodes_mutants --node RANK PORT MUTANT CONFIG. */
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qt_config.h"
#include "qt_device.h"
#include "qt_dp_nodes.h"
#include "qt_test.h"
#include "qt_test_port.h"
#include "qt_test_run.h"
#include "qt_train_nodes.h"

#define STEPS 4

typedef struct {
    const char *rank, *port;
} node_vars;

/* The launcher's variables of a node started by hand (NODE_RANK, NNODES, MASTER_ADDR, MASTER_PORT). */
static const char *node_var(void *ctx, const char *name) {
    const node_vars *v = ctx;
    return !strcmp(name, "NODE_RANK") ? v->rank : !strcmp(name, "NNODES") ? "2" : !strcmp(name, "MASTER_ADDR") ? "127.0.0.1"
         : !strcmp(name, "MASTER_PORT") ? v->port : NULL;
}

/* Child: node RANK of 2 trains CONFIG with planted bug MUTANT (a qt_mutant value) in force. Exit 0, or 1 with the
 * message on stderr. */
static int node_main(char **argv) {
    node_vars v = {argv[2], argv[3]};
#ifdef QT_MUTANTS
    qt_mutant_set((qt_mutant)atoi(argv[4]));
#endif
    static qt_config cfg;
    static qt_nodes nodes;
    char err[2048];
    qt_train_opts o = {NULL, -1, 0, NULL, NULL, NULL};
    const char *sets[] = {"parallel.nodes=2", "memory.plan=manual"};
    if (qt_config_load(&cfg, argv[5], sets, 2, err, sizeof err) || qt_train_meet_nodes(&cfg, node_var, &v, &nodes, err, sizeof err) ||
        qt_train_run_nodes(&cfg, &o, &nodes, NULL, err, sizeof err)) {
        fprintf(stderr, "node %s: %s\n", argv[2], err);
        return 1;
    }
    return 0;
}

/* Starts this binary as node k of 2 (port, planted bug m) on GPU k, its output in g_dir/NAME.node<k>. */
static pid_t start_node(const char *self, const char *name, int k, int port, int m, const char *cfg) {
    char out[512], ks[8], ps[16], ms[16];
    snprintf(out, sizeof out, "%s/%s.node%d", g_dir, name, k);
    snprintf(ks, sizeof ks, "%d", k), snprintf(ps, sizeof ps, "%d", port), snprintf(ms, sizeof ms, "%d", m);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        setenv("CUDA_VISIBLE_DEVICES", ks, 1);
        setenv("NCCL_P2P_DISABLE", "1", 1), setenv("NCCL_SHM_DISABLE", "1", 1), setenv("NCCL_SOCKET_IFNAME", "lo", 1);
        execl(self, self, "--node", ks, ps, ms, cfg, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Two nodes of run NAME (qt_test_run.h's tiny model on one GPU each, ZeRO-1 by default, the last step
 * checkpointed) with planted bug m: 0 when both ended with status 0, else the first other status. */
static int two_nodes(const char *self, const char *name, int m) {
    char cfg[512];
    write_cfg(cfg, sizeof cfg, name, STEPS, 0, 1, NULL);
    int port = qt_test_free_port();
    pid_t p0 = start_node(self, name, 0, port, m, cfg), p1 = start_node(self, name, 1, port, m, cfg);
    int s0 = wait_status(p0, 180), s1 = wait_status(p1, 180);
    return s0 ? s0 : s1;
}

static const char *g_self;

static void test_planted_bugs_seen(void) {
    QT_MUTANT_BUILD_ONLY();
    if (qt_cuda_device_count() < 2) QT_SKIP("needs 2 GPUs (2 emulated nodes x 1 GPU)");
    char cfg[512], out[512], why[256];
    write_cfg(cfg, sizeof cfg, "one", STEPS, 0, 1, NULL);
    snprintf(out, sizeof out, "%s/one.out", g_dir);
    const char *args[] = {cfg, "--set", "parallel.gpus=2", "--set", "memory.plan=manual", NULL};
    setenv("CUDA_VISIBLE_DEVICES", "0,1", 1);
    QT_REQUIRE(run_qtrain(out, args) == 0, "one process x 2 GPUs failed (%s)", out);
    int rc = two_nodes(g_self, "control", 0);
    QT_REQUIRE(rc == 0, "2 nodes without a planted bug: status %d (%s/control.node0)", rc, g_dir);
    QT_REQUIRE(same_state("one", "control", STEPS, why, sizeof why), "2 nodes without a planted bug differ from one "
               "process: %s (the check could not see a planted bug)", why);
#ifdef QT_MUTANTS
    static const struct {
        const char *name;
        qt_mutant m;
    } bugs[] = {{"weights_not_gathered", QT_MUT_NODES_WEIGHTS_NOT_GATHERED}, {"norm_mine", QT_MUT_NODES_NORM_MINE}};
    for (size_t i = 0; i < sizeof bugs / sizeof *bugs; i++) {
        rc = two_nodes(g_self, bugs[i].name, (int)bugs[i].m);
        int differs = rc == 0 && !same_state("one", bugs[i].name, STEPS, why, sizeof why);
        printf("  %s: %s\n", bugs[i].name, rc ? "a node failed" : differs ? why : "the one process's bits");
        QT_EXPECT(rc != 0 || differs, "planted bug %s: 2 nodes still train the one process's bits", bugs[i].name);
    }
#endif
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--node")) return node_main(argv);
    g_self = argv[0];
    g_gpu = 1;
    if (qt_t_run_setup(1, argv, "qt_nodes_mut")) return 1;
    QT_RUN(test_planted_bugs_seen);
    return qt_test_end();
}
