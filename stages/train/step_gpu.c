/*
 * stages/train/step_gpu.c — the GPU implementation of struct step_exec (step.h; issue 20's trainer path, moved
 * here from dflash-train.c by issue 25).
 *
 * Start-up (step_gpu_init), after drafter_load_target and any checkpoint restore into the host drafter and
 * struct optim: cudaSetDevice, one blocking stream (it orders after the init's synchronous uploads),
 * drafter_gpu_init (uploads the host weights), optim_gpu_init (uploads the host optimizer state),
 * drafter_gpu_warmup at T_max (cuBLASLt plans); the device memory in use is then the peak (a step allocates
 * nothing). The host adds a pinned buffer for one batch's arrays (desc_batch_max_payload_bytes(T_max)) and
 * registers each host input slot's payload once (cudaHostRegister; a refusal is logged through the error path
 * once and the copies run from pageable memory).
 * One micro-batch: the ids, positions, doc ids, mask, states and last are copied on the stream into
 * drafter_gpu_inputs: host slots host-to-device (bf16, checked on the host in place), device slots
 * device-to-device (their batch arrays first copied to the pinned buffer on a side stream and checked there),
 * fp32 host slots through drafter_gpu_load_batch (rounded to bf16 on the host; synchronous, the slow path; fp32
 * device slots are refused); an event is recorded after the copies; drafter_step_gpu (train: metrics left on
 * the device); micro waits for that event before returning, since the relay releases the slot then. A val
 * batch first collects the pending train metrics (so a pass between micro-batches is not pooled into them),
 * then runs with train 0 and waits for its own metrics. Every 256 pending train micro-batches the metrics are
 * collected (drafter_step_gpu's pending capacity).
 * Optimizer step: optim_gpu_grad_norm_start (g *= 1/A, the norm on the device), optim_gpu_grad_norm_wait (the
 * step's host synchronisation), the pending metrics collected, then apply: optim_gpu_step (clip on the device,
 * Muon + AdamW), zero_grad: drafter_gpu_zero_grad. to_host: synchronous downloads of the weights and optimizer
 * state into the host drafter and struct optim (checkpoints, exports), skipped when nothing changed since.
 */
#include "train/step.h"

#include "core/err.h"

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#include "train/optim_gpu.h"
#include "train/dp_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPU_METRIC_SLOTS 256   /* drafter_step_gpu holds at most this many steps' metrics (drafter.h) */
#define CUDA_OK(call, what)                                                                                     \
    do {                                                                                                        \
        cudaError_t e_ = (call);                                                                                \
        if (e_ != cudaSuccess) return err_fail(err, err_len, "%s: %s", (what), cudaGetErrorString(e_));       \
    } while (0)

struct step_gpu {
    struct drafter *d;
    struct optim *opt;
    int device;
    const char *in_ring;
    struct drafter_gpu *g;
    struct optim_gpu *og;
    cudaStream_t stream;             /* every device call of the step, the copies and the optimizer */
    cudaStream_t side;               /* the copy of a device slot's batch arrays to the host for checking */
    cudaEvent_t copied;              /* recorded after the copies out of an input slot */
    void *h_batch;                   /* pinned: a device slot's batch arrays, checked on the host */
    size_t h_batch_cap;
    void **registered;               /* per input slot index: the host payload registered (cudaHostRegister) */
    uint32_t n_registered;
    int register_failed;             /* cudaHostRegister refused once: pageable copies from then on */
    float **sum_bufs;                /* the trainable device gradients, for the ranks' sum (made by the first one) */
    size_t *sum_counts;
    int n_sum;
    int pending;                     /* train steps whose metrics are still on the device */
    int host_fresh;                  /* 1: the host weights/optimizer state equal the device's */
    void (*log)(const char *line);   /* the memory plan and the one cudaHostRegister refusal (nullable) */
};

