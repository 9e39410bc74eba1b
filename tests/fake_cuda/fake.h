// What the fake driver's parts share: the kernels compiled from kernels.cu (kernels.cpp), the
// driver API (driver.cpp) and cuBLAS (cublas.cpp, through the `pc_fake_*` calls).

#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fake {

// Bytes of dynamic shared memory a block may use without opting in (48 KiB, as on every GPU
// since sm_30), and a guard behind it that must still hold its poison after the block ran.
constexpr size_t kSharedLimit = 48 * 1024;
constexpr size_t kSharedGuard = 4 * 1024;

struct Arg {
    size_t size;
    bool pointer;
};

// One `extern "C" __global__` function of kernels.cu: `run` unpacks cuLaunchKernel's argument
// array and runs the kernel body for the current CUDA thread.
struct Kernel {
    const char* name;
    void (*run)(void** params);
    std::vector<Arg> args;
};

// One `extern __shared__` array: its storage for the calling OS thread.
struct SharedArray {
    const char* name;
    unsigned char* (*storage)();
};

const Kernel* find_kernel(const std::string& name);
const std::vector<SharedArray>& shared_arrays();

}  // namespace fake

// Calls for the fake cuBLAS (C linkage, exported by libcuda.so.1).
extern "C" {
// The context current on the calling thread (null when none).
void* pc_fake_current_context();
// The context a stream belongs to, or null for an unknown stream.
void* pc_fake_stream_context(void* stream);
// Counts a library call among the launches PC_FAKE_CUDA_STATS reports (a GEMM, by its name).
void pc_fake_count_call(const char* name);
// The context's sticky error (0 when none).
int pc_fake_context_error(void* context);
// Whether [ptr, ptr + bytes) lies inside one live allocation on the context's device; when not,
// the context takes the sticky error CUDA_ERROR_ILLEGAL_ADDRESS and the reason is printed.
bool pc_fake_check_range(void* context, void* stream, uint64_t ptr, size_t bytes,
                         const char* what);
}
