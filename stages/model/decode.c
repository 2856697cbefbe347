/*
 * stages/model/decode.c — the KV-cached decode step on the CPU (model/decode.h). Same layer sequence as
 * target.c's forward_cpu; only the attention reads its keys and values from the cache.
 */
#include "model/decode.h"
#include "core/err.h"

#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct decode {
    struct target *t;
    const struct model_config *c;
    int n_slots, max_len, max_step;
    int *len;                   /* (n_slots) */
    float *kc, *vc;             /* (L, n_slots, max_len, NKV·HD) */
    size_t cache_bytes;
    /* work, (max_step rows) */
    float *x, *h, *qkv, *q, *k, *v, *att, *gu, *act;
    int32_t *pos;
    double *p, *o;              /* attention scratch: (max_len), (HD) */
};

void decode_free(struct decode *d) {
    if (!d) return;
    free(d->len);
    free(d->kc);
    free(d->vc);
    free(d->x);
    free(d->h);
    free(d->qkv);
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->att);
    free(d->gu);
    free(d->act);
    free(d->pos);
    free(d->p);
    free(d->o);
    free(d);
}

struct decode *decode_init(struct target *t, int n_slots, int max_len, int max_step_tokens, char *err, int err_len) {
    const struct model_config *c = target_config(t);
    if (target_device(t) >= 0) {
        err_fail(err, err_len, "decode: the KV-cached decode step runs on the CPU only (the GPU path is not written "
                 "yet); load the target with --device cpu");
        return NULL;
    }
    if (c->arch == HF_ARCH_QWEN3_5) {
        err_fail(err, err_len, "decode: Qwen3.5/3.6 targets (Gated DeltaNet layers) need a recurrent-state cache, "
                 "which is not written yet");
        return NULL;
    }
    if (n_slots < 1 || max_len < 1 || max_step_tokens < 1) {
        err_fail(err, err_len, "decode: %d slots of %d tokens, %d per step", n_slots, max_len, max_step_tokens);
        return NULL;
    }
    struct decode *d = calloc(1, sizeof *d);
    if (!d) {
        err_fail(err, err_len, "decode: out of memory");
        return NULL;
    }
    d->t = t;
    d->c = c;
    d->n_slots = n_slots;
    d->max_len = max_len;
    d->max_step = max_step_tokens;
    int C = c->hidden_size, I = c->intermediate_size, HD = c->head_dim, NH = c->num_attention_heads;
    int NKV = c->num_key_value_heads, L = c->num_hidden_layers, QKV = (NH + 2 * NKV) * HD;
    size_t cache = (size_t)L * n_slots * max_len * NKV * HD, T = (size_t)max_step_tokens;
    d->cache_bytes = 2 * cache * sizeof(float);
    d->len = calloc((size_t)n_slots, sizeof *d->len);
    d->kc = malloc(cache * sizeof(float));
    d->vc = malloc(cache * sizeof(float));
    d->x = malloc(T * C * sizeof(float));
    d->h = malloc(T * C * sizeof(float));
    d->qkv = malloc(T * QKV * sizeof(float));
    d->q = malloc(T * NH * HD * sizeof(float));
    d->k = malloc(T * NKV * HD * sizeof(float));
    d->v = malloc(T * NKV * HD * sizeof(float));
    d->att = malloc(T * NH * HD * sizeof(float));
    d->gu = malloc(T * 2 * I * sizeof(float));
    d->act = malloc(T * I * sizeof(float));
    d->pos = malloc(T * sizeof(int32_t));
    d->p = malloc(((size_t)max_len + 1) * sizeof(double));
    d->o = malloc(((size_t)HD + 1) * sizeof(double));
    if (!d->len || !d->kc || !d->vc || !d->x || !d->h || !d->qkv || !d->q || !d->k || !d->v || !d->att || !d->gu ||
        !d->act || !d->pos || !d->p || !d->o) {
        err_fail(err, err_len, "decode: out of memory for %d slots x %d tokens (%.1f MiB of cache)", n_slots, max_len,
                 (double)d->cache_bytes / (1 << 20));
        decode_free(d);
        return NULL;
    }
    return d;
}

int decode_len(const struct decode *d, int slot) { return slot >= 0 && slot < d->n_slots ? d->len[slot] : -1; }

size_t decode_cache_bytes(const struct decode *d) { return d->cache_bytes; }

int decode_truncate(struct decode *d, int slot, int len, char *err, int err_len) {
    if (slot < 0 || slot >= d->n_slots) return err_fail(err, err_len, "decode: slot %d of %d", slot, d->n_slots);
    if (len < 0 || len > d->len[slot])
        return err_fail(err, err_len, "decode: truncate slot %d to %d tokens, it holds %d", slot, len, d->len[slot]);
    d->len[slot] = len;
    return 0;
}

/* Attention of the new rows [r0, r1) of one slot (positions base.. base + r1 - r0 - 1) over that slot's cache,
 * which already holds their own K/V: the loop of attention_forward_ref, keys in position order. */
static void attend(struct decode *d, const float *kc, const float *vc, int r0, int r1, int base) {
    const struct model_config *c = d->c;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads, HD = c->head_dim, G = NH / NKV;
    size_t kvrow = (size_t)NKV * HD;
    double scale = 1.0f / sqrtf((float)HD);
    for (int r = r0; r < r1; r++) {
        int n = base + (r - r0) + 1;   /* keys 0 .. position */
        for (int h = 0; h < NH; h++) {
            int kh = h / G;
            const float *qi = d->q + ((size_t)r * NH + h) * HD;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                const float *kj = kc + (size_t)j * kvrow + (size_t)kh * HD;
                double s = 0;
                for (int e = 0; e < HD; e++) s += (double)qi[e] * kj[e];
                d->p[j] = s * (float)scale;
                if (d->p[j] > m) m = d->p[j];
            }
            for (int e = 0; e < HD; e++) d->o[e] = 0;
            for (int j = 0; j < n; j++) {
                double w = exp(d->p[j] - m);
                sum += w;
                const float *vj = vc + (size_t)j * kvrow + (size_t)kh * HD;
                for (int e = 0; e < HD; e++) d->o[e] += w * vj[e];
            }
            float *oi = d->att + ((size_t)r * NH + h) * HD;
            for (int e = 0; e < HD; e++) oi[e] = (float)(d->o[e] / sum);
        }
    }
}

