/*
 * kernels/gemm_ref.c — CPU reference GEMMs (kernels/gemm.h).
 *
 * Both operands are first packed so that every output element is a dot product of two contiguous
 * K-vectors (row i of op(a), column j of op(b)); rows of the output are split across threads.
 * A dot product sums 64-element chunks in float (8 interleaved lanes, so it vectorises) and adds
 * the chunks into a double: the result does not depend on the thread count, and the error stays
 * far below the bf16 tolerances the GPU tests use.
 */
#include "kernels/gemm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double dot(const float *a, const float *b, int K) {
    double acc = 0;
    for (int k0 = 0; k0 < K; k0 += 64) {
        int k1 = K < k0 + 64 ? K : k0 + 64, k = k0;
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t = 0;
        for (; k + 8 <= k1; k += 8)
            for (int l = 0; l < 8; l++) s[l] += a[k + l] * b[k + l];
        for (; k < k1; k++) t += a[k] * b[k];
        acc += (double)(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + t);
    }
    return acc;
}

struct job {
    float *d;
    const float *ap, *bp;   /* packed: ap [M,K], bp [N,K] */
    int M, N, K, r0, r1;
    float alpha, beta;
};

static void *run_rows(void *arg) {
    struct job *j = arg;
    for (int i = j->r0; i < j->r1; i++) {
        const float *ar = j->ap + (size_t)i * j->K;
        float *dr = j->d + (size_t)i * j->N;
        for (int c = 0; c < j->N; c++) {
            double v = (double)j->alpha * dot(ar, j->bp + (size_t)c * j->K, j->K);
            if (j->beta != 0.0f) v += (double)j->beta * dr[c];
            dr[c] = (float)v;
        }
    }
    return NULL;
}

/* Copy the [rows, cols] matrix src (row-major) into dst, transposed when trans. */
static float *pack(const float *src, int trans, int rows, int cols) {
    float *p = malloc((size_t)rows * cols * sizeof *p + 1);
    if (!p) abort();   /* a reference that cannot allocate cannot say anything useful */
    if (!trans) {
        memcpy(p, src, (size_t)rows * cols * sizeof *p);
    } else {       /* src is [cols, rows] */
        for (int c = 0; c < cols; c++)
            for (int r = 0; r < rows; r++) p[(size_t)r * cols + c] = src[(size_t)c * rows + r];
    }
    return p;
}

void gemm_forward_ref(float *d, const float *a, int trans_a, const float *b, int trans_b,
                      int M, int N, int K, float alpha, float beta) {
    if (M <= 0 || N <= 0) return;
    /* ap: op(a) as [M,K]; bp: op(b)ᵀ as [N,K] (b stored [N,K] when trans_b, else [K,N]). */
    float *ap = pack(a, trans_a, M, K);
    float *bp = pack(b, !trans_b, N, K);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = (double)M * N * K < 4e6 ? 1 : (int)(ncpu < 1 ? 1 : ncpu > 8 ? 8 : ncpu);
    if (nt > M) nt = M;
    struct job jobs[8];
    pthread_t th[8];
    int started = 0;
    for (int t = 0; t < nt; t++) {
        jobs[t] = (struct job){d, ap, bp, M, N, K, (int)((long)M * t / nt), (int)((long)M * (t + 1) / nt), alpha, beta};
        if (t > 0 && pthread_create(&th[t], NULL, run_rows, &jobs[t]) == 0) started |= 1 << t;
        else if (t > 0) run_rows(&jobs[t]);   /* no thread: do the rows here */
    }
    run_rows(&jobs[0]);
    for (int t = 1; t < nt; t++)
        if (started & (1 << t)) pthread_join(th[t], NULL);
    free(ap);
    free(bp);
}

void gemm_linear_forward_ref(float *y, const float *x, const float *w, const float *bias,
                             int M, int N, int K) {
    gemm_forward_ref(y, x, 0, w, 1, M, N, K, 1.0f, 0.0f);
    if (bias)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) y[(size_t)i * N + j] += bias[j];
}

void gemm_linear_backward_ref(float *dx, float *dw, float *dbias, const float *dy, const float *x,
                              const float *w, int M, int N, int K, int accumulate) {
    float beta = accumulate ? 1.0f : 0.0f;
    if (dx) gemm_forward_ref(dx, dy, 0, w, 0, M, K, N, 1.0f, beta);   /* [M,N]·[N,K] */
    if (dw) gemm_forward_ref(dw, dy, 1, x, 0, N, K, M, 1.0f, beta);   /* [N,M]·[M,K] */
    if (dbias)
        for (int j = 0; j < N; j++) {
            double s = accumulate ? dbias[j] : 0.0;
            for (int i = 0; i < M; i++) s += dy[(size_t)i * N + j];
            dbias[j] = (float)s;
        }
}
