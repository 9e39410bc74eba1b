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
            case 17: r = v < 0.0f ? alpha * (expf(v) - 1.0f) : v; break;        // Elu
            case 18: r = beta * (v <= 0.0f ? alpha * (expf(v) - 1.0f) : v); break;  // Selu
            case 19:                                                            // Celu
                r = fmaxf(v, 0.0f) + fminf(alpha * (expf(v / alpha) - 1.0f), 0.0f);
                break;
            case 20: r = v * tanhf(log1pf(expf(v))); break;                     // Mish
            case 21: r = v > 20.0f ? v : log1pf(expf(v)); break;                // Softplus
            case 22: r = v / (1.0f + fabsf(v)); break;                          // Softsign
            case 23: r = v > alpha ? v : 0.0f; break;                           // ThresholdedRelu
            case 24: r = v < -beta ? v + alpha : (v > beta ? v - alpha : 0.0f); break;  // Shrink
            case 25: r = floorf(v); break;                                      // Floor
            case 26: r = ceilf(v); break;                                       // Ceil
            case 27: r = rintf(v); break;                      // Round (half to even)
            case 28: r = v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v); break;       // Sign
            case 29: r = sinf(v); break;
            case 30: r = cosf(v); break;
            case 31: r = tanf(v); break;
            case 32: r = asinf(v); break;
            case 33: r = acosf(v); break;
            case 34: r = atanf(v); break;
            case 35: r = sinhf(v); break;
            case 36: r = coshf(v); break;
            case 37: r = asinhf(v); break;
            case 38: r = acoshf(v); break;
            case 39: r = atanhf(v); break;
            case 40: r = alpha * v; break;                                      // Mean's scale
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
            case 6: r = fminf(u, v); break;
            case 7: r = u < 0.0f ? u * v : u; break;  // PRelu (v the slope)
            default: r = fmodf(u, v); break;          // Mod with fmod = 1

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

// How `block_reduce` combines the threads' values.
#define COMBINE_SUM 0
#define COMBINE_MAX 1
#define COMBINE_MIN 2
#define COMBINE_PROD 3

__device__ __forceinline__ float combine(float a, float b, int how) {
    switch (how) {
        case COMBINE_MAX: return fmaxf(a, b);
        case COMBINE_MIN: return fminf(a, b);
        case COMBINE_PROD: return a * b;
        default: return a + b;
    }
}

// Block-wide sum, max, min or product of one value per thread (blockDim.x a power of two, at
// most 1024).
__device__ float block_reduce(float v, int how, float* scratch) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            scratch[threadIdx.x] = combine(scratch[threadIdx.x], scratch[threadIdx.x + s], how);
        }
        __syncthreads();
    }
    float r = scratch[0];
    __syncthreads();
    return r;
}

// Softmax (mode 0), log-softmax (1) or hardmax (2: 1 at the row's first maximum, 0 elsewhere)
// of each row of a [rows, cols] matrix; one block per row.
extern "C" __global__ void softmax_rows_f32(const float* x, float* y, long long rows,
                                            long long cols, int mode) {
    extern __shared__ float scratch[];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * cols;
        float* out = y + row * cols;
        float m = -PC_INFINITY;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, in[j]);
        m = block_reduce(m, COMBINE_MAX, scratch);
        if (mode == 2) {
            // The first index holding the maximum (exact as a float below 2^24 columns).
            float first = PC_INFINITY;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                if (in[j] == m) first = fminf(first, (float)j);
            }
            first = block_reduce(first, COMBINE_MIN, scratch);
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                out[j] = (float)j == first ? 1.0f : 0.0f;
            }
            continue;
        }
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += expf(in[j] - m);
        s = block_reduce(s, COMBINE_SUM, scratch);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            out[j] = mode == 1 ? in[j] - m - logf(s) : expf(in[j] - m) / s;
        }
    }
}

// Layer normalisation (rms = 0) or RMS normalisation (rms = 1) of each row; scale and bias hold
// `cols` values (bias is read only when has_bias). Each row's mean and inverse standard
// deviation go to mean_out[row] and inv_out[row] (LayerNormalization's optional outputs).
// One block per row.
extern "C" __global__ void norm_rows_f32(const float* x, const float* scale, const float* bias,
                                         float* y, long long rows, long long cols, float epsilon,
                                         int rms, int has_bias, float* mean_out,
                                         float* inv_out) {
    extern __shared__ float scratch[];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * cols;
        float* out = y + row * cols;
        float mean = 0.0f;
        if (!rms) {
            float s = 0.0f;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += in[j];
            mean = block_reduce(s, COMBINE_SUM, scratch) / (float)cols;
        }
        float q = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float c = in[j] - mean;
            q += c * c;
        }
        float inv = rsqrtf(block_reduce(q, COMBINE_SUM, scratch) / (float)cols + epsilon);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float v = (in[j] - mean) * inv * scale[j];
            out[j] = has_bias ? v + bias[j] : v;
        }
        if (threadIdx.x == 0) {
            mean_out[row] = mean;
            inv_out[row] = inv;
        }
    }
}

