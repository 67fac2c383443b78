/* mem_plan.c — rows of the GPU memory plan (see qt_mem_plan.h). */
#include "qt_mem_plan.h"

#include <stdio.h>
#include <string.h>

#include "qt_error.h"

size_t qt_mem_aligned(size_t bytes) { return (bytes + QT_MEM_ALIGN - 1) / QT_MEM_ALIGN * QT_MEM_ALIGN; }

void qt_mem_plan_begin(qt_mem_plan *p, char *base) {
    memset(p, 0, sizeof *p);
    p->base = base;
}

static void add_row(int *n, size_t cap, qt_mem_row *r, const char *kind, size_t bytes) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(r[i].kind, kind)) {
            r[i].bytes += bytes;
            return;
        }
    QT_CHECK((size_t)*n < cap, "memory plan has more than %zu kinds", cap);
    r[*n].kind = kind;
    r[(*n)++].bytes = bytes;
}

void *qt_mem_plan_carve(qt_mem_plan *p, const char *kind, size_t bytes) {
    bytes = qt_mem_aligned(bytes);
    add_row(&p->n, QT_MEM_PLAN_ROWS, p->row, kind, bytes);
    void *r = p->base ? p->base + p->off : NULL;
    p->off += bytes;
    return r;
}

void qt_mem_plan_host(qt_mem_plan *p, const char *kind, size_t bytes) {
    add_row(&p->n_host, QT_MEM_PLAN_ROWS, p->host, kind, bytes);
}

void qt_mem_plan_print(const qt_mem_plan *p) {
    for (int i = 0; i < p->n; i++) printf("  %-28s %10.1f MiB\n", p->row[i].kind, p->row[i].bytes / 1048576.0);
    printf("  %-28s %10.1f MiB\n", "total (one allocation)", p->off / 1048576.0);
    for (int i = 0; i < p->n_host; i++)
        printf("  %-28s %10.1f MiB (pinned host memory)\n", p->host[i].kind, p->host[i].bytes / 1048576.0);
}
