/*
 * kernels/gated_delta_ref.c — the gated delta rule in plain C (kernels/gated_delta.h): the per-token
 * recurrence (the specification, double reductions) and the kernel's chunked algorithm in fp32.
 */
#include "kernels/gated_delta.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
/* torch.nn.functional.softplus(beta=1, threshold=20) */
static float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

int gated_delta_check_shape(int n_k, int n_v, int d_k, int d_v, char *err, int err_len) {
    const char *why = NULL;
    if (n_k < 1 || n_v < 1 || d_k < 1 || d_v < 1) why = "every size must be >= 1";
    else if (n_v % n_k) why = "linear_num_key_heads must divide linear_num_value_heads";
    else if (d_k > GATED_DELTA_MAX_DK) why = "linear_key_head_dim is above the GPU kernel's 128";
    if (!why) return 0;
    if (err && err_len > 0)
        snprintf(err, (size_t)err_len, "gated delta rule: %s (linear heads k %d / v %d, head dims k %d / v %d)", why,
                 n_k, n_v, d_k, d_v);
    return -1;
}

/* Token t of the recurrence, every value head, from state [n_v, d_k, d_v] (updated in place). */
static void token_(float *o, const float *q, const float *k, const float *v, const float *b, const float *a,
                   const float *a_neg, const float *dt_bias, const struct gated_delta_shape *s, int t, float *state) {
    const int nv = s->n_v, dk = s->d_k, dv = s->d_v, rep = s->n_v / s->n_k;
    for (int j = 0; j < nv; j++) {
        const float *qt = q + (size_t)t * s->qk_stride + (size_t)(j / rep) * dk;
        const float *kt = k + (size_t)t * s->qk_stride + (size_t)(j / rep) * dk;
        const float *vt = v + (size_t)t * s->v_stride + (size_t)j * dv;
        float beta = sigmoidf_(b[(size_t)t * s->ba_stride + j]);
        float decay = expf(a_neg[j] * softplusf_(a[(size_t)t * s->ba_stride + j] + dt_bias[j]));
        float *S = state + (size_t)j * dk * dv, *ot = o + (size_t)t * nv * dv + (size_t)j * dv;
        for (size_t i = 0; i < (size_t)dk * dv; i++) S[i] *= decay;
        for (int e = 0; e < dv; e++) {
            double m = 0;
            for (int i = 0; i < dk; i++) m += (double)S[(size_t)i * dv + e] * kt[i];
            float delta = (vt[e] - (float)m) * beta;
            for (int i = 0; i < dk; i++) S[(size_t)i * dv + e] += kt[i] * delta;
            double acc = 0;
            for (int i = 0; i < dk; i++) acc += (double)S[(size_t)i * dv + e] * qt[i];
            ot[e] = (float)acc;
        }
    }
}

void gated_delta_forward_ref(float *o, const float *q, const float *k, const float *v, const float *b,
                             const float *a, const float *a_neg, const float *dt_bias, const int32_t *cu_seqlens,
                             const struct gated_delta_shape *s, float *state) {
    for (int d = 0; d < s->n_docs; d++) {
        memset(state, 0, (size_t)s->n_v * s->d_k * s->d_v * sizeof(float));   /* every document starts from zero */
        for (int t = cu_seqlens[d]; t < cu_seqlens[d + 1]; t++) token_(o, q, k, v, b, a, a_neg, dt_bias, s, t, state);
    }
}

void gated_delta_decode_ref(float *o, const float *q, const float *k, const float *v, const float *b, const float *a,
                            const float *a_neg, const float *dt_bias, const int32_t *cu, const int32_t *seq_slot,
                            const int32_t *seq_pos, const struct gated_delta_shape *s, float *state, float *snap,
                            int n_snap) {
    const size_t SS = (size_t)s->n_v * s->d_k * s->d_v;
    for (int i = 0; i < s->n_docs; i++) {
        float *st = state + (size_t)seq_slot[i] * SS;
        for (int t = cu[i]; t < cu[i + 1]; t++) {
            token_(o, q, k, v, b, a, a_neg, dt_bias, s, t, st);
            if (n_snap > 0 && t >= cu[i + 1] - n_snap) {
                int p = seq_pos[i] + (t - cu[i]);
                memcpy(snap + ((size_t)seq_slot[i] * n_snap + (size_t)(p % n_snap)) * SS, st, SS * sizeof(float));
            }
        }
    }
}

/* A chunk's common part (both chunked references): the rows' q, k, beta, the cumulative decay G, A (strictly lower
 * beta_t e^{G_t - G_s} k_t·k_s) and P (lower e^{G_t - G_s} q_t·k_s), dots over i ascending. */
struct chunk_ctx_ {
    float A[GATED_DELTA_CHUNK][GATED_DELTA_CHUNK], P[GATED_DELTA_CHUNK][GATED_DELTA_CHUNK];
    float G[GATED_DELTA_CHUNK], beta[GATED_DELTA_CHUNK];
    const float *K[GATED_DELTA_CHUNK], *Q[GATED_DELTA_CHUNK];
};

