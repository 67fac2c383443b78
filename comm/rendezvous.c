/* rendezvous.c — the nodes' start-up meeting over TCP (qt_rendezvous.h): hello, blob, barrier.
 *
 * Wire (integers big-endian): hello = "QTRZ", version, rank, nodes, gpus, hash hi, hash lo (28 bytes,
 * node -> 0); reply = "QTRZ", status (0 ok, 1 failed), blob[QT_RDZV_BLOB], msg[256] (node 0 -> node:
 * once with the blob, once as the barrier's go); ack = "QTRZ", rank (node -> 0, blob received).
 * Sockets are non-blocking; every wait is a poll() bounded by the call's deadline. After a failure node 0
 * keeps its port GRACE_S longer to tell late nodes why. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "qt_error.h"
#include "qt_rendezvous.h"

#define MAGIC 0x5154525au /* "QTRZ" */
#define VERSION 1u
#define HELLO 28
#define MSG 256
#define REPLY (8 + QT_RDZV_BLOB + MSG)
#define ACK 8
#define GRACE_S 2.0   /* the other nodes wait this much longer than node 0, so node 0's verdict reaches them */
#define MAX_PENDING 64

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void put32(unsigned char *p, uint32_t v) { p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = v; }
static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Waits for events on fd until deadline: 1 ready, 0 timed out, -1 error (errno). */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double rem = deadline - now_s();
        if (rem <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, (int)(rem * 1000) + 1);
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

/* Sends or receives exactly n bytes before deadline: 0 done, 1 the peer closed, -1 error or timeout
 * (errno ETIMEDOUT). */
static int xfer(int fd, void *buf, size_t n, int sending, double deadline) {
    unsigned char *p = buf;
    while (n) {
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k > 0) {
            p += k, n -= (size_t)k;
            continue;
        }
        if (k == 0 && !sending) return 1;
        if (k < 0 && errno == EPIPE) return 1;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return errno == ECONNRESET ? 1 : -1;
        int w = wait_fd(fd, sending ? POLLOUT : POLLIN, deadline);
        if (w == 0) errno = ETIMEDOUT;
        if (w <= 0) return -1;
    }
    return 0;
}

static int send_reply(int fd, int status, const unsigned char *blob, const char *msg, double deadline) {
    static const unsigned char zero[QT_RDZV_BLOB];
    unsigned char r[REPLY] = {0};
    put32(r, MAGIC), put32(r + 4, (uint32_t)status);
    memcpy(r + 8, blob ? blob : zero, QT_RDZV_BLOB);
    snprintf((char *)r + 8 + QT_RDZV_BLOB, MSG, "%s", msg ? msg : "");
    return xfer(fd, r, REPLY, 1, deadline);
}

/* ---- node 0 ---- */

typedef struct {
    int nodes, *fd;         /* fd[r]: node r's connection once its hello is accepted, else -1 */
    int pend[MAX_PENDING];  /* connections whose hello is not complete */
    size_t got[MAX_PENDING];
    unsigned char hello[MAX_PENDING][HELLO];
    int npend;
} server;

static int listen_on(int port, char *err, size_t errlen) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) return qt_errf(err, errlen, "node 0: socket(): %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 128)) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE)
            return qt_errf(err, errlen, "node 0: port %d is in use on this host (MASTER_PORT=%d): pick a free one", port, port);
        return qt_errf(err, errlen, "node 0: cannot listen on port %d: %s", port, strerror(e));
    }
    return fd;
}

