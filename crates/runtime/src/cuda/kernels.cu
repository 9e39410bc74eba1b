// pipecut's CUDA kernels, compiled once per device at run time with NVRTC (fp32 compute, as the
// CPU reference runtime: half-precision weights are widened when they are loaded).
//
// Shapes and strides travel by value in `Dims` (rank at most MAX_RANK), so a launch needs no
// extra upload. Every kernel uses a grid-stride loop over 64-bit indices.

#define MAX_RANK 8
#define PC_INFINITY __int_as_float(0x7f800000)

struct Dims {
    int rank;
    int wide;  // 1: 64-bit division for every position (PIPECUT_CUDA_WIDE_INDEX=on, to compare)
    long long shape[MAX_RANK];
    long long a[MAX_RANK];
    long long b[MAX_RANK];
    long long c[MAX_RANK];
};

// Splits `*i` by `s` (positive): answers the remainder and leaves the quotient in `*i`, by
// 32-bit division when both fit, as they do below 2^31 elements (the 64-bit division is a
// software routine several times as long: im2col divides a dozen times per element, and the
// one-hot Equal of magika's [16, 2048, 257] spent most of its time dividing).
__device__ __forceinline__ long long split_index(long long* i, long long s) {
    if (*i <= 0x7fffffffLL && s <= 0x7fffffffLL) {
        unsigned int q = (unsigned int)*i / (unsigned int)s;
        long long r = *i - (long long)q * s;
        *i = q;
        return r;
    }
    long long q = *i / s;
    long long r = *i - q * s;
    *i = q;
    return r;
}

// Element offsets of output position `i` in up to three broadcast operands (`d.wide`: 64-bit
// division throughout, to compare).
__device__ __forceinline__ void offsets(const Dims& d, long long i, long long* oa, long long* ob,
                                        long long* oc) {
    long long a = 0, b = 0, c = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
        long long idx;
        if (d.wide) {
            idx = i % d.shape[k];
            i /= d.shape[k];
        } else {
            idx = split_index(&i, d.shape[k]);
        }
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

// Codes shared with crates/runtime/src/cuda/ops.rs (`Unary`).
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

// Codes shared with ops.rs (`Binary`); `binary_flat_f32` computes the same.
__device__ __forceinline__ float binary_value(float u, float v, int op) {
    switch (op) {
        case 0: return u + v;
        case 1: return u - v;
        case 2: return u * v;
        case 3: return u / v;
        case 4: return powf(u, v);
        case 5: return fmaxf(u, v);
        case 6: return fminf(u, v);
        case 7: return u < 0.0f ? u * v : u;  // PRelu (v the slope)
        default: return fmodf(u, v);          // Mod with fmod = 1
    }
}

extern "C" __global__ void binary_f32(const float* a, const float* b, float* y, long long n,
                                      Dims d, int op) {
    GRID_STRIDE(i, n) {
        long long oa, ob, oc;
        offsets(d, i, &oa, &ob, &oc);
        y[i] = binary_value(a[oa], b[ob], op);
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
        long long t = i;
        long long p = split_index(&t, cols), r = split_index(&t, rows);
        long long grp = split_index(&t, g.groups), b = first + t;
        long long kx = split_index(&r, g.kw), ky = split_index(&r, g.kh), ci = r;
        long long ox = split_index(&p, g.ow), oy = p;
        long long iy = oy * g.sh + ky * g.dh - g.ph;
        long long ix = ox * g.sw + kx * g.dw - g.pw;
        bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
        col[i] = inside ? x[((b * g.c + grp * cg + ci) * g.h + iy) * g.w + ix] : 0.0f;
    }
}

// ---- Conv epilogues (crates/runtime/src/cuda/conv_fold.rs) ----
//
// The nodes `runtime/fuse.rs` folds into a Conv, applied to its output value v of channel c in
// their own kernels' order: a BatchNormalization's (v - mean) * factor + shift with [mean,
// factor, shift] per channel (`norm`, read only when has_norm), a Mul then an Add of scalars,
// a written-out hard-swish v * clip(v + add, lo, hi) / div (Clip: max, then min), a Relu. With
// every flag 0 it is the identity.
struct ConvEpilogue {
    float scale, shift, add, lo, hi, div;
    int has_norm, has_affine, has_hard_swish, relu;
};

__device__ __forceinline__ float conv_epilogue_value(float v, long long c, const float* norm,
                                                     const ConvEpilogue& e) {
    if (e.has_norm) v = (v - norm[3 * c]) * norm[3 * c + 1] + norm[3 * c + 2];
    if (e.has_affine) v = v * e.scale + e.shift;
    if (e.has_hard_swish) v = v * fminf(fmaxf(v + e.add, e.lo), e.hi) / e.div;
    if (e.relu) v = fmaxf(v, 0.0f);
    return v;
}

// The convolution's bias (when has_bias) and the epilogue in place over y [n / (channels *
// plane), channels, plane]: for a convolution whose output cuBLAS wrote.
extern "C" __global__ void conv_epilogue_f32(float* y, const float* bias, int has_bias,
                                             const float* norm, long long n, long long plane,
                                             long long channels, ConvEpilogue e) {
    GRID_STRIDE(i, n) {
        long long t = i;
        split_index(&t, plane);
        long long c = split_index(&t, channels);
        float v = has_bias ? y[i] + bias[c] : y[i];
        y[i] = conv_epilogue_value(v, c, norm, e);
    }
}

// Direct convolution, one thread per output value: for convolutions with one input channel
// per group (depthwise), where im2col would need a GEMM per channel. Weights [m, c/groups,
// kh, kw]; the bias (m values) is read only when has_bias; the epilogue (identity but for a
// fold) applied as each value is written.
extern "C" __global__ void conv_direct_f32(const float* x, const float* wt, const float* bias,
                                           float* y, Window2d g, int has_bias,
                                           const float* norm, ConvEpilogue e) {
    long long cg = g.c / g.groups, mg = g.m / g.groups;
    GRID_STRIDE(i, g.n * g.m * g.oh * g.ow) {
        long long t = i;
        long long ox = split_index(&t, g.ow), oy = split_index(&t, g.oh);
        long long oc = split_index(&t, g.m), b = t;
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
        y[i] = conv_epilogue_value(acc, oc, norm, e);
    }
}

// Transposed convolution, one thread per output value gathering the input taps that reach it
// (no atomics): input [n, c, h, w], weights [c, m/groups, kh, kw], output [n, m, oh, ow], pads
// (ph, pw) cut from the output's start. The bias (m values) is read only when has_bias.
extern "C" __global__ void conv_transpose_f32(const float* x, const float* wt, const float* bias,
                                              float* y, Window2d g, int has_bias) {
    long long cg = g.c / g.groups, mg = g.m / g.groups;
    GRID_STRIDE(i, g.n * g.m * g.oh * g.ow) {
        long long t = i;
        long long ox = split_index(&t, g.ow), oy = split_index(&t, g.oh);
        long long oc = split_index(&t, g.m), b = t;
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
        long long plane = i;
        long long ox = split_index(&plane, g.ow), oy = split_index(&plane, g.oh);
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
        long long t = i;
        split_index(&t, inner);
        long long ch = split_index(&t, channels);
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

// ---- Attention and RotaryEmbedding (crates/runtime/src/cuda/attention.rs) ----

// The row-wise middle of ONNX Attention on scores[rows, cols] = scale · Q·Kᵀ (rows are
// (batch, q_head, query) in that order): the additive mask (mask[b·mask_b + h·mask_h + i·mask_i
// + j] for j < mask_cols, masked beyond, when has_mask), the causal mask (key j > query i +
// past_len), the padding mask (j ≥ lengths[b], when has_lengths), the soft cap c·tanh(x/c),
// then the softmax over the row, in place. When want_qk, qk gets the row at the stage `mode`
// names (0 scaled, 1 masked, 2 capped, 3 softmaxed), as the CPU kernel's
// qk_matmul_output_mode. One block per row.
extern "C" __global__ void attention_softmax_f32(
    float* scores, float* qk, const float* mask, const float* lengths, long long rows,
    long long cols, long long q_heads, long long q_seq, long long past_len, long long mask_b,
    long long mask_h, long long mask_i, long long mask_cols, int has_mask, int causal,
    int has_lengths, float softcap, int mode, int want_qk, long long left_window,
    long long right_window) {
    extern __shared__ float scratch[];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        long long i = row % q_seq, h = (row / q_seq) % q_heads, b = row / (q_seq * q_heads);
        float* s = scores + row * cols;
        float* out = qk + row * cols;
        const float* mask_row = mask + b * mask_b + h * mask_h + i * mask_i;
        // Query i's absolute position: after the past cache, or (an external cache, no past)
        // nonpad_kv_seqlen[b] - q_seq.
        long long offset = has_lengths && past_len == 0 ? (long long)lengths[b] - q_seq : past_len;
        float m = -PC_INFINITY, open = -PC_INFINITY;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float x = s[j];
            if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
            if (want_qk && (mode == 0 || mode == 1)) out[j] = x;
            long long distance = i + offset - j;
            bool hidden = (causal && distance < 0) || (left_window >= 0 && distance > left_window) ||
                          (right_window >= 0 && -distance > right_window) ||
                          (has_lengths && (float)j >= lengths[b]);
            float bias = 0.0f;
            if (has_mask) bias = j < mask_cols ? mask_row[j] : -PC_INFINITY;
            if (hidden) bias = -PC_INFINITY;
            open = fmaxf(open, bias);
            x += bias;
            if (want_qk && mode == 2) out[j] = x;
            s[j] = x;
            m = fmaxf(m, x);
        }
        m = block_reduce(m, COMBINE_MAX, scratch);
        open = block_reduce(open, COMBINE_MAX, scratch);
        // A row whose bias masks every key (or whose scores are all -inf) gives zeros, as the
        // reference's fully-masked-row guard does.
        if (open == -PC_INFINITY || m == -PC_INFINITY) {
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
                s[j] = 0.0f;
                if (want_qk && mode == 3) out[j] = 0.0f;
            }
            continue;
        }
        float sum = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(s[j] - m);
        sum = block_reduce(sum, COMBINE_SUM, scratch);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float p = expf(s[j] - m) / sum;
            s[j] = p;
            if (want_qk && mode == 3) out[j] = p;
        }
    }
}

