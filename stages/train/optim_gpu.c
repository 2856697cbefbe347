/*
 * stages/train/optim_gpu.c — the GPU optimizers over a drafter_gpu or a plain device table (train/optim_gpu.h).
 * Init plans everything once: the state, the Newton–Schulz scratch for the largest shape batch, and the device
 * tables (the gradients of the norm, the Muon matrices in batch order, the AdamW tensors and their chunks), all in
 * one cudaMalloc; a step then only enqueues launches.
 */
#ifdef DFLASH_CUDA
#include "train/optim_gpu.h"

#include "core/err.h"
#include "train/drafter.h"
#include "train/optim.h"

#include "kernels/adamw.h"
#include "kernels/blas.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One Muon batch: nb matrices of one shape, entries [tab_off, tab_off + nb) of the Muon table. */
struct og_batch {
    int64_t rows, cols;
    int nb, tab_off;
};

struct optim_gpu {
    struct optim *host;
    struct optim_gpu_tensor *dev;      /* (n) the device pointers of the table */
    cudaStream_t s;
    int n;
    float **m, **v, **mom;             /* (n) device state, NULL outside the tensor's group */
    void *base;
    size_t bytes;
    double *sumsq, *partials, *ns_ss;  /* (1), (max(n_norm, max_nb) · OG_PARTIALS), (max_nb) */
    bf16 *ns_x, *ns_y, *ns_a, *ns_b;   /* Newton–Schulz scratch of the largest batch */
    og_vec *d_norm;                    /* (n_norm) trainable gradients, table order */
    int n_norm;
    og_muon_ptrs *d_muon;              /* (n_muon) Muon matrices in batch order */
    int *muon_idx;                     /* (n_muon) host: table index of each Muon table entry */
    struct og_batch *batches;          /* (n_batches) host */
    int n_batches;
    adamw_tensor *d_adamw;             /* (n_adamw) */
    adamw_chunk *d_chunks;             /* (n_chunks) */
    int64_t n_chunks;
    double muon_flops;
    int muon_batched;
    int ns_symmetric;
    double *h_sumsq;                   /* pinned (1) */
    cudaEvent_t ev;
    int norm_pending;
};

#define CU(call, what) do { cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) return err_fail(err, err_len, "%s: %s: %s", fn, (what), cudaGetErrorString(e_)); } while (0)
#define KL(call) do { if ((call)) return err_fail(err, err_len, "%s: %s", fn, kernels_error()); } while (0)

static size_t a256(size_t x) { return (x + 255) & ~(size_t)255; }

void optim_gpu_free(struct optim_gpu *o) {
    if (!o) return;
    if (o->base) cudaFree(o->base);
    if (o->h_sumsq) cudaFreeHost(o->h_sumsq);
    if (o->ev) cudaEventDestroy(o->ev);
    free(o->dev);
    free(o->m);
    free(o->v);
    free(o->mom);
    free(o->muon_idx);
    free(o->batches);
    free(o);
}

size_t optim_gpu_planned_bytes(const struct optim_gpu *o) { return o->bytes; }
void optim_gpu_set_muon_batched(struct optim_gpu *o, int batched) { o->muon_batched = !!batched; }
void optim_gpu_set_ns_symmetric(struct optim_gpu *o, int on) { o->ns_symmetric = !!on; }

void og_sym_mirror_ref(bf16 *a, int m, int nb, long long stride) {
    const int h = m / 2;
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < h; i++)
            for (int j = 0; j < h; j++) a[b * stride + (long long)i * m + h + j] = a[b * stride + (long long)(h + j) * m + i];
}
double optim_gpu_muon_flops(const struct optim_gpu *o) { return o->muon_flops; }
int optim_gpu_muon_batches(const struct optim_gpu *o) { return o->muon_batched ? o->n_batches : o->host->n_muon; }