static void chunk_setup_(struct chunk_ctx_ *x, const float *q, const float *k, const float *b, const float *a,
                         float a_neg, float dtb, const struct gated_delta_shape *s, int j, int c0, int n) {
    const int dk = s->d_k, hk = j / (s->n_v / s->n_k);
    for (int t = 0; t < n; t++) {
        size_t r = (size_t)(c0 + t);
        x->K[t] = k + r * s->qk_stride + (size_t)hk * dk;
        x->Q[t] = q + r * s->qk_stride + (size_t)hk * dk;
        x->beta[t] = sigmoidf_(b[r * s->ba_stride + j]);
        float g = a_neg * softplusf_(a[r * s->ba_stride + j] + dtb);
        x->G[t] = t ? x->G[t - 1] + g : g;
    }
    for (int t = 0; t < n; t++)
        for (int u = 0; u <= t; u++) {
            float kk = 0, qk = 0;
            for (int i = 0; i < dk; i++) { kk += x->K[t][i] * x->K[u][i]; qk += x->Q[t][i] * x->K[u][i]; }
            x->A[t][u] = u < t ? x->beta[t] * expf(x->G[t] - x->G[u]) * kk : 0.0f;
            x->P[t][u] = expf(x->G[t] - x->G[u]) * qk;
        }
}

/* A chunk's end, for value columns e0..e0+ne-1 with the new values U (n rows of W = 128 columns): o += P·U, then
 * S = e^{G_last} S + Σ_u e^{G_last − G_u} k_u ⊗ U_u. */
static void chunk_finish_(const struct chunk_ctx_ *x, float *o, const struct gated_delta_shape *s, int j, int c0,
                          int n, int e0, int ne, float (*U)[128], float *S) {
    const int dk = s->d_k, dv = s->d_v;
    for (int t = 0; t < n; t++) {
        float *ot = o + (size_t)(c0 + t) * s->n_v * dv + (size_t)j * dv;
        for (int e = 0; e < ne; e++) {
            float acc = 0;
            for (int u = 0; u <= t; u++) acc += x->P[t][u] * U[u][e];
            ot[e0 + e] += acc;
        }
    }
    float gl = expf(x->G[n - 1]);
    for (int i = 0; i < dk; i++)
        for (int e = 0; e < ne; e++) {
            float acc = 0;
            for (int u = 0; u < n; u++) acc += expf(x->G[n - 1] - x->G[u]) * x->K[u][i] * U[u][e];
            S[(size_t)i * dv + e0 + e] = gl * S[(size_t)i * dv + e0 + e] + acc;
        }
}

/* One chunk of n <= 64 tokens starting at row c0 for value head j, every column of S (the kernel
 * runs 64 columns per CTA; columns are independent, so the result is the same). fp32 sums in the
 * kernel's order: dot products over i ascending, substitutions over s ascending. */
static void chunk_(float *o, const float *q, const float *k, const float *v, const float *b, const float *a,
                   float a_neg, float dtb, const struct gated_delta_shape *s, int j, int c0, int n, float *S) {
    enum { C = GATED_DELTA_CHUNK };
    const int dk = s->d_k, dv = s->d_v;
    enum { W = 128 };   /* value columns per pass (bounded stack) */
    struct chunk_ctx_ x;
    chunk_setup_(&x, q, k, b, a, a_neg, dtb, s, j, c0, n);
    float U[C][W];
    float (*A)[C] = x.A, *G = x.G, *beta = x.beta;
    const float *const *K = x.K, *const *Q = x.Q;
    for (int e0 = 0; e0 < dv; e0 += W) {
        int ne = dv - e0 < W ? dv - e0 : W;
        for (int t = 0; t < n; t++) {
            const float *vt = v + (size_t)(c0 + t) * s->v_stride + (size_t)j * dv;
            float *ot = o + (size_t)(c0 + t) * s->n_v * dv + (size_t)j * dv;
            float eg = expf(G[t]);
            for (int e = 0; e < ne; e++) {
                float ks = 0, qs = 0;
                for (int i = 0; i < dk; i++) {
                    ks += K[t][i] * S[(size_t)i * dv + e0 + e];
                    qs += Q[t][i] * S[(size_t)i * dv + e0 + e];
                }
                U[t][e] = beta[t] * (vt[e0 + e] - eg * ks);
                ot[e0 + e] = eg * qs;   /* the inter-chunk part; the intra part is added below */
            }
        }
        for (int t = 1; t < n; t++)
            for (int e = 0; e < ne; e++) {
                float acc = 0;
                for (int u = 0; u < t; u++) acc += A[t][u] * U[u][e];
                U[t][e] -= acc;
            }
        chunk_finish_(&x, o, s, j, c0, n, e0, ne, U, S);
    }
}

typedef void (*chunk_fn_)(float *o, const float *q, const float *k, const float *v, const float *b, const float *a,
                          float a_neg, float dtb, const struct gated_delta_shape *s, int j, int c0, int n, float *S);

