/* dp_nodes_none.c — the entry points of qt_dp_nodes.h in a CUDA build without NCCL (the Makefile's
 * NCCL_FOUND empty): compiled in place of dp_nodes.c. Nothing is made: a run across nodes is refused,
 * saying why; the ranks' calls are never reached (no engine has the communicators). */
#include "qt_dp_nodes.h"

#include "qt_error.h"

#define QT_NO_NCCL "built without NCCL: training across nodes needs nccl.h and libnccl (the CUDA toolkit's or the system's)"

int qt_dp_nodes_ids(unsigned char *ids, int gpus, char *err, size_t errlen) {
    (void)ids, (void)gpus;
    return qt_errf(err, errlen, "parallel.nodes: %s", QT_NO_NCCL);
}

qt_dp_nodes *qt_dp_nodes_create(const qt_nodes *n, int gpus, const int *devices, qt_comm *comm, double timeout_s,
                                char *err, size_t errlen) {
    (void)n, (void)gpus, (void)devices, (void)comm, (void)timeout_s;
    qt_errf(err, errlen, "parallel.nodes: %s", QT_NO_NCCL);
    return NULL;
}

void qt_dp_nodes_free(qt_dp_nodes *x, int abort) { (void)x, (void)abort; }

qt_internode *qt_dp_nodes_link(qt_dp_nodes *x) {
    (void)x;
    return NULL;
}

int qt_dp_nodes_failed(qt_dp_nodes *x, char *msg, size_t cap) {
    (void)x, (void)msg, (void)cap;
    return 0;
}

void qt_dp_nodes_gather(qt_dp_nodes *x, const double *mine, int per, double *all) {
    (void)x, (void)mine, (void)per, (void)all;
    qt_fail(__FILE__, __LINE__, "qt_dp_nodes_gather", "%s", QT_NO_NCCL);
}

void qt_dp_nodes_sum(qt_internode *x, int g, void *local, void *mine, size_t n_local, size_t n_mine, qt_dtype dt,
                     cudaStream_t s) {
    (void)x, (void)g, (void)local, (void)mine, (void)n_local, (void)n_mine, (void)dt, (void)s;
    qt_fail(__FILE__, __LINE__, "qt_dp_nodes_sum", "%s", QT_NO_NCCL);
}

void qt_dp_nodes_all_gather(qt_internode *x, int g, void *local, const void *mine, size_t per, qt_dtype dt,
                            cudaStream_t s) {
    (void)x, (void)g, (void)local, (void)mine, (void)per, (void)dt, (void)s;
    qt_fail(__FILE__, __LINE__, "qt_dp_nodes_all_gather", "%s", QT_NO_NCCL);
}

void qt_dp_nodes_max(qt_internode *x, int g, float *vals, int n, cudaStream_t s) {
    (void)x, (void)g, (void)vals, (void)n, (void)s;
    qt_fail(__FILE__, __LINE__, "qt_dp_nodes_max", "%s", QT_NO_NCCL);
}

void qt_dp_nodes_widen(qt_internode *x, int g, const qt_shard *sh, const void *pieces, size_t es, void *out, void *stage,
                       size_t stage_bytes, cudaStream_t s) {
    (void)x, (void)g, (void)sh, (void)pieces, (void)es, (void)out, (void)stage, (void)stage_bytes, (void)s;
    qt_fail(__FILE__, __LINE__, "qt_dp_nodes_widen", "%s", QT_NO_NCCL);
}