// RotaryEmbedding, one thread per element of x: x is [batch, heads, seq, size] (rank4) or
// [batch, seq, heads·size]; the first `rotary` elements of each head turn by the cache row
// rows[b·seq + s] of cos/sin ([positions, rotary/2]), pairing the two halves or, when
// interleaved, neighbours; the rest is copied.
extern "C" __global__ void rotary_f32(const float* x, const float* cos_cache,
                                      const float* sin_cache, const long long* rows, float* y,
                                      long long n, long long seq, long long heads, long long size,
                                      long long rotary, int rank4, int interleaved) {
    long long half = rotary / 2;
    GRID_STRIDE(e, n) {
        long long d = e % size, s, b;
        if (rank4) {
            s = (e / size) % seq;
            b = e / (size * seq * heads);
        } else {
            s = (e / (size * heads)) % seq;
            b = e / (size * heads * seq);
        }
        if (d >= rotary) {
            y[e] = x[e];
            continue;
        }
        long long base = e - d;
        long long pair = interleaved ? d / 2 : d % half;
        bool first = interleaved ? d % 2 == 0 : d < half;
        float x1 = x[base + (interleaved ? 2 * pair : pair)];
        float x2 = x[base + (interleaved ? 2 * pair + 1 : half + pair)];
        long long row = rows[b * seq + s];
        float c = cos_cache[row * half + pair], sn = sin_cache[row * half + pair];
        y[e] = first ? c * x1 - sn * x2 : sn * x1 + c * x2;
    }
}

// ---- GridSample (crates/runtime/src/cuda/grid_sample.rs) ----

// Spatial sizes of GridSample's input, by value (at most 6 spatial axes: rank 8 in all).
struct GridDims {
    int rank;
    long long dims[6];
};

// `x` reflected into [low, high], repeatedly, as a pair of mirrors would.
__device__ float grid_reflect(float x, float low, float high) {
    float range = high - low;
    if (range <= 0.0f) return low;
    float outside;
    bool from_low;
    if (x < low) {
        outside = low - x;
        from_low = true;
    } else if (x > high) {
        outside = x - high;
        from_low = false;
    } else {
        return x;
    }
    float flips = floorf(outside / range);
    float rest = outside - flips * range;
    bool even = (long long)flips % 2 == 0;
    return from_low == even ? low + rest : high - rest;
}

// The pixel of `plane` at integer coordinates `at`, with the padding rule (0 zeros, 1 border,
// 2 reflection) for those outside.
__device__ float grid_pixel(const float* plane, const GridDims& d, const long long* at,
                            int padding, int align_corners) {
    long long offset = 0;
    for (int k = 0; k < d.rank; ++k) {
        long long n = d.dims[k], c = at[k];
        if (padding == 0 && (c < 0 || c >= n)) return 0.0f;
        if (padding == 2) {
            float low = align_corners ? 0.0f : -0.5f;
            float high = align_corners ? (float)n - 1.0f : (float)n - 0.5f;
            c = (long long)grid_reflect((float)c, low, high);
        }
        c = c < 0 ? 0 : (c > n - 1 ? n - 1 : c);
        offset = offset * n + c;
    }
    return plane[offset];
}

// The spec's cubic weights (A = -0.75) of the four taps around fraction t.
__device__ void grid_cubic_weights(float t, float* w) {
    const float A = -0.75f;
    float x = t + 1.0f;
    w[0] = ((A * x - 5.0f * A) * x + 8.0f * A) * x - 4.0f * A;
    w[1] = ((A + 2.0f) * t - (A + 3.0f)) * t * t + 1.0f;
    x = 1.0f - t;
    w[2] = ((A + 2.0f) * x - (A + 3.0f)) * x * x + 1.0f;
    x = 2.0f - t;
    w[3] = ((A * x - 5.0f * A) * x + 8.0f * A) * x - 4.0f * A;
}

// GridSample as the CPU kernel (kernels/grid_sample.rs): y[n, c, p] samples x[n, c] at grid
// point p of batch row n (grid[..., 0] indexes the last axis); mode 0 nearest (half to even),
// 1 linear, 2 cubic (2-D). One thread per output.
extern "C" __global__ void grid_sample_f32(const float* x, const float* grid, float* y,
                                           long long n_out, long long channels, long long points,
                                           GridDims d, int mode, int padding, int align_corners) {
    long long plane_len = 1;
    for (int k = 0; k < d.rank; ++k) plane_len *= d.dims[k];
    GRID_STRIDE(i, n_out) {
        long long p = i % points, plane_index = i / points, batch = plane_index / channels;
        const float* plane = x + plane_index * plane_len;
        const float* g = grid + (batch * points + p) * d.rank;
        float coords[6];
        long long at[6];
        for (int k = 0; k < d.rank; ++k) {
            float size = (float)d.dims[k], normalised = g[d.rank - 1 - k];
            float v = align_corners ? (normalised + 1.0f) / 2.0f * (size - 1.0f)
                                    : ((normalised + 1.0f) * size - 1.0f) / 2.0f;
            if (padding == 1) v = fminf(fmaxf(v, 0.0f), size - 1.0f);
            if (padding == 2) {
                v = grid_reflect(v, align_corners ? 0.0f : -0.5f,
                                 align_corners ? size - 1.0f : size - 0.5f);
            }
            coords[k] = v;
        }
        float value = 0.0f;
        if (mode == 0) {
            for (int k = 0; k < d.rank; ++k) at[k] = (long long)rintf(coords[k]);
            value = grid_pixel(plane, d, at, padding, align_corners);
        } else if (mode == 1) {
            for (int bits = 0; bits < (1 << d.rank); ++bits) {
                float weight = 1.0f;
                for (int k = 0; k < d.rank; ++k) {
                    float base = floorf(coords[k]), t = coords[k] - base;
                    bool upper = (bits >> k) & 1;
                    at[k] = (long long)base + (upper ? 1 : 0);
                    weight *= upper ? t : 1.0f - t;
                }
                if (weight != 0.0f) value += weight * grid_pixel(plane, d, at, padding, align_corners);
            }
        } else {
            float y0 = floorf(coords[0]), x0 = floorf(coords[1]), wy[4], wx[4];
            grid_cubic_weights(coords[0] - y0, wy);
            grid_cubic_weights(coords[1] - x0, wx);
            for (int a = 0; a < 4; ++a) {
                for (int b = 0; b < 4; ++b) {
                    at[0] = (long long)y0 - 1 + a;
                    at[1] = (long long)x0 - 1 + b;
                    value += wy[a] * wx[b] * grid_pixel(plane, d, at, padding, align_corners);
                }
            }
        }
        y[i] = value;
    }
}

