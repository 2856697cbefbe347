/*
 * stages/train/cpu_ops.c — fast CPU ops of the drafter step (stages/train/cpu_ops.h): chunked threads, BLAS linear
 * layers, the fused LM head + loss. Chunk boundaries depend on the shapes only, so results are bitwise independent of
 * the thread count (see the header's DESIGN).
 */
#include "train/cpu_ops.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- threads */

int cpu_ops_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > CPU_OPS_MAX_THREADS ? CPU_OPS_MAX_THREADS : (int)n;
}

void cpu_ops_blas_init(void) {
    openblas_set_num_threads(1);
}

struct par {
    void (*fn)(void *, int, int);
    void *ctx;
    int n_chunks;
    int next;   /* atomic: the next chunk to take */
};

struct par_arg {
    struct par *p;
    int thread;
};

static void *par_run(void *arg) {
    struct par_arg *a = arg;
    for (;;) {
        int c = __atomic_fetch_add(&a->p->next, 1, __ATOMIC_RELAXED);
        if (c >= a->p->n_chunks) break;
        a->p->fn(a->p->ctx, c, a->thread);
    }
    return NULL;
}

void cpu_ops_parallel(int n_threads, int n_chunks, void (*fn)(void *ctx, int chunk, int thread), void *ctx) {
    if (n_chunks <= 0) return;
    if (n_threads > n_chunks) n_threads = n_chunks;
    if (n_threads > CPU_OPS_MAX_THREADS) n_threads = CPU_OPS_MAX_THREADS;
    if (n_threads < 1) n_threads = 1;
    struct par p = {fn, ctx, n_chunks, 0};
    struct par_arg args[CPU_OPS_MAX_THREADS];
    pthread_t th[CPU_OPS_MAX_THREADS];
    int started[CPU_OPS_MAX_THREADS] = {0};
    for (int t = 1; t < n_threads; t++) {
        args[t] = (struct par_arg){&p, t};
        started[t] = pthread_create(&th[t], NULL, par_run, &args[t]) == 0;   /* else: the others take its chunks */
    }
    args[0] = (struct par_arg){&p, 0};
    par_run(&args[0]);
    for (int t = 1; t < n_threads; t++)
        if (started[t]) pthread_join(th[t], NULL);
}

/* ---------------------------------------------------------------- linear layers */

/* Rows per chunk of an M-row output: 64, or fewer chunks of at least 16 rows when M is small (shape only). */
static int chunk_rows(int M) {
    return M >= 512 ? 64 : M >= 64 ? 32 : 16;
}

struct lin {
    float *out;
    const float *a, *b;
    int M, N, K, rows, accumulate;
};

static void lin_fwd_chunk(void *ctx, int c, int thread) {
    (void)thread;
    struct lin *l = ctx;
    int r0 = c * l->rows, r1 = r0 + l->rows < l->M ? r0 + l->rows : l->M;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, l->N, l->K, 1.0f, l->a + (size_t)r0 * l->K, l->K,
                l->b, l->K, 0.0f, l->out + (size_t)r0 * l->N, l->N);
}

void cpu_ops_linear_forward(int n_threads, float *y, const float *x, const float *w, int M, int N, int K) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        memset(y, 0, sizeof *y * (size_t)M * N);
        return;
    }
    struct lin l = {y, x, w, M, N, K, chunk_rows(M), 0};
    cpu_ops_parallel(n_threads, (M + l.rows - 1) / l.rows, lin_fwd_chunk, &l);
}

static void lin_dx_chunk(void *ctx, int c, int thread) {
    (void)thread;
    struct lin *l = ctx;   /* out dx (M, K), a dy (M, N), b w (N, K) */
    int r0 = c * l->rows, r1 = r0 + l->rows < l->M ? r0 + l->rows : l->M;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, l->K, l->N, 1.0f, l->a + (size_t)r0 * l->N, l->N,
                l->b, l->K, l->accumulate ? 1.0f : 0.0f, l->out + (size_t)r0 * l->K, l->K);
}