/* Every document, every value head: the state from zero, then the document's chunks of <= 64 rows in order. */
static void chunked_walk_(chunk_fn_ fn, float *o, const float *q, const float *k, const float *v, const float *b,
                          const float *a, const float *a_neg, const float *dt_bias, const int32_t *cu_seqlens,
                          const struct gated_delta_shape *s, float *state) {
    for (int d = 0; d < s->n_docs; d++)
        for (int j = 0; j < s->n_v; j++) {
            float *S = state + (size_t)j * s->d_k * s->d_v;
            memset(S, 0, (size_t)s->d_k * s->d_v * sizeof(float));
            for (int c0 = cu_seqlens[d]; c0 < cu_seqlens[d + 1]; c0 += GATED_DELTA_CHUNK) {
                int n = cu_seqlens[d + 1] - c0 < GATED_DELTA_CHUNK ? cu_seqlens[d + 1] - c0 : GATED_DELTA_CHUNK;
                fn(o, q, k, v, b, a, a_neg[j], dt_bias[j], s, j, c0, n, S);
            }
        }
}

void gated_delta_forward_chunked_ref(float *o, const float *q, const float *k, const float *v, const float *b,
                                     const float *a, const float *a_neg, const float *dt_bias,
                                     const int32_t *cu_seqlens, const struct gated_delta_shape *s, float *state) {
    chunked_walk_(chunk_, o, q, k, v, b, a, a_neg, dt_bias, cu_seqlens, s, state);
}

/* One chunk of the split form (gated_delta_forward_split): the chunk-local solves first, W = (I + A)⁻¹ (beta e^G ⊙ K)
 * and U0 = (I + A)⁻¹ (beta ⊙ V), then against the state at the chunk start U = U0 − W S, o = e^G ⊙ Q S + P U and the
 * state update; the same sums in the same order as the three GPU kernels (dots over i ascending, substitutions over
 * u ascending into one accumulator subtracted once). */
static void split_chunk_(float *o, const float *q, const float *k, const float *v, const float *b, const float *a,
                         float a_neg, float dtb, const struct gated_delta_shape *s, int j, int c0, int n, float *S) {
    enum { C = GATED_DELTA_CHUNK, W = 128 };
    const int dk = s->d_k, dv = s->d_v;
    struct chunk_ctx_ x;
    chunk_setup_(&x, q, k, b, a, a_neg, dtb, s, j, c0, n);
    float Wm[C][GATED_DELTA_MAX_DK], U[C][W];
    float (*A)[C] = x.A, *G = x.G, *beta = x.beta;
    const float *const *K = x.K, *const *Q = x.Q;
    /* W = (I + A)⁻¹ (beta e^G ⊙ K): forward substitution per column */
    for (int i = 0; i < dk; i++)
        for (int t = 0; t < n; t++) {
            float acc = 0;
            for (int u = 0; u < t; u++) acc += A[t][u] * Wm[u][i];
            Wm[t][i] = beta[t] * expf(G[t]) * K[t][i] - acc;
        }
    for (int e0 = 0; e0 < dv; e0 += W) {
        int ne = dv - e0 < W ? dv - e0 : W;
        /* U0 = (I + A)⁻¹ (beta ⊙ V) */
        for (int e = 0; e < ne; e++)
            for (int t = 0; t < n; t++) {
                float acc = 0;
                for (int u = 0; u < t; u++) acc += A[t][u] * U[u][e];
                U[t][e] = beta[t] * v[(size_t)(c0 + t) * s->v_stride + (size_t)j * dv + e0 + e] - acc;
            }
        /* U = U0 − W S and the inter-chunk output e^G ⊙ Q S, against the state at the chunk start */
        for (int t = 0; t < n; t++) {
            float *ot = o + (size_t)(c0 + t) * s->n_v * dv + (size_t)j * dv;
            float eg = expf(G[t]);
            for (int e = 0; e < ne; e++) {
                float ws = 0, qs = 0;
                for (int i = 0; i < dk; i++) {
                    ws += Wm[t][i] * S[(size_t)i * dv + e0 + e];
                    qs += Q[t][i] * S[(size_t)i * dv + e0 + e];
                }
                U[t][e] -= ws;
                ot[e0 + e] = eg * qs;
            }
        }
        chunk_finish_(&x, o, s, j, c0, n, e0, ne, U, S);
    }
}

void gated_delta_forward_split_ref(float *o, const float *q, const float *k, const float *v, const float *b,
                                   const float *a, const float *a_neg, const float *dt_bias,
                                   const int32_t *cu_seqlens, const struct gated_delta_shape *s, float *state) {
    chunked_walk_(split_chunk_, o, q, k, v, b, a, a_neg, dt_bias, cu_seqlens, s, state);
}

static size_t align256_(size_t b) { return (b + 255) / 256 * 256; }

size_t gated_delta_split_workspace_bytes(int T, int n_docs, const struct gated_delta_shape *s) {
    if (T < 0 || n_docs < 1) return 0;
    const size_t nc = (size_t)(T / GATED_DELTA_CHUNK + n_docs), rows = (size_t)T, nv = (size_t)s->n_v;
    return align256_(4 * (2 * nc + (size_t)n_docs + 2)) + align256_(4 * rows * nv) +
           align256_(4 * rows * nv * (size_t)s->d_k) + align256_(4 * rows * nv * (size_t)s->d_v);
}