// ---- RNN, GRU and LSTM (crates/runtime/src/cuda/recurrent.rs) ----

// A direction's activations (codes of `recurrent_act`), with their alphas and betas.
struct RecurrentActs {
    int code[3];
    float alpha[3];
    float beta[3];
};

// Activation `k` of the direction on `v`, after the clip (clip > 0), as the CPU kernel's
// `Activation::apply`: 0 Relu, 1 Tanh, 2 Sigmoid, 3 Affine, 4 LeakyRelu, 5 ThresholdedRelu,
// 6 ScaledTanh, 7 HardSigmoid, 8 Elu, 9 Softsign, 10 Softplus.
__device__ float recurrent_act(const RecurrentActs& acts, int k, float v, float clip) {
    if (clip > 0.0f) v = fminf(fmaxf(v, -clip), clip);
    float a = acts.alpha[k], b = acts.beta[k];
    switch (acts.code[k]) {
        case 0: return fmaxf(v, 0.0f);
        case 1: return tanhf(v);
        case 2: return 1.0f / (1.0f + expf(-v));
        case 3: return a * v + b;
        case 4: return v >= 0.0f ? v : a * v;
        case 5: return v > a ? v : 0.0f;
        case 6: return a * tanhf(b * v);
        case 7: return fminf(fmaxf(a * v + b, 0.0f), 1.0f);
        case 8: return v >= 0.0f ? v : a * (expf(v) - 1.0f);
        case 9: return v / (1.0f + fabsf(v));
        default: return logf(1.0f + expf(v));
    }
}

// One time step t of one direction `dir` of an RNN (cell 0), GRU (1) or LSTM (2), a thread per
// (batch row, hidden unit). xw is the direction's X·Wᵀ ([seq, batch, gates·hidden]); rh the
// step's h·Rᵀ ([batch, rh_cols]); bias the [directions, 2·gates·hidden] Wb then Rb; peep LSTM's
// [directions, 3·hidden]; h, c the [directions, batch, hidden] states, updated in place; y the
// [seq, directions, batch, hidden] output. A row whose sequence (lens, as floats) has ended
// keeps its state and writes 0 to y. GRU without linear_before_reset takes two phases: 0 writes
// gated = r ⊙ h (the host then computes rh_candidate = gated·R_hᵀ), 1 finishes the step.
extern "C" __global__ void recurrent_step_f32(
    const float* xw, const float* rh, const float* rh_candidate, const float* bias,
    const float* peep, const float* lens, float* h, float* c, float* gated, float* y,
    long long batch, long long hidden, long long directions, long long dir, long long t,
    long long rh_cols, int cell, int phase, int has_bias, int has_peep, int input_forget,
    int linear_before_reset, RecurrentActs acts, float clip) {
    long long gates = cell == 0 ? 1 : (cell == 1 ? 3 : 4);
    GRID_STRIDE(i, batch * hidden) {
        long long b = i / hidden, j = i % hidden;
        long long at = (dir * batch + b) * hidden + j;
        long long y_at = ((t * directions + dir) * batch + b) * hidden + j;
        bool active = (float)t < lens[b];
        if (!active) {
            if (phase == 0) gated[i] = 0.0f;
            else y[y_at] = 0.0f;
            continue;
        }
        const float* x_row = xw + (t * batch + b) * gates * hidden;
        const float* r_row = rh + b * rh_cols;
        const float* wb = bias + dir * 2 * gates * hidden;
        const float* rb = wb + gates * hidden;
#define PRE_W(g) (x_row[(g) * hidden + j] + (has_bias ? wb[(g) * hidden + j] : 0.0f))
#define PRE_R(g) (r_row[(g) * hidden + j] + (has_bias ? rb[(g) * hidden + j] : 0.0f))
        float state = h[at], next;
        if (cell == 0) {
            next = recurrent_act(acts, 0, PRE_W(0) + PRE_R(0), clip);
        } else if (cell == 1) {
            if (phase == 0) {
                gated[i] = recurrent_act(acts, 0, PRE_W(1) + PRE_R(1), clip) * state;
                continue;
            }
            float z = recurrent_act(acts, 0, PRE_W(0) + PRE_R(0), clip);
            float candidate;
            if (linear_before_reset) {
                float r = recurrent_act(acts, 0, PRE_W(1) + PRE_R(1), clip);
                candidate = recurrent_act(acts, 1, PRE_W(2) + r * PRE_R(2), clip);
            } else {
                float rc = rh_candidate[i] + (has_bias ? rb[2 * hidden + j] : 0.0f);
                candidate = recurrent_act(acts, 1, PRE_W(2) + rc, clip);
            }
            next = (1.0f - z) * candidate + z * state;
        } else {
            const float* p = peep + dir * 3 * hidden;
            float cell_state = c[at];
            float pi = has_peep ? p[j] : 0.0f, po = has_peep ? p[hidden + j] : 0.0f,
                  pf = has_peep ? p[2 * hidden + j] : 0.0f;
            float in = recurrent_act(acts, 0, PRE_W(0) + PRE_R(0) + pi * cell_state, clip);
            float forget = input_forget
                               ? 1.0f - in
                               : recurrent_act(acts, 0, PRE_W(2) + PRE_R(2) + pf * cell_state, clip);
            float candidate = recurrent_act(acts, 1, PRE_W(3) + PRE_R(3), clip);
            float next_c = forget * cell_state + in * candidate;
            float out = recurrent_act(acts, 0, PRE_W(1) + PRE_R(1) + po * next_c, clip);
            c[at] = next_c;
            next = out * recurrent_act(acts, 2, next_c, clip);
        }
#undef PRE_W
#undef PRE_R
        h[at] = next;
        y[y_at] = next;
    }
}

// ---- Pad (crates/runtime/src/cuda/movement_ops.rs) ----

// Pad as the CPU kernel (kernels/movement.rs): over the output shape d.shape, with the input's
// strides in d.a, the leading pads in d.b (negative crops) and the input's shape in d.c; a
// coordinate outside the input reads `value` (mode 0), the nearest edge (1), the mirror image
// without repeating the edge (2, reflect) or the periodic image (3, wrap).
extern "C" __global__ void pad_f32(const float* x, float* y, long long n, Dims d, int mode,
                                   float value) {
    GRID_STRIDE(i, n) {
        long long rest = i, offset = 0;
        bool constant = false;
        for (int k = d.rank - 1; k >= 0; --k) {
            long long c = rest % d.shape[k] - d.b[k], size = d.c[k];
            rest /= d.shape[k];
            if (c < 0 || c >= size) {
                if (mode == 0) {
                    constant = true;
                    break;
                } else if (mode == 1) {
                    c = c < 0 ? 0 : size - 1;
                } else if (mode == 3) {
                    c = ((c % size) + size) % size;
                } else if (size == 1) {
                    c = 0;
                } else {
                    long long period = 2 * (size - 1), m = ((c % period) + period) % period;
                    c = m < size ? m : period - m;
                }
            }
            offset += c * d.a[k];
        }
        y[i] = constant ? value : x[offset];
    }
}

// ---- RoiAlign (crates/runtime/src/cuda/roi_align.rs) ----

// One bilinear tap of RoiAlign at (y, x) of an height × width plane, weighted as the CPU
// kernel's `sample_corners` (nothing outside the [-1, size] margin; max_mode takes the largest
// weighted corner, else their sum).
__device__ float roi_tap(const float* plane, float y, float x, long long height, long long width,
                         int max_mode) {
    long long y0 = 0, y1 = 0, x0 = 0, x1 = 0;
    float ly = 0.0f, lx = 0.0f, hy = 0.0f, hx = 0.0f;
    if (!(y < -1.0f || y > (float)height || x < -1.0f || x > (float)width)) {
        float vy = fmaxf(y, 0.0f), vx = fmaxf(x, 0.0f);
        y0 = (long long)vy;
        x0 = (long long)vx;
        if (y0 >= height - 1) {
            y0 = y1 = height - 1;
        } else {
            y1 = y0 + 1;
            ly = vy - (float)y0;
        }
        if (x0 >= width - 1) {
            x0 = x1 = width - 1;
        } else {
            x1 = x0 + 1;
            lx = vx - (float)x0;
        }
        hy = 1.0f - ly;
        hx = 1.0f - lx;
    }
    float a = hy * hx * plane[y0 * width + x0], b = hy * lx * plane[y0 * width + x1];
    float c = ly * hx * plane[y1 * width + x0], d = ly * lx * plane[y1 * width + x1];
    if (max_mode) return fmaxf(fmaxf(fmaxf(fmaxf(-PC_INFINITY, a), b), c), d);
    return a + b + c + d;
}