struct optim_gpu *optim_gpu_init(struct optim *host, struct drafter_gpu *g, FILE *plan, char *err, int err_len) {
    static const char fn[] = "optim_gpu_init";
    if (host->n != drafter_gpu_n_params(g)) {
        err_fail(err, err_len, "%s: the optimizer has %d tensors, the drafter %d", fn, host->n, drafter_gpu_n_params(g));
        return NULL;
    }
    struct optim_gpu_tensor *dev = calloc((size_t)(host->n ? host->n : 1), sizeof *dev);
    if (!dev) {
        err_fail(err, err_len, "%s: out of memory", fn);
        return NULL;
    }
    for (int i = 0; i < host->n; i++) {
        const struct drafter_gpu_param *p = drafter_gpu_param(g, i);
        if (strcmp(host->t[i].name, p->host->name) || (host->group[i] != OPTIM_GROUP_NONE && !p->g)) {
            err_fail(err, err_len, "%s: optimizer tensor %d (%s) does not match the drafter's %s", fn, i, host->t[i].name,
                     p->host->name);
            free(dev);
            return NULL;
        }
        dev[i] = (struct optim_gpu_tensor){p->w, p->g, p->copy};
    }
    struct optim_gpu *o = optim_gpu_init_table(host, dev, drafter_gpu_stream(g), plan, err, err_len);
    free(dev);
    return o;
}

/* Group the Muon matrices by shape (first appearance in table order) and cut each group into balanced batches of at
 * most OG_NS_BATCH_ELEMS elements. Fills o->muon_idx, o->batches, o->n_batches. */
static int plan_batches(struct optim_gpu *o, char *err, int err_len) {
    static const char fn[] = "optim_gpu_init";
    const struct optim *h = o->host;
    o->muon_idx = calloc((size_t)(h->n_muon ? h->n_muon : 1), sizeof *o->muon_idx);
    o->batches = calloc((size_t)(h->n_muon ? h->n_muon : 1), sizeof *o->batches);
    int *done = calloc((size_t)(h->n ? h->n : 1), sizeof *done), *members = calloc((size_t)(h->n ? h->n : 1), sizeof *members);
    if (!o->muon_idx || !o->batches || !done || !members) {
        free(done);
        free(members);
        return err_fail(err, err_len, "%s: out of memory", fn);
    }
    int k = 0;
    for (int i = 0; i < h->n; i++) {
        if (h->group[i] != OPTIM_GROUP_MUON || done[i]) continue;
        const int64_t r = h->t[i].shape[0], c = h->t[i].shape[1];
        int cnt = 0;
        for (int j = i; j < h->n; j++)
            if (h->group[j] == OPTIM_GROUP_MUON && !done[j] && h->t[j].shape[0] == r && h->t[j].shape[1] == c) {
                members[cnt++] = j;
                done[j] = 1;
            }
        size_t ne = (size_t)(r * c), per = OG_NS_BATCH_ELEMS / ne;
        if (per < 1) per = 1;
        if (per > 65535) per = 65535;
        int nchunk = (int)((cnt + per - 1) / per), size = (cnt + nchunk - 1) / nchunk;
        for (int at = 0; at < cnt; at += size) {
            struct og_batch *b = &o->batches[o->n_batches++];
            b->rows = r;
            b->cols = c;
            b->nb = cnt - at < size ? cnt - at : size;
            b->tab_off = k;
            for (int q = 0; q < b->nb; q++) o->muon_idx[k++] = members[at + q];
        }
    }
    free(done);
    free(members);
    return 0;
}

