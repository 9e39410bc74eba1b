// pipecut's CUDA kernels, compiled once per device at run time with NVRTC (fp32 compute, as the
// CPU reference runtime: half-precision weights are widened when they are loaded).
//
// Shapes and strides travel by value in `Dims` (rank at most MAX_RANK), so a launch needs no
// extra upload. Every kernel uses a grid-stride loop over 64-bit indices.

#define MAX_RANK 8
#define PC_INFINITY __int_as_float(0x7f800000)

struct Dims {
    int rank;
    long long shape[MAX_RANK];
    long long a[MAX_RANK];
    long long b[MAX_RANK];
    long long c[MAX_RANK];
};

// Element offsets of output position `i` in up to three broadcast operands.
__device__ __forceinline__ void offsets(const Dims& d, long long i, long long* oa, long long* ob,
                                        long long* oc) {
    long long a = 0, b = 0, c = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
        long long idx = i % d.shape[k];
        i /= d.shape[k];
        a += idx * d.a[k];
        b += idx * d.b[k];
        c += idx * d.c[k];
    }
    *oa = a;
    *ob = b;
    *oc = c;
}

#define GRID_STRIDE(i, n) \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

// Codes shared with src/runtime/cuda/ops.rs (`Unary`).
extern "C" __global__ void unary_f32(const float* x, float* y, long long n, int op, float alpha,
                                     float beta) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float r;
        switch (op) {
            case 0: r = fmaxf(v, 0.0f); break;                                  // Relu
            case 1: r = 1.0f / (1.0f + expf(-v)); break;                        // Sigmoid
            case 2: r = tanhf(v); break;                                        // Tanh
            case 3: r = erff(v); break;                                         // Erf
            case 4: r = expf(v); break;                                         // Exp
            case 5: r = logf(v); break;                                         // Log
            case 6: r = sqrtf(v); break;                                        // Sqrt
            case 7: r = -v; break;                                              // Neg
            case 8: r = fabsf(v); break;                                        // Abs
            case 9: r = 1.0f / v; break;                                        // Reciprocal
            case 10: r = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;  // Gelu
            case 11: {                                                          // Gelu tanh
                float inner = 0.79788456080286536f * (v + 0.044715f * v * v * v);
                r = 0.5f * v * (1.0f + tanhf(inner));
                break;
            }
            case 12: r = v >= 0.0f ? v : alpha * v; break;                      // LeakyRelu
            case 13: r = fminf(fmaxf(v, alpha), beta); break;                   // Clip
            case 14: r = v * (1.0f / (1.0f + expf(-alpha * v))); break;         // Swish
            case 15: r = fminf(fmaxf(alpha * v + beta, 0.0f), 1.0f); break;    // HardSigmoid
            case 16: r = v * fminf(fmaxf(v / 6.0f + 0.5f, 0.0f), 1.0f); break; // HardSwish
            default: r = v; break;                                              // Identity
        }
        y[i] = r;
    }
}

// Codes shared with ops.rs (`Binary`).
extern "C" __global__ void binary_f32(const float* a, const float* b, float* y, long long n,
                                      Dims d, int op) {
    GRID_STRIDE(i, n) {
        long long oa, ob, oc;
        offsets(d, i, &oa, &ob, &oc);
        float u = a[oa], v = b[ob];
        float r;
        switch (op) {
            case 0: r = u + v; break;
            case 1: r = u - v; break;
            case 2: r = u * v; break;
            case 3: r = u / v; break;
            case 4: r = powf(u, v); break;
            case 5: r = fmaxf(u, v); break;
            default: r = fminf(u, v); break;
        }
        y[i] = r;
    }
}

// y = cond ? a : b, all three broadcast (strides a, b, c = cond).
extern "C" __global__ void where_f32(const unsigned char* cond, const float* a, const float* b,
                                     float* y, long long n, Dims d) {
    GRID_STRIDE(i, n) {
        long long oa, ob, oc;
        offsets(d, i, &oa, &ob, &oc);
        y[i] = cond[oc] ? a[oa] : b[ob];
    }
}

// y[i] = x[base + Σ idx_k · a_k]: transpose, slice, expand, split and broadcast materialisation.
extern "C" __global__ void gather_strided_f32(const float* x, float* y, long long n, Dims d,
                                              long long base) {
    GRID_STRIDE(i, n) {
        long long oa, ob, oc;
        offsets(d, i, &oa, &ob, &oc);
        y[i] = x[base + oa];
    }
}

