/*
 * stages/train/optim_gpu.cu — elementwise and reduction kernels of the GPU optimizers (train/optim_gpu.h).
 * Every reduction uses a fixed grid and a fixed summation order, so results are bitwise repeatable.
 */
#include "train/optim_gpu.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

namespace {

__device__ __forceinline__ float og_lerp(float a, float b, float w) {   /* torch.lerp, two branches */
    return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

__device__ __forceinline__ float og_clip(const double *sumsq, float max_norm) {
    if (!sumsq || max_norm <= 0.f) return 1.f;
    double c = (double)max_norm / (sqrt(*sumsq) + 1e-6);
    return c < 1.0 ? (float)c : 1.f;
}

template <typename T>
__device__ __forceinline__ double og_sq(T v);
template <>
__device__ __forceinline__ double og_sq<float>(float v) { return (double)v * v; }
template <>
__device__ __forceinline__ double og_sq<__nv_bfloat16>(__nv_bfloat16 v) {
    double f = __bfloat162float(v);
    return f * f;
}

/* block b sums elements b·256 + t + k·(256·OG_PARTIALS) in a fixed tree: deterministic */
template <typename T>
__global__ void og_partial_kernel(const T *x, size_t n, double *partials) {
    __shared__ double sh[256];
    double s = 0;
    for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < n; i += (size_t)256 * OG_PARTIALS) s += og_sq<T>(x[i]);
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

__global__ void og_final_kernel(const double *partials, double *out, float *out_f, int accumulate) {
    double s = 0;
    for (int i = 0; i < OG_PARTIALS; i++) s += partials[i];
    double r = accumulate ? *out + s : s;
    *out = r;
    if (out_f) *out_f = (float)r;
}

__global__ void og_scale_kernel(float *g, size_t n, float s) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) g[i] *= s;
}

__global__ void og_muon_prep_kernel(float *mom, const float *g, __nv_bfloat16 *x, size_t n, float mu, int nesterov,
                                    const double *sumsq, float max_norm) {
    const float clip = og_clip(sumsq, max_norm);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = clip == 1.f ? g[i] : g[i] * clip;
        float m = og_lerp(mom[i], gi, 1.0f - mu);
        mom[i] = m;
        x[i] = __float2bfloat16(nesterov ? og_lerp(gi, m, mu) : m);
    }
}

__global__ void og_muon_normalize_kernel(__nv_bfloat16 *x, size_t n, const double *ss, float eps) {
    float norm = __bfloat162float(__float2bfloat16((float)sqrt(*ss)));
    if (norm < eps) norm = eps;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(__bfloat162float(x[i]) / norm);
}

__global__ void og_muon_update_kernel(float *w, __nv_bfloat16 *copy, const __nv_bfloat16 *x, size_t n, float decay,
                                      float adj) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = w[i] * decay;
        v = v - adj * __bfloat162float(x[i]);
        w[i] = v;
        if (copy) copy[i] = __float2bfloat16(v);
    }
}

/* ---- multi-tensor and batched forms (issue 28): the same per-element arithmetic and reduction order as the
 * kernels above, one launch for a whole table or shape group (blockIdx.y = the tensor / matrix). */

/* g *= scale (when scale != 1) fused with og_partial_kernel<float>'s partials, per table entry: bitwise the same as
 * og_scale followed by og_sumsq_f32's partials. */
__global__ void og_partial_multi_kernel(const og_vec *tab, float scale, double *partials) {
    const og_vec t = tab[blockIdx.y];
    __shared__ double sh[256];
    double s = 0;
    for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < t.n; i += (size_t)256 * OG_PARTIALS) {
        float v = t.g[i];
        if (scale != 1.0f) {
            v *= scale;
            t.g[i] = v;
        }
        s += og_sq<float>(v);
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[(size_t)blockIdx.y * OG_PARTIALS + blockIdx.x] = sh[0];
}

/* the table's total in table order, each tensor's partials summed serially first: og_final_kernel's arithmetic */
__global__ void og_final_multi_kernel(const double *partials, int nt, double *out, float *out_f) {
    double r = 0;
    for (int t = 0; t < nt; t++) {
        double s = 0;
        for (int i = 0; i < OG_PARTIALS; i++) s += partials[(size_t)t * OG_PARTIALS + i];
        r = t == 0 ? s : r + s;
    }
    *out = r;
    if (out_f) *out_f = (float)r;
}

__global__ void og_partial_bf16_batched_kernel(const __nv_bfloat16 *x, size_t ne, double *partials) {
    const __nv_bfloat16 *xb = x + (size_t)blockIdx.y * ne;
    __shared__ double sh[256];
    double s = 0;
    for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < ne; i += (size_t)256 * OG_PARTIALS)
        s += og_sq<__nv_bfloat16>(xb[i]);
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[(size_t)blockIdx.y * OG_PARTIALS + blockIdx.x] = sh[0];
}

__global__ void og_final_batched_kernel(const double *partials, int nb, double *out) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= nb) return;
    double s = 0;
    for (int i = 0; i < OG_PARTIALS; i++) s += partials[(size_t)j * OG_PARTIALS + i];
    out[j] = s;
}

