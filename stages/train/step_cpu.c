/*
 * stages/train/step_cpu.c — the CPU implementation of struct step_exec (step.h): the fp32 drafter_step on host
 * slots (bf16 features widened exactly into two planned buffers, fp32 features read in place), optim_step.
 *
 * Accumulation (issue 29): each train micro-batch's gradient is computed from zero and then added to the sum of
 * the step's earlier ones (a planned stash holds that sum meanwhile), so a step's gradient is g0 + g1 + ... with
 * each g_i rounded alone: what W data-parallel ranks summing their own micro-batches produce (for W = 2, bit for
 * bit; stages/train/dp.h).
 */
#include "train/step.h"

#include "core/err.h"
#include "kernels/common.h"

#include <stdlib.h>
#include <string.h>

struct step_cpu {
    struct drafter *d;
    struct optim *opt;
    struct optim_tensor *tens;
    int n_tens;
    const char *in_ring;
    float *hidden_f32, *last_f32;   /* planned: (T_max, k·H), (T_max, H) */
    float *stash;                   /* planned: every gradient element (the step's sum so far) */
    size_t n_grad;
    int n_micro;                    /* train micro-batches in the gradients since the last zero_grad */
    int round_bf16;                 /* step_cpu_round_features */
};

static void grads_to_stash(struct step_cpu *s) {
    size_t o = 0;
    for (int i = 0; i < s->n_tens; i++) {
        const struct optim_tensor *t = &s->tens[i];
        if (!t->g) continue;
        size_t n = (size_t)(t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0]);
        memcpy(s->stash + o, t->g, n * sizeof(float));
        memset(t->g, 0, n * sizeof(float));
        o += n;
    }
}

static void stash_add(struct step_cpu *s) {
    size_t o = 0;
    for (int i = 0; i < s->n_tens; i++) {
        const struct optim_tensor *t = &s->tens[i];
        if (!t->g) continue;
        size_t n = (size_t)(t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0]);
        for (size_t j = 0; j < n; j++) t->g[j] = s->stash[o + j] + t->g[j];
        o += n;
    }
}

static int cpu_micro(void *impl, const struct ring_slot *is, const struct desc_features *fd, int train, uint64_t seed,
                     struct step_acc *acc, struct drafter_metrics *val, const struct step_dump *dump, char *err,
                     int err_len) {
    struct step_cpu *s = impl;
    const struct drafter_config *c = drafter_config_of(s->d);
    char e2[768];
    if (is->on_device)
        return err_fail(err, err_len, "ring '%s' holds GPU payloads, but the trainer runs on the CPU: run with "
                        "--device cuda:N, or create the ring with dev=host", s->in_ring);
    if (desc_batch_check_payload(&fd->batch, is->payload, c->V_t, e2, sizeof e2))
        return err_fail(err, err_len, "features seq %llu: %s", (unsigned long long)fd->batch.seq, e2);
    struct desc_batch_arrays ba;
    desc_batch_arrays(&fd->batch, is->payload, &ba);
    size_t T = fd->batch.n_tokens, kH = (size_t)c->k * c->H;
    const float *hidden = (const float *)((const char *)is->payload + fd->off_states);
    const float *last = (const float *)((const char *)is->payload + fd->off_last);
    if (s->round_bf16 && fd->dtype == DESC_DTYPE_F32) {   /* what the GPU path stores: bf16(x), widened */
        for (size_t e = 0; e < T * kH; e++) s->hidden_f32[e] = bf16_round(hidden[e]);
        for (size_t e = 0; e < T * (size_t)c->H; e++) s->last_f32[e] = bf16_round(last[e]);
        hidden = s->hidden_f32;
        last = s->last_f32;
    } else if (fd->dtype == DESC_DTYPE_BF16) {   /* widened exactly into the planned buffers */
        floats_from_bf16(s->hidden_f32, (const bf16 *)hidden, T * kH);
        floats_from_bf16(s->last_f32, (const bf16 *)last, T * (size_t)c->H);
        hidden = s->hidden_f32;
        last = s->last_f32;
    }
    struct drafter_batch b = {(int)T, (int)fd->batch.budget, ba.input_ids, ba.loss_mask, ba.position_ids, ba.doc_ids,
                              hidden, last};
    if (!train) return drafter_step(s->d, &b, seed, fd->batch.seq, 0, val, err, err_len);
    struct drafter_metrics m;
    if (s->n_micro) grads_to_stash(s);   /* this batch's gradient from zero, then added */
    if (drafter_step(s->d, &b, seed, fd->batch.seq, 1, &m, err, err_len)) return -1;
    if (s->n_micro) stash_add(s);
    s->n_micro++;
    if (dump && drafter_dump_step(s->d, dump->dir, &b, &m, &dump->info, err, err_len)) return -1;
    drafter_metrics_add(&acc->m, &m);
    acc->loss_sum += m.loss_sum;
    return 0;
}

