/* qt_test_port.h — a TCP port for the rendezvous tests: one nothing listens on now. */
#ifndef QT_TEST_PORT_H
#define QT_TEST_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* The kernel's pick for port 0 on 127.0.0.1, released (another process may take it first: rare). */
static inline int qt_test_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

#endif
