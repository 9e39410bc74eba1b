// A fake `libcublas.so.12`: the cuBLAS calls cudarc makes for pipecut, with cuBLAS's argument
// checks, every matrix checked to lie inside live device memory of the handle's context, and a
// reference GEMM (double accumulation) for the result. A handle belongs to the context current
// when it was created; using it while another context (or none) is current fails, as work
// would otherwise go to the wrong device.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

#include "fake.h"

namespace {

enum Status : int {
    SUCCESS = 0,
    NOT_INITIALIZED = 1,
    INVALID_VALUE = 7,
    EXECUTION_FAILED = 13,
    INTERNAL_ERROR = 14,
};

enum Operation : int { OP_N = 0, OP_T = 1, OP_C = 2 };

struct Handle {
    void* context;
    void* stream = nullptr;
    int pointer_mode = 0;
    // A user workspace (cublasSetWorkspace): cuBLAS writes into it in later calls.
    uint64_t workspace = 0;
    size_t workspace_bytes = 0;
    int math_mode = 0;  // cublasSetMathMode's: 3 is CUBLAS_TF32_TENSOR_OP_MATH
};

std::set<Handle*>& handles() {
    static auto* h = new std::set<Handle*>();
    return *h;
}

void say(const std::string& text) { std::fprintf(stderr, "fake libcublas: %s\n", text.c_str()); }

int need_handle(Handle* h) {
    if (!handles().count(h)) return NOT_INITIALIZED;
    if (pc_fake_current_context() != h->context) {
        say("a handle used while its context is not current on the calling thread");
        return EXECUTION_FAILED;
    }
    if (pc_fake_context_error(h->context)) return EXECUTION_FAILED;
    return SUCCESS;
}

// Element (row, col) of op(M) where M is column-major with leading dimension ld.
inline float at(const float* m, int ld, bool trans, long row, long col) {
    return trans ? m[col + row * long(ld)] : m[row + col * long(ld)];
}

// Bytes a column-major rows x cols matrix with leading dimension ld spans.
size_t extent(long rows, long cols, int ld) {
    if (rows == 0 || cols == 0) return 0;
    return size_t((cols - 1) * long(ld) + rows) * sizeof(float);
}

int gemm_batched(Handle* h, int transa, int transb, int m, int n, int k, const float* alpha,
                 const float* a, int lda, long long stride_a, const float* b, int ldb,
                 long long stride_b, const float* beta, float* c, int ldc, long long stride_c,
                 int batch) {
    if (int r = need_handle(h)) return r;
    pc_fake_count_call("cublasSgemm");
    // Products cuBLAS may run in TF32 (computed here in full precision all the same).
    if (h->math_mode == 3) pc_fake_count_call("cublasSgemm in TF32");
    // cuBLAS's own checks (cublasSgemmStridedBatched).
    bool ta = transa != OP_N, tb = transb != OP_N;
    if ((transa != OP_N && transa != OP_T && transa != OP_C) ||
        (transb != OP_N && transb != OP_T && transb != OP_C) || m < 0 || n < 0 || k < 0 ||
        batch < 0 || lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) ||
        ldc < std::max(1, m) || !alpha || !beta) {
        say("gemm arguments rejected: m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
            std::to_string(k) + " lda " + std::to_string(lda) + " ldb " + std::to_string(ldb) +
            " ldc " + std::to_string(ldc) + " batch " + std::to_string(batch));
        return INVALID_VALUE;
    }
    if (h->pointer_mode != 0) return INVALID_VALUE;  // alpha and beta are host pointers here
    // A workspace freed while the handle still holds it is written to by the next product.
    if (h->workspace_bytes &&
        !pc_fake_check_range(h->context, h->stream, h->workspace, h->workspace_bytes,
                             "cuBLAS workspace")) {
        return EXECUTION_FAILED;
    }
    for (int p = 0; p < batch; ++p) {
        const float* ap = a + p * stride_a;
        const float* bp = b + p * stride_b;
        float* cp = c + p * stride_c;
        auto check = [&](const void* ptr, size_t bytes, const char* what) {
            return bytes == 0 ||
                   pc_fake_check_range(h->context, h->stream,
                                       reinterpret_cast<uint64_t>(ptr), bytes, what);
        };
        bool reads_a = k > 0 && *alpha != 0.0f;
        if ((reads_a && !check(ap, extent(ta ? k : m, ta ? m : k, lda), "matrix A")) ||
            (reads_a && !check(bp, extent(tb ? n : k, tb ? k : n, ldb), "matrix B")) ||
            !check(cp, extent(m, n, ldc), "matrix C")) {
            return EXECUTION_FAILED;
        }
        for (long j = 0; j < n; ++j) {
            for (long i = 0; i < m; ++i) {
                double sum = 0.0;
                if (reads_a) {
                    for (long l = 0; l < k; ++l) sum += double(at(ap, lda, ta, i, l)) * at(bp, ldb, tb, l, j);
                }
                float& out = cp[i + j * long(ldc)];
                // beta = 0 ignores C entirely (it may hold NaNs), as cuBLAS documents.
                double prior = *beta == 0.0f ? 0.0 : double(*beta) * out;
                out = float(double(*alpha) * sum + prior);
            }
        }
    }
    return SUCCESS;
}

}  // namespace