// RoiAlign as the CPU kernel (kernels/detection.rs), one thread per output [roi, c, ph, pw]:
// rois [count, 4] as (x0, y0, x1, y1), batch_of the (checked) image of each.
extern "C" __global__ void roi_align_f32(const float* x, const float* rois,
                                         const long long* batch_of, float* y, long long n_out,
                                         long long channels, long long height, long long width,
                                         long long out_h, long long out_w, long long sampling,
                                         float scale, int half_pixel, int max_mode) {
    GRID_STRIDE(i, n_out) {
        long long pw = i % out_w, ph = (i / out_w) % out_h;
        long long c = (i / (out_w * out_h)) % channels, r = i / (out_w * out_h * channels);
        float offset = half_pixel ? 0.5f : 0.0f;
        float x0 = rois[r * 4] * scale - offset, y0 = rois[r * 4 + 1] * scale - offset;
        float x1 = rois[r * 4 + 2] * scale - offset, y1 = rois[r * 4 + 3] * scale - offset;
        float roi_w = x1 - x0, roi_h = y1 - y0;
        if (!half_pixel) {
            roi_w = fmaxf(roi_w, 1.0f);
            roi_h = fmaxf(roi_h, 1.0f);
        }
        float bin_h = roi_h / (float)out_h, bin_w = roi_w / (float)out_w;
        long long grid_h = sampling > 0 ? sampling : (long long)fmaxf(ceilf(roi_h / (float)out_h), 0.0f);
        long long grid_w = sampling > 0 ? sampling : (long long)fmaxf(ceilf(roi_w / (float)out_w), 0.0f);
        long long samples = grid_h * grid_w > 1 ? grid_h * grid_w : 1;
        const float* plane = x + (batch_of[r] * channels + c) * height * width;
        float acc = 0.0f;
        bool any = false;
        for (long long iy = 0; iy < grid_h; ++iy) {
            float sy = y0 + (float)ph * bin_h + ((float)iy + 0.5f) * bin_h / (float)grid_h;
            for (long long ix = 0; ix < grid_w; ++ix) {
                float sx = x0 + (float)pw * bin_w + ((float)ix + 0.5f) * bin_w / (float)grid_w;
                float v = roi_tap(plane, sy, sx, height, width, max_mode);
                if (max_mode) acc = any ? fmaxf(acc, v) : v;
                else acc += v;
                any = true;
            }
        }
        y[i] = max_mode ? acc : acc / (float)samples;
    }
}

// ---- DeformConv (crates/runtime/src/cuda/deform_conv.rs) ----

// DeformConv's sizes: input [n, ic, ih, iw], weights [oc, icg, kh, kw], output [n, oc, oh, ow],
// offset groups, strides, leading pads and dilations (height, width).
struct DeformGeometry {
    long long ic, ih, iw, oc, icg, kh, kw, oh, ow, offset_group, sh, sw, ph, pw, dh, dw;
};

// The CPU kernel's bilinear sample of an height × width plane at (y, x): corners outside read 0.
__device__ float deform_bilinear(const float* plane, long long height, long long width, float y,
                                 float x) {
    float y0 = floorf(y), x0 = floorf(x), dy = y - y0, dx = x - x0, sum = 0.0f;
    for (int a = 0; a < 2; ++a) {
        for (int b = 0; b < 2; ++b) {
            float yy = y0 + (float)a, xx = x0 + (float)b;
            float w = (a ? dy : 1.0f - dy) * (b ? dx : 1.0f - dx);
            if (yy >= 0.0f && xx >= 0.0f && (long long)yy < height && (long long)xx < width) {
                sum += w * plane[(long long)yy * width + (long long)xx];
            }
        }
    }
    return sum;
}

// DeformConv (2-D) as the CPU kernel (kernels/spatial.rs), one thread per output value: every
// tap samples its input channel at the tap's position moved by the offset
// ([n, 2·offset_group·taps, oh, ow]), times the mask when has_mask; the bias when has_bias.
extern "C" __global__ void deform_conv_f32(const float* x, const float* wt, const float* offset,
                                           const float* bias, const float* mask, float* y,
                                           long long n_out, DeformGeometry g, int has_bias,
                                           int has_mask) {
    long long taps = g.kh * g.kw, points = g.oh * g.ow;
    long long ocg = g.oc / (g.ic / g.icg), per_offset_group = g.ic / g.offset_group;
    GRID_STRIDE(i, n_out) {
        long long p = i % points, o = (i / points) % g.oc, b = i / (points * g.oc);
        long long oi = p / g.ow, oj = p % g.ow, group = o / ocg;
        float acc = 0.0f;
        for (long long ci = 0; ci < g.icg; ++ci) {
            long long c = group * g.icg + ci, og = c / per_offset_group;
            const float* plane = x + (b * g.ic + c) * g.ih * g.iw;
            const float* off = offset + (b * g.offset_group + og) * 2 * taps * points + p;
            for (long long t = 0; t < taps; ++t) {
                long long ki = t / g.kw, kj = t % g.kw;
                float sy = (float)(oi * g.sh - g.ph + ki * g.dh) + off[(2 * t) * points];
                float sx = (float)(oj * g.sw - g.pw + kj * g.dw) + off[(2 * t + 1) * points];
                float m = has_mask ? mask[((b * g.offset_group + og) * taps + t) * points + p]
                                   : 1.0f;
                float sampled = deform_bilinear(plane, g.ih, g.iw, sy, sx) * m;
                acc += wt[(o * g.icg + ci) * taps + t] * sampled;
            }
        }
        y[i] = has_bias ? acc + bias[o] : acc;
    }
}

// ---- Batch statistics: MeanVarianceNormalization, training BatchNormalization
// (crates/runtime/src/cuda/moments.rs) ----

// The mean and population variance of each row of a [rows, cols] matrix (two passes, as the
// CPU kernels), into mean[row] and var[row]; when normalize, y = (x − mean) / (√var + 1e-9)
// (MeanVarianceNormalization). One block per row.
extern "C" __global__ void moments_rows_f32(const float* x, float* y, float* mean, float* var,
                                            long long rows, long long cols, int normalize) {
    extern __shared__ float scratch[];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* in = x + row * cols;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += in[j];
        float m = block_reduce(s, COMBINE_SUM, scratch) / (float)cols;
        float q = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) q += (in[j] - m) * (in[j] - m);
        float v = block_reduce(q, COMBINE_SUM, scratch) / (float)cols;
        if (threadIdx.x == 0) {
            mean[row] = m;
            var[row] = v;
        }
        if (normalize) {
            float d = sqrtf(v) + 1e-9f;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) y[row * cols + j] = (in[j] - m) / d;
        }
    }
}

// Training BatchNormalization's running statistics: old · momentum + batch · (1 − momentum).
extern "C" __global__ void running_stats_f32(const float* old, const float* batch, float* y,
                                             long long n, float momentum) {
    GRID_STRIDE(i, n) { y[i] = old[i] * momentum + batch[i] * (1.0f - momentum); }
}

// ---- DFT and STFT, Det, the ai.onnx.ml ops, Trilu, TopK and reductions off the trailing
// axes (crates/runtime/src/cuda/spectral.rs, linalg.rs, ml.rs, layout_ops.rs, top_k.rs,
// reductions.rs) ----

// DFT of every line of x [outer, n, inner, parts] (parts 1 real, 2 complex) along n, into
// y [outer, kept, inner, 2]: bin k sums sample j times twiddle[(k·j) mod length] (cos, sin
// pairs, the host's table), over the first min(n, length) samples (zero padding past n), in
// double like the CPU kernel. One thread per output bin.
extern "C" __global__ void dft_f32(const float* x, const double* twiddle, float* y,
                                   long long outer, long long n, long long inner, int parts,
                                   long long length, long long kept, double scale) {
    long long samples = n < length ? n : length;
    GRID_STRIDE(i, outer * kept * inner) {
        long long in_line = i % inner;
        long long k = (i / inner) % kept;
        long long o = i / (inner * kept);
        double re = 0.0, im = 0.0;
        for (long long j = 0; j < samples; ++j) {
            long long at = ((o * n + j) * inner + in_line) * parts;
            double a = x[at];
            double b = parts == 2 ? (double)x[at + 1] : 0.0;
            long long m = (k * j) % length;
            double c = twiddle[2 * m], s = twiddle[2 * m + 1];
            re += a * c - b * s;
            im += a * s + b * c;
        }
        y[2 * i] = (float)(re * scale);
        y[2 * i + 1] = (float)(im * scale);
    }
}

