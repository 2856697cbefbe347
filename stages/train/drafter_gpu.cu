/*
 * stages/train/drafter_gpu.cu — glue kernels of the GPU training step (train/drafter_gpu.h).
 */
#include "train/drafter_gpu.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

__global__ void dg_block_inputs_kernel(int32_t *pos, int32_t *tok, const int32_t *anchors, const int32_t *ids,
                                       const int32_t *position_ids, int Tc, int N, int B, int32_t mask_token) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long R = (long long)N * B;
    if (i < Tc) {
        pos[i] = position_ids[i];
    } else if (i < Tc + R) {
        int r = (int)(i - Tc), b = r / B, j = r % B;
        int a = anchors[b];
        pos[i] = position_ids[a] + j;
        tok[r] = j == 0 ? ids[a] : mask_token;
    }
}

extern "C" int dg_block_inputs(int32_t *pos, int32_t *tok, const int32_t *anchors, const int32_t *input_ids,
                               const int32_t *position_ids, int Tc, int N, int B, int32_t mask_token,
                               cudaStream_t stream) {
    if (Tc < 1 || N < 1 || B < 1) return kernels_fail("dg_block_inputs: bad sizes Tc=%d N=%d B=%d", Tc, N, B);
    long long n = (long long)Tc + (long long)N * B;
    dg_block_inputs_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(pos, tok, anchors, input_ids, position_ids,
                                                                          Tc, N, B, mask_token);
    KERNELS_CHECK_LAUNCH("dg_block_inputs");
    return 0;
}

__global__ void dg_noise_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *in, size_t n_noise, size_t n, uint64_t base,
                                float scale) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float x = __bfloat162float(in[e]);
        if (e < n_noise) {
            uint64_t z = kernels_mix64(base + (uint64_t)(e + 1) * KERNELS_RNG_GAMMA);   /* kernels_rng_next of base + e·γ */
            double u = (double)(z >> 40) * (1.0 / 16777216.0);
            x = x + (float)(2.0 * (u - 0.5) * (double)scale);
        }
        out[e] = __float2bfloat16(x);
    }
}

extern "C" int dg_noise(bf16 *out, const bf16 *in, int T, int Tc, int C, uint64_t base, float scale,
                        cudaStream_t stream) {
    if (T < 0 || Tc < T || C < 1) return kernels_fail("dg_noise: bad sizes T=%d Tc=%d C=%d", T, Tc, C);
    size_t n = (size_t)Tc * C;
    if (n == 0) return 0;
    dg_noise_kernel<<<1024, 256, 0, stream>>>((__nv_bfloat16 *)out, (const __nv_bfloat16 *)in, (size_t)T * C, n, base,
                                              scale);
    KERNELS_CHECK_LAUNCH("dg_noise");
    return 0;
}

__global__ void dg_eal_kernel(int32_t *sum, int32_t *count, const int32_t *arg, const uint8_t *mask, int N, int B,
                              int first) {
    __shared__ int ss[256], sc[256];
    int s_ = 0, c_ = 0;
    for (int b = threadIdx.x; b < N; b += blockDim.x) {
        int any = 0, run = 0, open = 1;
        for (int j = first; j < B; j++) {
            int s = b * B + j;
            any |= mask[s] != 0;
            if (open && mask[s] && arg[2 * s] == arg[2 * s + 1]) run++;
            else open = 0;
        }
        if (any) {
            s_ += run + 1;
            c_ += 1;
        }
    }
    ss[threadIdx.x] = s_;
    sc[threadIdx.x] = c_;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            ss[threadIdx.x] += ss[threadIdx.x + w];
            sc[threadIdx.x] += sc[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *sum = ss[0];
        *count = sc[0];
    }
}

extern "C" int dg_eal(int32_t *sum, int32_t *count, const int32_t *arg, const uint8_t *mask, int N, int B, int first,
                      cudaStream_t stream) {
    if (N < 1 || B < 1 || first < 0) return kernels_fail("dg_eal: bad sizes N=%d B=%d first=%d", N, B, first);
    dg_eal_kernel<<<1, 256, 0, stream>>>(sum, count, arg, mask, N, B, first);
    KERNELS_CHECK_LAUNCH("dg_eal");
    return 0;
}
