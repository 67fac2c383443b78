/* qt_train_nodes.h — the trainer's part of a run across nodes (parallel.nodes > 1, docs/multi-node.md).
 *
 * Every node reads every micro-batch of a step (the loader's state is the same on every node) and its
 * engine trains on its own global ranks' ones; node 0 alone keeps the run directory, the log and the
 * checkpoints (a follower, node > 0, keeps none of them; with ZeRO over the nodes its pieces cross to node
 * 0 in the engine's state_items and get_weights, which every node calls). At each checkpoint and at the
 * end the nodes agree (the engine's nodes_count): node 0's write started (or
 * finished), or every node stops with node 0's failure named; a stop request (a signal) on any node
 * stops every node after the same step. On one machine each call is the one-machine call, nothing more. */
#ifndef QT_TRAIN_NODES_H
#define QT_TRAIN_NODES_H

#include <stddef.h>

#include "qt_launch.h"
#include "qt_train_ckpt.h"

struct qt_config;
/* parallel.nodes > 1: where this node stands (the launcher's variables, read through get), node 0's NCCL ids
 * for the run's GPUs, then the nodes' meeting (qt_rendezvous.h), which checks every node's config and GPU
 * count against node 0's and hands over the ids; a run without GPUs (device: cpu, none visible) stops there
 * on every node. 0 with *nodes filled (for qt_train_run_nodes), or -1 with err. */
int qt_train_meet_nodes(const struct qt_config *cfg, qt_launch_getter get, void *ctx, struct qt_nodes *nodes, char *err,
                        size_t errlen);

/* 1 when nodes (NULL: one machine) says this process is a node other than node 0. */
int qt_train_nodes_follower(const struct qt_nodes *nodes);
/* How many nodes pass mine != 0 (a barrier of every node, through the engine's nodes_count, which only an engine
 * across nodes has): into *count. 0, or -1 with err (the trainer is broken then). */
int qt_train_nodes_agree(qt_trainer *t, int mine, int *count, char *err, size_t errlen);
/* Whether to stop before the next step: 1 when a stop was asked on this node (sig != 0) or any other. 0 or 1;
 * -1 with err when the nodes cannot agree (a node is gone). */
int qt_train_nodes_stop(qt_trainer *t, int sig, char *err, size_t errlen);
/* The end of the run, after node 0's last write and export (rc: this node's outcome so far): every node
 * waits for every other (none takes another's leaving for a failure); rc, or -1 with err when another node
 * failed there. */
int qt_train_nodes_finish(qt_trainer *t, int rc, char *err, size_t errlen);

#endif