__global__ void og_muon_prep_batched_kernel(const og_muon_ptrs *tab, size_t ne, __nv_bfloat16 *x, float mu,
                                            int nesterov, const double *sumsq, float max_norm) {
    const og_muon_ptrs t = tab[blockIdx.y];
    __nv_bfloat16 *xb = x + (size_t)blockIdx.y * ne;
    const float clip = og_clip(sumsq, max_norm);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < ne; i += (size_t)gridDim.x * blockDim.x) {
        float gi = clip == 1.f ? t.g[i] : t.g[i] * clip;
        float m = og_lerp(t.mom[i], gi, 1.0f - mu);
        t.mom[i] = m;
        xb[i] = __float2bfloat16(nesterov ? og_lerp(gi, m, mu) : m);
    }
}

__global__ void og_muon_normalize_batched_kernel(__nv_bfloat16 *x, size_t ne, const double *ss, float eps) {
    __nv_bfloat16 *xb = x + (size_t)blockIdx.y * ne;
    float norm = __bfloat162float(__float2bfloat16((float)sqrt(ss[blockIdx.y])));
    if (norm < eps) norm = eps;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < ne; i += (size_t)gridDim.x * blockDim.x)
        xb[i] = __float2bfloat16(__bfloat162float(xb[i]) / norm);
}

__global__ void og_muon_update_batched_kernel(const og_muon_ptrs *tab, size_t ne, const __nv_bfloat16 *x, float decay,
                                              float adj) {
    const og_muon_ptrs t = tab[blockIdx.y];
    const __nv_bfloat16 *xb = x + (size_t)blockIdx.y * ne;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < ne; i += (size_t)gridDim.x * blockDim.x) {
        float v = t.w[i] * decay;
        v = v - adj * __bfloat162float(xb[i]);
        t.w[i] = v;
        if (t.copy) ((__nv_bfloat16 *)t.copy)[i] = __float2bfloat16(v);
    }
}

/* The upper-right h x h block of each (m, m) matrix (m = 2h) from the lower-left one, transposed: 32 x 32 tiles through
 * shared memory (coalesced reads of rows, coalesced writes of rows). */
__global__ void og_sym_mirror_kernel(__nv_bfloat16 *a, int m, long long stride) {
    __shared__ __nv_bfloat16 tile[32][33];
    const int h = m / 2;
    __nv_bfloat16 *ab = a + (long long)blockIdx.z * stride;
    const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;   /* tile of the lower-left block: rows h + r0.., cols c0.. */
    for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
        int r = r0 + dy, c = c0 + threadIdx.x;
        if (r < h && c < h) tile[dy][threadIdx.x] = ab[(size_t)(h + r) * m + c];
    }
    __syncthreads();
    for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
        int i = c0 + dy, j = r0 + threadIdx.x;   /* upper-right (i, h + j) = lower-left (h + j, i) */
        if (i < h && j < h) ab[(size_t)i * m + h + j] = tile[threadIdx.x][dy];
    }
}

unsigned og_grid(size_t n) {
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b ? b : 1) : 4096);
}

}  // namespace

extern "C" int og_scale(float *g, size_t n, float s, cudaStream_t st) {
    if (n == 0) return 0;
    og_scale_kernel<<<og_grid(n), 256, 0, st>>>(g, n, s);
    KERNELS_CHECK_LAUNCH("og_scale");
    return 0;
}

extern "C" int og_sumsq_f32(const float *x, size_t n, double *partials, double *out, float *out_f, int accumulate,
                            cudaStream_t st) {
    og_partial_kernel<float><<<OG_PARTIALS, 256, 0, st>>>(x, n, partials);
    KERNELS_CHECK_LAUNCH("og_sumsq_f32 partials");
    og_final_kernel<<<1, 1, 0, st>>>(partials, out, out_f, accumulate);
    KERNELS_CHECK_LAUNCH("og_sumsq_f32 final");
    return 0;
}

extern "C" int og_sumsq_bf16(const bf16 *x, size_t n, double *partials, double *out, cudaStream_t st) {
    og_partial_kernel<__nv_bfloat16><<<OG_PARTIALS, 256, 0, st>>>((const __nv_bfloat16 *)x, n, partials);
    KERNELS_CHECK_LAUNCH("og_sumsq_bf16 partials");
    og_final_kernel<<<1, 1, 0, st>>>(partials, out, NULL, 0);
    KERNELS_CHECK_LAUNCH("og_sumsq_bf16 final");
    return 0;
}

extern "C" int og_muon_prep(float *mom, const float *g, bf16 *x, size_t n, float mu, int nesterov, const double *sumsq,
                            float max_norm, cudaStream_t st) {
    if (n == 0) return 0;
    og_muon_prep_kernel<<<og_grid(n), 256, 0, st>>>(mom, g, (__nv_bfloat16 *)x, n, mu, nesterov, sumsq, max_norm);
    KERNELS_CHECK_LAUNCH("og_muon_prep");
    return 0;
}