/* The metrics of the train steps enqueued since the last collection into acc (waits for the last step's copy). */
static int gpu_collect(struct step_gpu *s, struct step_acc *acc, char *err, int err_len) {
    if (!s->pending) return 0;
    struct drafter_metrics m;
    if (drafter_gpu_metrics(s->g, &m, err, err_len)) return -1;
    drafter_metrics_add(&acc->m, &m);
    acc->loss_sum += m.loss_sum;   /* Σ of the steps' per-batch losses, as the CPU path adds them */
    s->pending = 0;
    return 0;
}

/* Register a host input slot's payload with CUDA once (pinned: full-speed asynchronous copies). A refusal is
 * reported once through s->log and the copies run from pageable memory (correct, slower). */
static void gpu_register_slot(struct step_gpu *s, const struct ring_slot *is) {
    if (s->register_failed || is->index >= s->n_registered || s->registered[is->index] == is->payload) return;
    if (s->registered[is->index]) cudaHostUnregister(s->registered[is->index]);   /* a remap: not seen so far */
    s->registered[is->index] = NULL;
    cudaError_t e = cudaHostRegister(is->payload, (size_t)is->payload_cap, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        s->register_failed = 1;
        char line[512];
        snprintf(line, sizeof line, "cudaHostRegister of ring '%s' slot %u (%llu bytes) failed: %s; copying from "
                 "pageable memory", s->in_ring, is->index, (unsigned long long)is->payload_cap, cudaGetErrorString(e));
        if (s->log) s->log(line);
        return;
    }
    s->registered[is->index] = is->payload;
}

/* End of the batch arrays of b inside its payload (the standard layout puts them first). */
static size_t batch_arrays_end(const struct desc_batch *b) {
    uint64_t T = b->n_tokens, D = b->n_docs, e[6] = {b->off_row_ids + 8 * D, b->off_input_ids + 4 * T,
                                                     b->off_loss_mask + T, b->off_position_ids + 4 * T,
                                                     b->off_doc_ids + 4 * T, b->off_cu_seqlens + 4 * (D + 1)};
    uint64_t m = 0;
    for (int i = 0; i < 6; i++) if (e[i] > m) m = e[i];
    return (size_t)m;
}

/* Fill the drafter_gpu's input buffers with one features item on s->stream and record s->copied after the copies
 * out of the slot (see the file comment). */