void cpu_ops_linear_backward_dx(int n_threads, float *dx, const float *dy, const float *w, int M, int N, int K,
                                int accumulate) {
    if (M <= 0 || K <= 0) return;
    if (N <= 0) {
        if (!accumulate) memset(dx, 0, sizeof *dx * (size_t)M * K);
        return;
    }
    struct lin l = {dx, dy, w, M, N, K, chunk_rows(M), accumulate};
    cpu_ops_parallel(n_threads, (M + l.rows - 1) / l.rows, lin_dx_chunk, &l);
}

static void lin_dw_chunk(void *ctx, int c, int thread) {
    (void)thread;
    struct lin *l = ctx;   /* out dw (N, K), a dy (M, N), b x (M, K); chunks over the N rows of dw */
    int r0 = c * l->rows, r1 = r0 + l->rows < l->N ? r0 + l->rows : l->N;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1 - r0, l->K, l->M, 1.0f, l->a + r0, l->N, l->b, l->K,
                1.0f, l->out + (size_t)r0 * l->K, l->K);
}

void cpu_ops_linear_backward_dw(int n_threads, float *dw, const float *dy, const float *x, int M, int N, int K) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    struct lin l = {dw, dy, x, M, N, K, N >= 128 ? 32 : 16, 1};
    cpu_ops_parallel(n_threads, (N + l.rows - 1) / l.rows, lin_dw_chunk, &l);
}

/* ---------------------------------------------------------------- fused LM head + loss */

/* Rows per chunk: whole blocks, about 64 rows (the D-PACE weights of a block need all its rows). */
static int lm_chunk_rows(const lmhead_loss_config *c) {
    int blocks = 64 / c->B;
    return c->B * (blocks < 1 ? 1 : blocks);
}

int64_t cpu_ops_lmhead_ws_floats(const lmhead_loss_config *c, int n_threads) {
    int64_t rows = lm_chunk_rows(c);
    return (int64_t)(n_threads < 1 ? 1 : n_threads) * rows * (2 * (int64_t)c->V + c->D);
}

struct lm {
    const lmhead_loss_config *c;
    const lmhead_loss_mode *md;
    const float *xn, *lm, *vlm, *vnorm, *last;
    const int32_t *anchors;
    const uint8_t *valid, *loss_mask;
    float *ws;
    int rows;               /* rows per chunk */
    double inv_msum;        /* 1 / (Σ m + 1e-5) */
    float *row_loss, *row_weight, *dxn;
    int32_t *pred, *tgt;
    uint8_t *row_mask;
};

/* The mask of row s (lmhead_loss_ref.c's lmhead_mask). */
static int lm_mask(const lmhead_loss_config *c, const lmhead_loss_mode *md, const int32_t *anchors,
                   const uint8_t *valid, const uint8_t *loss_mask, int s) {
    int b = s / c->B, j = s % c->B;
    int p = anchors[b] + j + (md->sample_from_anchor ? 1 : 0);
    if (p >= c->T || !valid[b]) return 0;
    return (md->sample_from_anchor || j != 0) && loss_mask[p];
}