/* Checks a complete hello against node 0's options; 0 accepted (s->fd[rank] set), -1 refused (err). */
static int accept_hello(server *s, int i, const qt_rdzv_opts *o, char *err, size_t errlen) {
    const unsigned char *h = s->hello[i];
    int rank = (int)get32(h + 8), nodes = (int)get32(h + 12), gpus = (int)get32(h + 16);
    uint64_t hash = (uint64_t)get32(h + 20) << 32 | get32(h + 24);
    if (rank < 1 || rank >= o->nodes)
        return qt_errf(err, errlen, "node %d: rank out of range (node 0 expects ranks 1..%d)", rank, o->nodes - 1);
    if (s->fd[rank] >= 0) return qt_errf(err, errlen, "node %d: arrived twice (two processes claim that node rank)", rank);
    if (nodes != o->nodes)
        return qt_errf(err, errlen, "node %d: expects %d nodes, node 0 expects %d", rank, nodes, o->nodes);
    if (gpus != o->gpus)
        return qt_errf(err, errlen, "node %d: has %d GPUs, node 0 has %d (every node needs the same count)", rank, gpus, o->gpus);
    if (hash != o->config_hash)
        return qt_errf(err, errlen, "node %d: config hash 0x%016llx differs from node 0's 0x%016llx (the nodes "
                       "must run the same config)", rank, (unsigned long long)hash, (unsigned long long)o->config_hash);
    s->fd[rank] = s->pend[i];
    return 0;
}

/* Reads what pending connection i sent; drops it when it closes or is not a qtrain node.
 * Returns -1 (err) when its complete hello is refused, else 0. */
static int read_pending(server *s, int i, const qt_rdzv_opts *o, char *err, size_t errlen) {
    ssize_t k = recv(s->pend[i], s->hello[i] + s->got[i], HELLO - s->got[i], 0);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    int drop = k <= 0, rc = 0;
    if (!drop && (s->got[i] += (size_t)k) == HELLO) {
        drop = 1;
        if (get32(s->hello[i]) == MAGIC && get32(s->hello[i] + 4) == VERSION) {
            rc = accept_hello(s, i, o, err, errlen);
            if (rc) send_reply(s->pend[i], 1, NULL, err, now_s() + 1.0);
            else s->pend[i] = -1; /* kept as fd[rank] */
        }
    }
    if (drop) {
        if (s->pend[i] >= 0) close(s->pend[i]);
        s->npend--;
        s->pend[i] = s->pend[s->npend], s->got[i] = s->got[s->npend];
        memcpy(s->hello[i], s->hello[s->npend], HELLO);
    }
    return rc;
}

/* The ranks not arrived, as "2, 3". */
static void missing(const server *s, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int r = 1; r < s->nodes && n < cap; r++)
        if (s->fd[r] < 0) n += (size_t)snprintf(out + n, cap - n, "%s%d", n ? ", " : "", r);
}

/* Accepts connections until every node's hello is in, or fails (err) naming the node at fault. */
static int gather(server *s, int lfd, const qt_rdzv_opts *o, double deadline, char *err, size_t errlen) {
    for (int arrived = 0; arrived < o->nodes - 1;) {
        struct pollfd p[1 + MAX_PENDING + QT_RDZV_MAX_NODES];
        int np = 0, nk = 0, known[QT_RDZV_MAX_NODES];
        p[np++] = (struct pollfd){lfd, POLLIN, 0};
        for (int i = 0; i < s->npend; i++) p[np++] = (struct pollfd){s->pend[i], POLLIN, 0};
        for (int r = 1; r < o->nodes; r++)
            if (s->fd[r] >= 0) known[nk++] = r, p[np++] = (struct pollfd){s->fd[r], POLLIN, 0};
        double rem = deadline - now_s();
        char miss[256];
        missing(s, miss, sizeof miss);
        if (rem <= 0)
            return qt_errf(err, errlen, "node %s never arrived (waited %.1f s on port %d for %d nodes)", miss,
                           o->timeout_s, o->port, o->nodes);
        if (poll(p, (nfds_t)np, (int)(rem * 1000) + 1) < 0 && errno != EINTR)
            return qt_errf(err, errlen, "node 0: poll(): %s", strerror(errno));
        for (int j = 0; j < nk; j++)
            if (p[1 + s->npend + j].revents)
                return qt_errf(err, errlen, "node %d closed its connection before every node arrived", known[j]);
        for (int i = s->npend - 1; i >= 0; i--)
            if (p[1 + i].revents && read_pending(s, i, o, err, errlen)) return -1;
        arrived = 0;
        for (int r = 1; r < o->nodes; r++) arrived += s->fd[r] >= 0;
        if (p[0].revents & POLLIN) {
            int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0 && s->npend == MAX_PENDING) close(fd);
            else if (fd >= 0) s->pend[s->npend] = fd, s->got[s->npend++] = 0;
        }
    }
    return 0;
}