static int gpu_load(struct step_gpu *s, const struct ring_slot *is, const struct desc_features *fd, char *err,
                    int err_len) {
    const struct drafter_config *c = drafter_config_of(s->d);
    const struct drafter_gpu_inputs *in = drafter_gpu_inputs(s->g);
    cudaStream_t st = s->stream;
    const size_t T = fd->batch.n_tokens, kH = (size_t)c->k * c->H, H = (size_t)c->H;
    const unsigned long long seq = (unsigned long long)fd->batch.seq;
    char e2[768];
    if (is->on_device && is->device != s->device)
        return err_fail(err, err_len, "ring '%s' holds payloads on cuda:%d, the trainer runs on cuda:%d: use one device",
                        s->in_ring, is->device, s->device);
    if (fd->dtype == DESC_DTYPE_F32) {
        if (is->on_device)
            return err_fail(err, err_len, "features seq %llu: fp32 features in a GPU ring are not supported by the GPU "
                            "trainer; write bf16 (dflash-hspack) or use a host ring", seq);
        if (desc_batch_check_payload(&fd->batch, is->payload, c->V_t, e2, sizeof e2))
            return err_fail(err, err_len, "features seq %llu: %s", seq, e2);
        struct desc_batch_arrays ba;
        desc_batch_arrays(&fd->batch, is->payload, &ba);
        struct drafter_batch b = {(int)T, (int)fd->batch.budget, ba.input_ids, ba.loss_mask, ba.position_ids,
                                  ba.doc_ids, (const float *)((const char *)is->payload + fd->off_states),
                                  (const float *)((const char *)is->payload + fd->off_last)};
        if (drafter_gpu_load_batch(s->g, &b, err, err_len)) return -1;   /* synchronous: the slot is read */
        CUDA_OK(cudaEventRecord(s->copied, st), "cudaEventRecord");
        return 0;
    }
    enum cudaMemcpyKind kind = is->on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    const void *check_base = is->payload;
    if (is->on_device) {
        size_t nb = batch_arrays_end(&fd->batch);
        if (nb > s->h_batch_cap)
            return err_fail(err, err_len, "features seq %llu: batch arrays of %zu bytes exceed the planned %zu", seq, nb,
                            s->h_batch_cap);
        CUDA_OK(cudaMemcpyAsync(s->h_batch, is->payload, nb, cudaMemcpyDeviceToHost, s->side), "batch arrays copy");
        CUDA_OK(cudaStreamSynchronize(s->side), "batch arrays copy");
        check_base = s->h_batch;
    } else {
        gpu_register_slot(s, is);
    }
    if (desc_batch_check_payload(&fd->batch, check_base, c->V_t, e2, sizeof e2))
        return err_fail(err, err_len, "features seq %llu: %s", seq, e2);
    struct desc_batch_arrays ba;   /* pointers into the slot (host or device) */
    desc_batch_arrays(&fd->batch, is->payload, &ba);
    const char *pl = is->payload;
    CUDA_OK(cudaMemcpyAsync(in->input_ids, ba.input_ids, 4 * T, kind, st), "input_ids copy");
    CUDA_OK(cudaMemcpyAsync(in->position_ids, ba.position_ids, 4 * T, kind, st), "position_ids copy");
    CUDA_OK(cudaMemcpyAsync(in->doc_ids, ba.doc_ids, 4 * T, kind, st), "doc_ids copy");
    CUDA_OK(cudaMemcpyAsync(in->loss_mask, ba.loss_mask, T, kind, st), "loss_mask copy");
    CUDA_OK(cudaMemcpyAsync(in->hidden, pl + fd->off_states, 2 * T * kH, kind, st), "hidden copy");
    CUDA_OK(cudaMemcpyAsync(in->last, pl + fd->off_last, 2 * T * H, kind, st), "last copy");
    CUDA_OK(cudaEventRecord(s->copied, st), "cudaEventRecord");
    return 0;
}

static int gpu_micro(void *impl, const struct ring_slot *is, const struct desc_features *fd, int train, uint64_t seed,
                     struct step_acc *acc, struct drafter_metrics *val, const struct step_dump *dump, char *err,
                     int err_len) {
    struct step_gpu *s = impl;
    if (dump) return err_fail(err, err_len, "step dumps run on the CPU path only (the dump records the fp32 step)");
    const int T = (int)fd->batch.n_tokens, budget = (int)fd->batch.budget;
    const uint64_t seq = fd->batch.seq;
    int rc = gpu_load(s, is, fd, err, err_len);
    if (!rc && !train) {
        rc = gpu_collect(s, acc, err, err_len);
        if (!rc) rc = drafter_step_gpu(s->g, T, budget, seed, seq, 0, val, err, err_len);
    } else if (!rc) {
        if (s->pending >= GPU_METRIC_SLOTS) rc = gpu_collect(s, acc, err, err_len);
        if (!rc) rc = drafter_step_gpu(s->g, T, budget, seed, seq, 1, NULL, err, err_len);
        if (!rc) s->pending++;
        s->host_fresh = 0;
    }
    /* the slot is released when this returns: its copies must be done (also on failure) */
    cudaError_t e = cudaEventSynchronize(s->copied);
    if (rc) return -1;
    if (e != cudaSuccess)
        return err_fail(err, err_len, "waiting for the copies out of the input slot: %s", cudaGetErrorString(e));
    return 0;
}

