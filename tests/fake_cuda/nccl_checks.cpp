// Misuse the fake libnccl must refuse as NCCL (or a GPU) would, in two processes (rank 0 on
// device 0, rank 1 on device 1 of a fake 2-GPU machine): built and run by tests/distributed.rs.
// Prints one line per check, `ok NAME` or `FAIL NAME: why`, and exits non-zero on any failure.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

extern "C" {
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned flags);
CUresult cuDevicePrimaryCtxRetain(void** context, int device);
CUresult cuCtxSetCurrent(void* context);
CUresult cuStreamCreate(void** stream, unsigned flags);
CUresult cuMemAlloc_v2(CUdeviceptr* ptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr ptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes);
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes);

struct ncclUniqueId {
    char internal[128];
};
struct ncclConfig {
    size_t size;
    unsigned magic;
    unsigned version;
    int blocking;
};
int ncclGetUniqueId(ncclUniqueId* id);
int ncclCommInitRankConfig(void** comm, int nranks, ncclUniqueId id, int rank, void* config);
int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank);
int ncclCommGetAsyncError(void* comm, int* error);
int ncclSend(const void* buf, size_t count, int datatype, int peer, void* comm, void* stream);
int ncclRecv(void* buf, size_t count, int datatype, int peer, void* comm, void* stream);
int ncclCommDestroy(void* comm);
}

namespace {

constexpr int kFloat = 7;
constexpr int kInvalidArgument = 4, kInvalidUsage = 5, kRemoteError = 6, kInProgress = 7;
int failures = 0;
// Rank 1 writes a byte here when it is done with the second communicator, so that rank 0
// does not tear it down under rank 1's last send.
int done_pipe[2];

void check(int rank, bool good, const char* name, int got) {
    if (good) {
        std::printf("ok rank %d: %s\n", rank, name);
    } else {
        std::printf("FAIL rank %d: %s (result %d)\n", rank, name, got);
        ++failures;
    }
    std::fflush(stdout);
}

// A non-blocking communicator's operation: its call answers ncclInProgress, then
// ncclCommGetAsyncError says how it ended.
int finished(int called, void* comm) {
    if (called != kInProgress) return -100 - called;
    int state = kInProgress;
    while (state == kInProgress) {
        ncclCommGetAsyncError(comm, &state);
        usleep(100);
    }
    return state;
}

struct Gpu {
    void* context;
    void* stream;
};

Gpu open_gpu(int device) {
    Gpu g{};
    cuInit(0);
    cuDevicePrimaryCtxRetain(&g.context, device);
    cuCtxSetCurrent(g.context);
    cuStreamCreate(&g.stream, 0);
    return g;
}

void rank0(ncclUniqueId a, ncclUniqueId b) {
    Gpu gpu = open_gpu(0);
    CUdeviceptr buf;
    cuMemAlloc_v2(&buf, 16);
    ncclConfig config{sizeof(ncclConfig), 0xcafebeef, 22304, 0};
    void* comm = nullptr;
    int r = ncclCommInitRankConfig(&comm, 2, a, 0, &config);
    check(0, r == kInProgress, "a non-blocking communicator answers ncclInProgress", r);
    int state = -1;
    ncclCommGetAsyncError(comm, &state);
    check(0, state == kInProgress, "then is polled to completion", state);
    ncclCommGetAsyncError(comm, &state);
    check(0, state == 0, "and completes", state);
    r = finished(ncclRecv(reinterpret_cast<void*>(buf), 4, kFloat, 1, comm, gpu.stream), comm);
    float values[4] = {};
    cuMemcpyDtoH_v2(values, buf, sizeof values);
    check(0, r == 0 && values[0] == 1 && values[3] == 4, "bytes cross between processes", r);
    r = finished(ncclRecv(reinterpret_cast<void*>(buf), 4, kFloat, 1, comm, gpu.stream), comm);
    check(0, r == kRemoteError, "a receive from a peer that left is ncclRemoteError", r);
    ncclCommGetAsyncError(comm, &state);
    check(0, state == kRemoteError, "and stays the communicator's async error", state);
    ncclCommDestroy(comm);

    ncclCommInitRank(&comm, 2, b, 0);
    r = ncclRecv(reinterpret_cast<void*>(buf), 2, kFloat, 1, comm, gpu.stream);
    check(0, r == kInvalidUsage, "a receive of another size than sent is refused", r);
    char done;
    if (read(done_pipe[0], &done, 1) != 1) check(0, false, "rank 1 finished", 0);
    // Last: a buffer outside live memory faults the context (a sticky error, as on a GPU).
    r = ncclSend(reinterpret_cast<void*>(buf), 8, kFloat, 1, comm, gpu.stream);
    check(0, r == kInvalidArgument, "a send past the end of its allocation is refused", r);
    ncclCommDestroy(comm);
}

void rank1(ncclUniqueId a, ncclUniqueId b) {
    Gpu gpu = open_gpu(1);
    CUdeviceptr buf;
    cuMemAlloc_v2(&buf, 16);
    float values[4] = {1, 2, 3, 4};
    cuMemcpyHtoD_v2(buf, values, sizeof values);
    void* comm = nullptr;
    ncclCommInitRank(&comm, 2, a, 1);
    int r = ncclSend(reinterpret_cast<void*>(buf), 4, kFloat, 0, comm, gpu.stream);
    check(1, r == 0, "a send of live device memory", r);
    r = ncclSend(reinterpret_cast<void*>(buf), 4, kFloat, 1, comm, gpu.stream);
    check(1, r == kInvalidArgument, "a send to itself is refused", r);
    cuCtxSetCurrent(nullptr);
    r = ncclSend(reinterpret_cast<void*>(buf), 4, kFloat, 0, comm, gpu.stream);
    check(1, r == kInvalidUsage, "a send with no context current is refused", r);
    Gpu other = open_gpu(0);
    r = ncclSend(reinterpret_cast<void*>(buf), 4, kFloat, 0, comm, other.stream);
    check(1, r == kInvalidUsage, "a send while another device's context is current is refused",
          r);
    cuCtxSetCurrent(gpu.context);
    r = ncclSend(reinterpret_cast<void*>(buf), 4, kFloat, 0, comm, other.stream);
    check(1, r == kInvalidArgument, "a send on another device's stream is refused", r);
    ncclCommDestroy(comm);

    ncclCommInitRank(&comm, 2, b, 1);
    r = ncclSend(reinterpret_cast<void*>(buf), 4, kFloat, 0, comm, gpu.stream);
    check(1, r == 0, "a send the peer receives at the wrong size", r);
    // Last: freed memory faults the context.
    cuMemFree_v2(buf);
    r = ncclSend(reinterpret_cast<void*>(buf), 4, kFloat, 0, comm, gpu.stream);
    check(1, r == kInvalidArgument, "a send of freed memory is refused", r);
    if (write(done_pipe[1], "x", 1) != 1) check(1, false, "tell rank 0", 0);
    ncclCommDestroy(comm);
}

}  // namespace

int main() {
    ncclUniqueId a, b;
    if (ncclGetUniqueId(&a) != 0 || ncclGetUniqueId(&b) != 0) {
        std::printf("FAIL ncclGetUniqueId\n");
        return 1;
    }
    if (pipe(done_pipe) != 0) {
        std::printf("FAIL pipe\n");
        return 1;
    }
    pid_t child = fork();
    if (child == 0) {
        rank1(a, b);
        return failures == 0 ? 0 : 1;
    }
    rank0(a, b);
    int status = 0;
    waitpid(child, &status, 0);
    return failures == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