static void lm_chunk(void *ctx, int chunk, int thread) {
    struct lm *a = ctx;
    const lmhead_loss_config *c = a->c;
    const int V = c->V, D = c->D, B = c->B, R = c->N * c->B;
    int r0 = chunk * a->rows, r1 = r0 + a->rows < R ? r0 + a->rows : R, n = r1 - r0;
    float *z = a->ws + (size_t)thread * a->rows * (2 * (size_t)V + D), *t = z + (size_t)a->rows * V;
    float *th = t + (size_t)a->rows * V;

    /* target rows: the verifier norm of last[src] exactly as lmhead_row computes it; rows past the batch get 0 */
    for (int i = 0; i < n; i++) {
        int s = r0 + i, b = s / B, j = s % B;
        int src = a->anchors[b] + j - (a->md->sample_from_anchor ? 0 : 1);
        if (src < 0) src += c->T;
        float *h = th + (size_t)i * D;
        if (src >= c->T) {
            memset(h, 0, sizeof *h * (size_t)D);
            continue;
        }
        const float *y = a->last + (size_t)src * D;
        double ss = 0;
        for (int e = 0; e < D; e++) ss += (double)y[e] * y[e];
        float rstd = (float)(1.0 / sqrt(ss / D + c->eps));
        for (int e = 0; e < D; e++) h[e] = y[e] * rstd * a->vnorm[e];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, D, 1.0f, a->xn + (size_t)r0 * D, D, a->lm, D, 0.0f, z, V);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, D, 1.0f, th, D, a->vlm, D, 0.0f, t, V);

    /* per row: argmaxes (first maximum), log-sum-exps and the loss */
    double lz_row[1024];   /* chunk rows <= max(64, B) <= 1024 (lmhead_loss_check: B small; checked below) */
    for (int i = 0; i < n; i++) {
        int s = r0 + i, b = s / B, j = s % B;
        int src = a->anchors[b] + j - (a->md->sample_from_anchor ? 0 : 1);
        float *zr = z + (size_t)i * V, *tr = t + (size_t)i * V;
        int pa = 0, ta = 0;
        for (int v = 1; v < V; v++) if (zr[v] > zr[pa]) pa = v;
        for (int v = 1; v < V; v++) if (tr[v] > tr[ta]) ta = v;
        int m = lm_mask(c, a->md, a->anchors, a->valid, a->loss_mask, s);
        a->pred[s] = pa;
        a->tgt[s] = src < c->T ? ta : -1;
        a->row_mask[s] = (uint8_t)m;
        a->row_loss[s] = 0;
        if (!m) continue;
        double mz = zr[pa], sz = 0, l;
        if (c->loss == LMHEAD_LOSS_CE) {   /* z becomes exp(z − max) (one exp per logit, reused by the backward) */
            double zt = zr[ta];
            float mzf = zr[pa];
            for (int v = 0; v < V; v++) {
                float e = expf(zr[v] - mzf);
                zr[v] = e;
                sz += e;
            }
            lz_row[i] = 1.0 / sz;   /* the backward's softmax scale */
            l = mz + log(sz) - zt;
        } else {
            for (int v = 0; v < V; v++) sz += exp(zr[v] - mz);
            double lz = mz + log(sz);
            lz_row[i] = lz;
            double mt = tr[ta], st = 0;
            for (int v = 0; v < V; v++) st += exp(tr[v] - mt);
            double lt = mt + log(st);
            l = 0;
            for (int v = 0; v < V; v++) {
                double pt = exp(tr[v] - lt);
                l += pt * ((tr[v] - lt) - (zr[v] - lz));
                tr[v] = (float)pt;   /* P, kept for the backward */
            }
        }
        a->row_loss[s] = (float)l;
    }

    /* block weights (lmhead_loss_forward_mode_ref's loop, per block of this chunk) */
    for (int b = r0 / B; b < r1 / B; b++) {
        double P = 1, suffix = 0, pk[1024];
        for (int j = 0; j < B; j++) {
            int s = b * B + j;
            double sj = a->row_mask[s] ? (1.0 - c->alpha) * exp(-(double)a->row_loss[s]) + c->alpha : 1.0;
            P *= sj;
            pk[j] = P;
        }
        for (int j = B - 1; j >= 0; j--) {
            int s = b * B + j, m = a->row_mask[s];
            double w;
            if (c->weighting == LMHEAD_WEIGHT_NONE) w = 1;
            else if (c->weighting == LMHEAD_WEIGHT_EXP_DECAY && a->md->sample_from_anchor) w = exp(-(double)j / c->gamma);
            else if (c->weighting == LMHEAD_WEIGHT_EXP_DECAY) w = j == 0 ? 0 : exp(-(double)(j - 1) / c->gamma);
            else {
                suffix += m ? pk[j] : 0;
                w = suffix;
            }
            a->row_weight[s] = m ? (float)w : 0.0f;
        }
    }
    if (!a->dxn) return;

    /* backward: dz = coef·(Q − P) in place of z, then dxn = dz · lm_head */
    for (int i = 0; i < n; i++) {
        int s = r0 + i;
        float *zr = z + (size_t)i * V;
        double coef = a->row_weight[s] * a->inv_msum;
        if (!a->row_mask[s] || coef == 0) {
            memset(zr, 0, sizeof *zr * (size_t)V);
            continue;
        }
        if (c->loss == LMHEAD_LOSS_CE) {   /* zr holds exp(z − max); lz_row the 1 / Σ */
            int tg = a->tgt[s];
            float cf = (float)coef, q = (float)lz_row[i];
            for (int v = 0; v < V; v++) zr[v] = cf * (zr[v] * q);
            zr[tg] -= cf;
        } else {
            double lz = lz_row[i];
            const float *pr = t + (size_t)i * V;
            for (int v = 0; v < V; v++) zr[v] = (float)(coef * (exp(zr[v] - lz) - (double)pr[v]));
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, V, 1.0f, z, V, a->lm, D, 0.0f,
                a->dxn + (size_t)r0 * D, D);
}