static int cpu_grad_norm(void *impl, struct step_acc *acc, float scale, double clip, double *norm, char *err,
                         int err_len) {
    struct step_cpu *s = impl;
    (void)acc, (void)err, (void)err_len;
    optim_scale_grads(s->tens, s->n_tens, scale);
    *norm = optim_clip_grad_norm(s->tens, s->n_tens, clip);
    return 0;
}

static int cpu_apply(void *impl, double lr_factor, double clip, char *err, int err_len) {
    struct step_cpu *s = impl;
    (void)clip;   /* clipped in grad_norm */
    return optim_step(s->opt, lr_factor, err, err_len);
}

static int cpu_zero_grad(void *impl, char *err, int err_len) {
    struct step_cpu *s = impl;
    (void)err, (void)err_len;
    optim_zero_grad(s->tens, s->n_tens);
    s->n_micro = 0;
    return 0;
}

static int cpu_to_host(void *impl, char *err, int err_len) {
    (void)impl, (void)err, (void)err_len;
    return 0;
}

static int cpu_sum_grads(void *impl, struct dp *dp, char *err, int err_len) {
    struct step_cpu *s = impl;
    for (int i = 0; i < s->n_tens; i++) {
        const struct optim_tensor *t = &s->tens[i];
        if (!t->g) continue;
        size_t n = (size_t)(t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0]);
        if (dp_sum_f32(dp, t->g, n, err, err_len)) return -1;
    }
    return 0;
}

static void cpu_free(void *impl) {
    struct step_cpu *s = impl;
    if (!s) return;
    free(s->hidden_f32);
    free(s->last_f32);
    free(s->stash);
    free(s);
}

int step_cpu_init(struct step_exec *x, struct drafter *d, struct optim *opt, struct optim_tensor *tens, int n_tens,
                  const char *in_ring, char *err, int err_len) {
    memset(x, 0, sizeof *x);
    const struct drafter_config *c = drafter_config_of(d);
    struct step_cpu *s = calloc(1, sizeof *s);
    if (!s) return err_fail(err, err_len, "out of memory");
    *s = (struct step_cpu){d, opt, tens, n_tens, in_ring, NULL, NULL, NULL, 0, 0, 0};
    size_t kH = (size_t)c->k * c->H;
    s->hidden_f32 = malloc((size_t)c->T_max * kH * sizeof(float));
    s->last_f32 = malloc((size_t)c->T_max * c->H * sizeof(float));
    for (int i = 0; i < n_tens; i++)
        if (tens[i].g) s->n_grad += (size_t)(tens[i].ndim == 2 ? tens[i].shape[0] * tens[i].shape[1] : tens[i].shape[0]);
    s->stash = malloc((s->n_grad ? s->n_grad : 1) * sizeof(float));
    if (!s->hidden_f32 || !s->last_f32 || !s->stash) {
        cpu_free(s);
        return err_fail(err, err_len, "out of memory planning the widening buffers (%d tokens x %zu floats)", c->T_max,
                        kH + (size_t)c->H);
    }
    *x = (struct step_exec){s, "cpu", 0, cpu_micro, cpu_grad_norm, cpu_apply, cpu_zero_grad, cpu_to_host, cpu_free,
                            cpu_sum_grads};
    return 0;
}

void step_cpu_round_features(struct step_exec *x, int on) {
    struct step_cpu *s = x->impl;
    s->round_bf16 = on != 0;
}