struct optim_gpu *optim_gpu_init_table(struct optim *host, const struct optim_gpu_tensor *dev, cudaStream_t s,
                                       FILE *plan, char *err, int err_len) {
    static const char fn[] = "optim_gpu_init";
    for (int i = 0; i < host->n; i++)   /* frozen tensors are never touched (the GPU drafter may keep no fp32 copy) */
        if (host->group[i] != OPTIM_GROUP_NONE && (!dev[i].w || !dev[i].g)) {
            err_fail(err, err_len, "%s: tensor %d (%s) has no device %s", fn, i, host->t[i].name,
                     dev[i].w ? "gradient" : "weights");
            return NULL;
        }
    struct optim_gpu *o = calloc(1, sizeof *o);
    if (!o) {
        err_fail(err, err_len, "%s: out of memory", fn);
        return NULL;
    }
    o->host = host;
    o->s = s;
    o->n = host->n;
    o->muon_batched = 1;
    o->dev = calloc((size_t)(o->n ? o->n : 1), sizeof *o->dev);
    o->m = calloc((size_t)(o->n ? o->n : 1), sizeof *o->m);
    o->v = calloc((size_t)(o->n ? o->n : 1), sizeof *o->v);
    o->mom = calloc((size_t)(o->n ? o->n : 1), sizeof *o->mom);
    if (!o->dev || !o->m || !o->v || !o->mom) {
        optim_gpu_free(o);
        err_fail(err, err_len, "%s: out of memory", fn);
        return NULL;
    }
    if (o->n) memcpy(o->dev, dev, (size_t)o->n * sizeof *dev);
    /* sizes: state per tensor, the batches, then the scratch and the tables */
    size_t state = 0;
    for (int i = 0; i < o->n; i++) {
        size_t ne = (size_t)host->numel[i];
        if (host->group[i] == OPTIM_GROUP_NONE) continue;
        o->n_norm++;
        if (host->group[i] == OPTIM_GROUP_ADAMW) state += 2 * a256(4 * ne);
        if (host->group[i] == OPTIM_GROUP_MUON) {
            state += a256(4 * ne);
            int64_t r = host->t[i].shape[0], c = host->t[i].shape[1], mn = r < c ? r : c, mx = r < c ? c : r;
            o->muon_flops += host->cfg.ns_steps * (4.0 * mn * mn * mx + 2.0 * mn * mn * mn);
            if (r % 8 || c % 8) {
                optim_gpu_free(o);
                err_fail(err, err_len, "%s: Muon matrix %s is %lld x %lld; cuBLASLt needs both dims multiples of 8", fn,
                         host->t[i].name, (long long)r, (long long)c);
                return NULL;
            }
        }
    }
    if (o->n_norm > 65535) {
        optim_gpu_free(o);
        err_fail(err, err_len, "%s: %d trainable tensors; the norm's table takes at most 65535", fn, o->n_norm);
        return NULL;
    }
    if (plan_batches(o, err, err_len)) {
        optim_gpu_free(o);
        return NULL;
    }
    size_t max_x = 0, max_a = 0;
    int max_nb = 1;
    for (int b = 0; b < o->n_batches; b++) {
        const struct og_batch *q = &o->batches[b];
        size_t mn = (size_t)(q->rows < q->cols ? q->rows : q->cols);
        if ((size_t)q->nb * q->rows * q->cols > max_x) max_x = (size_t)q->nb * q->rows * q->cols;
        if ((size_t)q->nb * mn * mn > max_a) max_a = (size_t)q->nb * mn * mn;
        if (q->nb > max_nb) max_nb = q->nb;
    }
    /* AdamW tensors and their chunks (planned on the host with the final device pointers below) */
    adamw_tensor *at = calloc((size_t)(host->n_adamw ? host->n_adamw : 1), sizeof *at);
    if (!at) {
        optim_gpu_free(o);
        err_fail(err, err_len, "%s: out of memory", fn);
        return NULL;
    }
    for (int i = 0, k = 0; i < o->n; i++)
        if (host->group[i] == OPTIM_GROUP_ADAMW) at[k++].n = host->numel[i];
    int64_t n_chunks = adamw_multi_chunks(at, host->n_adamw);
    const int n_part = o->n_norm > max_nb ? o->n_norm : max_nb;
    size_t tables = a256(sizeof(og_vec) * (size_t)o->n_norm) + a256(sizeof(og_muon_ptrs) * (size_t)host->n_muon) +
                    a256(sizeof(adamw_tensor) * (size_t)host->n_adamw) + a256(sizeof(adamw_chunk) * (size_t)n_chunks);
    size_t scratch = a256(8) + a256(8 * (size_t)max_nb) + a256(8 * (size_t)OG_PARTIALS * n_part) + 2 * a256(2 * max_x) +
                     2 * a256(2 * max_a);
    o->bytes = state + scratch + tables;
    cudaError_t ce = cudaMalloc(&o->base, o->bytes);
    if (ce != cudaSuccess) {
        err_fail(err, err_len, "%s: cudaMalloc of %.1f MiB of optimizer state: %s", fn, o->bytes / 1048576.0,
                 cudaGetErrorString(ce));
        free(at);
        optim_gpu_free(o);
        return NULL;
    }
    char *p = o->base;
    for (int i = 0; i < o->n; i++) {
        size_t ne = (size_t)host->numel[i];
        if (host->group[i] == OPTIM_GROUP_ADAMW) {
            o->m[i] = (float *)p, p += a256(4 * ne);
            o->v[i] = (float *)p, p += a256(4 * ne);
        }
        if (host->group[i] == OPTIM_GROUP_MUON) o->mom[i] = (float *)p, p += a256(4 * ne);
    }
    o->sumsq = (double *)p, p += a256(8);
    o->ns_ss = (double *)p, p += a256(8 * (size_t)max_nb);
    o->partials = (double *)p, p += a256(8 * (size_t)OG_PARTIALS * n_part);
    o->ns_x = (bf16 *)p, p += a256(2 * max_x);
    o->ns_y = (bf16 *)p, p += a256(2 * max_x);
    o->ns_a = (bf16 *)p, p += a256(2 * max_a);
    o->ns_b = (bf16 *)p, p += a256(2 * max_a);
    o->d_norm = (og_vec *)p, p += a256(sizeof(og_vec) * (size_t)o->n_norm);
    o->d_muon = (og_muon_ptrs *)p, p += a256(sizeof(og_muon_ptrs) * (size_t)host->n_muon);
    o->d_adamw = (adamw_tensor *)p, p += a256(sizeof(adamw_tensor) * (size_t)host->n_adamw);
    o->d_chunks = (adamw_chunk *)p, p += a256(sizeof(adamw_chunk) * (size_t)n_chunks);
    /* the host images of the tables */
    og_vec *hn = calloc((size_t)(o->n_norm ? o->n_norm : 1), sizeof *hn);
    og_muon_ptrs *hm = calloc((size_t)(host->n_muon ? host->n_muon : 1), sizeof *hm);
    adamw_chunk *hc = calloc((size_t)(n_chunks ? n_chunks : 1), sizeof *hc);
    int ok = hn && hm && hc;
    if (ok) {
        for (int i = 0, k = 0, a = 0; i < o->n; i++) {
            if (host->group[i] == OPTIM_GROUP_NONE) continue;
            hn[k++] = (og_vec){o->dev[i].g, (size_t)host->numel[i]};
            if (host->group[i] == OPTIM_GROUP_ADAMW)
                at[a++] = (adamw_tensor){o->dev[i].w, o->m[i], o->v[i], o->dev[i].g, o->dev[i].copy,
                                         host->numel[i], 0, 0};
        }
        for (int k = 0; k < host->n_muon; k++) {
            int i = o->muon_idx[k];
            hm[k] = (og_muon_ptrs){o->dev[i].w, o->dev[i].g, o->dev[i].copy, o->mom[i]};
        }
        if (adamw_multi_plan(at, host->n_adamw, hc, n_chunks) != n_chunks) {
            err_fail(err, err_len, "%s: %s", fn, kernels_error());
            ok = -1;
        }
    }
    o->n_chunks = n_chunks;
    if (ok == 1 &&
        (cudaMemset(o->base, 0, o->bytes) != cudaSuccess ||
         cudaMemcpy(o->d_norm, hn, sizeof *hn * (size_t)o->n_norm, cudaMemcpyHostToDevice) != cudaSuccess ||
         cudaMemcpy(o->d_muon, hm, sizeof *hm * (size_t)host->n_muon, cudaMemcpyHostToDevice) != cudaSuccess ||
         cudaMemcpy(o->d_adamw, at, sizeof *at * (size_t)host->n_adamw, cudaMemcpyHostToDevice) != cudaSuccess ||
         cudaMemcpy(o->d_chunks, hc, sizeof *hc * (size_t)n_chunks, cudaMemcpyHostToDevice) != cudaSuccess ||
         cudaMallocHost((void **)&o->h_sumsq, sizeof(double)) != cudaSuccess ||
         cudaEventCreateWithFlags(&o->ev, cudaEventDisableTiming) != cudaSuccess)) {
        err_fail(err, err_len, "%s: zeroing the state, uploading the tables, the pinned norm buffer or the event failed", fn);
        ok = -1;
    } else if (ok == 0) {
        err_fail(err, err_len, "%s: out of memory", fn);
    }
    free(hn);
    free(hm);
    free(hc);
    free(at);
    if (ok != 1 || optim_gpu_upload_state(o, err, err_len)) {
        optim_gpu_free(o);
        return NULL;
    }
    if (plan)
        fprintf(plan, "dflash-train gpu optimizer plan: state fp32 %.3f MiB (%d Muon, %d AdamW tensors), Newton-Schulz "
                "scratch %.3f MiB (%d shape batches, largest %d matrices), tables %.3f MiB (%lld AdamW chunks), total "
                "%.3f MiB\n", state / 1048576.0, host->n_muon, host->n_adamw, scratch / 1048576.0, o->n_batches, max_nb,
                tables / 1048576.0, (long long)n_chunks, o->bytes / 1048576.0);
    return o;
}

