/* qt_mem_plan.h — the GPU memory plan: one device allocation carved into named rows, plus the host
 * rows (pinned memory a store keeps instead), printed as the allocator table at start.
 *
 * Each store (parameters, activations, the model's own buffers) adds its rows by carving: the first
 * pass (base NULL) only sums the bytes, the second hands out addresses in the same order, so the table
 * is exactly what is allocated. Rows of the same kind merge. */
#ifndef QT_MEM_PLAN_H
#define QT_MEM_PLAN_H

#include <stddef.h>

#define QT_MEM_PLAN_ROWS 32
#define QT_MEM_ALIGN 256

typedef struct {
    const char *kind;
    size_t bytes;
} qt_mem_row;

typedef struct {
    char *base;   /* the device allocation (borrowed); NULL while sizing */
    size_t off;   /* bytes carved so far */
    int n, n_host;
    qt_mem_row row[QT_MEM_PLAN_ROWS], host[QT_MEM_PLAN_ROWS];
} qt_mem_plan;

size_t qt_mem_aligned(size_t bytes);
/* Starts a pass over base (NULL: sizing only); the rows start empty. */
void qt_mem_plan_begin(qt_mem_plan *p, char *base);
/* The next `bytes` (rounded up to QT_MEM_ALIGN) under row `kind` (a string literal); NULL while sizing. */
void *qt_mem_plan_carve(qt_mem_plan *p, const char *kind, size_t bytes);
/* Records pinned host memory a store allocated itself (printed, not carved). */
void qt_mem_plan_host(qt_mem_plan *p, const char *kind, size_t bytes);
/* Prints the rows, the device total and the host rows, two spaces in. */
void qt_mem_plan_print(const qt_mem_plan *p);

#endif
