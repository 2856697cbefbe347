/*
 * stages/train/optim_gpu.c — the GPU optimizers over a drafter_gpu (train/optim_gpu.h).
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

struct optim_gpu {
    struct optim *host;
    struct drafter_gpu *g;
    cudaStream_t s;
    int n;
    float **m, **v, **mom;             /* (n) device state, NULL outside the tensor's group */
    void *base;
    size_t bytes;
    double *sumsq, *partials, *ns_ss;  /* (1), (OG_PARTIALS), (1) */
    float *sumsq_f;                    /* (1) for adamw_step */
    bf16 *ns_x, *ns_y, *ns_a, *ns_b;   /* Newton–Schulz scratch */
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
    free(o->m);
    free(o->v);
    free(o->mom);
    free(o);
}

size_t optim_gpu_planned_bytes(const struct optim_gpu *o) { return o->bytes; }

struct optim_gpu *optim_gpu_init(struct optim *host, struct drafter_gpu *g, FILE *plan, char *err, int err_len) {
    static const char fn[] = "optim_gpu_init";
    if (host->n != drafter_gpu_n_params(g)) {
        err_fail(err, err_len, "%s: the optimizer has %d tensors, the drafter %d", fn, host->n, drafter_gpu_n_params(g));
        return NULL;
    }
    for (int i = 0; i < host->n; i++) {
        const struct drafter_gpu_param *p = drafter_gpu_param(g, i);
        if (strcmp(host->t[i].name, p->host->name) || (host->group[i] != OPTIM_GROUP_NONE && !p->g)) {
            err_fail(err, err_len, "%s: optimizer tensor %d (%s) does not match the drafter's %s", fn, i, host->t[i].name,
                     p->host->name);
            return NULL;
        }
    }
    struct optim_gpu *o = calloc(1, sizeof *o);
    if (!o) {
        err_fail(err, err_len, "%s: out of memory", fn);
        return NULL;
    }
    o->host = host;
    o->g = g;
    o->s = drafter_gpu_stream(g);
    o->n = host->n;
    o->m = calloc((size_t)o->n, sizeof *o->m);
    o->v = calloc((size_t)o->n, sizeof *o->v);
    o->mom = calloc((size_t)o->n, sizeof *o->mom);
    if (!o->m || !o->v || !o->mom) {
        optim_gpu_free(o);
        err_fail(err, err_len, "%s: out of memory", fn);
        return NULL;
    }
    /* sizes: state per tensor, then the scratch */
    size_t state = 0, max_mn = 0, max_m2 = 0;
    for (int i = 0; i < o->n; i++) {
        size_t ne = (size_t)host->numel[i];
        if (host->group[i] == OPTIM_GROUP_ADAMW) state += 2 * a256(4 * ne);
        if (host->group[i] == OPTIM_GROUP_MUON) {
            state += a256(4 * ne);
            int64_t r = host->t[i].shape[0], c = host->t[i].shape[1], mn = r < c ? r : c;
            if (ne > max_mn) max_mn = ne;
            if ((size_t)(mn * mn) > max_m2) max_m2 = (size_t)(mn * mn);
            if (r % 8 || c % 8) {
                optim_gpu_free(o);
                err_fail(err, err_len, "%s: Muon matrix %s is %lld x %lld; cuBLASLt needs both dims multiples of 8", fn,
                         host->t[i].name, (long long)r, (long long)c);
                return NULL;
            }
        }
    }
    size_t scratch = a256(8) * 2 + a256(8 * OG_PARTIALS) + a256(4) + 2 * a256(2 * max_mn) + 2 * a256(2 * max_m2);
    o->bytes = state + scratch;
    cudaError_t ce = cudaMalloc(&o->base, o->bytes);
    if (ce != cudaSuccess) {
        err_fail(err, err_len, "%s: cudaMalloc of %.1f MiB of optimizer state: %s", fn, o->bytes / 1048576.0,
                 cudaGetErrorString(ce));
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
    o->ns_ss = (double *)p, p += a256(8);
    o->partials = (double *)p, p += a256(8 * OG_PARTIALS);
    o->sumsq_f = (float *)p, p += a256(4);
    o->ns_x = (bf16 *)p, p += a256(2 * max_mn);
    o->ns_y = (bf16 *)p, p += a256(2 * max_mn);
    o->ns_a = (bf16 *)p, p += a256(2 * max_m2);
    o->ns_b = (bf16 *)p, p += a256(2 * max_m2);
    if (cudaMemset(o->base, 0, o->bytes) != cudaSuccess || cudaMallocHost((void **)&o->h_sumsq, sizeof(double)) != cudaSuccess ||
        cudaEventCreateWithFlags(&o->ev, cudaEventDisableTiming) != cudaSuccess) {
        err_fail(err, err_len, "%s: zeroing the state, the pinned norm buffer or the event failed", fn);
        optim_gpu_free(o);
        return NULL;
    }
    if (optim_gpu_upload_state(o, err, err_len)) {
        optim_gpu_free(o);
        return NULL;
    }
    if (plan)
        fprintf(plan, "dflash-train gpu optimizer plan: state fp32 %.3f MiB (%d Muon, %d AdamW tensors), Newton-Schulz "
                "scratch %.3f MiB, total %.3f MiB\n", state / 1048576.0, host->n_muon, host->n_adamw, scratch / 1048576.0,
                o->bytes / 1048576.0);
    return o;
}

int optim_gpu_grad_norm_start(struct optim_gpu *o, float scale, char *err, int err_len) {
    static const char fn[] = "optim_gpu_grad_norm_start";
    int first = 1;
    for (int i = 0; i < o->n; i++) {
        if (o->host->group[i] == OPTIM_GROUP_NONE) continue;
        const struct drafter_gpu_param *p = drafter_gpu_param(o->g, i);
        size_t ne = (size_t)o->host->numel[i];
        if (scale != 1.0f) KL(og_scale(p->g, ne, scale, o->s));
        KL(og_sumsq_f32(p->g, ne, o->partials, o->sumsq, o->sumsq_f, !first, o->s));
        first = 0;
    }
    if (first) CU(cudaMemsetAsync(o->sumsq, 0, sizeof(double), o->s), "sumsq");
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

/* One Muon matrix (see optim_gpu.h): the direction in o->ns_x or o->ns_y, applied to w and its bf16 copy. */
static int muon_one(struct optim_gpu *o, int i, float lr, float max_norm, char *err, int err_len) {
    static const char fn[] = "optim_gpu_step (Muon)";
    const struct optim_config *c = &o->host->cfg;
    const struct drafter_gpu_param *p = drafter_gpu_param(o->g, i);
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

int optim_gpu_step(struct optim_gpu *o, double lr_mult, double max_norm, char *err, int err_len) {
    static const char fn[] = "optim_gpu_step";
    struct optim *h = o->host;
    if (!(lr_mult >= 0) || !isfinite(lr_mult))
        return err_fail(err, err_len, "%s: lr multiplier must be finite and >= 0, got %g", fn, lr_mult);
    if (!o->norm_pending) return err_fail(err, err_len, "%s: optim_gpu_grad_norm_start was not called", fn);
    if (h->n_muon) {
        float lr = (float)(h->cfg.muon_lr * lr_mult);
        for (int i = 0; i < o->n; i++)
            if (h->group[i] == OPTIM_GROUP_MUON && muon_one(o, i, lr, (float)max_norm, err, err_len)) return -1;
        h->muon_step++;
    }
    if (h->n_adamw) {
        if (h->adamw_step + 1 > 0x7fffffff) return err_fail(err, err_len, "%s: AdamW step counter overflows int", fn);
        adamw_params p = {(float)(h->cfg.lr * lr_mult), (float)h->cfg.beta1, (float)h->cfg.beta2, (float)h->cfg.eps,
                          (float)h->cfg.weight_decay, (int)(h->adamw_step + 1), (float)max_norm};
        for (int i = 0; i < o->n; i++) {
            if (h->group[i] != OPTIM_GROUP_ADAMW) continue;
            const struct drafter_gpu_param *q = drafter_gpu_param(o->g, i);
            KL(adamw_step(q->w, o->m[i], o->v[i], q->g, q->copy, (size_t)h->numel[i], &p,
                          max_norm > 0 ? o->sumsq_f : NULL, o->s));
        }
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