int cpu_ops_lmhead_loss(int n_threads, const lmhead_loss_config *c, const lmhead_loss_mode *md, const float *xn,
                        const float *lm_head, const float *vlm_head, const float *vnorm_w, const float *last,
                        const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask, float *ws,
                        float *loss, float *row_loss, float *row_weight, int32_t *correct, int32_t *total,
                        int32_t *pred, int32_t *tgt, uint8_t *row_mask, float *dxn, char *err, int err_len) {
    static const lmhead_loss_mode zero_mode;
    if (!md) md = &zero_mode;
    if (lmhead_loss_check(c, err, err_len)) return -1;
    if (c->B > 1024) {
        snprintf(err, err_len, "cpu_ops_lmhead_loss: B=%d > 1024", c->B);
        return -1;
    }
    int lim = md->budget > c->T ? md->budget : c->T, R = c->N * c->B, B = c->B;
    for (int b = 0; b < c->N; b++)
        if (anchors[b] < 0 || anchors[b] >= c->T || anchors[b] + c->B > lim) {
            snprintf(err, err_len, "lmhead_loss: anchors[%d]=%d leaves no room for a block of %d in T=%d (budget %d)",
                     b, anchors[b], c->B, c->T, md->budget);
            return -1;
        }
    double msum = 0;
    for (int s = 0; s < R; s++) msum += lm_mask(c, md, anchors, valid, loss_mask, s);
    struct lm a = {c, md, xn, lm_head, vlm_head, vnorm_w, last, anchors, valid, loss_mask, ws, lm_chunk_rows(c),
                   1.0 / (msum + 1e-5), row_loss, row_weight, dxn, pred, tgt, row_mask};
    cpu_ops_parallel(n_threads, (R + a.rows - 1) / a.rows, lm_chunk, &a);

    /* reductions in the reference's order */
    memset(correct, 0, sizeof *correct * (size_t)B);
    memset(total, 0, sizeof *total * (size_t)B);
    double L = 0;
    for (int s = 0; s < R; s++)
        if (row_mask[s]) {
            correct[s % B] += pred[s] == tgt[s];
            total[s % B] += 1;
        }
    for (int b = 0; b < c->N; b++)
        for (int j = B - 1; j >= 0; j--) L += (double)row_weight[b * B + j] * row_loss[b * B + j];
    *loss = (float)(L / (msum + 1e-5));
    return 0;
}

/* ---------------------------------------------------------------- block attention */

static int ba_args(const block_attn_config *c, const int32_t *anchors, char *err, int err_len) {
    if (block_attn_check(c, err, err_len)) return -1;
    if ((c->n_h / c->n_kv) * c->B > 1024) {
        snprintf(err, err_len, "cpu_ops block attention: %d query heads per kv head x block %d > 1024 rows",
                 c->n_h / c->n_kv, c->B);
        return -1;
    }
    for (int b = 0; b < c->N; b++)
        if (anchors[b] < 0 || anchors[b] >= c->T) {
            snprintf(err, err_len, "block_attn: anchors[%d]=%d is outside [0, T=%d)", b, anchors[b], c->T);
            return -1;
        }
    return 0;
}

