/* oneshot.cu — the kernel of comm's one-kernel collectives; the protocol is in oneshot.h.
 *
 * Flags are posted with st.release.sys after every block's writes were fenced at system scope, and read
 * with ld.acquire.sys, so a rank that sees a peer's flag also sees what the peer published (in its arena
 * region, through host memory) or stored (into this rank's output, over NVLink). The grid is capped so all
 * blocks are resident at once: a block spins on flags that other blocks of this kernel must still post. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "oneshot.h"
#include "qt_error.h"
#include "reduce.cuh"

#define OS_THREADS 512
#define OS_BYTES_PER_BLOCK (16u << 10) /* 4 x H200, 1 MiB all-gather: 16 blocks 13.6 us, 32 11.7, 64 11.8 */

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long ld_acquire_gpu(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(unsigned long long *p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* Threads 0..n-1 (but r) store v into my cell of rank t's flags. */
__device__ __forceinline__ void post(const qt_oneshot *a, unsigned long long v) {
    int t = threadIdx.x;
    if (t < a->n && t != a->r) st_release(a->flags[t] + a->r, v);
}

/* Threads 0..n-1 (but r) of the calling block wait until every peer's cell in my flags reaches v;
 * 0 if the comm was aborted first. */
__device__ __forceinline__ int wait_flags(const qt_oneshot *a, unsigned long long v) {
    __shared__ int ok;
    int t = threadIdx.x;
    if (t == 0) ok = 1;
    __syncthreads();
    if (t < a->n && t != a->r) {
        const unsigned long long *p = a->flags[a->r] + t;
        for (unsigned it = 1; ld_acquire(p) < v; it++)
            if ((it & 1023) == 0 && *(volatile const int *)a->abort) {
                ok = 0;
                break;
            }
    }
    __syncthreads();
    return ok;
}

/* Every block: returns once every peer posted its start flag for seq (0 if aborted). Only block 0 polls
 * the flags (in host memory for host kinds: a poller per block per peer flooded PCIe with reads); the
 * others poll its word in my device memory. */
__device__ __forceinline__ int wait_start(const qt_oneshot *a) {
    __shared__ unsigned long long seen;
    if (blockIdx.x == 0) {
        int ok = wait_flags(a, 2 * a->seq);
        if (threadIdx.x == 0) {
            __threadfence(); /* cumulative: what the flags' releases made visible, before go */
            *(volatile unsigned long long *)&a->local->go = ok ? a->seq : ~0ull;
        }
        return ok;
    }
    if (threadIdx.x == 0) {
        unsigned long long g;
        while ((g = ld_acquire_gpu(&a->local->go)) < a->seq) {}
        seen = g;
    }
    __syncthreads();
    return seen != ~0ull;
}

/* Called by every block once its threads finished a step: 1 in the block that finishes it last, whose
 * later release then covers every block's writes (the block barrier, then one system-scope fence per
 * block, as a grid barrier does). Resets the counter for the next kernel. */
__device__ __forceinline__ int last_block(unsigned *ctr) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        last = atomicAdd(ctr, 1) == gridDim.x - 1;
        if (last) {
            atomicExch(ctr, 0);
            __threadfence_system(); /* order the other blocks' writes (seen through ctr) before our flags */
        }
    }
    __syncthreads();
    return last;
}

/* d[0..b) = s[0..b), grid-stride. 16-byte vectors when d and s share their alignment mod 16 (4 bytes when
 * mod 4; bytes otherwise: e.g. 1-byte shards at odd offsets), four in flight per thread: remote loads
 * take microseconds. */
