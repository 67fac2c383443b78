/* train_nodes.c — the trainer across nodes: node 0 writes, the nodes agree (qt_train_nodes.h). */
#include "qt_train_nodes.h"

#include <stdio.h>

#include "qt_config.h"
#include "qt_crc32.h"
#include "qt_device.h"
#include "qt_dp_nodes.h"
#include "qt_error.h"
#include "qt_plan.h"
#include "qt_rendezvous.h"

_Static_assert(QT_NODES_IDS == QT_RDZV_BLOB, "the rendezvous hands over the NCCL ids of qt_nodes");

int qt_train_meet_nodes(const qt_config *cfg, qt_launch_getter get, void *ctx, qt_nodes *nodes, char *err, size_t errlen) {
    qt_launch l;
    if (qt_launch_resolve(&l, cfg->parallel.nodes, get, ctx, err, errlen)) return -1;
    static char dump[1 << 16];
    size_t n = qt_config_dump(cfg, dump, sizeof dump);
    int devs[QT_COMM_MAX_RANKS], visible = cfg->device == QT_DEVICE_CPU ? 0 : qt_cuda_device_count();
    int gpus = visible > 0 ? qt_plan_rank_devices(cfg, visible, devs, err, errlen) : 0;
    if (gpus < 0) return -1;
    *nodes = (qt_nodes){.node = l.node_rank, .nodes = l.nodes};
    if (l.node_rank == 0 && gpus > 0 && qt_dp_nodes_ids(nodes->ids, gpus, err, errlen)) return -1;
    qt_rdzv_opts o = {l.master_addr, l.master_port, l.node_rank, l.nodes, gpus,
                      qt_crc32(0, dump, n < sizeof dump ? n : sizeof dump), 300.0};
    if (qt_rdzv_run(&o, nodes->ids, err, errlen)) return -1;
    printf("qtrain: parallel.nodes %d: node %d met the others (%s launch, node 0 at %s:%d, %d GPUs each)\n", l.nodes,
           l.node_rank, l.launcher, l.master_addr, l.master_port, gpus);
    fflush(stdout);
    if (gpus == 0) /* every node has node 0's count: every node stops here */
        return qt_errf(err, errlen, "parallel.nodes: %d: training across nodes runs on GPUs (NCCL between them), and "
                       "this run has none (device: cpu, or no CUDA device visible)", l.nodes);
    return 0;
}

int qt_train_nodes_follower(const qt_nodes *nodes) { return nodes && nodes->nodes > 1 && nodes->node > 0; }

int qt_train_nodes_agree(qt_trainer *t, int mine, int *count, char *err, size_t errlen) {
    if (qt_engine_nodes_count(t->eng, mine, count, err, errlen) == 0) return 0;
    t->broken = 1;
    return -1;
}

int qt_train_nodes_stop(qt_trainer *t, int sig, char *err, size_t errlen) {
    if (!t->eng->ops->nodes_count) return sig != 0;
    int count = 0;
    if (qt_train_nodes_agree(t, sig != 0, &count, err, errlen)) return -1;
    return count > 0;
}

int qt_train_nodes_finish(qt_trainer *t, int rc, char *err, size_t errlen) {
    if (!t->eng->ops->nodes_count || t->broken) return rc;
    int failed = 0;
    if (qt_train_nodes_agree(t, rc != 0, &failed, rc ? NULL : err, rc ? 0 : errlen)) return -1;
    if (rc == 0 && failed)
        return qt_errf(err, errlen, "%d of the %d nodes failed at the end of the run (node 0 writes the last "
                       "checkpoint: its output says more)", failed, t->eng->plan->parallel.nodes);
    return rc;
}
