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

void qt_dp_nodes_sum(qt_internode *x, int g, void *buf, size_t count, qt_dtype dt, cudaStream_t s) {
    (void)x, (void)g, (void)buf, (void)count, (void)dt, (void)s;
    qt_fail(__FILE__, __LINE__, "qt_dp_nodes_sum", "%s", QT_NO_NCCL);
}

void qt_dp_nodes_norm(const qt_param_store *ps, qt_comm *comm, int rank, int nodes, double *sumsq, float max_norm,
                      void *ws, cudaStream_t s) {
    (void)ps, (void)comm, (void)rank, (void)nodes, (void)sumsq, (void)max_norm, (void)ws, (void)s;
    qt_fail(__FILE__, __LINE__, "qt_dp_nodes_norm", "%s", QT_NO_NCCL);
}
