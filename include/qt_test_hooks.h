/* qt_test_hooks.h — TEST-ONLY switches of the library: fault injection, timing perturbations and
 * small-model overrides that tests and benches set through qt_test_hooks_set. Never read from the
 * environment or a config; a production run leaves them all zero (off). Process-wide: set them before
 * creating the engine they should affect. The planted bugs that show a test can fail are not hooks: they
 * exist in the test build only (qt_mutant.h). */
#ifndef QT_TEST_HOOKS_H
#define QT_TEST_HOOKS_H

#include <stddef.h>

typedef struct {
    size_t offload_chunk;   /* > 0: state elements per chunk of an offloaded optimizer (many chunks in a
                             * small model); 0: QT_GPU_OPTIM_CHUNK */
    long dp_ag_delay_ms;    /* > 0: a rank's side stream sleeps this long before each step's weight
                             * gather/update (and each ZeRO-3 gather, each offloaded weights' copy up): a
                             * forward that did not wait for it reads stale weights */
    int dp_fail_rank;       /* with dp_fail_step > 0: that data-parallel rank fails just before that */
    long dp_fail_step;      /* optimizer step (1-based) */
    int fp8_unfused_amax;   /* 1: fp8 abs-maxes in separate passes instead of folded into producers */
    long dp_sum_delay_ms;   /* > 0: a data-parallel rank's side stream sleeps this long before each bucket's
                             * gradient sum (offloaded gradients: before each bucket's store to host): a
                             * backward that did not wait for its ZeRO-2 slot adds into one still holding
                             * another bucket */
    long zero3_read_delay_ms; /* > 0: ZeRO-3: the model stream sleeps this long after each weight acquire,
                             * before the layer reads (a gather that does not wait for the slot's
                             * readers overwrites it first); dp_ag_delay_ms also delays each ZeRO-3 gather */
    long dp_fail_gather;    /* > 0 with dp_fail_rank: that rank fails instead of issuing its dp_fail_gather-th
                             * ZeRO-3 weight gather into a shared slot (counted from 1), while the other
                             * ranks wait in it */
    const char *nonfinite_tensor; /* with nonfinite_step > 0: the GPU engines set one gradient element of this
                                   * tensor (its middle one) to NaN just before that optimizer step's AdamW
                                   * (1-based), so the update writes NaN into its weight, master, m and v */
    long nonfinite_step;
    long ckpt_write_delay_ms;     /* > 0: the checkpoint writer sleeps this long after each range of the live
                                   * (offloaded) state it writes: a slow disk the optimizer must wait for */
    int ckpt_sync;                /* 1: each checkpoint waits for its own write before training goes on (the
                                   * synchronous reference of the in-place write test) */
    long offload_residual_delay_ms; /* > 0: memory.offload_residual's copy stream sleeps this long before
                                   * each residual copy (either way): a compute stream that did not wait
                                   * for a copy reads or overwrites the slot too early */
    long stage_down_delay_ms;     /* > 0: qt_chunk_pipe's down stream sleeps this long before each way down */
    long grad_stage_elems;        /* > 0: ZeRO-2/3's offloaded gradient shard is added in chunks of this many
                                   * elements (a small test model's pieces fit one of the default 4 Mi) */
    int act_own_inputs;           /* 1: every layer keeps its own ln1, ln2 and h even with an fp8 backward
                                   * (one buffer per layer instead of one shared: test_recompute compares the two) */
} qt_test_hooks;

/* Copies h (NULL: all off). */
void qt_test_hooks_set(const qt_test_hooks *h);
/* The hooks in force (all zero unless a test set them). */
const qt_test_hooks *qt_test_hooks_get(void);

#endif
