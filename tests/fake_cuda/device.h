// CUDA C as plain C++ for the fake driver: included before `crates/runtime/src/cuda/kernels.cu`, which
// is compiled unmodified. A kernel becomes an `extern "C"` function that one CUDA thread runs;
// driver.cpp calls it once per thread of the grid. `threadIdx`, `blockIdx`, `blockDim` and
// `gridDim` are thread-local variables the driver sets before it runs (or resumes) a CUDA thread,
// and `__syncthreads()` switches fibers, so a barrier is a real barrier.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// `extern __shared__ T name[];` declares the block's dynamic shared memory. Every CUDA thread of
// a block runs on the same OS thread (as fibers), so thread-local storage is shared by exactly
// the threads of one block; the definitions are generated from the kernel source (shared.inc).
#define __shared__ __thread

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
};

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

// The barrier: its source line tells barriers apart, so threads of one block that wait at
// different `__syncthreads()` calls are reported (undefined behaviour on a GPU).
extern "C" void pc_fake_syncthreads(int line);
#define __syncthreads() pc_fake_syncthreads(__LINE__)

inline float __int_as_float(int bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}
inline int __float_as_int(float f) {
    int bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
inline float __expf(float v) { return std::exp(v); }
inline float __logf(float v) { return std::log(v); }
inline float __fdividef(float a, float b) { return a / b; }