// Concat: y[o · out_inner + offset + j] = x[o · in_inner + j].
extern "C" __global__ void copy_block_f32(const float* x, float* y, long long outer,
                                          long long in_inner, long long out_inner,
                                          long long offset) {
    GRID_STRIDE(i, outer * in_inner) {
        long long o = i / in_inner, j = i % in_inner;
        y[o * out_inner + offset + j] = x[i];
    }
}

// Gather along an axis: x is [outer, axis_len, inner], idx has n_idx (already non-negative)
// entries, y is [outer, n_idx, inner].
extern "C" __global__ void gather_axis_f32(const float* x, const long long* idx, float* y,
                                           long long outer, long long axis_len, long long n_idx,
                                           long long inner) {
    GRID_STRIDE(i, outer * n_idx * inner) {
        long long j = i % inner;
        long long t = (i / inner) % n_idx;
        long long o = i / (inner * n_idx);
        y[i] = x[(o * axis_len + idx[t]) * inner + j];
    }
}

// Block-wide sum or max of one value per thread (blockDim.x a power of two, at most 1024).
__device__ float block_reduce(float v, bool is_max, float* scratch) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float o = scratch[threadIdx.x + s];
            scratch[threadIdx.x] = is_max ? fmaxf(scratch[threadIdx.x], o)
                                          : scratch[threadIdx.x] + o;
        }
        __syncthreads();
    }
    float r = scratch[0];
    __syncthreads();
    return r;
}

// Softmax or log-softmax of each row of a [rows, cols] matrix; one block per row.
extern "C" __global__ void softmax_rows_f32(const float* x, float* y, long long rows,
                                            long long cols, int log_softmax) {
    extern __shared__ float scratch[];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * cols;
        float* out = y + row * cols;
        float m = -PC_INFINITY;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, in[j]);
        m = block_reduce(m, true, scratch);
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += expf(in[j] - m);
        s = block_reduce(s, false, scratch);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            out[j] = log_softmax ? in[j] - m - logf(s) : expf(in[j] - m) / s;
        }
    }
}

// Layer normalisation (rms = 0) or RMS normalisation (rms = 1) of each row; scale and bias hold
// `cols` values (bias is read only when has_bias). One block per row.
extern "C" __global__ void norm_rows_f32(const float* x, const float* scale, const float* bias,
                                         float* y, long long rows, long long cols, float epsilon,
                                         int rms, int has_bias) {
    extern __shared__ float scratch[];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * cols;
        float* out = y + row * cols;
        float mean = 0.0f;
        if (!rms) {
            float s = 0.0f;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += in[j];
            mean = block_reduce(s, false, scratch) / (float)cols;
        }
        float q = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float c = in[j] - mean;
            q += c * c;
        }
        float inv = rsqrtf(block_reduce(q, false, scratch) / (float)cols + epsilon);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float v = (in[j] - mean) * inv * scale[j];
            out[j] = has_bias ? v + bias[j] : v;
        }
    }
}

// Reduction of each row of a [rows, cols] matrix (the reduced axes trailing and contiguous, the
// common case): one block per row, the threads striding over it, so the reads are coalesced and
// a long row is summed in parallel. Codes as in `reduce_f32`.
extern "C" __global__ void reduce_rows_f32(const float* x, float* y, long long rows,
                                           long long cols, int op) {
    extern __shared__ float scratch[];
    bool is_max = op == 2, is_min = op == 3;
    float init = is_max ? -PC_INFINITY : is_min ? PC_INFINITY : 0.0f;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * cols;
        float acc = init;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float v = in[j];
            acc = is_max ? fmaxf(acc, v) : is_min ? fminf(acc, v) : acc + (op == 4 ? v * v : v);
        }
        // The minimum is the negated maximum of the negated values.
        float r = block_reduce(is_min ? -acc : acc, is_max || is_min, scratch);
        if (threadIdx.x == 0) {
            y[row] = is_min ? -r : (op == 1 ? r / (float)cols : r);
        }
    }
}