int optim_gpu_grad_norm_start(struct optim_gpu *o, float scale, char *err, int err_len) {
    static const char fn[] = "optim_gpu_grad_norm_start";
    if (o->n_norm) KL(og_grad_sumsq_multi(o->d_norm, o->n_norm, scale, o->partials, o->sumsq, NULL, o->s));
    else CU(cudaMemsetAsync(o->sumsq, 0, sizeof(double), o->s), "sumsq");
    CU(cudaMemcpyAsync(o->h_sumsq, o->sumsq, sizeof(double), cudaMemcpyDeviceToHost, o->s), "sumsq copy");
    CU(cudaEventRecord(o->ev, o->s), "event");
    o->norm_pending = 1;
    return 0;
}

int optim_gpu_grad_norm_wait(struct optim_gpu *o, double *norm, char *err, int err_len) {
    static const char fn[] = "optim_gpu_grad_norm_wait";
    if (!o->norm_pending) return err_fail(err, err_len, "%s: optim_gpu_grad_norm_start was not called", fn);
    CU(cudaEventSynchronize(o->ev), "event");
    *norm = sqrt(*o->h_sumsq);
    return 0;
}

/* One Muon matrix (the per-matrix path): the direction in o->ns_x or o->ns_y, applied to w and its bf16 copy. */
static int muon_one(struct optim_gpu *o, int i, float lr, float max_norm, char *err, int err_len) {
    static const char fn[] = "optim_gpu_step (Muon)";
    const struct optim_config *c = &o->host->cfg;
    const struct optim_gpu_tensor *p = &o->dev[i];
    const int64_t rows = o->host->t[i].shape[0], cols = o->host->t[i].shape[1];
    const size_t ne = (size_t)(rows * cols);
    const int tall = rows > cols;
    const int m = (int)(tall ? cols : rows);   /* A, B are (m, m) */
    cudaStream_t s = o->s;
    bf16 *x = o->ns_x, *y = o->ns_y, *A = o->ns_a, *Bm = o->ns_b;
    KL(og_muon_prep(o->mom[i], p->g, x, ne, (float)c->muon_momentum, c->muon_nesterov, o->sumsq, max_norm, s));
    KL(og_sumsq_bf16(x, ne, o->partials, o->ns_ss, s));
    KL(og_muon_normalize(x, ne, o->ns_ss, (float)c->ns_eps, s));
    const float ca = (float)c->ns_a, cb = (float)c->ns_b, cc = (float)c->ns_c;
    const int R = (int)rows, C = (int)cols;
    for (int it = 0; it < c->ns_steps; it++) {
        if (!tall) {   /* X (R, C), R <= C: A = X·Xᵀ (R, R) */
            KL(blas_matmul(A, BLAS_BF16, x, 0, x, 1, NULL, m, m, C, 0, 0, 0, 1.0f, 0.0f, s));
        } else {       /* A = Xᵀ·X (C, C) */
            KL(blas_matmul(A, BLAS_BF16, x, 1, x, 0, NULL, m, m, R, 0, 0, 0, 1.0f, 0.0f, s));
        }
        CU(cudaMemcpyAsync(Bm, A, 2 * (size_t)m * m, cudaMemcpyDeviceToDevice, s), "NS copy");
        KL(blas_matmul(Bm, BLAS_BF16, A, 0, A, 0, NULL, m, m, m, 0, 0, 0, cc, cb, s));
        CU(cudaMemcpyAsync(y, x, 2 * ne, cudaMemcpyDeviceToDevice, s), "NS copy");
        if (!tall) {   /* X = a·X + B·X */
            KL(blas_matmul(y, BLAS_BF16, Bm, 0, x, 0, NULL, R, C, R, 0, 0, 0, 1.0f, ca, s));
        } else {       /* X = a·X + X·B */
            KL(blas_matmul(y, BLAS_BF16, x, 0, Bm, 0, NULL, R, C, C, 0, 0, 0, 1.0f, ca, s));
        }
        bf16 *t = x;
        x = y;
        y = t;
    }
    const double ratio = 0.2 * sqrt((double)(rows > cols ? rows : cols));
    const float adj = (float)((double)lr * ratio);
    const float decay = 1.0f - lr * (float)c->muon_weight_decay;
    KL(og_muon_update(p->w, p->copy, x, ne, decay, adj, s));
    return 0;
}

