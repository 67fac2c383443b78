/* qt_step_loss.h — the CPU engines' loss of an optimizer step from its micro-steps' mean losses. */
#ifndef QT_STEP_LOSS_H
#define QT_STEP_LOSS_H

typedef struct {
    double loss_sum;      /* the micro-steps' mean losses, summed */
    double tok_sum;       /* their target losses, summed (mean x count) */
    long valid, valid0;   /* targets >= 0 since the last take; the first micro-step's count */
    int n_micro, uneven;  /* uneven: the micro-steps' target counts differ (loss masks) */
} qt_step_loss;

/* One micro-step: its mean loss l over its v targets. */
static inline void qt_step_loss_add(qt_step_loss *s, float l, long v) {
    if (s->n_micro == 0) s->valid0 = v;
    s->uneven |= v != s->valid0;
    s->loss_sum += l;
    s->tok_sum += (double)l * v;
    s->valid += v;
    s->n_micro++;
}

/* The mean over all targets of the step, and a fresh start. With equal counts it is the mean of the
 * micro-steps' means, computed that way so that runs without masks log the same bits as before masks. */
static inline float qt_step_loss_take(qt_step_loss *s) {
    float loss;
    if (s->uneven) loss = s->valid ? (float)(s->tok_sum / s->valid) : 0.0f;
    else loss = s->n_micro ? (float)(s->loss_sum / s->n_micro) : 0.0f;
    *s = (qt_step_loss){0};
    return loss;
}

#endif
