/* qt_test_hooks.h — TEST-ONLY switches of the library: fault injection, timing perturbations and
 * small-model overrides that tests and benches set through qt_test_hooks_set. Never read from the
 * environment or a config; a production run leaves them all zero (off). Process-wide: set them before
 * creating the engine they should affect. */
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
    int recompute_stale_h;  /* 1: MUTANT: memory.recompute's rebuild of the SwiGLU output h is skipped for
                             * layers 1.. (their backward reads what the layer above left in the shared
                             * buffer): the recompute test must catch it */
    long dp_sum_delay_ms;   /* > 0: a data-parallel rank's side stream sleeps this long before each bucket's
                             * gradient sum (offloaded gradients: before each bucket's store to host): a
                             * backward that did not wait for its ZeRO-2 slot adds into one still holding
                             * another bucket */
    int zero_mutant;        /* MUTANTS for the ZeRO tests: 1 = the ZeRO-2 backward does not wait for its
                             * shared gradient slots; 2 = ZeRO-2 sums each bucket in descending rank order
                             * (all-gather + adds; the same as ascending for 2 ranks, not for 3); ZeRO-3
                             * (qt_weight_slots.h): 3 = a weight slot is gathered into before its last
                             * reader ran (no wait for the slot's release); 4 = the model reads a shared
                             * weight slot without waiting for its (prefetched) gather (3 and 4 also with
                             * memory.offload: [weights], whose slots are filled by H2D copies); offloaded
                             * gradients (memory.offload: [gradients]): 1 = the backward does not wait for
                             * its shared gradient slot's store and load; 5 = a shared slot is not zeroed
                             * after its store to host; 6 = the norm and AdamW do not wait for the last stores;
                             * with ZeRO ranks: 7 = ZeRO-3 with offloaded weights fills each weight slot from a
                             * device copy of that bucket's first gather (AdamW's writes to the host pieces
                             * never read); 8 = ZeRO-2/3 with offloaded gradients writes (=) each micro-step's
                             * summed piece into the host shard instead of adding (+=) it; 9 = one GPU's
                             * offloaded gradients: a shared slot's load does not wait for its store;
                             * 10 = ZeRO-2/3 with offloaded gradients adds a chunk of the host shard in its
                             * device staging without bringing it up first (qt_param_grad_piece_add);
                             * parallel.gather_dtype e4m3: 11 = each rank quantizes its pieces with their own
                             * abs-max (no max over the ranks); 12 = the codes are made only once (stale
                             * after the first AdamW); 13 = with offloaded pieces the codes are made in the
                             * device scratch without copying the piece up (what the slot held before); a host
                             * gradient shard's clearing (qt_host_shard.h): 14 = a cleared piece's chunks are
                             * neither brought up nor zeroed in their slots, 15 = a cleared piece is written or
                             * read without being zeroed first */
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
    int fp8_wslot_stale;    /* 1: MUTANT: with memory.fp8_weight_cache none the backward does not quantize
                             * layers below the top QT_FP8_WSLOTS into their slot again (it reads what
                             * layer l + 2's backward left there): the weight-cache test must catch it */
    int fp8_wcache_stale_scale; /* 1: MUTANT: with fp8_weight_cache none the weights' abs-max is taken only at
                                 * creation (later steps quantize with the initial weights' scale) */
    int nonfinite_unchecked;      /* 1: MUTANT: the GPU engines skip the per-step finiteness count of the
                                   * updated weights (the nonfinite test must catch it) */
    long ckpt_write_delay_ms;     /* > 0: the checkpoint writer sleeps this long after each range of the live
                                   * (offloaded) state it writes: a slow disk the optimizer must wait for */
    int ckpt_sync;                /* 1: each checkpoint waits for its own write before training goes on (the
                                   * synchronous reference of the in-place write test) */
    int ckpt_unguarded;           /* 1: MUTANT: the offloaded optimizer does not wait for the checkpoint
                                   * writer's mark before it changes the host state (the test must catch it) */
    long offload_residual_delay_ms; /* > 0: memory.offload_residual's copy stream sleeps this long before
                                   * each residual copy (either way): a compute stream that did not wait
                                   * for a copy reads or overwrites the slot too early */
    int offload_residual_mutant;  /* MUTANT 1: the backward reads a fetched residual without waiting for
                                   * its copy; 2: the forward overwrites a residual slot before its copy to
                                   * host has finished. Eager steps only (a capture refuses the unjoined copy) */
    int opt_stream_mutant;        /* MUTANTS of the offloaded optimizer's streamed weights and gradients
                                   * (memory.offload [weights] / [gradients] with the state offloaded): 1 = the
                                   * updated weights are not copied back down, 2 = the gradients not up, 3 = the
                                   * copies up do not wait for the caller's stream (where the gradients were
                                   * written) */
    long stage_down_delay_ms;     /* > 0: qt_chunk_pipe's down stream sleeps this long before each way down */
    int stage_reuse_early;        /* 1: MUTANT: qt_chunk_pipe refills a slot without waiting for its way down */
    long grad_stage_elems;        /* > 0: ZeRO-2/3's offloaded gradient shard is added in chunks of this many
                                   * elements (a small test model's pieces fit one of the default 4 Mi) */
    int attention_nondet;         /* 1: MUTANT: perf.deterministic does not reach the attention backward (cuDNN's
                                   * default graph, whose dQ sums vary run to run): test_determinism must catch it */
    int act_own_inputs;           /* 1: every layer keeps its own ln1, ln2 and h even with an fp8 backward
                                   * (one buffer per layer instead of one shared: test_recompute compares the two) */
    int recompute_stale_ln;       /* 1: MUTANT: with an fp8 backward a recomputed qkv / gate|up of layers 1..
                                   * reads the shared ln1 / ln2 without rebuilding it first */
} qt_test_hooks;

/* Copies h (NULL: all off). */
void qt_test_hooks_set(const qt_test_hooks *h);
/* The hooks in force (all zero unless a test set them). */
const qt_test_hooks *qt_test_hooks_get(void);

#endif
