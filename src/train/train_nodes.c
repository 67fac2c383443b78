/* train_nodes.c — the trainer across nodes: node 0 writes, the nodes agree (qt_train_nodes.h). */
#include "qt_train_nodes.h"

#include <stdio.h>

#include "qt_dp_nodes.h"
#include "qt_error.h"

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
