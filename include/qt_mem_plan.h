/* qt_mem_plan.h — the memory plan: one device allocation carved into named rows, the device memory
 * allocated outside it (library workspaces, comm buffers, the runtime reserve), and the host rows
 * (pinned and pageable buffers), printed as the allocator table at start and by `qtrain --plan`.
 *
 * Each store (parameters, activations, the model's own buffers) adds its rows by carving: the first
 * pass (base NULL) only sums the bytes, the second hands out addresses in the same order, so the table
 * is exactly what is allocated. Rows of the same kind and place merge. The totals are checked against
 * the limits (memory.gpu_limit_gib, memory.host_limit_gib or MemAvailable) before anything is allocated;
 * the CUDA context is never counted. */
#ifndef QT_MEM_PLAN_H
#define QT_MEM_PLAN_H

#include <stddef.h>

#define QT_MEM_PLAN_ROWS 48
#define QT_MEM_ALIGN 256

/* Where a row's bytes live. */
typedef enum {
    QT_MEM_ARENA,    /* carved from the one device allocation */
    QT_MEM_DEVICE,   /* device memory allocated by its owner (workspaces, comm, reserve) */
    QT_MEM_PINNED,   /* page-locked host memory (qt_pinned_alloc) */
    QT_MEM_PAGEABLE, /* malloc'd host memory */
} qt_mem_where;

typedef struct {
    const char *kind;
    qt_mem_where where;
    size_t bytes;
} qt_mem_row;

typedef struct {
    char *base;   /* the device allocation (borrowed); NULL while sizing */
    size_t off;   /* bytes carved so far (the arena) */
    int n;
    qt_mem_row row[QT_MEM_PLAN_ROWS];
} qt_mem_plan;

size_t qt_mem_aligned(size_t bytes);
/* Starts a pass over base (NULL: sizing only); the rows start empty. */
void qt_mem_plan_begin(qt_mem_plan *p, char *base);
/* The next `bytes` (rounded up to QT_MEM_ALIGN) under row `kind` (a string literal); NULL while sizing. */
void *qt_mem_plan_carve(qt_mem_plan *p, const char *kind, size_t bytes);
/* Records memory an owner allocates itself (device outside the arena, pinned or pageable host). */
void qt_mem_plan_add(qt_mem_plan *p, qt_mem_where where, const char *kind, size_t bytes);
/* Records pinned host memory a store allocated itself (= qt_mem_plan_add(p, QT_MEM_PINNED, ...)). */
void qt_mem_plan_host(qt_mem_plan *p, const char *kind, size_t bytes);
/* Appends every row of src to p (the arena rows as arena bytes of p's own). */
void qt_mem_plan_merge(qt_mem_plan *p, const qt_mem_plan *src);
/* Bytes on the GPU (arena + outside rows) or on the host (pinned + pageable). */
size_t qt_mem_plan_device_total(const qt_mem_plan *p);
size_t qt_mem_plan_host_total(const qt_mem_plan *p);
/* 0 when the device (host = 0) or host (host = 1) total fits in limit bytes; else -1 with a message
 * naming the total, the limit (as limit_what, e.g. "memory.gpu_limit_gib = 24") and the biggest rows. */
int qt_mem_plan_check(const qt_mem_plan *p, int host, size_t limit, const char *limit_what, char *err, size_t errlen);
/* Prints the rows of one place, two spaces in. */
void qt_mem_plan_print_rows(const qt_mem_plan *p, qt_mem_where where);
/* Prints the rows (arena, outside, host), the totals, two spaces in. */
void qt_mem_plan_print(const qt_mem_plan *p);

/* Bytes from a limit in GiB (0 stays 0, "no limit"; a positive value is at least 1 byte). */
size_t qt_mem_gib(double gib);

#endif