/* The visible context rows of block b (block_attn_ref.c's block_attn_keys without the block's own slots). */
static int ba_context(const block_attn_config *c, const int32_t *anchors, const int32_t *doc_ids, int b, int *idx) {
    int a = anchors[b], n = 0, d = doc_ids[a];
    int lo = c->window > 0 ? a - c->window : 0;
    if (lo < 0) lo = 0;
    if (d != -1)
        for (int p = lo; p < a; p++)
            if (doc_ids[p] == d) idx[n++] = p;
    return n;
}

static float dotf(const float *a, const float *b, int D) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t = 0;
    int e = 0;
    for (; e + 8 <= D; e += 8)
        for (int l = 0; l < 8; l++) s[l] += a[e + l] * b[e + l];
    for (; e < D; e++) t += a[e] * b[e];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + t;
}

/* Per-thread scratch of the attention chunks, in floats: keys and values of one (block, kv head) gathered (cap, D)
 * x2 and their gradients x2, the G·B queries, output gradients and query gradients (GB, D) x3, scores and their
 * gradients (GB, cap) x2. */
static size_t ba_ws_floats(const block_attn_config *c) {
    size_t cap = (size_t)c->T + c->B, GB = (size_t)(c->n_h / c->n_kv) * c->B, D = (size_t)c->d_h;
    return 4 * cap * D + 3 * GB * D + 2 * GB * cap;
}

struct ba {
    const block_attn_config *c;
    const float *q, *k, *v, *out, *dout, *lse;
    const int32_t *anchors, *doc_ids;
    float *o, *l, *dq, *dk, *dv;
    int *idx;       /* (threads, T + B) */
    float *ws;      /* (threads, ba_ws_floats) */
};

/* Gather block b's keys (context rows, then its B slots) for kv head g into kg, vg (n, D), its queries of the heads
 * of g into qg (GB, D), row r = j·G + hh; and, when dout is given, the output gradients into dog. Returns n. */
static int ba_gather(const struct ba *a, int b, int g, int *idx, float *kg, float *vg, float *qg, float *dog) {
    const block_attn_config *c = a->c;
    int D = c->d_h, G = c->n_h / c->n_kv;
    int nc = ba_context(c, a->anchors, a->doc_ids, b, idx), n = nc + c->B;
    for (int jj = 0; jj < c->B; jj++) idx[nc + jj] = c->T + b * c->B + jj;
    for (int i = 0; i < n; i++) {
        size_t ko = ((size_t)idx[i] * c->n_kv + g) * D;
        memcpy(kg + (size_t)i * D, a->k + ko, sizeof(float) * (size_t)D);
        memcpy(vg + (size_t)i * D, a->v + ko, sizeof(float) * (size_t)D);
    }
    for (int j = 0; j < c->B; j++) {
        size_t qo = (((size_t)b * c->B + j) * c->n_h + (size_t)g * G) * D;
        memcpy(qg + (size_t)j * G * D, a->q + qo, sizeof(float) * (size_t)G * D);
        if (dog) memcpy(dog + (size_t)j * G * D, a->dout + qo, sizeof(float) * (size_t)G * D);
    }
    return n;
}

static void ba_fwd_chunk(void *ctx, int b, int thread) {
    struct ba *a = ctx;
    const block_attn_config *c = a->c;
    int D = c->d_h, G = c->n_h / c->n_kv, GB = G * c->B, cap = c->T + c->B;
    int *idx = a->idx + (size_t)thread * cap;
    float *kg = a->ws + (size_t)thread * ba_ws_floats(c), *vg = kg + (size_t)cap * D;
    float *qg = vg + 3 * (size_t)cap * D, *og = qg + (size_t)GB * D, *sc = og + 2 * (size_t)GB * D;
    for (int g = 0; g < c->n_kv; g++) {
        int n = ba_gather(a, b, g, idx, kg, vg, qg, NULL), nc = n - c->B;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, GB, n, D, c->scale, qg, D, kg, D, 0.0f, sc, n);
        double lsum[1024];   /* GB <= n_h·B: checked by the caller */
        for (int r = 0; r < GB; r++) {
            int j = r / G, nv = nc + (c->causal ? j + 1 : c->B);
            float m;
            double l = lsum[r] = cpu_ops_softmax_prefix(sc + (size_t)r * n, nv, n, &m);
            int h = g * G + r % G;
            a->l[(size_t)h * c->N * c->B + (size_t)b * c->B + j] = (float)(m + log(l));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, GB, D, n, 1.0f, sc, n, vg, D, 0.0f, og, D);
        for (int r = 0; r < GB; r++) {
            int j = r / G, h = g * G + r % G;
            float inv = (float)(1.0 / lsum[r]), *o = a->o + (((size_t)b * c->B + j) * c->n_h + h) * D;
            for (int e = 0; e < D; e++) o[e] = og[(size_t)r * D + e] * inv;
        }
    }
}