extern "C" int og_muon_normalize(bf16 *x, size_t n, const double *ss, float eps, cudaStream_t st) {
    if (n == 0) return 0;
    og_muon_normalize_kernel<<<og_grid(n), 256, 0, st>>>((__nv_bfloat16 *)x, n, ss, eps);
    KERNELS_CHECK_LAUNCH("og_muon_normalize");
    return 0;
}

extern "C" int og_muon_update(float *w, bf16 *copy, const bf16 *x, size_t n, float decay, float adj, cudaStream_t st) {
    if (n == 0) return 0;
    og_muon_update_kernel<<<og_grid(n), 256, 0, st>>>(w, (__nv_bfloat16 *)copy, (const __nv_bfloat16 *)x, n, decay, adj);
    KERNELS_CHECK_LAUNCH("og_muon_update");
    return 0;
}

/* ---- multi-tensor and batched launchers */

extern "C" int og_grad_sumsq_multi(const og_vec *tab, int nt, float scale, double *partials, double *out, float *out_f,
                                   cudaStream_t st) {
    if (nt < 1 || nt > 65535) return kernels_fail("og_grad_sumsq_multi: %d tensors (1..65535)", nt);
    og_partial_multi_kernel<<<dim3(OG_PARTIALS, (unsigned)nt), 256, 0, st>>>(tab, scale, partials);
    KERNELS_CHECK_LAUNCH("og_grad_sumsq_multi partials");
    og_final_multi_kernel<<<1, 1, 0, st>>>(partials, nt, out, out_f);
    KERNELS_CHECK_LAUNCH("og_grad_sumsq_multi final");
    return 0;
}

extern "C" int og_sumsq_bf16_batched(const bf16 *x, size_t ne, int nb, double *partials, double *out, cudaStream_t st) {
    if (nb < 1 || nb > 65535) return kernels_fail("og_sumsq_bf16_batched: batch %d (1..65535)", nb);
    og_partial_bf16_batched_kernel<<<dim3(OG_PARTIALS, (unsigned)nb), 256, 0, st>>>((const __nv_bfloat16 *)x, ne,
                                                                                      partials);
    KERNELS_CHECK_LAUNCH("og_sumsq_bf16_batched partials");
    og_final_batched_kernel<<<(unsigned)((nb + 63) / 64), 64, 0, st>>>(partials, nb, out);
    KERNELS_CHECK_LAUNCH("og_sumsq_bf16_batched final");
    return 0;
}

extern "C" int og_muon_prep_batched(const og_muon_ptrs *tab, int nb, size_t ne, bf16 *x, float mu, int nesterov,
                                    const double *sumsq, float max_norm, cudaStream_t st) {
    if (ne == 0) return 0;
    if (nb < 1 || nb > 65535) return kernels_fail("og_muon_prep_batched: batch %d (1..65535)", nb);
    og_muon_prep_batched_kernel<<<dim3(og_grid(ne), (unsigned)nb), 256, 0, st>>>(tab, ne, (__nv_bfloat16 *)x, mu,
                                                                                  nesterov, sumsq, max_norm);
    KERNELS_CHECK_LAUNCH("og_muon_prep_batched");
    return 0;
}

extern "C" int og_sym_mirror_batched(bf16 *a, int m, int nb, long long stride, cudaStream_t st) {
    if (m < 2 || m % 2 || nb < 1 || nb > 65535 || stride < (long long)m * m)
        return kernels_fail("og_sym_mirror_batched: m %d (even, >= 2), batch %d (1..65535), stride %lld (>= m*m)", m, nb,
                            stride);
    const int h = m / 2, t = (h + 31) / 32;
    og_sym_mirror_kernel<<<dim3((unsigned)t, (unsigned)t, (unsigned)nb), dim3(32, 8), 0, st>>>((__nv_bfloat16 *)a, m,
                                                                                            stride);
    KERNELS_CHECK_LAUNCH("og_sym_mirror_batched");
    return 0;
}

extern "C" int og_muon_normalize_batched(bf16 *x, size_t ne, int nb, const double *ss, float eps, cudaStream_t st) {
    if (ne == 0) return 0;
    if (nb < 1 || nb > 65535) return kernels_fail("og_muon_normalize_batched: batch %d (1..65535)", nb);
    og_muon_normalize_batched_kernel<<<dim3(og_grid(ne), (unsigned)nb), 256, 0, st>>>((__nv_bfloat16 *)x, ne, ss, eps);
    KERNELS_CHECK_LAUNCH("og_muon_normalize_batched");
    return 0;
}

extern "C" int og_muon_update_batched(const og_muon_ptrs *tab, int nb, size_t ne, const bf16 *x, float decay, float adj,
                                      cudaStream_t st) {
    if (ne == 0) return 0;
    if (nb < 1 || nb > 65535) return kernels_fail("og_muon_update_batched: batch %d (1..65535)", nb);
    og_muon_update_batched_kernel<<<dim3(og_grid(ne), (unsigned)nb), 256, 0, st>>>(tab, ne, (const __nv_bfloat16 *)x,
                                                                                    decay, adj);
    KERNELS_CHECK_LAUNCH("og_muon_update_batched");
    return 0;
}