// Normalisation of each row of [rows, cols] by its own mean and variance, with a scale and bias
// per channel: element j of row r has channel ((r · cols + j) / inner) % channels.
// InstanceNormalization (a row per image and channel, inner = the plane) and
// GroupNormalization (a row per image and group; scale per channel, inner = the plane, or per
// group before opset 21, inner = cols). One block per row.
extern "C" __global__ void norm_channels_f32(const float* x, const float* scale,
                                             const float* bias, float* y, long long rows,
                                             long long cols, long long channels,
                                             long long inner, float epsilon) {
    extern __shared__ float scratch[];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * cols;
        float* out = y + row * cols;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += in[j];
        float mean = block_reduce(s, COMBINE_SUM, scratch) / (float)cols;
        float q = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float c = in[j] - mean;
            q += c * c;
        }
        float inv = rsqrtf(block_reduce(q, COMBINE_SUM, scratch) / (float)cols + epsilon);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            long long ch = ((row * cols + j) / inner) % channels;
            out[j] = (in[j] - mean) * inv * scale[ch] + bias[ch];
        }
    }
}

// Reductions, codes shared with ops.rs (`reduce_code`): 0 sum, 1 mean, 2 max, 3 min, 4 sum of
// squares, 5 L1, 6 L2, 7 log-sum, 8 log-sum-exp, 9 product.
__device__ __forceinline__ int reduce_combine(int op) {
    return op == 2 ? COMBINE_MAX : op == 3 ? COMBINE_MIN : op == 9 ? COMBINE_PROD : COMBINE_SUM;
}

__device__ __forceinline__ float reduce_init(int op) {
    return op == 2 ? -PC_INFINITY : op == 3 ? PC_INFINITY : op == 9 ? 1.0f : 0.0f;
}

// The term value v adds (`shift` is log-sum-exp's maximum, subtracted before the exponential).
__device__ __forceinline__ float reduce_term(int op, float v, float shift) {
    switch (op) {
        case 4: case 6: return v * v;
        case 5: return fabsf(v);
        case 8: return expf(v - shift);
        default: return v;
    }
}

__device__ __forceinline__ float reduce_finish(int op, float r, float shift, long long count) {
    switch (op) {
        case 1: return r / (float)count;
        case 6: return sqrtf(r);
        case 7: return logf(r);
        case 8: return logf(r) + shift;
        default: return r;
    }
}

// Log-sum-exp's shift: the maximum, or 0 when it is infinite (so that an all -inf row gives
// -inf, not NaN).
__device__ __forceinline__ float finite_shift(float m) {
    return fabsf(m) == PC_INFINITY ? 0.0f : m;
}

// Reduction of each row of a [rows, cols] matrix (the reduced axes trailing and contiguous, the
// common case): one block per row, the threads striding over it, so the reads are coalesced and
// a long row is reduced in parallel.
extern "C" __global__ void reduce_rows_f32(const float* x, float* y, long long rows,
                                           long long cols, int op) {
    extern __shared__ float scratch[];
    int how = reduce_combine(op);
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * cols;
        float shift = 0.0f;
        if (op == 8) {
            float m = -PC_INFINITY;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, in[j]);
            shift = finite_shift(block_reduce(m, COMBINE_MAX, scratch));
        }
        float acc = reduce_init(op);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            acc = combine(acc, reduce_term(op, in[j], shift), how);
        }
        float r = block_reduce(acc, how, scratch);
        if (threadIdx.x == 0) y[row] = reduce_finish(op, r, shift, cols);
    }
}