double cpu_ops_softmax_prefix(float *row, int nv, int n, float *max_out) {
    float m = -INFINITY;
    for (int i = 0; i < nv; i++)
        if (row[i] > m) m = row[i];
    double l = 0;
    for (int i = 0; i < nv; i++) {
        row[i] = expf(row[i] - m);
        l += row[i];
    }
    for (int i = nv; i < n; i++) row[i] = 0;
    *max_out = m;
    return l;
}

int cpu_ops_block_attn_forward(int n_threads, const block_attn_config *c, const float *q, const float *k,
                               const float *v, const int32_t *anchors, const int32_t *doc_ids, float *out, float *lse,
                               char *err, int err_len) {
    if (ba_args(c, anchors, err, err_len)) return -1;
    int nt = n_threads < 1 ? 1 : n_threads > CPU_OPS_MAX_THREADS ? CPU_OPS_MAX_THREADS : n_threads;
    if (nt > c->N) nt = c->N;
    size_t cap = (size_t)c->T + c->B;
    struct ba a = {c, q, k, v, NULL, NULL, NULL, anchors, doc_ids, out, lse, NULL, NULL, NULL,
                   malloc(sizeof(int) * cap * nt), malloc(sizeof(float) * ba_ws_floats(c) * nt)};
    if (!a.idx || !a.ws) {
        free(a.idx); free(a.ws);
        snprintf(err, err_len, "cpu_ops_block_attn_forward: out of memory");
        return -1;
    }
    cpu_ops_parallel(nt, c->N, ba_fwd_chunk, &a);
    free(a.idx); free(a.ws);
    return 0;
}

static void ba_bwd_chunk(void *ctx, int g, int thread) {
    struct ba *a = ctx;
    const block_attn_config *c = a->c;
    int D = c->d_h, G = c->n_h / c->n_kv, GB = G * c->B, cap = c->T + c->B, KV = c->T + c->N * c->B;
    int *idx = a->idx + (size_t)thread * cap;
    float *kg = a->ws + (size_t)thread * ba_ws_floats(c), *vg = kg + (size_t)cap * D, *dkg = vg + (size_t)cap * D;
    float *dvg = dkg + (size_t)cap * D, *qg = dvg + (size_t)cap * D, *dog = qg + (size_t)GB * D;
    float *dqg = dog + (size_t)GB * D, *pr = dqg + (size_t)GB * D, *dp = pr + (size_t)GB * cap;
    for (int r = 0; r < KV; r++) {
        memset(a->dk + ((size_t)r * c->n_kv + g) * D, 0, sizeof(float) * (size_t)D);
        memset(a->dv + ((size_t)r * c->n_kv + g) * D, 0, sizeof(float) * (size_t)D);
    }
    for (int b = 0; b < c->N; b++) {   /* in order: dk/dv rows shared by blocks are summed block by block */
        int n = ba_gather(a, b, g, idx, kg, vg, qg, dog), nc = n - c->B;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, GB, n, D, c->scale, qg, D, kg, D, 0.0f, pr, n);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, GB, n, D, 1.0f, dog, D, vg, D, 0.0f, dp, n);
        for (int r = 0; r < GB; r++) {   /* P = exp(S − lse); dS = P ⊙ (dP − Di)·scale */
            int j = r / G, h = g * G + r % G, nv = nc + (c->causal ? j + 1 : c->B);
            size_t row = (size_t)b * c->B + j, qo = (row * c->n_h + h) * D;
            float lse = a->lse[(size_t)h * c->N * c->B + row], Di = dotf(a->dout + qo, a->out + qo, D);
            float *p = pr + (size_t)r * n, *ds = dp + (size_t)r * n;
            for (int i = 0; i < nv; i++) {
                p[i] = expf(p[i] - lse);
                ds[i] = p[i] * (ds[i] - Di) * c->scale;
            }
            for (int i = nv; i < n; i++) p[i] = ds[i] = 0;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, GB, D, n, 1.0f, dp, n, kg, D, 0.0f, dqg, D);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, GB, 1.0f, dp, n, qg, D, 0.0f, dkg, D);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, GB, 1.0f, pr, n, dog, D, 0.0f, dvg, D);
        for (int j = 0; j < c->B; j++)
            memcpy(a->dq + (((size_t)b * c->B + j) * c->n_h + (size_t)g * G) * D, dqg + (size_t)j * G * D,
                   sizeof(float) * (size_t)G * D);
        for (int i = 0; i < n; i++) {
            size_t ko = ((size_t)idx[i] * c->n_kv + g) * D;
            for (int e = 0; e < D; e++) {
                a->dk[ko + e] += dkg[(size_t)i * D + e];
                a->dv[ko + e] += dvg[(size_t)i * D + e];
            }
        }
    }
}