int decode_extend(struct decode *d, int n_seq, const int *slots, const int32_t *ids, const int32_t *cu,
                  float *states, float *last, char *err, int err_len) {
    const struct model_config *c = d->c;
    if (n_seq < 1 || cu[0] != 0) return err_fail(err, err_len, "decode: %d sequences, cu[0] = %d", n_seq, cu[0]);
    int T = cu[n_seq];
    if (T < 1 || T > d->max_step)
        return err_fail(err, err_len, "decode: %d new tokens in one step, the plan allows 1..%d", T, d->max_step);
    for (int i = 0; i < n_seq; i++) {
        int s = slots[i], m = cu[i + 1] - cu[i];
        if (s < 0 || s >= d->n_slots) return err_fail(err, err_len, "decode: slot %d of %d", s, d->n_slots);
        if (m < 0) return err_fail(err, err_len, "decode: cu[%d] > cu[%d]", i, i + 1);
        if (d->len[s] + m > d->max_len)
            return err_fail(err, err_len, "decode: slot %d would hold %d tokens, the plan allows %d", s, d->len[s] + m,
                            d->max_len);
        for (int j = 0; j < i; j++)
            if (slots[j] == s) return err_fail(err, err_len, "decode: slot %d twice in one step", s);
        for (int r = cu[i]; r < cu[i + 1]; r++) d->pos[r] = d->len[s] + (r - cu[i]);
    }
    int C = c->hidden_size, I = c->intermediate_size, HD = c->head_dim, NH = c->num_attention_heads;
    int NKV = c->num_key_value_heads, L = c->num_hidden_layers, QKV = (NH + 2 * NKV) * HD;
    float eps = (float)c->rms_norm_eps;
    size_t kvrow = (size_t)NKV * HD, slot_rows = (size_t)d->max_len * kvrow, plane = (size_t)T * C;
    int n_cap = target_n_capture(d->t);
    const int *cap = target_capture(d->t);
    if (embedding_forward_ref(d->x, ids, target_cpu_embed(d->t), T, C, c->vocab_size))
        return err_fail(err, err_len, "decode: %s", kernels_error());
    for (int l = 0; l < L; l++) {
        struct target_layer_view ly;
        if (target_cpu_layer(d->t, l, &ly, err, err_len)) return -1;
        rmsnorm_forward_ref(d->h, NULL, d->x, ly.ln_in, T, C, eps);
        gemm_forward_ref(d->qkv, d->h, 0, ly.w_qkv, 1, T, QKV, C, 1.0f, 0.0f);
        size_t nq = (size_t)NH * HD;
        for (int r = 0; r < T; r++) {
            const float *row = d->qkv + (size_t)r * QKV;
            memcpy(d->q + (size_t)r * nq, row, nq * sizeof(float));
            memcpy(d->k + (size_t)r * kvrow, row + nq, kvrow * sizeof(float));
            memcpy(d->v + (size_t)r * kvrow, row + nq + kvrow, kvrow * sizeof(float));
        }
        if (c->qk_norm) {
            rmsnorm_forward_ref(d->q, NULL, d->q, ly.q_norm, T * NH, HD, eps);
            rmsnorm_forward_ref(d->k, NULL, d->k, ly.k_norm, T * NKV, HD, eps);
        }
        rope_forward_ref(d->q, d->k, d->pos, target_cpu_inv_freq(d->t), T, NH, NKV, HD);
        for (int i = 0; i < n_seq; i++) {
            int s = slots[i], m = cu[i + 1] - cu[i];
            float *kc = d->kc + ((size_t)l * d->n_slots + s) * slot_rows;
            float *vc = d->vc + ((size_t)l * d->n_slots + s) * slot_rows;
            memcpy(kc + (size_t)d->len[s] * kvrow, d->k + (size_t)cu[i] * kvrow, (size_t)m * kvrow * sizeof(float));
            memcpy(vc + (size_t)d->len[s] * kvrow, d->v + (size_t)cu[i] * kvrow, (size_t)m * kvrow * sizeof(float));
            attend(d, kc, vc, cu[i], cu[i + 1], d->len[s]);
        }
        gemm_forward_ref(d->x, d->att, 0, ly.w_o, 1, T, C, NH * HD, 1.0f, 1.0f);
        rmsnorm_forward_ref(d->h, NULL, d->x, ly.ln_post, T, C, eps);
        gemm_forward_ref(d->gu, d->h, 0, ly.w_gu, 1, T, 2 * I, C, 1.0f, 0.0f);
        swiglu_forward_ref(d->act, d->gu, d->gu + I, T, I, 2 * I);
        gemm_forward_ref(d->x, d->act, 0, ly.w_down, 1, T, C, I, 1.0f, 1.0f);
        if (states)
            for (int j = 0; j < n_cap; j++)
                if (cap[j] == l) memcpy(states + (size_t)j * plane, d->x, plane * sizeof(float));
    }
    if (last) memcpy(last, d->x, plane * sizeof(float));
    for (int i = 0; i < n_seq; i++) d->len[slots[i]] += cu[i + 1] - cu[i];
    return 0;
}
