/* mem_plan.c — rows of the memory plan, their totals and the limit check (see qt_mem_plan.h). */
#include "qt_mem_plan.h"

#include <stdio.h>
#include <string.h>

#include "qt_error.h"

size_t qt_mem_aligned(size_t bytes) { return (bytes + QT_MEM_ALIGN - 1) / QT_MEM_ALIGN * QT_MEM_ALIGN; }

/* A positive limit is at least one byte: 1e-10 GiB is a limit nothing fits, never "no limit" (0). */
size_t qt_mem_gib(double gib) {
    size_t b = (size_t)(gib * 1073741824.0);
    return b == 0 && gib > 0 ? 1 : b;
}

void qt_mem_plan_begin(qt_mem_plan *p, char *base) {
    memset(p, 0, sizeof *p);
    p->base = base;
}

void qt_mem_plan_add(qt_mem_plan *p, qt_mem_where where, const char *kind, size_t bytes) {
    for (int i = 0; i < p->n; i++)
        if (p->row[i].where == where && !strcmp(p->row[i].kind, kind)) {
            p->row[i].bytes += bytes;
            return;
        }
    QT_CHECK(p->n < QT_MEM_PLAN_ROWS, "memory plan has more than %d kinds", QT_MEM_PLAN_ROWS);
    p->row[p->n++] = (qt_mem_row){kind, where, bytes};
}

void *qt_mem_plan_carve(qt_mem_plan *p, const char *kind, size_t bytes) {
    bytes = qt_mem_aligned(bytes);
    qt_mem_plan_add(p, QT_MEM_ARENA, kind, bytes);
    void *r = p->base ? p->base + p->off : NULL;
    p->off += bytes;
    return r;
}

void qt_mem_plan_host(qt_mem_plan *p, const char *kind, size_t bytes) { qt_mem_plan_add(p, QT_MEM_PINNED, kind, bytes); }

void qt_mem_plan_merge(qt_mem_plan *p, const qt_mem_plan *src) {
    for (int i = 0; i < src->n; i++) qt_mem_plan_add(p, src->row[i].where, src->row[i].kind, src->row[i].bytes);
    p->off += src->off;
}

static int on_host(qt_mem_where w) { return w == QT_MEM_PINNED || w == QT_MEM_PAGEABLE; }

static size_t total(const qt_mem_plan *p, int host) {
    size_t t = 0;
    for (int i = 0; i < p->n; i++)
        if (on_host(p->row[i].where) == host) t += p->row[i].bytes;
    return t;
}

size_t qt_mem_plan_device_total(const qt_mem_plan *p) { return total(p, 0); }
size_t qt_mem_plan_host_total(const qt_mem_plan *p) { return total(p, 1); }

/* "1.23 GiB", or "45.6 MiB" below a GiB. */
static const char *size_str(size_t b, char *buf, size_t cap) {
    if (b >= ((size_t)1 << 30)) snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
    else snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
    return buf;
}

static const char *const where_name[] = {"GPU arena", "GPU", "pinned host", "host"};

int qt_mem_plan_check(const qt_mem_plan *p, int host, size_t limit, const char *limit_what, char *err, size_t errlen) {
    size_t t = total(p, host);
    if (t <= limit) return 0;
    int top[3] = {-1, -1, -1};
    for (int i = 0; i < p->n; i++) {
        if (on_host(p->row[i].where) != host || !p->row[i].bytes) continue;
        for (int k = 0; k < 3; k++)
            if (top[k] < 0 || p->row[i].bytes > p->row[top[k]].bytes) {
                memmove(top + k + 1, top + k, (size_t)(2 - k) * sizeof *top);
                top[k] = i;
                break;
            }
    }
    char a[32], b[32];
    size_t n = (size_t)snprintf(err, errlen, "the %s memory plan needs %s%s but %s allows %s; biggest items:",
                                host ? "host" : "GPU", size_str(t, a, sizeof a), host ? "" : " (the CUDA context not counted)",
                                limit_what, size_str(limit, b, sizeof b));
    for (int k = 0; k < 3 && top[k] >= 0 && n < errlen; k++)
        n += (size_t)snprintf(err + n, errlen - n, "%s %s %s (%s)", k ? "," : "", p->row[top[k]].kind,
                              size_str(p->row[top[k]].bytes, a, sizeof a), where_name[p->row[top[k]].where]);
    return -1;
}

void qt_mem_plan_print_rows(const qt_mem_plan *p, qt_mem_where w) {
    for (int i = 0; i < p->n; i++)
        if (p->row[i].where == w) printf("  %-30s %10.1f MiB  %s\n", p->row[i].kind, p->row[i].bytes / 1048576.0, where_name[w]);
}

void qt_mem_plan_print(const qt_mem_plan *p) {
    for (int w = QT_MEM_ARENA; w <= QT_MEM_PAGEABLE; w++) {
        qt_mem_plan_print_rows(p, (qt_mem_where)w);
        if (w == QT_MEM_ARENA && p->off)
            printf("  %-30s %10.1f MiB  (one allocation)\n", "arena total", p->off / 1048576.0);
        if (w == QT_MEM_DEVICE)
            printf("  %-30s %10.1f MiB  (the CUDA context not counted)\n", "GPU total", total(p, 0) / 1048576.0);
    }
    printf("  %-30s %10.1f MiB\n", "host total", total(p, 1) / 1048576.0);
}