// Reduction over some axes. `kept` maps an output position to its input offset (shape = output
// shape, a = input strides of the kept axes); `reduced` walks the reduced axes (shape, a).
extern "C" __global__ void reduce_f32(const float* x, float* y, long long n_out, Dims kept,
                                      Dims reduced, long long count, int op) {
    int how = reduce_combine(op);
    GRID_STRIDE(i, n_out) {
        long long base, unused_b, unused_c;
        offsets(kept, i, &base, &unused_b, &unused_c);
        float shift = 0.0f;
        if (op == 8) {
            float m = -PC_INFINITY;
            for (long long r = 0; r < count; ++r) {
                long long off, ub, uc;
                offsets(reduced, r, &off, &ub, &uc);
                m = fmaxf(m, x[base + off]);
            }
            shift = finite_shift(m);
        }
        float acc = reduce_init(op);
        for (long long r = 0; r < count; ++r) {
            long long off, ub, uc;
            offsets(reduced, r, &off, &ub, &uc);
            acc = combine(acc, reduce_term(op, x[base + off], shift), how);
        }
        y[i] = reduce_finish(op, acc, shift, count);
    }
}

// Index of the maximum (is_min = 0) or minimum along the middle axis of x [outer, len, inner],
// the first one unless `last`: one thread per output.
extern "C" __global__ void arg_reduce_f32(const float* x, long long* y, long long outer,
                                          long long len, long long inner, int is_min, int last) {
    GRID_STRIDE(i, outer * inner) {
        long long o = i / inner, j = i % inner;
        const float* in = x + o * len * inner + j;
        long long best = 0;
        float best_value = in[0];
        for (long long k = 1; k < len; ++k) {
            float v = in[k * inner];
            bool better = is_min ? (last ? v <= best_value : v < best_value)
                                 : (last ? v >= best_value : v > best_value);
            if (better) {
                best = k;
                best_value = v;
            }
        }
        y[i] = best;
    }
}

// Cumulative sum along the middle axis of x [outer, len, inner], one thread per line;
// `exclusive` leaves out the element itself, `reverse` sums from the end.
extern "C" __global__ void cumsum_f32(const float* x, float* y, long long outer, long long len,
                                      long long inner, int exclusive, int reverse) {
    GRID_STRIDE(i, outer * inner) {
        long long base = (i / inner) * len * inner + i % inner;
        float acc = 0.0f;
        for (long long t = 0; t < len; ++t) {
            long long k = reverse ? len - 1 - t : t;
            float v = x[base + k * inner];
            if (exclusive) {
                y[base + k * inner] = acc;
                acc += v;
            } else {
                acc += v;
                y[base + k * inner] = acc;
            }
        }
    }
}