/* One shape batch: the per-matrix path's steps, each once for all nb matrices. */
static int muon_batch(struct optim_gpu *o, const struct og_batch *b, float lr, float max_norm, char *err, int err_len) {
    static const char fn[] = "optim_gpu_step (Muon batch)";
    const struct optim_config *c = &o->host->cfg;
    const int64_t rows = b->rows, cols = b->cols;
    const size_t ne = (size_t)(rows * cols);
    const int tall = rows > cols, nb = b->nb;
    const int m = (int)(tall ? cols : rows);
    const long long sx = (long long)ne, sm = (long long)m * m;
    const og_muon_ptrs *tab = o->d_muon + b->tab_off;
    cudaStream_t s = o->s;
    bf16 *x = o->ns_x, *y = o->ns_y, *A = o->ns_a, *Bm = o->ns_b;
    KL(og_muon_prep_batched(tab, nb, ne, x, (float)c->muon_momentum, c->muon_nesterov, o->sumsq, max_norm, s));
    KL(og_sumsq_bf16_batched(x, ne, nb, o->partials, o->ns_ss, s));
    KL(og_muon_normalize_batched(x, ne, nb, o->ns_ss, (float)c->ns_eps, s));
    const float ca = (float)c->ns_a, cb = (float)c->ns_b, cc = (float)c->ns_c;
    const int R = (int)rows, C = (int)cols;
    const int sym = o->ns_symmetric && m % 16 == 0, h = m / 2;
    for (int it = 0; it < c->ns_steps; it++) {
        if (sym) {
            /* A's blocks 11, 22, 21 from the halves of X (rows, or columns when tall), then 12 = 21ᵀ */
            const size_t xh = tall ? (size_t)h : (size_t)h * C;   /* offset of X's second half */
            const int K = tall ? R : C, ld = C;
            const size_t off[3][3] = {{0, 0, 0}, {(size_t)h * m + h, xh, xh}, {(size_t)h * m, xh, 0}};   /* d, a, b */
            for (int q = 0; q < 3; q++)
                KL(blas_matmul_batched(A + off[q][0], NULL, BLAS_BF16, x + off[q][1], tall, x + off[q][2], !tall, h, h,
                                       K, ld, ld, m, sx, sx, sm, nb, 1.0f, 0.0f, s));
            KL(og_sym_mirror_batched(A, m, nb, sm, s));
            /* B's blocks: B_ij = c·A[i rows, :]·A[:, j cols] + b·A_ij */
            const size_t bo[3][3] = {{0, 0, 0}, {(size_t)h * m + h, (size_t)h * m, (size_t)h}, {(size_t)h * m, (size_t)h * m, 0}};
            for (int q = 0; q < 3; q++)
                KL(blas_matmul_batched(Bm + bo[q][0], A + bo[q][0], BLAS_BF16, A + bo[q][1], 0, A + bo[q][2], 0, h, h, m,
                                       m, m, m, sm, sm, sm, nb, cc, cb, s));
            KL(og_sym_mirror_batched(Bm, m, nb, sm, s));
        } else {
            if (!tall) KL(blas_matmul_batched(A, NULL, BLAS_BF16, x, 0, x, 1, m, m, C, 0, 0, 0, sx, sx, sm, nb, 1.0f, 0.0f, s));
            else       KL(blas_matmul_batched(A, NULL, BLAS_BF16, x, 1, x, 0, m, m, R, 0, 0, 0, sx, sx, sm, nb, 1.0f, 0.0f, s));
            /* B = c·A·A + b·A (C read from A: no copy) */
            KL(blas_matmul_batched(Bm, A, BLAS_BF16, A, 0, A, 0, m, m, m, 0, 0, 0, sm, sm, sm, nb, cc, cb, s));
        }
        /* Y = B·X + a·X (or X·B + a·X), C read from X */
        if (!tall) KL(blas_matmul_batched(y, x, BLAS_BF16, Bm, 0, x, 0, R, C, R, 0, 0, 0, sm, sx, sx, nb, 1.0f, ca, s));
        else       KL(blas_matmul_batched(y, x, BLAS_BF16, x, 0, Bm, 0, R, C, C, 0, 0, 0, sx, sm, sx, nb, 1.0f, ca, s));
        bf16 *t = x;
        x = y;
        y = t;
    }
    const double ratio = 0.2 * sqrt((double)(rows > cols ? rows : cols));
    const float adj = (float)((double)lr * ratio);
    const float decay = 1.0f - lr * (float)c->muon_weight_decay;
    KL(og_muon_update_batched(tab, nb, ne, x, decay, adj, s));
    return 0;
}