int cpu_ops_block_attn_backward(int n_threads, const block_attn_config *c, const float *q, const float *k,
                                const float *v, const int32_t *anchors, const int32_t *doc_ids, const float *out,
                                const float *dout, const float *lse, float *dq, float *dk, float *dv, char *err,
                                int err_len) {
    if (ba_args(c, anchors, err, err_len)) return -1;
    int nt = n_threads < 1 ? 1 : n_threads > CPU_OPS_MAX_THREADS ? CPU_OPS_MAX_THREADS : n_threads;
    if (nt > c->n_kv) nt = c->n_kv;
    size_t cap = (size_t)c->T + c->B;
    struct ba a = {c, q, k, v, out, dout, lse, anchors, doc_ids, NULL, NULL, dq, dk, dv,
                   malloc(sizeof(int) * cap * nt), malloc(sizeof(float) * ba_ws_floats(c) * nt)};
    if (!a.idx || !a.ws) {
        free(a.idx); free(a.ws);
        snprintf(err, err_len, "cpu_ops_block_attn_backward: out of memory");
        return -1;
    }
    cpu_ops_parallel(nt, c->n_kv, ba_bwd_chunk, &a);
    free(a.idx); free(a.ws);
    return 0;
}

/* ---------------------------------------------------------------- row-wise references on row chunks */

enum { ROW_RMS_FWD, ROW_RMS_DX, ROW_RMS_DW, ROW_SWIGLU_FWD, ROW_SWIGLU_BWD, ROW_ROPE_FWD, ROW_ROPE_BWD };

struct rows {
    int op, N, C, rows, acc, NH;
    float eps;
    float *y, *y2;
    const float *x, *x2, *x3, *w, *r;
    const int32_t *pos;
};

/* Rows per chunk: about 32K elements (shape only). */
static int rows_per_chunk(int C) {
    int r = 32768 / (C > 0 ? C : 1);
    return r < 1 ? 1 : r;
}