// Reduction over some axes. `kept` maps an output position to its input offset (shape = output
// shape, a = input strides of the kept axes); `reduced` walks the reduced axes (shape, a).
// Codes shared with ops.rs (`Reduce`).
extern "C" __global__ void reduce_f32(const float* x, float* y, long long n_out, Dims kept,
                                      Dims reduced, long long count, int op) {
    GRID_STRIDE(i, n_out) {
        long long base, unused_b, unused_c;
        offsets(kept, i, &base, &unused_b, &unused_c);
        float acc = (op == 2) ? -PC_INFINITY : (op == 3) ? PC_INFINITY : 0.0f;
        for (long long r = 0; r < count; ++r) {
            long long off, ub, uc;
            offsets(reduced, r, &off, &ub, &uc);
            float v = x[base + off];
            switch (op) {
                case 2: acc = fmaxf(acc, v); break;
                case 3: acc = fminf(acc, v); break;
                case 4: acc += v * v; break;
                default: acc += v; break;
            }
        }
        y[i] = (op == 1) ? acc / (float)count : acc;
    }
}

// The geometry of a 2-D window op (a 1-D one has h = kh = 1): input [n, c, h, w], output
// [n, m, oh, ow] (m = c for pooling), kernel, strides, dilations, begin pads (ph, pw) and end
// pads (ph1, pw1), groups. Shared with ops.rs (`Window2d`).
struct Window2d {
    long long n, c, h, w;
    long long m, oh, ow;
    long long kh, kw, sh, sw, dh, dw, ph, pw, ph1, pw1;
    long long groups;
};

// im2col of `images` images from image `first` on: for image b, group g, row r = (ci, ky, kx)
// of the group's kernel and output position p, col[((b · groups + g) · rows + r) · cols + p]
// is the input under that tap (0 in the padding). A GEMM per group then convolves.
extern "C" __global__ void im2col_f32(const float* x, float* col, Window2d g, long long first,
                                      long long images) {
    long long cg = g.c / g.groups, rows = cg * g.kh * g.kw, cols = g.oh * g.ow;
    GRID_STRIDE(i, images * g.groups * rows * cols) {
        long long p = i % cols, t = i / cols;
        long long r = t % rows;
        t /= rows;
        long long grp = t % g.groups, b = first + t / g.groups;
        long long kx = r % g.kw, ky = (r / g.kw) % g.kh, ci = r / (g.kw * g.kh);
        long long iy = (p / g.ow) * g.sh + ky * g.dh - g.ph;
        long long ix = (p % g.ow) * g.sw + kx * g.dw - g.pw;
        bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
        col[i] = inside ? x[((b * g.c + grp * cg + ci) * g.h + iy) * g.w + ix] : 0.0f;
    }
}

// Direct convolution, one thread per output value: for convolutions with one input channel
// per group (depthwise), where im2col would need a GEMM per channel. Weights [m, c/groups,
// kh, kw]; the bias (m values) is read only when has_bias.
extern "C" __global__ void conv_direct_f32(const float* x, const float* wt, const float* bias,
                                           float* y, Window2d g, int has_bias) {
    long long cg = g.c / g.groups, mg = g.m / g.groups;
    GRID_STRIDE(i, g.n * g.m * g.oh * g.ow) {
        long long ox = i % g.ow, t = i / g.ow;
        long long oy = t % g.oh;
        t /= g.oh;
        long long oc = t % g.m, b = t / g.m;
        long long first_channel = (oc / mg) * cg;
        float acc = has_bias ? bias[oc] : 0.0f;
        for (long long ci = 0; ci < cg; ++ci) {
            const float* plane = x + (b * g.c + first_channel + ci) * g.h * g.w;
            const float* taps = wt + (oc * cg + ci) * g.kh * g.kw;
            for (long long ky = 0; ky < g.kh; ++ky) {
                long long iy = oy * g.sh + ky * g.dh - g.ph;
                if (iy < 0 || iy >= g.h) continue;
                for (long long kx = 0; kx < g.kw; ++kx) {
                    long long ix = ox * g.sw + kx * g.dw - g.pw;
                    if (ix >= 0 && ix < g.w) acc += plane[iy * g.w + ix] * taps[ky * g.kw + kx];
                }
            }
        }
        y[i] = acc;
    }
}

