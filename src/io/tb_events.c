/* tb_events.c — TensorBoard event files: TFRecord framing and hand-encoded Event protobufs (qt_tb_events.h). */
#include "qt_tb_events.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qt_ckpt.h"
#include "qt_crc32c.h"
#include "qt_error.h"

struct qt_tb {
    int fd;
    char path[4096];
};

static uint32_t masked_crc(const void *p, size_t n) {
    uint32_t c = qt_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

size_t qt_tb_frame(const void *data, size_t n, uint8_t *out) {
    put_le(out, n, 8);
    put_le(out + 8, masked_crc(out, 8), 4);
    memcpy(out + 12, data, n);
    put_le(out + 12 + n, masked_crc(data, n), 4);
    return n + 16;
}

/* Protobuf writing into [p, end): each call returns the new position, or NULL once out of room. */
static uint8_t *varint(uint8_t *p, const uint8_t *end, uint64_t v) {
    do {
        if (!p || p >= end) return NULL;
        *p++ = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return p;
}

static uint8_t *bytes(uint8_t *p, const uint8_t *end, int field, const void *s, size_t n) {
    p = varint(varint(p, end, (uint64_t)field << 3 | 2), end, n);
    if (!p || (size_t)(end - p) < n) return NULL;
    memcpy(p, s, n);
    return p + n;
}

static uint8_t *fixed(uint8_t *p, const uint8_t *end, int field, int wire, uint64_t v, int width) {
    p = varint(p, end, (uint64_t)field << 3 | wire);
    if (!p || end - p < width) return NULL;
    put_le(p, v, width);
    return p + width;
}

/* A Summary.Value: tag (1) and simple_value (2, fixed32). */
static uint8_t *value(uint8_t *p, const uint8_t *end, const char *tag, float v) {
    uint8_t tmp[512], *q = bytes(tmp, tmp + sizeof tmp, 1, tag, strlen(tag));
    uint32_t bits;
    memcpy(&bits, &v, 4);
    q = fixed(q, tmp + sizeof tmp, 2, 5, bits, 4);
    return q ? bytes(p, end, 1, tmp, (size_t)(q - tmp)) : NULL;
}

size_t qt_tb_event(uint8_t *buf, size_t cap, double wall_time, long step, const char *file_version,
                   const char *const *tags, const float *values, int n) {
    const uint8_t *end = buf + cap;
    uint64_t wt;
    memcpy(&wt, &wall_time, 8);
    uint8_t *p = fixed(buf, end, 1, 1, wt, 8);
    p = varint(varint(p, end, 2 << 3 | 0), end, (uint64_t)(int64_t)step);
    if (file_version) p = bytes(p, end, 3, file_version, strlen(file_version));
    else {
        uint8_t sum[8192], *q = sum;
        for (int i = 0; i < n && q; i++) q = value(q, sum + sizeof sum, tags[i], values[i]);
        p = q ? bytes(p, end, 5, sum, (size_t)(q - sum)) : NULL;
    }
    return p ? (size_t)(p - buf) : 0;
}

/* One framed record, with one write() (a short write continues, so a record is whole unless the disk fills). */
static int put_record(qt_tb *tb, const uint8_t *ev, size_t n, char *err, size_t errlen) {
    uint8_t *rec = malloc(n + 16);
    if (!rec) return qt_errf(err, errlen, "log.tensorboard: out of host memory");
    size_t len = qt_tb_frame(ev, n, rec), off = 0;
    while (off < len) {
        ssize_t w = write(tb->fd, rec + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            free(rec);
            return qt_errf(err, errlen, "log.tensorboard: %s: write failed: %s", tb->path, strerror(w < 0 ? errno : EIO));
        }
        off += (size_t)w;
    }
    free(rec);
    return 0;
}

qt_tb *qt_tb_open(const char *dir, char *err, size_t errlen) {
    char e2[2048], host[256] = "localhost";
    if (qt_ckpt_mkdirs(dir, e2, sizeof e2)) {
        qt_errf(err, errlen, "log.tensorboard: %s", e2);
        return NULL;
    }
    qt_tb *tb = calloc(1, sizeof *tb);
    if (!tb) {
        qt_errf(err, errlen, "log.tensorboard: out of host memory");
        return NULL;
    }
    gethostname(host, sizeof host - 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%ld.%s.%d", dir, (long)ts.tv_sec, host, (int)getpid());
    tb->fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (tb->fd < 0) {
        qt_errf(err, errlen, "log.tensorboard: cannot create %s: %s", tb->path, strerror(errno));
        free(tb);
        return NULL;
    }
    uint8_t ev[256];
    size_t n = qt_tb_event(ev, sizeof ev, ts.tv_sec + ts.tv_nsec * 1e-9, 0, "brain.Event:2", NULL, NULL, 0);
    if (put_record(tb, ev, n, err, errlen)) {
        qt_tb_close(tb);
        return NULL;
    }
    return tb;
}

int qt_tb_scalars(qt_tb *tb, double wall_time, long step, const char *const *tags, const float *values, int n,
                  char *err, size_t errlen) {
    uint8_t ev[8192];
    size_t len = qt_tb_event(ev, sizeof ev, wall_time, step, NULL, tags, values, n);
    if (!len) return qt_errf(err, errlen, "log.tensorboard: %d scalars do not fit one event", n);
    return put_record(tb, ev, len, err, errlen);
}

const char *qt_tb_path(const qt_tb *tb) { return tb->path; }

void qt_tb_close(qt_tb *tb) {
    if (!tb) return;
    close(tb->fd);
    free(tb);
}
