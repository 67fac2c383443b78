/* qt_cuda_types.h — the CUDA handle types that the module headers name (cudaStream_t, cudaEvent_t), without the CUDA
 * headers: host code of the CPU-only build includes those module headers on a machine that has no CUDA
 * toolkit. A source that calls the CUDA runtime includes <cuda_runtime.h> itself; nvcc sees the real
 * declaration (a C typedef may repeat with the same type, as here). */
#ifndef QT_CUDA_TYPES_H
#define QT_CUDA_TYPES_H

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif

#endif