int optim_gpu_step(struct optim_gpu *o, double lr_mult, double max_norm, char *err, int err_len) {
    static const char fn[] = "optim_gpu_step";
    struct optim *h = o->host;
    if (!(lr_mult >= 0) || !isfinite(lr_mult))
        return err_fail(err, err_len, "%s: lr multiplier must be finite and >= 0, got %g", fn, lr_mult);
    if (!o->norm_pending) return err_fail(err, err_len, "%s: optim_gpu_grad_norm_start was not called", fn);
    if (h->n_muon) {
        float lr = (float)(h->cfg.muon_lr * lr_mult);
        if (o->muon_batched) {
            for (int b = 0; b < o->n_batches; b++)
                if (muon_batch(o, &o->batches[b], lr, (float)max_norm, err, err_len)) return -1;
        } else {
            for (int i = 0; i < o->n; i++)
                if (h->group[i] == OPTIM_GROUP_MUON && muon_one(o, i, lr, (float)max_norm, err, err_len)) return -1;
        }
        h->muon_step++;
    }
    if (h->n_adamw) {
        if (h->adamw_step + 1 > 0x7fffffff) return err_fail(err, err_len, "%s: AdamW step counter overflows int", fn);
        adamw_params p = {(float)(h->cfg.lr * lr_mult), (float)h->cfg.beta1, (float)h->cfg.beta2, (float)h->cfg.eps,
                          (float)h->cfg.weight_decay, (int)(h->adamw_step + 1), (float)max_norm};
        KL(adamw_step_multi(o->d_adamw, o->d_chunks, o->n_chunks, &p, max_norm > 0 ? o->sumsq : NULL, o->s));
        h->adamw_step++;
    }
    o->norm_pending = 0;
    return 0;
}

