// Host cost of one cuBLAS call, kernel launch, stream-ordered allocation and event record on a
// GPU, bert_tiny's product shapes, fp32 and TF32: the floor a CUDA run's host time per node is
// read against (docs/benchmarks.md, "Third session lent a GPU"). Needs nvcc and cuBLAS:
//
//   nvcc -O2 -arch=sm_90 benches/gpu/blas_host_cost.cu -lcublas -o blas_host_cost && ./blas_host_cost
//
// Each line: the host's time per call over 2,000 calls, then with the device's time to finish
// them (equal when the loop ran at the device's pace).
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
__global__ void touch(float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += 1.0f; }
using clk = std::chrono::steady_clock;
template <class F> void bench(const char* name, cudaStream_t s, F f) {
  for (int i = 0; i < 50; ++i) f();
  cudaStreamSynchronize(s);
  const int N = 2000;
  auto t0 = clk::now();
  for (int i = 0; i < N; ++i) f();
  auto t1 = clk::now();
  cudaStreamSynchronize(s);
  auto t2 = clk::now();
  printf("%-44s host %7.2f us/call, with device %7.2f us/call\n", name,
         std::chrono::duration<double, std::micro>(t1 - t0).count() / N,
         std::chrono::duration<double, std::micro>(t2 - t0).count() / N);
}
int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cublasHandle_t h; cublasCreate(&h); cublasSetStream(h, s);
  float *a, *b, *c; void* ws;
  cudaMalloc(&a, 512 * 512 * 4); cudaMalloc(&b, 512 * 512 * 4); cudaMalloc(&c, 512 * 512 * 4);
  cudaMalloc(&ws, 32 << 20);
  float one = 1, zero = 0;
  auto N_ = CUBLAS_OP_N;
  for (int pass = 0; pass < 3; ++pass) {
    const char* tag = pass == 0 ? "default" : pass == 1 ? "+workspace" : "+workspace+tf32";
    if (pass == 1) cublasSetWorkspace(h, ws, 32 << 20);
    if (pass == 2) cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH);
    printf("== %s\n", tag);
    bench("Sgemm 512x128 . 128x128", s, [&] { cublasSgemm(h, N_, N_, 128, 512, 128, &one, b, 128, a, 128, &zero, c, 128); });
    bench("Sgemm 512x128 . 128x512", s, [&] { cublasSgemm(h, N_, N_, 512, 512, 128, &one, b, 512, a, 128, &zero, c, 512); });
    bench("SgemmStridedBatched(1) 512x128 . 128x128", s, [&] { cublasSgemmStridedBatched(h, N_, N_, 128, 512, 128, &one, b, 128, 0, a, 128, 0, &zero, c, 128, 0, 1); });
    bench("SgemmStridedBatched(1) beta 1", s, [&] { cublasSgemmStridedBatched(h, N_, N_, 128, 512, 128, &one, b, 128, 0, a, 128, 0, &one, c, 128, 0, 1); });
    bench("SgemmStridedBatched(32) 64x32 . 32x64", s, [&] { cublasSgemmStridedBatched(h, CUBLAS_OP_T, N_, 64, 64, 32, &one, b, 32, 2048, a, 32, 2048, &zero, c, 64, 4096, 32); });
  }
  bench("kernel launch <<<256,256>>> (runtime)", s, [&] { touch<<<256, 256, 0, s>>>(c, 65536); });
  bench("cudaMallocAsync 1 MB + cudaFreeAsync", s, [&] { void* p; cudaMallocAsync(&p, 1 << 20, s); cudaFreeAsync(p, s); });
  bench("cudaEventRecord", s, [&] { static cudaEvent_t e = [] { cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); return e; }(); cudaEventRecord(e, s); });
  printf("done\n");
}
