/*
 * tests/gdn_inputs.h — seeded inputs of the Gated DeltaNet kernels for the CPU and GPU suites
 * (header-only): a packed batch of documents of given lengths, q and k l2-normalised as the layer
 * feeds them (q scaled by 1/sqrt(d_k)), b and a rounded to bf16 (the GPU reads them from the bf16
 * projection row, so the references run on the same values), a_neg = −exp(A_log), dt_bias.
 * Layout as the target uses it: q | k | v in one conv row of width 2·n_k·d_k + n_v·d_v, b | a in a
 * row of 2·n_v.
 */
#ifndef TESTS_GDN_INPUTS_H
#define TESTS_GDN_INPUTS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gated_delta.h"
#include "kernels/l2norm.h"
#include "tests/testutil.h"

struct gdn_inputs {
    struct gated_delta_shape s;
    int conv_dim;
    int32_t *cu;          /* (ND+1) */
    float *conv;          /* (T, conv_dim): q | k | v */
    float *ba;            /* (T, 2·n_v): b | a, bf16 values */
    float *a_neg, *dt_bias;   /* (n_v) */
};

static inline float gdn_bf16r(float x) { return bf16_round(x); }

static inline void gdn_inputs_make(struct gdn_inputs *g, const int *lens, int n_docs, int n_k, int n_v, int d_k,
                                   int d_v, uint64_t seed) {
    memset(g, 0, sizeof *g);
    g->cu = malloc(sizeof(int32_t) * (size_t)(n_docs + 1));
    g->cu[0] = 0;
    for (int d = 0; d < n_docs; d++) g->cu[d + 1] = g->cu[d] + lens[d];
    int T = g->cu[n_docs];
    g->conv_dim = 2 * n_k * d_k + n_v * d_v;
    g->s = (struct gated_delta_shape){T, n_docs, n_k, n_v, d_k, d_v, g->conv_dim, g->conv_dim, 2 * n_v};
    g->conv = malloc(4 * ((size_t)T * g->conv_dim + 1));
    g->ba = malloc(4 * ((size_t)T * 2 * n_v + 1));
    g->a_neg = malloc(4 * (size_t)n_v);
    g->dt_bias = malloc(4 * (size_t)n_v);
    test_rng_fill(&seed, g->conv, (size_t)T * g->conv_dim, -1.0f, 1.0f);
    l2norm_forward_ref(g->conv, T, g->conv_dim, n_k, d_k, 1.0f / sqrtf((float)d_k));
    l2norm_forward_ref(g->conv + n_k * d_k, T, g->conv_dim, n_k, d_k, 1.0f);
    for (size_t i = 0; i < (size_t)T * 2 * n_v; i++) g->ba[i] = gdn_bf16r(test_rng_uniform(&seed, -3.0f, 3.0f));
    for (int j = 0; j < n_v; j++) {
        g->a_neg[j] = -expf(test_rng_uniform(&seed, -1.0f, 1.5f));   /* A_log as Qwen3.5's init: log U(0, 16) */
        g->dt_bias[j] = test_rng_uniform(&seed, -1.0f, 1.0f);
    }
}

static inline void gdn_inputs_free(struct gdn_inputs *g) {
    free(g->cu); free(g->conv); free(g->ba); free(g->a_neg); free(g->dt_bias);
}

/* The pointers of the gated delta rule inside the conv / ba rows. */
#define GDN_Q(g) ((g)->conv)
#define GDN_K(g) ((g)->conv + (g)->s.n_k * (g)->s.d_k)
#define GDN_V(g) ((g)->conv + 2 * (g)->s.n_k * (g)->s.d_k)
#define GDN_B(g) ((g)->ba)
#define GDN_A(g) ((g)->ba + (g)->s.n_v)

/* A decode schedule over packed documents (document d lives in slot d): step k takes, from every document not yet
 * done, its next sizes[(k + d) % n_sizes] rows (at most what is left), so steps mix sequences of several lengths
 * and a sequence's rows cross the documents' 64-row chunk boundaries anywhere. rows[r] is the packed batch's row
 * that step row r is. */
#define GDN_MAX_SEQ 8
struct gdn_step {
    int n_seq, T;
    int32_t cu[GDN_MAX_SEQ + 1], slot[GDN_MAX_SEQ], pos[GDN_MAX_SEQ];
    int32_t *rows;
};

/* Fills steps (at most max_steps); returns how many, or -1 if they did not suffice. */
static inline int gdn_schedule(const int32_t *cu_docs, int n_docs, const int *sizes, int n_sizes,
                               struct gdn_step *steps, int max_steps) {
    int done[GDN_MAX_SEQ] = {0}, n = 0;
    if (n_docs > GDN_MAX_SEQ) return -1;
    for (;;) {
        struct gdn_step *st = &steps[n];
        memset(st, 0, sizeof *st);
        for (int d = 0; d < n_docs; d++) {
            int left = cu_docs[d + 1] - cu_docs[d] - done[d], m = sizes[(n + d) % n_sizes];
            if (left <= 0) continue;
            if (m > left) m = left;
            st->slot[st->n_seq] = d;
            st->pos[st->n_seq] = done[d];
            st->cu[st->n_seq + 1] = st->cu[st->n_seq] + m;
            st->n_seq++;
        }
        if (st->n_seq == 0) return n;
        if (n == max_steps) return -1;
        st->T = st->cu[st->n_seq];
        st->rows = malloc(sizeof(int32_t) * (size_t)st->T);
        for (int i = 0; i < st->n_seq; i++)
            for (int r = st->cu[i]; r < st->cu[i + 1]; r++)
                st->rows[r] = cu_docs[st->slot[i]] + st->pos[i] + (r - st->cu[i]);
        for (int i = 0; i < st->n_seq; i++) done[st->slot[i]] += st->cu[i + 1] - st->cu[i];
        n++;
    }
}

/* dst [T, width] = the step's rows of src [., stride] */
static inline void gdn_gather(float *dst, const float *src, int stride, int width, const struct gdn_step *st) {
    for (int r = 0; r < st->T; r++)
        memcpy(dst + (size_t)r * width, src + (size_t)st->rows[r] * stride, sizeof(float) * (size_t)width);
}

/* per step row: its slot and position (the rows' form of the decode kernels) */
static inline void gdn_row_slots(const struct gdn_step *st, int32_t *slot, int32_t *pos) {
    for (int i = 0; i < st->n_seq; i++)
        for (int r = st->cu[i]; r < st->cu[i + 1]; r++) {
            slot[r] = st->slot[i];
            pos[r] = st->pos[i] + (r - st->cu[i]);
        }
}

#endif /* TESTS_GDN_INPUTS_H */