// Local response normalisation across channels of x [n, channels, inner], one thread per value:
// y = x / (bias + alpha / size · Σ x²)^beta over channels c − ⌊(size−1)/2⌋ … c + ⌈(size−1)/2⌉.
extern "C" __global__ void lrn_f32(const float* x, float* y, long long n, long long channels,
                                   long long inner, long long size, float alpha, float beta,
                                   float bias) {
    GRID_STRIDE(i, n) {
        long long c = (i / inner) % channels;
        long long plane = i - c * inner;
        long long lo = c - (size - 1) / 2, hi = c + size / 2;
        float sum = 0.0f;
        for (long long k = lo < 0 ? 0 : lo; k <= hi && k < channels; ++k) {
            float v = x[plane + k * inner];
            sum += v * v;
        }
        y[i] = x[i] / powf(bias + alpha / (float)size * sum, beta);
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

// The geometry of MaxPool, AveragePool or LpPool over up to three spatial axes (fewer are
// padded in front with axes of size 1): `planes` = n · c planes of in[0] × in[1] × in[2]
// values, out[] the output sizes, and per axis the kernel, stride, dilation, begin and end
// pads. Shared with window_ops.rs (`PoolNd`).
struct PoolNd {
    long long planes;
    long long in[3], out[3], kernel[3], stride[3], dilation[3], pad_begin[3], pad_end[3];
};

// Pooling of each plane over up to three spatial axes, one thread per output value: kind 0
// average (counting the padding when count_include_pad, except past the end padding), 1 max
// (-inf for a window wholly in the padding), 2 Lp ((Σ |v|^p)^(1/p) over the values inside).
// With `with_indices`, a max also writes MaxPool's Indices: the first maximum's position in the
// whole input, row-major or (column_major) column-major within its plane; 0 when no value
// beats -inf, as on the CPU.
extern "C" __global__ void pool_nd_f32(const float* x, float* y, PoolNd g, int kind,
                                       int count_include_pad, float p, long long* indices,
                                       int with_indices, int column_major) {
    long long in_plane = g.in[0] * g.in[1] * g.in[2];
    long long out_plane = g.out[0] * g.out[1] * g.out[2];
    GRID_STRIDE(i, g.planes * out_plane) {
        long long o2 = i % g.out[2], o1 = (i / g.out[2]) % g.out[1];
        long long o0 = (i / (g.out[2] * g.out[1])) % g.out[0];
        const float* in = x + (i / out_plane) * in_plane;
        float acc = kind == 1 ? -PC_INFINITY : 0.0f;
        long long count = 0, best = 0;
        for (long long k0 = 0; k0 < g.kernel[0]; ++k0) {
            long long c0 = o0 * g.stride[0] + k0 * g.dilation[0] - g.pad_begin[0];
            bool in0 = c0 >= 0 && c0 < g.in[0], pad0 = c0 < g.in[0] + g.pad_end[0];
            for (long long k1 = 0; k1 < g.kernel[1]; ++k1) {
                long long c1 = o1 * g.stride[1] + k1 * g.dilation[1] - g.pad_begin[1];
                bool in1 = c1 >= 0 && c1 < g.in[1], pad1 = c1 < g.in[1] + g.pad_end[1];
                for (long long k2 = 0; k2 < g.kernel[2]; ++k2) {
                    long long c2 = o2 * g.stride[2] + k2 * g.dilation[2] - g.pad_begin[2];
                    bool in2 = c2 >= 0 && c2 < g.in[2], pad2 = c2 < g.in[2] + g.pad_end[2];
                    if (in0 && in1 && in2) {
                        float v = in[(c0 * g.in[1] + c1) * g.in[2] + c2];
                        if (kind != 1) {
                            acc += kind == 2 ? powf(fabsf(v), p) : v;
                        } else if (v > acc) {
                            acc = v;
                            best = column_major ? c0 + c1 * g.in[0] + c2 * g.in[0] * g.in[1]
                                                : (c0 * g.in[1] + c1) * g.in[2] + c2;
                            best += (i / out_plane) * in_plane;
                        }
                        ++count;
                    } else if (count_include_pad && pad0 && pad1 && pad2) {
                        ++count;
                    }
                }
            }
        }
        y[i] = kind == 1 ? acc
             : kind == 2 ? powf(acc, 1.0f / p)
                         : (count == 0 ? 0.0f : acc / (float)count);
        if (with_indices) indices[i] = best;
    }
}

// y[t · inner + j] = x[offset[t] + j]: GatherND (a row per index tuple) and GatherElements
// (inner = 1), the offsets worked out on the host, where the indices are.
extern "C" __global__ void gather_rows_f32(const float* x, const long long* offset, float* y,
                                           long long rows, long long inner) {
    GRID_STRIDE(i, rows * inner) {
        y[i] = x[offset[i / inner] + i % inner];
    }
}

// Writes the rows of `updates` at y[offset[t] + j] (y already holds the data): ScatterND (a row
// per index tuple) and ScatterElements (inner = 1). With distinct offsets and no reduction (0)
// every value is its own thread; otherwise (1 add, 2 mul, 3 max, 4 min, 5 the last write wins)
// a thread takes column j of every row in order, so repeated offsets combine in the order the
// CPU applies them.
extern "C" __global__ void scatter_rows_f32(float* y, const float* updates,
                                            const long long* offset, long long rows,
                                            long long inner, int reduction) {
    if (reduction == 0) {
        GRID_STRIDE(i, rows * inner) {
            y[offset[i / inner] + i % inner] = updates[i];
        }
        return;
    }
    GRID_STRIDE(j, inner) {
        for (long long t = 0; t < rows; ++t) {
            float* at = y + offset[t] + j;
            float u = updates[t * inner + j];
            switch (reduction) {
                case 1: *at += u; break;
                case 2: *at *= u; break;
                case 3: *at = fmaxf(*at, u); break;
                case 4: *at = fminf(*at, u); break;
                default: *at = u; break;
            }
        }
    }
}

// Einsum of one to three operands: for output position i (over `out`, whose a/b/c are the
// operands' strides along the output labels) the sum over the summed labels (`summed`, `count`
// combinations) of the operands' product. One thread per output value.
extern "C" __global__ void einsum_f32(const float* a, const float* b, const float* c, float* y,
                                      long long n_out, Dims out, Dims summed, long long count,
                                      int operands) {
    GRID_STRIDE(i, n_out) {
        long long oa, ob, oc;
        offsets(out, i, &oa, &ob, &oc);
        float acc = 0.0f;
        for (long long s = 0; s < count; ++s) {
            long long sa, sb, sc;
            offsets(summed, s, &sa, &sb, &sc);
            float p = a[oa + sa];
            if (operands > 1) p *= b[ob + sb];
            if (operands > 2) p *= c[oc + sc];
            acc += p;
        }
        y[i] = acc;
    }
}

// ---- Masks and narrow floats (src/runtime/cuda/masks.rs) ----
// A boolean tensor on the device is held as floats, 0 or 1 (exact, and every float kernel can
// read it); these kernels make and combine such masks, choose by one, and round floats to the
// narrow formats a Cast names.

// Codes shared with masks.rs (`compare_code`): y = a OP b as 0 or 1, both broadcast.
extern "C" __global__ void mask_binary_f32(const float* a, const float* b, float* y, long long n,
                                           Dims d, int op) {
    GRID_STRIDE(i, n) {
        long long oa, ob, oc;
        offsets(d, i, &oa, &ob, &oc);
        float u = a[oa], v = b[ob];
        bool r;
        switch (op) {
            case 0: r = u < v; break;                          // Less
            case 1: r = u <= v; break;                         // LessOrEqual
            case 2: r = u > v; break;                          // Greater
            case 3: r = u >= v; break;                         // GreaterOrEqual
            case 4: r = u == v; break;                         // Equal
            case 5: r = u != 0.0f && v != 0.0f; break;         // And
            case 6: r = u != 0.0f || v != 0.0f; break;         // Or
            default: r = (u != 0.0f) != (v != 0.0f); break;   // Xor
        }
        y[i] = r ? 1.0f : 0.0f;
    }
}

// Codes shared with masks.rs (`mask_unary_code`): y = a test of x, as 0 or 1.
extern "C" __global__ void mask_unary_f32(const float* x, float* y, long long n, int op) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        bool r;
        switch (op) {
            case 0: r = v != v; break;                         // IsNaN
            case 1: r = fabsf(v) == PC_INFINITY; break;        // IsInf, both signs
            case 2: r = v == PC_INFINITY; break;               // IsInf, positive only
            case 3: r = v == -PC_INFINITY; break;              // IsInf, negative only
            case 4: r = v == 0.0f; break;                      // Not
            default: r = v != 0.0f; break;                     // Cast to bool
        }
        y[i] = r ? 1.0f : 0.0f;
    }
}

