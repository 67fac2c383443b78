/* test_rendezvous.c — the nodes' TCP rendezvous on 127.0.0.1, one thread per node: 1, 2 and 4 nodes
 * meet and share node 0's blob; a differing config hash or GPU count, a node that never arrives, one that
 * says hello and closes, one claiming a taken rank, and a port in use each fail on every node, naming it. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "qt_rendezvous.h"
#include "qt_test.h"
#include "qt_test_port.h"

typedef struct {
    qt_rdzv_opts o;
    unsigned char blob[QT_RDZV_BLOB];
    int rc;
    char err[1024];
} node;

static void *run_node(void *arg) {
    node *n = arg;
    n->rc = qt_rdzv_run(&n->o, n->blob, n->err, sizeof n->err);
    return NULL;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Sets up nodes [0, k) of nodes on port: 8 GPUs, hash 0xabc, blob of node 0 random, the others poisoned. */
static void setup(node *ns, int k, int nodes, int port, double timeout_s) {
    for (int r = 0; r < k; r++) {
        ns[r] = (node){.o = {"127.0.0.1", port, r, nodes, 8, 0xabcull, timeout_s}, .rc = 99};
        for (int i = 0; i < QT_RDZV_BLOB; i++) ns[r].blob[i] = r ? 0xee : (unsigned char)rand();
    }
}

/* Runs nodes [0, k) at once (node 0 last, so the others' retries are exercised); joins them. */
static void run_all(node *ns, int k) {
    pthread_t t[QT_RDZV_MAX_NODES];
    for (int r = k - 1; r >= 0; r--) pthread_create(&t[r], NULL, run_node, &ns[r]);
    for (int r = 0; r < k; r++) pthread_join(t[r], NULL);
}

static void meet(int nodes) {
    node ns[4];
    setup(ns, nodes, nodes, qt_test_free_port(), 10.0);
    run_all(ns, nodes);
    for (int r = 0; r < nodes; r++) {
        QT_EXPECT(ns[r].rc == 0, "%d nodes: node %d: rc %d: %s", nodes, r, ns[r].rc, ns[r].err);
        QT_EXPECT(!memcmp(ns[r].blob, ns[0].blob, QT_RDZV_BLOB), "%d nodes: node %d's blob differs from node 0's", nodes, r);
    }
}
static void test_one_node(void) { meet(1); }
static void test_two_nodes(void) { meet(2); }
static void test_four_nodes(void) { meet(4); }

/* Every node of ns[0, k) fails and its message holds want. */
static void expect_all_fail(node *ns, int k, const char *want) {
    for (int r = 0; r < k; r++)
        QT_EXPECT(ns[r].rc == -1 && strstr(ns[r].err, want), "node %d: rc %d, err \"%s\", expected \"%s\"", r,
                  ns[r].rc, ns[r].err, want);
}

static void test_config_hash_differs(void) {
    node ns[3];
    setup(ns, 3, 3, qt_test_free_port(), 10.0);
    ns[2].o.config_hash = 0xabd;
    run_all(ns, 3);
    expect_all_fail(ns, 3, "node 2: config hash 0x0000000000000abd differs from node 0's 0x0000000000000abc");
}

static void test_gpu_count_differs(void) {
    node ns[2];
    setup(ns, 2, 2, qt_test_free_port(), 10.0);
    ns[1].o.gpus = 4;
    run_all(ns, 2);
    expect_all_fail(ns, 2, "node 1: has 4 GPUs, node 0 has 8");
}

static void test_node_never_arrives(void) {
    node ns[4];
    setup(ns, 3, 4, qt_test_free_port(), 1.0);
    double t0 = now_s();
    run_all(ns, 3); /* node 3 never starts */
    double dt = now_s() - t0;
    expect_all_fail(ns, 3, "node 3 never arrived");
    QT_EXPECT(dt < 8.0, "took %.1f s for a 1 s timeout (and node 0's 2 s linger)", dt);
}

static void test_two_never_arrive(void) {
    node ns[4];
    setup(ns, 2, 4, qt_test_free_port(), 0.5);
    run_all(ns, 2);
    expect_all_fail(ns, 2, "node 2, 3 never arrived");
}

/* A node that connects, says hello as node 2 and closes: the others fail at once, naming it. */
static void *hello_and_close(void *arg) {
    int port = *(int *)arg, fd = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < 100; i++) { /* node 0 may not listen yet */
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (!connect(fd, (struct sockaddr *)&a, sizeof a)) break;
        close(fd), fd = -1;
        usleep(20000);
    }
    unsigned char h[28] = {'Q', 'T', 'R', 'Z', 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x0a, 0xbc};
    if (fd >= 0) send(fd, h, sizeof h, MSG_NOSIGNAL), close(fd);
    return NULL;
}

