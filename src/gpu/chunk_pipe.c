/* chunk_pipe.c — host chunks through device slots, the copies beside the work (qt_chunk_pipe.h). Slot i:
 * the up stream waits for back[i] (its last way down) and records ready[i] after the copies up; the worker
 * stream waits for ready[i], works, records done[i]; the down stream waits for done[i] and records back[i]
 * after the copies down. */
#include "qt_chunk_pipe.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <time.h>

#include "qt_error.h"
#ifdef QT_MUTANTS
#include "qt_mutant.h"
#endif
#include "qt_test_hooks.h"

struct qt_chunk_pipe {
    char *slots;  /* borrowed */
    size_t slot_bytes;
    cudaStream_t up, down;
    cudaEvent_t begin, ready[QT_CHUNK_PIPE_SLOTS], done[QT_CHUNK_PIPE_SLOTS], back[QT_CHUNK_PIPE_SLOTS];
    long next;    /* slots handed out so far; the current one is (next - 1) % QT_CHUNK_PIPE_SLOTS */
    long delay_ms;
};

qt_chunk_pipe *qt_chunk_pipe_create(void *slots, size_t slot_bytes) {
    qt_chunk_pipe *p = calloc(1, sizeof *p);
    QT_CHECK(p, "out of host memory");
    p->slots = slots;
    p->slot_bytes = slot_bytes;
    p->delay_ms = qt_test_hooks_get()->stage_down_delay_ms;
    QT_CUDA(cudaStreamCreateWithFlags(&p->up, cudaStreamNonBlocking));
    QT_CUDA(cudaStreamCreateWithFlags(&p->down, cudaStreamNonBlocking));
    cudaEvent_t *ev[] = {&p->begin, p->ready, p->done, p->back};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < (k ? QT_CHUNK_PIPE_SLOTS : 1); i++) QT_CUDA(cudaEventCreateWithFlags(&ev[k][i], cudaEventDisableTiming));
    return p;
}

void qt_chunk_pipe_free(qt_chunk_pipe *p) {
    if (!p) return;
    QT_CUDA(cudaStreamSynchronize(p->up));
    QT_CUDA(cudaStreamSynchronize(p->down));
    cudaEvent_t *ev[] = {&p->begin, p->ready, p->done, p->back};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < (k ? QT_CHUNK_PIPE_SLOTS : 1); i++) QT_CUDA(cudaEventDestroy(ev[k][i]));
    QT_CUDA(cudaStreamDestroy(p->up));
    QT_CUDA(cudaStreamDestroy(p->down));
    free(p);
}

void qt_chunk_pipe_begin(qt_chunk_pipe *p, cudaStream_t s) {
    QT_CUDA(cudaEventRecord(p->begin, s));
    QT_CUDA(cudaStreamWaitEvent(p->up, p->begin, 0));
}

static int current(const qt_chunk_pipe *p) { return (int)((p->next - 1) % QT_CHUNK_PIPE_SLOTS); }

void *qt_chunk_pipe_next(qt_chunk_pipe *p, cudaStream_t *up) {
    int i = (int)(p->next++ % QT_CHUNK_PIPE_SLOTS);
    int no_wait = 0;
#ifdef QT_MUTANTS
    no_wait = qt_mutant_on(QT_MUT_STAGE_REUSE_EARLY);
#endif
    if (p->next > QT_CHUNK_PIPE_SLOTS && !no_wait) QT_CUDA(cudaStreamWaitEvent(p->up, p->back[i], 0));
    *up = p->up;
    return p->slots + (size_t)i * p->slot_bytes;
}

void qt_chunk_pipe_ready(qt_chunk_pipe *p, cudaStream_t s) {
    QT_CHECK(p->next > 0, "chunk pipe: ready before a slot was taken");
    QT_CUDA(cudaEventRecord(p->ready[current(p)], p->up));
    QT_CUDA(cudaStreamWaitEvent(s, p->ready[current(p)], 0));
}

static void CUDART_CB sleep_ms(void *ms) {
    struct timespec t = {*(long *)ms / 1000, *(long *)ms % 1000 * 1000000L};
    nanosleep(&t, NULL);
}

cudaStream_t qt_chunk_pipe_done(qt_chunk_pipe *p, cudaStream_t s) {
    QT_CHECK(p->next > 0, "chunk pipe: done before a slot was taken");
    QT_CUDA(cudaEventRecord(p->done[current(p)], s));
    QT_CUDA(cudaStreamWaitEvent(p->down, p->done[current(p)], 0));
    if (p->delay_ms > 0) QT_CUDA(cudaLaunchHostFunc(p->down, sleep_ms, &p->delay_ms));
    return p->down;
}

void qt_chunk_pipe_back(qt_chunk_pipe *p) { QT_CUDA(cudaEventRecord(p->back[current(p)], p->down)); }

void qt_chunk_pipe_end(qt_chunk_pipe *p, cudaStream_t s) {
    if (p->next) QT_CUDA(cudaStreamWaitEvent(s, p->back[current(p)], 0));
}

void *qt_chunk_pipe_up(qt_chunk_pipe *p, const void *host, size_t up, cudaStream_t s) {
    QT_CHECK(up <= p->slot_bytes, "chunk pipe: %zu bytes up into slots of %zu", up, p->slot_bytes);
    cudaStream_t u;
    void *slot = qt_chunk_pipe_next(p, &u);
    if (up) QT_CUDA(cudaMemcpyAsync(slot, host, up, cudaMemcpyHostToDevice, u));
    qt_chunk_pipe_ready(p, s);
    return slot;
}

void qt_chunk_pipe_down(qt_chunk_pipe *p, void *host, size_t bytes, cudaStream_t s) {
    QT_CHECK(bytes <= p->slot_bytes, "chunk pipe: %zu bytes down from slots of %zu", bytes, p->slot_bytes);
    cudaStream_t d = qt_chunk_pipe_done(p, s);
    QT_CUDA(cudaMemcpyAsync(host, p->slots + (size_t)current(p) * p->slot_bytes, bytes, cudaMemcpyDeviceToHost, d));
    qt_chunk_pipe_back(p);
}
