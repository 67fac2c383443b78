/* qt_test_steps.h — an engine trained on fixed random tokens (the LoRA and QLoRA tests compare two engines'
 * bits after the same steps). */
#ifndef QT_TEST_STEPS_H
#define QT_TEST_STEPS_H

#include <stdint.h>
#include <stdlib.h>

#include "qt_engine.h"
#include "qt_error.h"
#include "qt_rng.h"
#include "qt_test.h"
#include "qt_train.h"

/* steps optimizer steps of e (lr 0.01), each of 2 micro-batches of tokens and targets drawn below vocab (seed 11,
 * the same on every call); the losses into loss[steps], then the logits of the last step's first micro-batch into
 * logits. */
static inline void qt_t_fixed_steps(qt_engine *e, int steps, int vocab, float *loss, float *logits) {
    long N = (long)e->plan->run.B * e->plan->run.T;
    int32_t *in = malloc(2 * N * sizeof *in), *tg = malloc(2 * N * sizeof *tg);
    QT_CHECK(in && tg, "out of memory");
    qt_rng r;
    qt_rng_seed(&r, 11);
    char err[1024];
    for (int s = 0; s < steps; s++) {
        for (long i = 0; i < 2 * N; i++)
            in[i] = (int32_t)qt_rng_below(&r, vocab), tg[i] = (int32_t)qt_rng_below(&r, vocab);
        for (int k = 0; k < 2; k++)
            QT_CHECK(qt_engine_micro_step(e, in + k * N, tg + k * N, qt_loss_scale(2, 1, 2 * N), err, sizeof err) == 0,
                     "%s", err);
        float gn;
        QT_CHECK(qt_engine_opt_step(e, 0.01f, s + 1, &loss[s], &gn, err, sizeof err) == 0, "%s", err);
    }
    QT_CHECK(qt_engine_forward_logits(e, in, logits, err, sizeof err) == 0, "%s", err);
    free(in), free(tg);
}

#endif