extern "C" {

int cublasCreate_v2(Handle** handle) {
    void* context = pc_fake_current_context();
    if (!context) {
        say("cublasCreate with no current context");
        return NOT_INITIALIZED;
    }
    if (pc_fake_context_error(context)) return NOT_INITIALIZED;
    *handle = new Handle{context};
    handles().insert(*handle);
    return SUCCESS;
}

// Tearing a handle down after its context faulted fails, as cuBLAS's own frees do then.
int cublasDestroy_v2(Handle* handle) {
    if (!handles().erase(handle)) return NOT_INITIALIZED;
    int error = pc_fake_context_error(handle->context);
    delete handle;
    return error ? INTERNAL_ERROR : SUCCESS;
}

int cublasSetStream_v2(Handle* handle, void* stream) {
    if (!handles().count(handle)) return NOT_INITIALIZED;
    void* context = pc_fake_stream_context(stream);
    if (context != handle->context) {
        say("cublasSetStream with a stream of another context");
        return INVALID_VALUE;
    }
    handle->stream = stream;
    // cuBLAS documents that setting the stream resets the workspace to its own.
    handle->workspace = 0;
    handle->workspace_bytes = 0;
    return SUCCESS;
}

int cublasSetWorkspace_v2(Handle* handle, void* workspace, size_t bytes) {
    if (!handles().count(handle)) return NOT_INITIALIZED;
    uint64_t ptr = reinterpret_cast<uint64_t>(workspace);
    if (bytes && !pc_fake_check_range(handle->context, handle->stream, ptr, bytes,
                                      "cuBLAS workspace")) {
        return INVALID_VALUE;
    }
    handle->workspace = ptr;
    handle->workspace_bytes = bytes;
    return SUCCESS;
}

int cublasSetMathMode(Handle* handle, int mode) {
    if (int r = need_handle(handle)) return r;
    // CUBLAS_DEFAULT_MATH, the deprecated TENSOR_OP, PEDANTIC and TF32_TENSOR_OP, each with
    // CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (16) or not.
    int base = mode & ~16;
    if (base < 0 || base > 3) return INVALID_VALUE;
    handle->math_mode = base;
    return 0;
}

int cublasSetPointerMode_v2(Handle* handle, int mode) {
    if (!handles().count(handle)) return NOT_INITIALIZED;
    handle->pointer_mode = mode;
    return SUCCESS;
}

int cublasGetPointerMode_v2(Handle* handle, int* mode) {
    if (!handles().count(handle)) return NOT_INITIALIZED;
    *mode = handle->pointer_mode;
    return SUCCESS;
}

int cublasSgemm_v2(Handle* handle, int transa, int transb, int m, int n, int k, const float* alpha,
                   const float* a, int lda, const float* b, int ldb, const float* beta, float* c,
                   int ldc) {
    return gemm_batched(handle, transa, transb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc,
                        0, 1);
}

int cublasSgemmStridedBatched(Handle* handle, int transa, int transb, int m, int n, int k,
                              const float* alpha, const float* a, int lda, long long stride_a,
                              const float* b, int ldb, long long stride_b, const float* beta,
                              float* c, int ldc, long long stride_c, int batch) {
    return gemm_batched(handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                        beta, c, ldc, stride_c, batch);
}

}  // extern "C"