static int gpu_grad_norm(void *impl, struct step_acc *acc, float scale, double clip, double *norm, char *err,
                         int err_len) {
    struct step_gpu *s = impl;
    (void)clip;   /* clipped in apply, on the device */
    /* g *= scale and the global norm on the device; the wait is the optimizer step's host synchronisation (the
     * metrics copies were enqueued before it on the same stream, so collecting them waits no more) */
    if (optim_gpu_grad_norm_start(s->og, scale, err, err_len) || optim_gpu_grad_norm_wait(s->og, norm, err, err_len) ||
        gpu_collect(s, acc, err, err_len))
        return -1;
    return 0;
}

static int gpu_apply(void *impl, double lr_factor, double clip, char *err, int err_len) {
    struct step_gpu *s = impl;
    s->host_fresh = 0;
    return optim_gpu_step(s->og, lr_factor, clip, err, err_len);
}

static int gpu_zero_grad(void *impl, char *err, int err_len) {
    struct step_gpu *s = impl;
    return drafter_gpu_zero_grad(s->g, err, err_len);
}

static int gpu_to_host(void *impl, char *err, int err_len) {
    struct step_gpu *s = impl;
    if (s->host_fresh) return 0;
    if (drafter_gpu_download_weights(s->g, err, err_len) || optim_gpu_download_state(s->og, err, err_len)) return -1;
    s->host_fresh = 1;
    return 0;
}

/* The device gradients summed over the ranks (one NCCL group on the step's stream, waited for with a bound).
 * A 1-rank run never comes here. The pointer table (one entry per trainable tensor) is made by the first call,
 * the one allocation of this path after start-up. */
static int gpu_sum_grads(void *impl, struct dp *dp, char *err, int err_len) {
    struct step_gpu *s = impl;
    if (dp->world <= 1) return 0;
    if (!dp->nccl) return err_fail(err, err_len, "%d trainer ranks on the GPU without an NCCL communicator", dp->world);
    if (!s->sum_bufs) {
        int np = drafter_gpu_n_params(s->g);
        s->sum_bufs = malloc((size_t)(np ? np : 1) * sizeof *s->sum_bufs);
        s->sum_counts = malloc((size_t)(np ? np : 1) * sizeof *s->sum_counts);
        if (!s->sum_bufs || !s->sum_counts) return err_fail(err, err_len, "out of memory");
        for (int i = 0; i < np; i++) {
            const struct drafter_gpu_param *q = drafter_gpu_param(s->g, i);
            if (!q->g || !q->host->trainable) continue;
            s->sum_bufs[s->n_sum] = q->g;
            s->sum_counts[s->n_sum++] = (size_t)q->host->numel;
        }
    }
    return dp_nccl_sum_dev_f32(dp->nccl, s->sum_bufs, s->sum_counts, s->n_sum, (void *)s->stream, err, err_len);
}

static void gpu_free(void *impl) {
    struct step_gpu *s = impl;
    if (!s) return;
    free(s->sum_bufs);
    free(s->sum_counts);
    if (s->stream) cudaStreamSynchronize(s->stream);
    for (uint32_t i = 0; i < s->n_registered; i++)
        if (s->registered[i]) cudaHostUnregister(s->registered[i]);
    free(s->registered);
    optim_gpu_free(s->og);
    drafter_gpu_free(s->g);
    if (s->h_batch) cudaFreeHost(s->h_batch);
    if (s->copied) cudaEventDestroy(s->copied);
    if (s->side) cudaStreamDestroy(s->side);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s);
}