__device__ __forceinline__ void copy_range(char *d, const char *s, size_t b, size_t tid, size_t stride) {
    uintptr_t x = (uintptr_t)d ^ (uintptr_t)s;
    size_t w = (x & 15) == 0 ? 16 : (x & 3) == 0 ? 4 : 1, head = (w - ((uintptr_t)d & (w - 1))) & (w - 1);
    if (head > b) head = b;
    if (tid < head) d[tid] = s[tid];
    size_t nw = (b - head) / w, i = tid;
    if (w == 16) {
        uint4 *dv = (uint4 *)(d + head);
        const uint4 *sv = (const uint4 *)(s + head);
        for (; i + 3 * stride < nw; i += 4 * stride) {
            uint4 v0 = sv[i], v1 = sv[i + stride], v2 = sv[i + 2 * stride], v3 = sv[i + 3 * stride];
            dv[i] = v0;
            dv[i + stride] = v1;
            dv[i + 2 * stride] = v2;
            dv[i + 3 * stride] = v3;
        }
        for (; i < nw; i += stride) dv[i] = sv[i];
    } else if (w == 4) {
        for (; i < nw; i += stride) ((uint32_t *)(d + head))[i] = ((const uint32_t *)(s + head))[i];
    } else {
        for (; i < nw; i += stride) d[head + i] = s[head + i];
    }
    for (i = head + nw * w + tid; i < b; i += stride) d[i] = s[i];
}

__global__ void __launch_bounds__(OS_THREADS) oneshot_kernel(qt_oneshot a) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long start = 2 * a.seq;
    if (a.pub_bytes) {
        copy_range((char *)a.pub_dst, (const char *)a.pub_src, a.pub_bytes, tid, stride);
        if (last_block(&a.local->arrive[0])) post(&a, start);
    } else if (blockIdx.x == 0) {
        post(&a, start);
    }
    if (!wait_start(&a)) return;
    if (a.reduce) {
        qt_reduce_args ra;
        int vec = 1;
        ra.nsrc = a.nsrc;
        ra.ndst = a.ndst;
        for (int k = 0; k < QT_COMM_MAX_RANKS; k++) {
            ra.src[k] = a.src[k];
            ra.dst[k] = a.dst[k];
            if (k < a.nsrc) vec &= ((uintptr_t)a.src[k] & 15) == 0;
            if (k < a.ndst) vec &= ((uintptr_t)a.dst[k] & 15) == 0;
        }
        reduce_range(ra, a.nelem, a.dt, a.red, vec, tid, stride);
    } else {
        for (int k = 0; k < a.npiece; k++) copy_range((char *)a.dst[k], (const char *)a.src[k], a.bytes[k], tid, stride);
    }
    if (last_block(&a.local->arrive[1])) {
        post(&a, start + 1);
        wait_flags(&a, start + 1);
    }
}

extern "C" void qt_comm_oneshot_launch(const qt_oneshot *a, cudaStream_t s) {
    QT_CHECK(a->n >= 2 && a->n <= QT_COMM_MAX_RANKS && a->npiece <= QT_COMM_MAX_RANKS && a->nsrc <= QT_COMM_MAX_RANKS &&
                 a->ndst <= QT_COMM_MAX_RANKS && a->max_blocks >= 1,
             "comm one-shot: %d ranks, %d pieces, %d sources, %d destinations, %d blocks", a->n, a->npiece, a->nsrc,
             a->ndst, a->max_blocks);
    QT_CHECK(!a->reduce || a->dt == QT_DT_F32 || a->dt == QT_DT_BF16, "comm one-shot reduce: dtype %s",
             qt_dtype_name((qt_dtype)a->dt));
    size_t work = a->pub_bytes;
    if (a->reduce) work += a->nelem * qt_dtype_size((qt_dtype)a->dt) * (size_t)(a->nsrc + a->ndst);
    else
        for (int k = 0; k < a->npiece; k++) work += a->bytes[k];
    size_t blocks = (work + OS_BYTES_PER_BLOCK - 1) / OS_BYTES_PER_BLOCK;
    if (blocks < 1) blocks = 1;
    if (blocks > (size_t)a->max_blocks) blocks = (size_t)a->max_blocks;
    oneshot_kernel<<<(unsigned)blocks, OS_THREADS, 0, s>>>(*a);
    QT_CUDA(cudaGetLastError());
}