// Transposed convolution, one thread per output value gathering the input taps that reach it
// (no atomics): input [n, c, h, w], weights [c, m/groups, kh, kw], output [n, m, oh, ow], pads
// (ph, pw) cut from the output's start. The bias (m values) is read only when has_bias.
extern "C" __global__ void conv_transpose_f32(const float* x, const float* wt, const float* bias,
                                              float* y, Window2d g, int has_bias) {
    long long cg = g.c / g.groups, mg = g.m / g.groups;
    GRID_STRIDE(i, g.n * g.m * g.oh * g.ow) {
        long long ox = i % g.ow, t = i / g.ow;
        long long oy = t % g.oh;
        t /= g.oh;
        long long oc = t % g.m, b = t / g.m;
        long long group = oc / mg, within = oc % mg;
        float acc = has_bias ? bias[oc] : 0.0f;
        for (long long ci = 0; ci < cg; ++ci) {
            long long channel = group * cg + ci;
            const float* plane = x + (b * g.c + channel) * g.h * g.w;
            const float* taps = wt + (channel * mg + within) * g.kh * g.kw;
            for (long long ky = 0; ky < g.kh; ++ky) {
                long long sy = oy + g.ph - ky * g.dh;
                if (sy < 0 || sy % g.sh != 0 || sy / g.sh >= g.h) continue;
                for (long long kx = 0; kx < g.kw; ++kx) {
                    long long sx = ox + g.pw - kx * g.dw;
                    if (sx < 0 || sx % g.sw != 0 || sx / g.sw >= g.w) continue;
                    acc += plane[(sy / g.sh) * g.w + sx / g.sw] * taps[ky * g.kw + kx];
                }
            }
        }
        y[i] = acc;
    }
}

// MaxPool (is_max) or AveragePool of each [h, w] plane, one thread per output value. A max
// window wholly in the padding gives -inf; the average counts the padding when
// count_include_pad, except the part of a ceil-mode window past the end padding.
extern "C" __global__ void pool_f32(const float* x, float* y, Window2d g, int is_max,
                                    int count_include_pad) {
    GRID_STRIDE(i, g.n * g.c * g.oh * g.ow) {
        long long ox = i % g.ow, oy = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
        const float* in = x + plane * g.h * g.w;
        float acc = is_max ? -PC_INFINITY : 0.0f;
        long long count = 0;
        for (long long ky = 0; ky < g.kh; ++ky) {
            long long iy = oy * g.sh + ky * g.dh - g.ph;
            for (long long kx = 0; kx < g.kw; ++kx) {
                long long ix = ox * g.sw + kx * g.dw - g.pw;
                if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) {
                    float v = in[iy * g.w + ix];
                    acc = is_max ? fmaxf(acc, v) : acc + v;
                    ++count;
                } else if (count_include_pad && iy < g.h + g.ph1 && ix < g.w + g.pw1) {
                    ++count;
                }
            }
        }
        y[i] = is_max ? acc : (count == 0 ? 0.0f : acc / (float)count);
    }
}

// Inference BatchNormalization of x [n, c, inner...] (n counts every value): per channel,
// (x - mean) · scale / sqrt(var + epsilon) + bias.
extern "C" __global__ void batch_norm_f32(const float* x, const float* scale, const float* bias,
                                          const float* mean, const float* var, float* y,
                                          long long n, long long channels, long long inner,
                                          float epsilon) {
    GRID_STRIDE(i, n) {
        long long ch = (i / inner) % channels;
        float factor = scale[ch] / sqrtf(var[ch] + epsilon);
        y[i] = (x[i] - mean[ch]) * factor + bias[ch];
    }
}

// One axis of a Resize: x is [outer, width, inner], y is [outer, out_width, inner]; output index o
// along the axis is Σ_t weight[o · taps + t] · x[., index[o · taps + t], .] (a weight of 0 is
// skipped, so that a nearest pick next to an infinity stays finite, as on the CPU).
extern "C" __global__ void resize_axis_f32(const float* x, float* y, const long long* index,
                                           const float* weight, long long outer, long long width,
                                           long long out_width, long long inner, long long taps) {
    GRID_STRIDE(i, outer * out_width * inner) {
        long long j = i % inner, o = (i / inner) % out_width, b = i / (inner * out_width);
        float acc = 0.0f;
        for (long long t = 0; t < taps; ++t) {
            float w = weight[o * taps + t];
            if (w != 0.0f) acc += w * x[(b * width + index[o * taps + t]) * inner + j];
        }
        y[i] = acc;
    }
}