static void test_node_closes_early(void) {
    node ns[3];
    int port = qt_test_free_port();
    setup(ns, 2, 3, port, 20.0);
    pthread_t t;
    pthread_create(&t, NULL, hello_and_close, &port);
    double t0 = now_s();
    run_all(ns, 2);
    pthread_join(t, NULL);
    expect_all_fail(ns, 2, "node 2 closed its connection");
    QT_EXPECT(now_s() - t0 < 10.0, "took %.1f s: the close was not noticed", now_s() - t0);
}

/* A connection that closes before saying anything (a port scan) is dropped; the nodes still meet. */
static void *connect_and_close(void *arg) {
    int port = *(int *)arg;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < 100; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0), ok = !connect(fd, (struct sockaddr *)&a, sizeof a);
        close(fd);
        if (ok) break;
        usleep(20000);
    }
    return NULL;
}

static void test_anonymous_close_ignored(void) {
    node ns[2];
    int port = qt_test_free_port();
    setup(ns, 2, 2, port, 10.0);
    pthread_t t[2];
    pthread_create(&t[0], NULL, connect_and_close, &port);
    usleep(50000);
    pthread_create(&t[1], NULL, connect_and_close, &port);
    run_all(ns, 2);
    pthread_join(t[0], NULL), pthread_join(t[1], NULL);
    for (int r = 0; r < 2; r++) QT_EXPECT(ns[r].rc == 0, "node %d: %s", r, ns[r].err);
}

static void test_rank_taken(void) {
    node ns[3];
    setup(ns, 3, 3, qt_test_free_port(), 2.0);
    ns[2].o.node_rank = 1; /* two processes claim node 1; node 2 never comes */
    run_all(ns, 3);
    for (int r = 0; r < 3; r++)
        QT_EXPECT(ns[r].rc == -1 && strstr(ns[r].err, "node 1"), "node %d: rc %d, err \"%s\"", r, ns[r].rc, ns[r].err);
    QT_EXPECT(strstr(ns[0].err, "node 1: arrived twice"), "node 0: %s", ns[0].err);
}

static void test_port_in_use(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t l = sizeof a;
    QT_REQUIRE(!bind(fd, (struct sockaddr *)&a, sizeof a) && !listen(fd, 4), "listen");
    getsockname(fd, (struct sockaddr *)&a, &l);
    int port = ntohs(a.sin_port);
    node ns[1];
    setup(ns, 1, 2, port, 1.0);
    run_all(ns, 1);
    char want[64];
    snprintf(want, sizeof want, "port %d is in use", port);
    expect_all_fail(ns, 1, want);
    close(fd);
}

/* Node 0 gone after the hello (a fake one that reads it and closes): the node names node 0. */
static void *fake_node0(void *arg) {
    int lfd = *(int *)arg, fd = accept(lfd, NULL, NULL);
    unsigned char h[28];
    if (fd >= 0) recv(fd, h, sizeof h, MSG_WAITALL), close(fd);
    return NULL;
}

static void test_node0_dies(void) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    QT_REQUIRE(!bind(lfd, (struct sockaddr *)&a, sizeof a) && !listen(lfd, 4), "listen");
    getsockname(lfd, (struct sockaddr *)&a, &l);
    node ns[2];
    setup(ns, 2, 2, ntohs(a.sin_port), 5.0);
    pthread_t t;
    pthread_create(&t, NULL, fake_node0, &lfd);
    run_node(&ns[1]);
    pthread_join(t, NULL);
    close(lfd);
    QT_EXPECT(ns[1].rc == -1 && strstr(ns[1].err, "node 1: node 0 (127.0.0.1:") && strstr(ns[1].err, "closed the connection"),
              "rc %d, err \"%s\"", ns[1].rc, ns[1].err);
}

static void test_bad_options(void) {
    node ns[1];
    setup(ns, 1, 2, 0, 1.0);
    run_all(ns, 1);
    expect_all_fail(ns, 1, "a port in 1..65535");
}

int main(void) {
    srand((unsigned)time(NULL));
    QT_RUN(test_one_node);
    QT_RUN(test_two_nodes);
    QT_RUN(test_four_nodes);
    QT_RUN(test_config_hash_differs);
    QT_RUN(test_gpu_count_differs);
    QT_RUN(test_node_never_arrives);
    QT_RUN(test_two_never_arrive);
    QT_RUN(test_node_closes_early);
    QT_RUN(test_anonymous_close_ignored);
    QT_RUN(test_rank_taken);
    QT_RUN(test_port_in_use);
    QT_RUN(test_node0_dies);
    QT_RUN(test_bad_options);
    return qt_test_end();
}