/* The blob to every node, every node's ack, then the go. */
static int release(server *s, const qt_rdzv_opts *o, const unsigned char *blob, double deadline, char *err,
                   size_t errlen) {
    for (int r = 1; r < o->nodes; r++)
        if (send_reply(s->fd[r], 0, blob, NULL, deadline))
            return qt_errf(err, errlen, "node %d closed its connection before taking the unique id", r);
    for (int r = 1; r < o->nodes; r++) {
        unsigned char a[ACK];
        int rc = xfer(s->fd[r], a, ACK, 0, deadline);
        if (rc == 1) return qt_errf(err, errlen, "node %d closed its connection during the barrier", r);
        if (rc || get32(a) != MAGIC || (int)get32(a + 4) != r)
            return qt_errf(err, errlen, "node %d did not confirm the barrier within %.1f s", r, o->timeout_s);
    }
    for (int r = 1; r < o->nodes; r++)
        if (send_reply(s->fd[r], 0, NULL, NULL, deadline))
            return qt_errf(err, errlen, "node %d closed its connection at the end of the barrier", r);
    return 0;
}

/* Sends the failure verdict on fd and closes it. The node's unread hello or ack is drained first (until it
 * closes, at most 0.5 s): closing a socket with unread data resets it, and a reset can discard the verdict
 * before the node reads it. */
static void tell_and_close(int fd, const char *verdict) {
    double end = now_s() + 0.5;
    if (!send_reply(fd, 1, NULL, verdict, end)) {
        shutdown(fd, SHUT_WR);
        unsigned char sink[256];
        while (wait_fd(fd, POLLIN, end) == 1) {
            ssize_t k = recv(fd, sink, sizeof sink, 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) break;
        }
    }
    close(fd);
}

/* After a failure: for GRACE_S more, every node that connects late gets the verdict, not a refused port. */
static void linger(int lfd, const char *verdict) {
    for (double end = now_s() + GRACE_S; wait_fd(lfd, POLLIN, end) == 1;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) tell_and_close(fd, verdict);
    }
}

static int serve(const qt_rdzv_opts *o, const unsigned char *blob, char *err, size_t errlen) {
    int lfd = listen_on(o->port, err, errlen);
    if (lfd < 0) return -1;
    int fds[o->nodes];
    server s = {.nodes = o->nodes, .fd = fds};
    for (int r = 0; r < o->nodes; r++) fds[r] = -1;
    double deadline = now_s() + o->timeout_s;
    int rc = gather(&s, lfd, o, deadline, err, errlen);
    if (!rc) rc = release(&s, o, blob, deadline, err, errlen);
    for (int r = 1; r < o->nodes; r++) /* the verdict to every node still there, arrived or not, then close */
        if (fds[r] >= 0) {
            if (rc) tell_and_close(fds[r], err);
            else close(fds[r]);
        }
    for (int i = 0; i < s.npend; i++) {
        if (rc) tell_and_close(s.pend[i], err);
        else close(s.pend[i]);
    }
    if (rc) linger(lfd, err);
    close(lfd);
    return rc;
}

/* ---- the other nodes ---- */