static int move_state(struct optim_gpu *o, int down, char *err, int err_len) {
    static const char fn[] = "optim_gpu state copy";
    struct optim *h = o->host;
    enum cudaMemcpyKind k = down ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    CU(cudaStreamSynchronize(o->s), "stream");
    for (int i = 0; i < o->n; i++) {
        size_t b = 4 * (size_t)h->numel[i];
        if (o->m[i]) {
            CU(down ? cudaMemcpy(h->m[i], o->m[i], b, k) : cudaMemcpy(o->m[i], h->m[i], b, k), h->t[i].name);
            CU(down ? cudaMemcpy(h->v[i], o->v[i], b, k) : cudaMemcpy(o->v[i], h->v[i], b, k), h->t[i].name);
        }
        if (o->mom[i]) CU(down ? cudaMemcpy(h->mom[i], o->mom[i], b, k) : cudaMemcpy(o->mom[i], h->mom[i], b, k), h->t[i].name);
    }
    return 0;
}

int optim_gpu_download_state(struct optim_gpu *o, char *err, int err_len) { return move_state(o, 1, err, err_len); }
int optim_gpu_upload_state(struct optim_gpu *o, char *err, int err_len) { return move_state(o, 0, err, err_len); }
#endif /* DFLASH_CUDA */