// STFT's frames: y [batch, frames, window_len, parts] takes sample f·step + j of each signal
// x [batch, samples, parts] (0 past its end), times window[j] when `weighted`.
extern "C" __global__ void stft_frames_f32(const float* x, const float* window, float* y,
                                           long long batch, long long samples, long long parts,
                                           long long frames, long long step,
                                           long long window_len, int weighted) {
    GRID_STRIDE(i, batch * frames * window_len * parts) {
        long long p = i % parts;
        long long j = (i / parts) % window_len;
        long long f = (i / (parts * window_len)) % frames;
        long long b = i / (parts * window_len * frames);
        long long s = f * step + j;
        float v = s < samples ? x[(b * samples + s) * parts + p] : 0.0f;
        y[i] = weighted && s < samples ? v * window[j] : v;
    }
}

// Determinants of `count` row-major m × m matrices: one block per matrix, LU with partial
// pivoting in double in `lu` (count · m · m scratch), as the CPU kernel: the pivot is the last
// row of largest magnitude (Rust's max_by), each swap negates, a zero pivot gives 0. Thread 0
// picks the pivot; the block swaps and eliminates. det_state: [determinant so far, pivot row].
extern "C" __global__ void det_f32(const float* x, double* lu, float* y, long long count,
                                   long long m) {
    extern __shared__ double det_state[];
    for (long long mat = blockIdx.x; mat < count; mat += gridDim.x) {
        double* a = lu + mat * m * m;
        for (long long e = threadIdx.x; e < m * m; e += blockDim.x) a[e] = x[mat * m * m + e];
        if (threadIdx.x == 0) det_state[0] = 1.0;
        __syncthreads();
        for (long long col = 0; col < m; ++col) {
            if (threadIdx.x == 0) {
                long long pivot = col;
                double best = fabs(a[col * m + col]);
                for (long long r = col + 1; r < m; ++r) {
                    double v = fabs(a[r * m + col]);
                    // Rust's total order: NaN above everything, ties to the later row.
                    if (v != v || (best == best && v >= best)) {
                        pivot = r;
                        best = v;
                    }
                }
                double p = a[pivot * m + col];
                det_state[1] = p == 0.0 ? -1.0 : (double)pivot;
                det_state[0] = p == 0.0 ? 0.0 : (pivot != col ? -det_state[0] : det_state[0]) * p;
            }
            __syncthreads();
            // Every thread reads the pivot row (−1: a zero pivot) from shared memory, which
            // thread 0 writes again only after three more barriers.
            long long pivot = (long long)det_state[1];
            if (pivot < 0) break;
            if (pivot != col) {
                for (long long k = col + threadIdx.x; k < m; k += blockDim.x) {
                    double t = a[pivot * m + k];
                    a[pivot * m + k] = a[col * m + k];
                    a[col * m + k] = t;
                }
            }
            __syncthreads();
            // Each row's factor replaces its entry in this column (never read again).
            double p = a[col * m + col];
            for (long long r = col + 1 + threadIdx.x; r < m; r += blockDim.x) a[r * m + col] /= p;
            __syncthreads();
            long long rest = m - col - 1;
            for (long long e = threadIdx.x; e < rest * rest; e += blockDim.x) {
                long long r = col + 1 + e / rest, k = col + 1 + e % rest;
                a[r * m + k] -= a[r * m + col] * a[col * m + k];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) y[mat] = (float)det_state[0];
        __syncthreads();
    }
}

// Binarizer: 1 where x > threshold, else 0 (NaN gives 0).
extern "C" __global__ void binarize_f32(const float* x, float* y, long long n, float threshold) {
    GRID_STRIDE(i, n) { y[i] = x[i] > threshold ? 1.0f : 0.0f; }
}

// A TreeEnsemble node as crates/runtime/src/cuda/ml.rs lays it out. A branch ≥ 0 is a node, < 0 the
// leaf −1 − branch.
struct TreeNode {
    int feature;
    int mode;  // nodes_modes: 0 ≤, 1 <, 2 ≥, 3 >, 4 ==, 5 !=, 6 member of a set
    int true_branch;
    int false_branch;
    int missing_true;  // a NaN feature takes the true branch
    int member_start;  // the set's first value in `members` (mode 6)
    int member_count;
    float split;
};

__device__ __forceinline__ bool tree_test(const TreeNode& node, float v, const float* members) {
    switch (node.mode) {
        case 0: return v <= node.split;
        case 1: return v < node.split;
        case 2: return v >= node.split;
        case 3: return v > node.split;
        case 4: return v == node.split;
        case 5: return v != node.split;
        default:
            for (int j = 0; j < node.member_count; ++j) {
                if (members[node.member_start + j] == v) return true;
            }
            return false;
    }
}

// The leaf each (row, tree) reaches: one thread per pair, walking at most `steps` nodes (the
// host checked that every walk ends at a leaf in fewer).
extern "C" __global__ void tree_leaves_f32(const float* x, const TreeNode* nodes,
                                           const float* members, const int* roots, int* leaves,
                                           long long rows, long long trees, long long width,
                                           long long steps) {
    GRID_STRIDE(i, rows * trees) {
        const float* features = x + (i / trees) * width;
        int at = roots[i % trees];
        for (long long s = 0; at >= 0 && s < steps; ++s) {
            const TreeNode& node = nodes[at];
            float v = features[node.feature];
            bool go_true = (v != v && node.missing_true) || tree_test(node, v, members);
            at = go_true ? node.true_branch : node.false_branch;
        }
        leaves[i] = at < 0 ? -1 - at : -1;
    }
}

// Each row's scores from its leaves, trees in order (the CPU kernel's order, so the same sums):
// aggregate 0 average, 1 sum, 2 min, 3 max; then post_transform 0 none, 1 softmax, 2 logistic,
// 3 softmax keeping zeros. One thread per row.
extern "C" __global__ void tree_aggregate_f32(const int* leaves, const float* weights,
                                              const int* leaf_targets, float* y, long long rows,
                                              long long trees, long long targets, int aggregate,
                                              int post) {
    const float largest = 3.40282347e+38f;
    GRID_STRIDE(row, rows) {
        float* scores = y + row * targets;
        float start = aggregate == 2 ? largest : (aggregate == 3 ? -largest : 0.0f);
        for (long long t = 0; t < targets; ++t) scores[t] = start;
        for (long long tree = 0; tree < trees; ++tree) {
            int leaf = leaves[row * trees + tree];
            if (leaf < 0) continue;
            float w = weights[leaf];
            float* s = scores + leaf_targets[leaf];
            switch (aggregate) {
                case 0: *s = *s + w / (float)trees; break;
                case 1: *s = *s + w; break;
                case 2: *s = fminf(*s, w); break;
                default: *s = fmaxf(*s, w); break;
            }
        }
        if (post == 2) {
            for (long long t = 0; t < targets; ++t) scores[t] = 1.0f / (1.0f + expf(-scores[t]));
        } else if (post == 1 || post == 3) {
            float top = -PC_INFINITY;
            for (long long t = 0; t < targets; ++t) top = fmaxf(top, scores[t]);
            float sum = 0.0f;
            for (long long t = 0; t < targets; ++t) {
                float e = (post == 3 && scores[t] == 0.0f) ? 0.0f : expf(scores[t] - top);
                scores[t] = e;
                sum += e;
            }
            for (long long t = 0; t < targets; ++t) scores[t] /= sum;
        }
    }
}

// Trilu: x where column − row ≥ k (upper) or ≤ k (lower) in each trailing rows × cols matrix,
// else 0.
extern "C" __global__ void trilu_f32(const float* x, float* y, long long n, long long rows,
                                     long long cols, long long k, int upper) {
    GRID_STRIDE(i, n) {
        long long diagonal = i % cols - (i / cols) % rows;
        bool keep = upper ? diagonal >= k : diagonal <= k;
        y[i] = keep ? x[i] : 0.0f;
    }
}

// Col2Im as a gather: position p of image plane `plane` (= n·C + c) sums the column entries
// landing on it, x[plane · plane_stride + source] for the sources listed in
// sources[starts[p] .. starts[p + 1]] (k · L + l, in the CPU kernel's order). A thread per
// output.
extern "C" __global__ void col2im_f32(const float* x, const long long* starts,
                                      const long long* sources, float* y, long long planes,
                                      long long image_size, long long plane_stride) {
    GRID_STRIDE(i, planes * image_size) {
        long long p = i % image_size;
        const float* in = x + (i / image_size) * plane_stride;
        float acc = 0.0f;
        for (long long s = starts[p]; s < starts[p + 1]; ++s) acc += in[sources[s]];
        y[i] = acc;
    }
}

// OneHot: y [outer, depth, inner] is values[1] where d equals the line's index hot[o·inner + i]
// (already normalised), else values[0].
extern "C" __global__ void one_hot_f32(const long long* hot, const float* values, float* y,
                                       long long n, long long depth, long long inner) {
    GRID_STRIDE(f, n) {
        long long rest = f % (depth * inner);
        long long line = (f / (depth * inner)) * inner + rest % inner;
        y[f] = values[hot[line] == rest / inner ? 1 : 0];
    }
}

// IEEE total order as a signed integer (Rust's total_cmp): negative values' magnitude bits
// flipped, so NaNs sort beyond the infinities by sign.
__device__ __forceinline__ int total_order_key(float v) {
    int bits = __float_as_int(v);
    return bits ^ (int)((unsigned)(bits >> 31) >> 1);
}

// Reduction over axes that are not the trailing ones (`kept` and `reduced` as for reduce_f32):
// one block per output, its threads striding over the reduced positions, so a reduction to few
// outputs (axis 0 of a [1000, 3] tensor: 3) runs in parallel rather than on a thread each.
extern "C" __global__ void reduce_blocks_f32(const float* x, float* y, long long n_out,
                                             Dims kept, Dims reduced, long long count, int op) {
    extern __shared__ float scratch[];
    int how = reduce_combine(op);
    for (long long i = blockIdx.x; i < n_out; i += gridDim.x) {
        long long base, off, unused_b, unused_c;
        offsets(kept, i, &base, &unused_b, &unused_c);
        float shift = 0.0f;
        if (op == 8) {
            float m = -PC_INFINITY;
            for (long long r = threadIdx.x; r < count; r += blockDim.x) {
                offsets(reduced, r, &off, &unused_b, &unused_c);
                m = fmaxf(m, x[base + off]);
            }
            shift = finite_shift(block_reduce(m, COMBINE_MAX, scratch));
        }
        float acc = reduce_init(op);
        for (long long r = threadIdx.x; r < count; r += blockDim.x) {
            offsets(reduced, r, &off, &unused_b, &unused_c);
            acc = combine(acc, reduce_term(op, x[base + off], shift), how);
        }
        float total = block_reduce(acc, how, scratch);
        if (threadIdx.x == 0) y[i] = reduce_finish(op, total, shift, count);
    }
}

// ---- 3-D Conv and ConvTranspose (crates/runtime/src/cuda/conv3d.rs) ----

// The geometry of a 3-D convolution: input [n, c, d, h, w], output [n, m, od, oh, ow], kernel,
// strides, leading pads and dilations per spatial axis (depth, height, width).
struct Window3d {
    long long n, c, m, groups;
    long long in[3], out[3], kernel[3], stride[3], pad[3], dilation[3];
};

// 3-D Conv (transposed = 0; weights [m, c/groups, kd, kh, kw]) or ConvTranspose (transposed =
// 1; weights [c, m/groups, kd, kh, kw], pads cut from the output's start), one thread per
// output value gathering the taps that reach it. The bias (m values) is read only when has_bias.
extern "C" __global__ void conv3d_f32(const float* x, const float* wt, const float* bias,
                                      float* y, Window3d g, int transposed, int has_bias) {
    long long cg = g.c / g.groups, mg = g.m / g.groups;
    long long taps = g.kernel[0] * g.kernel[1] * g.kernel[2];
    long long volume = g.in[0] * g.in[1] * g.in[2];
    long long total = g.n * g.m * g.out[0] * g.out[1] * g.out[2];
    GRID_STRIDE(i, total) {
        long long o[3];
        long long t = i;
        for (int a = 2; a >= 0; --a) {
            o[a] = t % g.out[a];
            t /= g.out[a];
        }
        long long oc = t % g.m, b = t / g.m, group = oc / mg, within = oc % mg;
        float acc = has_bias ? bias[oc] : 0.0f;
        for (long long ci = 0; ci < cg; ++ci) {
            long long channel = group * cg + ci;
            const float* plane = x + (b * g.c + channel) * volume;
            const float* w = wt + (transposed ? channel * mg + within : oc * cg + ci) * taps;
            for (long long k = 0; k < taps; ++k) {
                long long kk[3] = {k / (g.kernel[1] * g.kernel[2]), (k / g.kernel[2]) % g.kernel[1],
                                   k % g.kernel[2]};
                long long at = 0;
                bool inside = true;
                for (int a = 0; a < 3 && inside; ++a) {
                    long long p;
                    if (transposed) {
                        long long s = o[a] + g.pad[a] - kk[a] * g.dilation[a];
                        inside = s >= 0 && s % g.stride[a] == 0 && s / g.stride[a] < g.in[a];
                        p = s / g.stride[a];
                    } else {
                        p = o[a] * g.stride[a] + kk[a] * g.dilation[a] - g.pad[a];
                        inside = p >= 0 && p < g.in[a];
                    }
                    at = at * g.in[a] + p;
                }
                if (inside) acc += plane[at] * w[k];
            }
        }
        y[i] = acc;
    }
}

// ---- Masks and narrow floats (crates/runtime/src/cuda/masks.rs) ----
// A boolean tensor on the device is held as floats, 0 or 1 (exact, and every float kernel can
// read it); these kernels make and combine such masks, choose by one, and round floats to the
// narrow formats a Cast names.

// Codes shared with masks.rs (`compare_code`): a OP b as 0 or 1 (`mask_binary_flat_f32` too).
__device__ __forceinline__ float compare_value(float u, float v, int op) {
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
    return r ? 1.0f : 0.0f;
}

// y = a OP b as 0 or 1, both broadcast.
extern "C" __global__ void mask_binary_f32(const float* a, const float* b, float* y, long long n,
                                           Dims d, int op) {
    GRID_STRIDE(i, n) {
        long long oa, ob, oc;
        offsets(d, i, &oa, &ob, &oc);
        y[i] = compare_value(a[oa], b[ob], op);
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
// `max`, kept as float: round to nearest, ties to even, as crates/runtime/src/narrow.rs (`MiniFloat`)
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

// ---- Element-wise fast paths (crates/runtime/src/cuda/flat.rs chooses them on the host) ----
//
// When every operand is the output's shape, one element, or a row the output repeats (its
// shape, leading 1s aside, the output's trailing dims) and the output holds fewer than 2^31
// elements, operand k is read at `i`, 0 or `i mod len_k`: 32-bit indices, one 32-bit remainder
// at most per operand, instead of a 64-bit division and remainder per dimension (`offsets`).

#define GRID_STRIDE32(i, n) \
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += blockDim.x * gridDim.x)

// Position of output element `i` in an operand of `len` elements (`len` is n, 1 or a row's).
__device__ __forceinline__ unsigned int flat_at(unsigned int i, unsigned int len,
                                                unsigned int n) {
    return len == n ? i : (len == 1 ? 0u : i % len);
}

extern "C" __global__ void binary_flat_f32(const float* a, const float* b, float* y,
                                           unsigned int n, unsigned int a_len,
                                           unsigned int b_len, int op) {
    GRID_STRIDE32(i, n) {
        y[i] = binary_value(a[flat_at(i, a_len, n)], b[flat_at(i, b_len, n)], op);
    }
}

extern "C" __global__ void mask_binary_flat_f32(const float* a, const float* b, float* y,
                                                unsigned int n, unsigned int a_len,
                                                unsigned int b_len, int op) {
    GRID_STRIDE32(i, n) {
        y[i] = compare_value(a[flat_at(i, a_len, n)], b[flat_at(i, b_len, n)], op);
    }
}

// y = cond != 0 ? a : b, cond a device mask (`where_mask_f32`'s fast path).
extern "C" __global__ void where_mask_flat_f32(const float* cond, const float* a, const float* b,
                                               float* y, unsigned int n, unsigned int c_len,
                                               unsigned int a_len, unsigned int b_len) {
    GRID_STRIDE32(i, n) {
        y[i] = cond[flat_at(i, c_len, n)] != 0.0f ? a[flat_at(i, a_len, n)]
                                                  : b[flat_at(i, b_len, n)];
    }
}

// y = cond ? a : b, cond bytes uploaded from a host boolean tensor (`where_f32`'s fast path).
extern "C" __global__ void where_flat_f32(const unsigned char* cond, const float* a,
                                          const float* b, float* y, unsigned int n,
                                          unsigned int c_len, unsigned int a_len,
                                          unsigned int b_len) {
    GRID_STRIDE32(i, n) {
        y[i] = cond[flat_at(i, c_len, n)] ? a[flat_at(i, a_len, n)] : b[flat_at(i, b_len, n)];
    }
}

// ---- MatMulNBits (crates/runtime/src/cuda/nbits.rs) ----

// W [n, k] from MatMulNBits' packed weight: element (col, j) is value j % block of block
// j / block of column col (`bits` bits, low bits first in each byte, `blob` bytes a block),
// less its zero point, times its scale (one per column and block). Zero points: zero_kind 0
// the default 2^(bits-1), 1 floats [n · blocks], 2 packed like the values, `zp_row` bytes a
// column. The CPU kernel's arithmetic, in its order.
extern "C" __global__ void dequant_nbits_f32(const unsigned char* packed, const float* scales,
                                             const unsigned char* zp_packed,
                                             const float* zp_float, float* w, long long n,
                                             long long k, long long block, long long blob,
                                             int bits, int zero_kind, long long zp_row) {
    long long blocks = (k + block - 1) / block;
    long long per_byte = 8 / bits;
    int mask = (1 << bits) - 1;
    GRID_STRIDE(e, n * k) {
        long long col = e / k, j = e % k, b = j / block, i = j % block;
        int byte = packed[(col * blocks + b) * blob + i / per_byte];
        int q = (byte >> ((i % per_byte) * bits)) & mask;
        float zero;
        if (zero_kind == 1) {
            zero = zp_float[col * blocks + b];
        } else if (zero_kind == 2) {
            int zb = zp_packed[col * zp_row + b / per_byte];
            zero = (float)((zb >> ((b % per_byte) * bits)) & mask);
        } else {
            zero = (float)(1 << (bits - 1));
        }
        w[e] = ((float)q - zero) * scales[col * blocks + b];
    }
}

// ---- MelWeightMatrix (crates/runtime/src/cuda/mel_weights.rs) ----

// y [bins, mel] of triangular filters: filter i rises over spectrogram bins edges[i] ..=
// edges[i+1] and falls over edges[i+1] .. edges[i+2] (edges from the host, as the CPU kernel
// computes them). The CPU kernel writes the rising side, then the falling one, so the falling
// side owns the centre bin; a filter whose first two edges meet is 1 at its centre.
extern "C" __global__ void mel_weights_f32(const long long* edges, float* y, long long bins,
                                           long long mel) {
    GRID_STRIDE(e, bins * mel) {
        long long j = e / mel, i = e % mel;
        long long left = edges[i], center = edges[i + 1], right = edges[i + 2];
        double v = 0.0;
        if (j >= center && j < right) {
            v = (double)(right - j) / (double)(right - center);
        } else if (center == left) {
            v = j == center ? 1.0 : 0.0;
        } else if (j >= left && j <= center) {
            v = (double)(j - left) / (double)(center - left);
        }
        y[e] = (float)v;
    }
}

// ---- Bernoulli (crates/runtime/src/cuda/random.rs) ----

// Draw i (from 0) of the CPU kernel's SplitMix64 stream seeded with `seed`: the generator only
// adds γ to its state before mixing, so any draw is computed from its position alone.
__device__ __forceinline__ unsigned long long splitmix64_at(unsigned long long seed,
                                                           unsigned long long i) {
    unsigned long long z = seed + (i + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Bernoulli: y[i] = 1 where the uniform of draw i (its top 24 bits over 2^24, exact in a
// float) is below p[i], else 0: the CPU kernel's draws, a thread per element.
extern "C" __global__ void bernoulli_f32(const float* p, float* y, long long n,
                                         unsigned long long seed) {
    GRID_STRIDE(i, n) {
        float u = (float)(splitmix64_at(seed, (unsigned long long)i) >> 40) * 0x1p-24f;
        y[i] = u < p[i] ? 1.0f : 0.0f;
    }
}

// ---- LabelEncoder of float keys and values (crates/runtime/src/cuda/ml.rs) ----

// Each element's value by binary search over `count` distinct ascending keys (−0 equals 0 under
// ==), a NaN mapped to nan_value, a miss to fallback.
extern "C" __global__ void label_encode_f32(const float* x, const float* keys,
                                            const float* values, float* y, long long n,
                                            long long count, float nan_value, float fallback) {
    GRID_STRIDE(e, n) {
        float v = x[e];
        float out = fallback;
        if (v != v) {
            out = nan_value;
        } else {
            long long lo = 0, hi = count;
            while (lo < hi) {
                long long mid = (lo + hi) / 2;
                if (keys[mid] < v) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            if (lo < count && keys[lo] == v) out = values[lo];
        }
        y[e] = out;
    }
}

// ---- TopK by bitonic sort (crates/runtime/src/cuda/top_k.rs) ----

// Whether (a, index ia) comes before (b, index ib) in TopK's order: larger (or smaller when
// !largest) by IEEE total order, equal values by index (the CPU kernel's stable order). An
// index below 0 marks padding, which comes after everything.
__device__ __forceinline__ bool top_k_before(float a, float ia, float b, float ib, int largest) {
    if (ia < 0.0f) return false;
    if (ib < 0.0f) return true;
    int ka = total_order_key(a), kb = total_order_key(b);
    if (ka != kb) return largest ? ka > kb : ka < kb;
    return ia < ib;
}

// One compare-exchange of a bitonic sort network over a line of p (a power of two) values and
// indices: position j and its partner j ^ stride, into ascending order ("before" first) within
// blocks of `size` whose position & size is 0, descending in the others, so that `size`
// doubling to p leaves the whole line in order. v and ix start at position `base` of the line.
__device__ __forceinline__ void top_k_exchange(float* v, float* ix, long long j, long long base,
                                               long long size, long long stride, int largest) {
    long long partner = j ^ stride;
    if (partner <= j) return;
    bool ascending = ((base + j) & size) == 0;
    bool swap = ascending ? top_k_before(v[partner], ix[partner], v[j], ix[j], largest)
                          : top_k_before(v[j], ix[j], v[partner], ix[partner], largest);
    if (swap) {
        float t = v[j];
        v[j] = v[partner];
        v[partner] = t;
        t = ix[j];
        ix[j] = ix[partner];
        ix[partner] = t;
    }
}

// TopK of lines of up to p ≤ 4096 elements (p a power of two ≥ n) of x [outer, n, inner]: a
// block per line sorts it in shared memory (p values, then p indices) by the bitonic network,
// O(p log² p) comparisons spread over the block, and writes its first k.
extern "C" __global__ void top_k_block_f32(const float* x, float* values, float* indices,
                                           long long lines, long long n, long long inner,
                                           long long k, long long p, int largest) {
    extern __shared__ float top_k_line[];
    float* v = top_k_line;
    float* ix = top_k_line + p;
    for (long long line = blockIdx.x; line < lines; line += gridDim.x) {
        long long o = line / inner, i = line % inner;
        for (long long j = threadIdx.x; j < p; j += blockDim.x) {
            bool real = j < n;
            v[j] = real ? x[(o * n + j) * inner + i] : 0.0f;
            ix[j] = real ? (float)j : -1.0f;
        }
        __syncthreads();
        for (long long size = 2; size <= p; size <<= 1) {
            for (long long stride = size >> 1; stride > 0; stride >>= 1) {
                for (long long j = threadIdx.x; j < p; j += blockDim.x) {
                    top_k_exchange(v, ix, j, 0, size, stride, largest);
                }
                __syncthreads();
            }
        }
        for (long long r = threadIdx.x; r < k; r += blockDim.x) {
            values[(o * k + r) * inner + i] = v[r];
            indices[(o * k + r) * inner + i] = ix[r];
        }
        __syncthreads();
    }
}

// Longer lines sort in global memory: top_k_load_f32 copies each line of x [outer, n, inner]
// into row `line` of v, ix [lines, p] (padding marked by index −1); top_k_chunk_f32 runs the
// steps whose partners lie in one chunk of `chunk` positions in shared memory, and
// top_k_step_f32 one step of a larger stride over every line; top_k_store_f32 writes the
// first k.
extern "C" __global__ void top_k_load_f32(const float* x, float* v, float* ix, long long lines,
                                          long long n, long long inner, long long p) {
    GRID_STRIDE(e, lines * p) {
        long long line = e / p, j = e % p, o = line / inner, i = line % inner;
        bool real = j < n;
        v[e] = real ? x[(o * n + j) * inner + i] : 0.0f;
        ix[e] = real ? (float)j : -1.0f;
    }
}

extern "C" __global__ void top_k_step_f32(float* v, float* ix, long long lines, long long p,
                                          long long size, long long stride, int largest) {
    GRID_STRIDE(e, lines * p) {
        long long line = e / p;
        top_k_exchange(v + line * p, ix + line * p, e % p, 0, size, stride, largest);
    }
}

// The steps of strides below `chunk` in shared memory, a block per (line, chunk): with
// `presort` every size from 2 to `chunk` (each chunk sorted, in the direction the network
// wants it), else those of `size` (> chunk), after the global steps of its larger strides.
extern "C" __global__ void top_k_chunk_f32(float* v, float* ix, long long lines, long long p,
                                           long long chunk, long long size, int presort,
                                           int largest) {
    extern __shared__ float top_k_part[];
    float* sv = top_k_part;
    float* si = top_k_part + chunk;
    long long chunks = p / chunk;
    for (long long b = blockIdx.x; b < lines * chunks; b += gridDim.x) {
        long long line = b / chunks, base = (b % chunks) * chunk;
        float* lv = v + line * p + base;
        float* li = ix + line * p + base;
        for (long long j = threadIdx.x; j < chunk; j += blockDim.x) {
            sv[j] = lv[j];
            si[j] = li[j];
        }
        __syncthreads();
        long long first = presort ? 2 : size, last = presort ? chunk : size;
        for (long long s = first; s <= last; s <<= 1) {
            long long top = s < chunk ? s / 2 : chunk / 2;
            for (long long stride = top; stride > 0; stride >>= 1) {
                for (long long j = threadIdx.x; j < chunk; j += blockDim.x) {
                    top_k_exchange(sv, si, j, base, s, stride, largest);
                }
                __syncthreads();
            }
        }
        for (long long j = threadIdx.x; j < chunk; j += blockDim.x) {
            lv[j] = sv[j];
            li[j] = si[j];
        }
        __syncthreads();
    }
}

extern "C" __global__ void top_k_store_f32(const float* v, const float* ix, float* values,
                                           float* indices, long long lines, long long inner,
                                           long long k, long long p) {
    GRID_STRIDE(e, lines * k) {
        long long line = e / k, r = e % k, o = line / inner, i = line % inner;
        values[(o * k + r) * inner + i] = v[line * p + r];
        indices[(o * k + r) * inner + i] = ix[line * p + r];
    }
}

// ---- DFT as a fast transform (crates/runtime/src/cuda/fft.rs) ----
// Lines of complex doubles (re, im pairs), `m` (a power of two) a line, in `lines` rows.

// Row `line` of buf [lines, m] from line `line` of x [outer, n, inner, parts]: its first
// `samples` samples, each times chirp[j] when `chirped` (Bluestein's), then zeros.
extern "C" __global__ void fft_load_f64(const float* x, const double* chirp, double* buf,
                                        long long outer, long long n, long long inner,
                                        int parts, long long samples, long long m,
                                        int chirped) {
    GRID_STRIDE(e, outer * inner * m) {
        long long j = e % m, line = e / m, o = line / inner, i = line % inner;
        double re = 0.0, im = 0.0;
        if (j < samples) {
            long long at = ((o * n + j) * inner + i) * parts;
            re = x[at];
            im = parts == 2 ? (double)x[at + 1] : 0.0;
            if (chirped) {
                double c = chirp[2 * j], s = chirp[2 * j + 1];
                double r = re * c - im * s;
                im = re * s + im * c;
                re = r;
            }
        }
        buf[2 * e] = re;
        buf[2 * e + 1] = im;
    }
}

// One radix-2 Stockham step over every row of src into dst (both [lines, m]): with span
// `stride` (1, 2, 4, … m/2) and h = m / (2·stride), butterfly (p, q) reads p and p + h of
// sub-sequence q and writes their sum at 2p and their difference times twiddle[p·stride]
// at 2p + 1; log₂ m steps leave the transform in natural order, no bit reversal.
extern "C" __global__ void fft_step_f64(const double* src, double* dst, const double* twiddle,
                                        long long lines, long long m, long long stride) {
    long long h = m / (2 * stride);
    GRID_STRIDE(e, lines * (m / 2)) {
        long long line = e / (m / 2), t = e % (m / 2), p = t / stride, q = t % stride;
        const double* in = src + 2 * line * m;
        double* out = dst + 2 * line * m;
        long long a = q + stride * p, b = q + stride * (p + h);
        double ar = in[2 * a], ai = in[2 * a + 1], br = in[2 * b], bi = in[2 * b + 1];
        double c = twiddle[2 * p * stride], s = twiddle[2 * p * stride + 1];
        double dr = ar - br, di = ai - bi;
        long long even = q + stride * (2 * p), odd = q + stride * (2 * p + 1);
        out[2 * even] = ar + br;
        out[2 * even + 1] = ai + bi;
        out[2 * odd] = dr * c - di * s;
        out[2 * odd + 1] = dr * s + di * c;
    }
}

// Every row of buf [lines, m] times filter [m], element by element (Bluestein's convolution).
extern "C" __global__ void fft_multiply_f64(double* buf, const double* filter, long long lines,
                                            long long m) {
    GRID_STRIDE(e, lines * m) {
        long long j = e % m;
        double re = buf[2 * e], im = buf[2 * e + 1];
        double c = filter[2 * j], s = filter[2 * j + 1];
        buf[2 * e] = re * c - im * s;
        buf[2 * e + 1] = re * s + im * c;
    }
}

// y [outer, kept, inner, 2] from the first `kept` values of each row of buf [lines, m], times
// chirp[k] when `chirped`, times `scale`, rounded to float.
extern "C" __global__ void fft_store_f32(const double* buf, const double* chirp, float* y,
                                         long long outer, long long kept, long long inner,
                                         long long m, double scale, int chirped) {
    GRID_STRIDE(e, outer * kept * inner) {
        long long i = e % inner, k = (e / inner) % kept, o = e / (inner * kept);
        long long at = (o * inner + i) * m + k;
        double re = buf[2 * at], im = buf[2 * at + 1];
        if (chirped) {
            double c = chirp[2 * k], s = chirp[2 * k + 1];
            double r = re * c - im * s;
            im = re * s + im * c;
            re = r;
        }
        y[2 * e] = (float)(re * scale);
        y[2 * e + 1] = (float)(im * scale);
    }
}

// Fused transformer steps (crates/runtime/src/cuda/fuse.rs): nodes the exporters write out, run as one
// launch each.

// Gelu as exporters write it out, y = (t · (erf(t / div) + add)) · mul, on t = x or, folding the
// Add of a bias row before it, t = x + bias[i mod cols]; each operation in the nodes' order.
extern "C" __global__ void fused_gelu_f32(const float* x, const float* bias, float* y,
                                          long long n, long long cols, int has_bias, float div,
                                          float add, float mul) {
    GRID_STRIDE(i, n) {
        float t = has_bias ? x[i] + bias[i % cols] : x[i];
        y[i] = (t * (erff(t / div) + add)) * mul;
    }
}

// A MatMul's bias row written into its output before cuBLAS adds the product (beta = 1):
// y[i] = bias[i mod cols], plus residual[i] when has_residual (an Add after the bias's).
extern "C" __global__ void bias_rows_f32(const float* bias, const float* residual, float* y,
                                         long long n, long long cols, int has_residual) {
    GRID_STRIDE(i, n) {
        float b = bias[i % cols];
        y[i] = has_residual ? b + residual[i] : b;
    }
}

// SiLU as exporters write it out, y = x · sigmoid(x) (Sigmoid, then Mul by x), times
// other[i] when has_other (the Mul by a gate of the same shape after it: SwiGLU); each
// operation as the unfused kernels do it.
extern "C" __global__ void fused_silu_f32(const float* x, const float* other, float* y,
                                          long long n, int has_other) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float s = v * (1.0f / (1.0f + expf(-v)));
        y[i] = has_other ? s * other[i] : s;
    }
}