// y = cond != 0 ? a : b, all three broadcast (strides a, b, c = cond), cond a device mask.
extern "C" __global__ void where_mask_f32(const float* cond, const float* a, const float* b,
                                          float* y, long long n, Dims d) {
    GRID_STRIDE(i, n) {
        long long oa, ob, oc;
        offsets(d, i, &oa, &ob, &oc);
        y[i] = cond[oc] != 0.0f ? a[oa] : b[ob];
    }
}

// Flags of `round_float_f32` (masks.rs, `NarrowFloat`).
#define PC_HAS_INFINITY 1
#define PC_UNSIGNED_ZERO 2
#define PC_ALWAYS_SATURATES 4
#define PC_SATURATE 8

// x rounded to a float format of `mantissa` bits, exponent `bias` and largest finite value
// `max`, kept as float: round to nearest, ties to even, as src/runtime/narrow.rs (`MiniFloat`)
// does on the host, in double so every step is exact.
extern "C" __global__ void round_float_f32(const float* x, float* y, long long n, int mantissa,
                                           int bias, float max, int flags) {
    bool saturate = (flags & (PC_SATURATE | PC_ALWAYS_SATURATES)) != 0;
    bool has_infinity = (flags & PC_HAS_INFINITY) != 0;
    bool unsigned_zero = (flags & PC_UNSIGNED_ZERO) != 0;
    GRID_STRIDE(i, n) {
        float v = x[i];
        if (v != v) {
            // float4 E2M1 has no NaN: ml_dtypes gives its pattern for negative zero.
            y[i] = (flags & PC_ALWAYS_SATURATES) ? -0.0f : v;
            continue;
        }
        bool negative = __float_as_int(v) < 0;
        double magnitude = fabs((double)v);
        double rounded;
        bool overflow = false;
        if (magnitude == (double)PC_INFINITY) {
            overflow = true;
            rounded = 0.0;
        } else if (magnitude == 0.0) {
            rounded = 0.0;
        } else {
            int e2;
            frexp(magnitude, &e2);
            int exponent = e2 - 1;
            int lowest = 1 - bias;
            int spacing = (exponent > lowest ? exponent : lowest) - mantissa;
            double quantum = ldexp(1.0, spacing);
            rounded = rint(magnitude / quantum) * quantum;
            overflow = rounded > (double)max;
        }
        float r;
        if (overflow) {
            if (saturate) {
                r = max;
            } else if (has_infinity) {
                r = PC_INFINITY;
            } else {
                y[i] = __int_as_float(0x7fc00000);
                continue;
            }
        } else {
            r = (float)rounded;
        }
        if (negative) r = -r;
        if (r == 0.0f && unsigned_zero) r = 0.0f;
        y[i] = r;
    }
}