/* Connects to host:port, retrying refused connections until deadline; the fd, or -1 (err). */
static int dial(const qt_rdzv_opts *o, double deadline, char *err, size_t errlen) {
    struct addrinfo hint = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int g = getaddrinfo(o->host, port, &hint, &ai);
    if (g) return qt_errf(err, errlen, "node %d: cannot resolve node 0's host \"%s\": %s", o->node_rank, o->host, gai_strerror(g));
    int last = ETIMEDOUT;
    while (now_s() < deadline) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), e = 0;
        socklen_t el = sizeof e;
        if (fd < 0) break;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS) e = errno;
        else if (wait_fd(fd, POLLOUT, deadline) != 1) e = ETIMEDOUT;
        else getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
        if (!e) {
            freeaddrinfo(ai);
            return fd;
        }
        close(fd);
        last = e;
        struct timespec nap = {0, 100 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    freeaddrinfo(ai);
    return qt_errf(err, errlen, "node %d: could not reach node 0 at %s:%d within %.1f s (%s)", o->node_rank, o->host,
                   o->port, o->timeout_s, strerror(last));
}

/* Waits for node 0's reply: 0 ok (blob copied when blob), -1 (err) failed, closed or timed out. */
static int await(int fd, const qt_rdzv_opts *o, unsigned char *blob, double deadline, char *err, size_t errlen) {
    unsigned char r[REPLY];
    int rc = xfer(fd, r, REPLY, 0, deadline);
    if (rc == 1) return qt_errf(err, errlen, "node %d: node 0 (%s:%d) closed the connection", o->node_rank, o->host, o->port);
    if (rc) return qt_errf(err, errlen, "node %d: no answer from node 0 (%s:%d) within %.1f s", o->node_rank, o->host,
                           o->port, o->timeout_s + GRACE_S);
    if (get32(r) != MAGIC) return qt_errf(err, errlen, "node %d: %s:%d is not a qtrain node 0", o->node_rank, o->host, o->port);
    r[REPLY - 1] = 0;
    if (get32(r + 4)) return qt_errf(err, errlen, "node %d: node 0 stopped the rendezvous: %s", o->node_rank, (char *)r + 8 + QT_RDZV_BLOB);
    if (blob) memcpy(blob, r + 8, QT_RDZV_BLOB);
    return 0;
}

static int join(const qt_rdzv_opts *o, unsigned char *blob, char *err, size_t errlen) {
    double deadline = now_s() + o->timeout_s;
    int fd = dial(o, deadline, err, errlen);
    if (fd < 0) return -1;
    deadline += GRACE_S;
    unsigned char h[HELLO], a[ACK];
    put32(h, MAGIC), put32(h + 4, VERSION), put32(h + 8, (uint32_t)o->node_rank), put32(h + 12, (uint32_t)o->nodes);
    put32(h + 16, (uint32_t)o->gpus), put32(h + 20, (uint32_t)(o->config_hash >> 32)), put32(h + 24, (uint32_t)o->config_hash);
    put32(a, MAGIC), put32(a + 4, (uint32_t)o->node_rank);
    int rc = xfer(fd, h, HELLO, 1, deadline) ? qt_errf(err, errlen, "node %d: node 0 (%s:%d) closed the connection", o->node_rank, o->host, o->port)
           : await(fd, o, blob, deadline, err, errlen) ? -1
           : xfer(fd, a, ACK, 1, deadline) ? qt_errf(err, errlen, "node %d: node 0 (%s:%d) closed the connection", o->node_rank, o->host, o->port)
           : await(fd, o, NULL, deadline, err, errlen);
    close(fd);
    return rc;
}

int qt_rdzv_run(const qt_rdzv_opts *o, unsigned char *blob, char *err, size_t errlen) {
    if (o->nodes < 1 || o->nodes > QT_RDZV_MAX_NODES || o->node_rank < 0 || o->node_rank >= o->nodes || o->port < 1 || o->port > 65535 ||
        !(o->timeout_s > 0) || (o->node_rank && (!o->host || !*o->host)))
        return qt_errf(err, errlen, "rendezvous: node %d of %d, port %d, timeout %g s, host \"%s\": expected "
                       "0 <= node < nodes <= %d, a port in 1..65535, a timeout > 0 and node 0's host", o->node_rank,
                       o->nodes, o->port, o->timeout_s, o->host ? o->host : "", QT_RDZV_MAX_NODES);
    if (o->nodes == 1) return 0;
    return o->node_rank ? join(o, blob, err, errlen) : serve(o, blob, err, errlen);
}
