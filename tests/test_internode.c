/* test_internode.c — the NCCL collectives between nodes (comm/internode.c) after the TCP rendezvous.
 *
 * One node of one GPU runs in this process (any GPU machine). Two nodes are two child processes of this
 * binary on one host with disjoint CUDA_VISIBLE_DEVICES, NCCL forced onto its socket transport over the
 * loopback (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo): exactly the inter-node path.
 * Each node checks all-reduce (fp32, bf16), reduce-scatter, all-gather and the max all-reduce against the exact
 * values every node can compute; a node that exits after the rendezvous makes the other stop with a
 * message within 60 s. Needs 2 GPUs (2 nodes x 1) and 4 (2 x 2); skips with fewer.
 * Child mode: test_internode --node RANK NODES PORT GPUS_PER_NODE [die]. */
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qt_device.h"
#include "qt_error.h"
#include "qt_internode.h"
#include "qt_rendezvous.h"
#include "qt_test.h"
#include "qt_test_port.h"

#define N 1001 /* elements: odd, not a multiple of anything */
#define PER 333

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint16_t to_bf16(float f) { /* exact for the small integers used here */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* What node n, GPU g holds at i, fp32 and bf16 (small integers: every sum is exact). */
static float val32(int n, int g, int i) { return (float)((n + 1) * 1000 + g * 10 + i % 7); }
static float val16(int n, int g, int i) { return (float)((n + 1) * 8 + g + i % 3); }

#define CK(call) do { cudaError_t e_ = (call); if (e_) { fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); return 1; } } while (0)

/* Checks one local GPU's collectives; 0 or 1 (printed). */
static int check_gpu(qt_internode *ic, int g, int node, int nodes) {
    float h32[N], s32[N];
    uint16_t h16[N];
    void *d32, *d16, *o32;
    cudaStream_t s;
    CK(cudaSetDevice(g));
    CK(cudaStreamCreate(&s));
    CK(cudaMalloc(&d32, sizeof h32));
    CK(cudaMalloc(&d16, sizeof h16));
    CK(cudaMalloc(&o32, sizeof h32 * 2));
    for (int i = 0; i < N; i++) h32[i] = val32(node, g, i), h16[i] = to_bf16(val16(node, g, i));
    CK(cudaMemcpy(d32, h32, sizeof h32, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d16, h16, sizeof h16, cudaMemcpyHostToDevice));
    int bad = 0;
    /* all-reduce fp32 (out of place) and bf16 (in place) */
    if (qt_internode_all_reduce(ic, g, QT_DT_F32, d32, o32, N, s) || qt_internode_all_reduce(ic, g, QT_DT_BF16, d16, d16, N, s))
        return fprintf(stderr, "node %d: aborted\n", node), 1;
    CK(cudaMemcpyAsync(s32, o32, sizeof s32, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync(h16, d16, sizeof h16, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < N && !bad; i++) {
        float w32 = 0, w16 = 0;
        for (int n = 0; n < nodes; n++) w32 += val32(n, g, i), w16 += val16(n, g, i);
        if (s32[i] != w32 || from_bf16(h16[i]) != w16)
            bad = fprintf(stderr, "node %d GPU %d: all_reduce[%d] = %g, %g; expected %g, %g\n", node, g, i, s32[i],
                          from_bf16(h16[i]), w32, w16);
    }
    /* reduce-scatter of nodes * PER fp32 elements: this node's slice of the sum */
    if (qt_internode_reduce_scatter(ic, g, QT_DT_F32, d32, o32, PER, s)) return 1;
    CK(cudaMemcpyAsync(s32, o32, PER * 4, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < PER && !bad; i++) {
        float w = 0;
        for (int n = 0; n < nodes; n++) w += val32(n, g, node * PER + i);
        if (s32[i] != w) bad = fprintf(stderr, "node %d GPU %d: reduce_scatter[%d] = %g, expected %g\n", node, g, i, s32[i], w);
    }
    /* all-gather of PER fp32 elements per node */
    if (qt_internode_all_gather(ic, g, QT_DT_F32, d32, o32, PER, s)) return 1;
    CK(cudaMemcpyAsync(s32, o32, (size_t)nodes * PER * 4, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < nodes * PER && !bad; i++)
        if (s32[i] != val32(i / PER, g, i % PER))
            bad = fprintf(stderr, "node %d GPU %d: all_gather[%d] = %g, expected %g\n", node, g, i, s32[i], val32(i / PER, g, i % PER));
    /* max over nodes of PER fp32 values, in place: the largest node's */
    CK(cudaMemcpy(d32, h32, PER * 4, cudaMemcpyHostToDevice));
    if (qt_internode_all_reduce_max(ic, g, d32, PER, s)) return 1;
    CK(cudaMemcpyAsync(s32, d32, PER * 4, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < PER && !bad; i++)
        if (s32[i] != val32(nodes - 1, g, i))
            bad = fprintf(stderr, "node %d GPU %d: all_reduce_max[%d] = %g, expected %g\n", node, g, i, s32[i], val32(nodes - 1, g, i));
    cudaFree(d32), cudaFree(d16), cudaFree(o32), cudaStreamDestroy(s);
    return bad ? 1 : 0;
}

/* A node whose peer is gone: its all-reduce must not complete, and the watchdog loop stops it with
 * NCCL's message. Returns 3 when it stopped so, 1 otherwise. */
static int expect_peer_gone(qt_internode *ic, int node) {
    void *d;
    cudaStream_t s;
    char err[512] = "";
    CK(cudaSetDevice(0));
    CK(cudaStreamCreate(&s));
    CK(cudaMalloc(&d, 1 << 20));
    double t0 = now_s();
    qt_catch k; /* NCCL may report the lost peer while enqueueing (connections are made on first use) */
    qt_catch_push(&k);
    if (setjmp(k.jb)) {
        qt_internode_abort(ic);
        fprintf(stderr, "node %d: stopped after %.1f s: %s\n", node, now_s() - t0, k.msg);
        return 3;
    }
    int rc = qt_internode_all_reduce(ic, 0, QT_DT_F32, d, d, 1 << 18, s);
    qt_catch_pop(&k);
    if (rc) return 1;
    while (cudaStreamQuery(s) == cudaErrorNotReady && !qt_internode_check(ic, err, sizeof err) && now_s() - t0 < 60) usleep(1000);
    if (!err[0]) return fprintf(stderr, "node %d: the all-reduce %s with its peer gone\n", node,
                                now_s() - t0 < 60 ? "completed" : "hung 60 s"), 1;
    qt_internode_abort(ic);
    fprintf(stderr, "node %d: stopped after %.1f s: %s\n", node, now_s() - t0, err);
    return 3;
}

/* One node: rendezvous, communicators, then the checks (or, mode "die", exits at once; its peer in
 * mode "survive" must notice). Returns the process's exit status. */
static int run_node(int node, int nodes, int port, int gpus, const char *mode) {
    unsigned char blob[QT_RDZV_BLOB] = {0};
    char err[1024];
    if (!node && qt_internode_make_ids(blob, sizeof blob, gpus, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    qt_rdzv_opts o = {"127.0.0.1", port, node, nodes, gpus, 0x5eed, 60.0};
    if (qt_rdzv_run(&o, blob, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    int devices[QT_INTERNODE_MAX_GPUS];
    for (int g = 0; g < gpus; g++) devices[g] = g;
    qt_internode *ic;
    if (qt_internode_create(&ic, blob, node, nodes, gpus, devices, 60.0, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    if (!strcmp(mode, "die")) _exit(0); /* gone without a goodbye */
    if (!strcmp(mode, "survive")) return expect_peer_gone(ic, node);
    int bad = 0;
    for (int g = 0; g < gpus; g++) bad |= check_gpu(ic, g, node, nodes);
    qt_internode_free(ic);
    return bad;
}

static const char *self_exe;

/* Two nodes of gpus GPUs each as child processes; their exit statuses in st (-1: killed after 120 s). */
static void run_two(int gpus, const char *mode0, const char *mode1, int st[2]) {
    int port = qt_test_free_port();
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        if ((pid[r] = fork()) == 0) {
            char vis[32], a[4][16];
            snprintf(vis, sizeof vis, gpus == 1 ? "%d" : "%d,%d", r * gpus, r * gpus + 1);
            setenv("CUDA_VISIBLE_DEVICES", vis, 1);
            setenv("NCCL_P2P_DISABLE", "1", 1), setenv("NCCL_SHM_DISABLE", "1", 1), setenv("NCCL_SOCKET_IFNAME", "lo", 1);
            snprintf(a[0], 16, "%d", r), snprintf(a[1], 16, "2"), snprintf(a[2], 16, "%d", port), snprintf(a[3], 16, "%d", gpus);
            execl(self_exe, self_exe, "--node", a[0], a[1], a[2], a[3], r ? mode1 : mode0, (char *)NULL);
            _exit(127);
        }
    }
    for (int r = 0; r < 2; r++) {
        int s = 0;
        double t0 = now_s();
        while (waitpid(pid[r], &s, WNOHANG) == 0 && now_s() - t0 < 120) usleep(10000);
        if (now_s() - t0 >= 120) kill(pid[r], SIGKILL), waitpid(pid[r], &s, 0), st[r] = -1;
        else st[r] = WIFEXITED(s) ? WEXITSTATUS(s) : -1;
    }
}

static void test_one_node(void) {
    if (qt_cuda_device_count() < 1) QT_SKIP("no CUDA device");
    QT_EXPECT(run_node(0, 1, qt_test_free_port(), 1, "check") == 0, "one node, one GPU: see stderr");
}

static void test_two_nodes_one_gpu(void) {
    if (qt_cuda_device_count() < 2) QT_SKIP("needs 2 GPUs (2 emulated nodes of 1)");
    int st[2];
    run_two(1, "check", "check", st);
    QT_EXPECT(st[0] == 0 && st[1] == 0, "exit statuses %d, %d (stderr says why)", st[0], st[1]);
}

static void test_two_nodes_two_gpus(void) {
    if (qt_cuda_device_count() < 4) QT_SKIP("needs 4 GPUs (2 emulated nodes of 2)");
    int st[2];
    run_two(2, "check", "check", st);
    QT_EXPECT(st[0] == 0 && st[1] == 0, "exit statuses %d, %d (stderr says why)", st[0], st[1]);
}

static void test_node_dies(void) {
    if (qt_cuda_device_count() < 2) QT_SKIP("needs 2 GPUs (2 emulated nodes of 1)");
    int st[2];
    run_two(1, "survive", "die", st);
    QT_EXPECT(st[1] == 0 && st[0] == 3, "node 0 exit %d (3: stopped with NCCL's message), node 1 exit %d", st[0], st[1]);
}

int main(int argc, char **argv) {
    self_exe = argv[0];
    if (argc >= 6 && !strcmp(argv[1], "--node"))
        return run_node(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), argc > 6 ? argv[6] : "check");
    QT_RUN(test_one_node);
    QT_RUN(test_two_nodes_one_gpu);
    QT_RUN(test_two_nodes_two_gpus);
    QT_RUN(test_node_dies);
    return qt_test_end();
}