int step_gpu_init(struct step_exec *x, struct drafter *d, struct optim *opt, int device, const char *in_ring,
                  void (*plan)(const char *line), char *err, int err_len) {
    memset(x, 0, sizeof *x);
    struct step_gpu *s = calloc(1, sizeof *s);
    if (!s) return err_fail(err, err_len, "out of memory");
    s->d = d;
    s->opt = opt;
    s->device = device;
    s->in_ring = in_ring;
    s->log = plan;
    const struct drafter_config *c = drafter_config_of(d);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) { gpu_free(s); return err_fail(err, err_len, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e)); }
    /* a blocking stream: the synchronous cudaMemcpy uploads of drafter_gpu_init / optim_gpu_init run on the
     * legacy default stream, and pageable host-to-device copies may return before their DMA lands */
    if ((e = cudaStreamCreate(&s->stream)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming)) != cudaSuccess) {
        gpu_free(s);
        return err_fail(err, err_len, "CUDA stream/event creation: %s", cudaGetErrorString(e));
    }
    char *text = NULL;
    size_t text_len = 0;
    FILE *pf = open_memstream(&text, &text_len);
    if (!pf) { gpu_free(s); return err_fail(err, err_len, "out of memory"); }
    s->g = drafter_gpu_init(d, s->stream, pf, err, err_len);
    if (s->g) s->og = optim_gpu_init(opt, s->g, pf, err, err_len);
    fclose(pf);
    if (plan && text)
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            char l2[600];
            snprintf(l2, sizeof l2, "device memory plan: %s", line);
            plan(l2);
        }
    free(text);
    if (!s->g || !s->og) { gpu_free(s); return -1; }
    if (drafter_gpu_warmup(s->g, c->T_max, err, err_len)) { gpu_free(s); return -1; }
    if ((e = cudaStreamSynchronize(s->stream)) != cudaSuccess) {
        gpu_free(s);
        return err_fail(err, err_len, "warm-up step: %s", cudaGetErrorString(e));
    }
    size_t in_use = 0, total = 0;
    if (drafter_gpu_memory(s->g, &in_use, &total, err, err_len)) { gpu_free(s); return -1; }
    s->h_batch_cap = (size_t)desc_batch_max_payload_bytes((uint32_t)c->T_max);
    if ((e = cudaMallocHost(&s->h_batch, s->h_batch_cap)) != cudaSuccess) {
        gpu_free(s);
        return err_fail(err, err_len, "cudaMallocHost of %zu bytes: %s", s->h_batch_cap, cudaGetErrorString(e));
    }
    s->host_fresh = 1;
    *x = (struct step_exec){s, "gpu", (double)in_use / 1073741824.0, gpu_micro, gpu_grad_norm, gpu_apply,
                            gpu_zero_grad, gpu_to_host, gpu_free, gpu_sum_grads};
    if (plan) {
        char line[256];
        snprintf(line, sizeof line, "GPU path on cuda:%d: peak device memory %.2f GiB in use of %.2f GiB (planned %.2f GiB "
                 "drafter + %.2f GiB optimizer; every process on the device counts)", device, x->mem_gib,
                 (double)total / 1073741824.0,
                 (double)drafter_gpu_planned_bytes(s->g) / 1073741824.0,
                 (double)optim_gpu_planned_bytes(s->og) / 1073741824.0);
        plan(line);
    }
    return 0;
}

int step_gpu_plan_slots(struct step_exec *x, uint32_t n_slots, char *err, int err_len) {
    struct step_gpu *s = x->impl;
    if (!s || strcmp(x->name, "gpu")) return err_fail(err, err_len, "step_gpu_plan_slots: not a GPU step");
    void **r = calloc(n_slots ? n_slots : 1, sizeof *r);
    if (!r) return err_fail(err, err_len, "out of memory");
    free(s->registered);
    s->registered = r;
    s->n_registered = n_slots;
    return 0;
}

#else /* no CUDA in this build */

int step_gpu_init(struct step_exec *x, struct drafter *d, struct optim *opt, int device, const char *in_ring,
                  void (*plan)(const char *line), char *err, int err_len) {
    (void)x, (void)d, (void)opt, (void)in_ring, (void)plan;
    return err_fail(err, err_len, "the GPU path (cuda:%d) is not in this build (built without CUDA)", device);
}

int step_gpu_plan_slots(struct step_exec *x, uint32_t n_slots, char *err, int err_len) {
    (void)x, (void)n_slots;
    return err_fail(err, err_len, "the GPU path is not in this build");
}

#endif