static void rows_chunk(void *ctx, int c, int thread) {
    (void)thread;
    struct rows *a = ctx;
    int lim = a->op == ROW_RMS_DW ? a->C : a->N;
    int r0 = c * a->rows, n = (r0 + a->rows < lim ? r0 + a->rows : lim) - r0;
    size_t o = (size_t)r0 * a->C;
    switch (a->op) {
    case ROW_RMS_FWD: rmsnorm_forward_ref(a->y + o, a->y2 + r0, a->x + o, a->w, n, a->C, a->eps); break;
    case ROW_RMS_DX:
        rmsnorm_backward_ref(a->y + o, NULL, a->x + o, a->x2 + o, a->w, a->r + r0, n, a->C, a->acc);
        break;
    case ROW_RMS_DW:   /* columns [r0, r0 + n): rmsnorm_backward_ref's dw arithmetic, rows in order */
        for (int row = 0; row < a->N; row++) {
            const float *xr = a->x2 + (size_t)row * a->C, *dyr = a->x + (size_t)row * a->C;
            double rs = a->r[row];
            for (int col = r0; col < r0 + n; col++) {
                double xhat = xr[col] * rs;
                a->y[col] += (float)(dyr[col] * xhat);
            }
        }
        break;
    case ROW_SWIGLU_FWD: swiglu_forward_ref(a->y + o, a->x + o, a->x2 + o, n, a->C, a->C); break;
    case ROW_SWIGLU_BWD: swiglu_backward_ref(a->y + o, a->y2 + o, a->x + o, a->x2 + o, a->x3 + o, n, a->C, a->C); break;
    case ROW_ROPE_FWD:
        rope_forward_ref(a->y + o * a->NH, NULL, a->pos + r0, a->w, n, a->NH, 0, a->C);
        break;
    case ROW_ROPE_BWD:
        rope_backward_ref(a->y + o * a->NH, NULL, a->pos + r0, a->w, n, a->NH, 0, a->C);
        break;
    }
}

static void rows_run(int n_threads, struct rows *a) {
    int lim = a->op == ROW_RMS_DW ? a->C : a->N;
    if (lim <= 0) return;
    a->rows = a->op == ROW_RMS_DW ? 32 : rows_per_chunk(a->op >= ROW_ROPE_FWD ? a->C * a->NH : a->C);
    cpu_ops_parallel(n_threads, (lim + a->rows - 1) / a->rows, rows_chunk, a);
}

void cpu_ops_rmsnorm_forward(int n_threads, float *y, float *rstd, const float *x, const float *w, int N, int C,
                             float eps) {
    struct rows a = {.op = ROW_RMS_FWD, .N = N, .C = C, .eps = eps, .y = y, .y2 = rstd, .x = x, .w = w};
    rows_run(n_threads, &a);
}

void cpu_ops_rmsnorm_backward(int n_threads, float *dx, float *dw, const float *dy, const float *x, const float *w,
                              const float *rstd, int N, int C, int accumulate_dx) {
    struct rows a = {.op = ROW_RMS_DX, .N = N, .C = C, .acc = accumulate_dx, .y = dx, .x = dy, .x2 = x, .w = w,
                     .r = rstd};
    rows_run(n_threads, &a);
    if (!dw) return;
    a.op = ROW_RMS_DW;
    a.y = dw;
    rows_run(n_threads, &a);
}

void cpu_ops_swiglu_forward(int n_threads, float *out, const float *gate, const float *up, int T, int width) {
    struct rows a = {.op = ROW_SWIGLU_FWD, .N = T, .C = width, .y = out, .x = gate, .x2 = up};
    rows_run(n_threads, &a);
}

void cpu_ops_swiglu_backward(int n_threads, float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, int T, int width) {
    struct rows a = {.op = ROW_SWIGLU_BWD, .N = T, .C = width, .y = dgate, .y2 = dup, .x = dout, .x2 = gate, .x3 = up};
    rows_run(n_threads, &a);
}

void cpu_ops_rope_forward(int n_threads, float *q, const int32_t *pos, const float *inv_freq, int T, int NH, int HD) {
    struct rows a = {.op = ROW_ROPE_FWD, .N = T, .C = HD, .NH = NH, .y = q, .w = inv_freq, .pos = pos};
    rows_run(n_threads, &a);
}

void cpu_ops_rope_backward(int n_threads, float *dq, const int32_t *pos, const float *inv_freq, int T, int NH,
                           int HD) {
    struct rows a = {.op = ROW_ROPE_BWD, .N = T, .C = HD, .NH = NH, .y = dq, .w = inv_freq, .pos = pos};
    rows_run(n_threads, &a);
}
