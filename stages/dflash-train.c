/*
 * stages/dflash-train.c — the DFlash drafter trainer stage: reads `features` items, trains the drafter
 * (stages/train/drafter.h) with Muon + AdamW (stages/train/optim.h), and writes exactly resumable
 * checkpoints (stages/train/ckpt.h) (design.md §2, §7, §8; dflash-reference.md §3–§9; issue 16).
 *
 * DESIGN
 * - Data flow of one optimizer step (A = --grad-accum micro-batches, one packed batch each):
 *     for each micro-batch (in sequence order; the relay drops duplicates and seqs already applied):
 *       decode + check the features descriptor against the drafter (k, H, layout, dtype, layer ids, budget);
 *       widen bf16 states to fp32 into planned buffers (fp32 items are read in place);
 *       drafter_step: anchors keyed by (seed, seq), noise, masks, forward, fused LM-head loss, metrics,
 *       backward adding into the gradients;
 *     scale the gradients by 1/A (the mean of the A per-batch losses), clip the global norm (1.0),
 *     the non-finite guard (skip, or stop after --max-nonfinite in a row), Muon then AdamW at
 *     lr·sched(step), zero the gradients, one metric record on the bus, and every --ckpt-every steps
 *     (and at the end) a checkpoint and state/train.json.
 * - Validation (dflash-pack --val-frac/--val-every): a features item whose batch split is `val` runs
 *   drafter_step with train = 0 (no noise, no backward: gradients, optimizer and guard untouched) and
 *   is not a micro-batch; consecutive val items form one pass, pooled and sent as ONE metric record
 *   (val_loss, val_full_acc, val_eal, val_eal_marginal, val_position_j_acc, val_batches) when the next
 *   train item arrives or the stream ends; its step is the optimizer steps done. Checkpoints happen
 *   inside train items, after the pass before them was closed, so no val state needs saving. With
 *   --grad-accum > 1 a pass may fall between the micro-batches of one step. Val seqs advance next_seq
 *   like train seqs: a resume asks for the first seq after the last item before its checkpoint, so a
 *   pass consumed after that checkpoint is evaluated (and reported) again, changing no weight.
 * - Exact resume: every random draw is counter-based on (seed, batch seq), so the state to save is the
 *   weights, the optimizer state, the guard's counters, the step and the next sequence number. --resume
 *   loads the newest valid checkpoint (a corrupt one is skipped and logged; one of another configuration is
 *   refused with the field named), drops every batch seq below its next_seq, and says which seq it needs on
 *   stdout and in state/train.json, so the pipeline can rewind the packer. A batch consumed after the last
 *   checkpoint is therefore trained again after a crash, exactly as an uninterrupted run trained it.
 * - Memory: the drafter plans every buffer at start-up from (--tokens, --max-anchors, the model); this file
 *   adds two planned widening buffers (CPU path only). A step allocates nothing here.
 * - The GPU path (issue 20; --device cuda:N, or auto on a machine with a GPU). Start-up, after
 *   drafter_load_target and any checkpoint restore into the host drafter and struct optim: cudaSetDevice, one
 *   blocking stream (it orders after the init's synchronous uploads), drafter_gpu_init (uploads the host
 *   weights), optim_gpu_init (uploads the host optimizer state), drafter_gpu_warmup at --tokens (cuBLASLt
 *   plans), then drafter_gpu_memory is logged as the peak (a step allocates nothing) and sent as gpu_mem_gib
 *   in every metric and val record. Memory plan: the device allocation is the two inits' plans (logged region
 *   by region); the host adds a pinned buffer for one batch's arrays (desc_batch_max_payload_bytes(--tokens))
 *   and registers each host input slot's payload once (cudaHostRegister; a refusal is logged and the copies
 *   run from pageable memory). Data flow of one micro-batch: decode + check as above; the ids, positions, doc
 *   ids, mask, states and last are copied on the stream into drafter_gpu_inputs: host slots host-to-device
 *   (bf16, checked on the host in place), device slots device-to-device (their batch arrays are first copied
 *   to the pinned buffer on a side stream and checked there), fp32 host slots through drafter_gpu_load_batch
 *   (rounded to bf16 on the host; synchronous, the slow path; fp32 device slots are refused); an event is
 *   recorded after the copies; drafter_step_gpu (train 1, metrics left on the device); compute waits for that
 *   event before returning, since the relay releases the slot then. Optimizer step: optim_gpu_grad_norm_start
 *   (g *= 1/A, the norm on the device), optim_gpu_grad_norm_wait, drafter_gpu_metrics (the A micro-batches'
 *   metrics, complete by then), the guard on the host as on the CPU, optim_gpu_step (clip to --clip on the
 *   device, Muon + AdamW), drafter_gpu_zero_grad. A val batch first collects the pending train metrics (so a
 *   pass between micro-batches is not pooled into them), then runs drafter_step_gpu with train 0 and waits for
 *   its own metrics. Host waits, all of them: per micro-batch the copies event (the step itself runs on);
 *   per optimizer step the grad-norm wait (the metrics wait after it finds them done); per val batch its
 *   metrics; per device slot the batch-arrays copy; per fp32 host slot drafter_gpu_load_batch; every 256 train
 *   micro-batches of one step a metrics collection (drafter_step_gpu's pending capacity); at a checkpoint and
 *   before the exports the synchronous downloads (drafter_gpu_download_weights, optim_gpu_download_state) into
 *   the host drafter and struct optim, which ckpt.c and export.c read as on the CPU path. --dump-dir is refused
 *   on the GPU (the dump records the fp32 CPU step: run that step with --device cpu). Numerics are the
 *   drafter_gpu's (bf16 storage, fp32 accumulation), so a GPU run tracks a CPU run (tests/gpu/
 *   test_train_stage_gpu: loss within 5% per step) but is not bit-equal to it; a GPU run is deterministic and
 *   resumes exactly on the GPU. step_s on the GPU is host time per step (the step runs asynchronously).
 * - End: the stream ends (the packer's --epochs), or --max-steps optimizer steps are done (the relay's
 *   RELAY_FINISH: the trainer leaves before the end of the stream). Either way a last partial accumulation
 *   is applied, a final checkpoint is written and the exit status is 0. A validation pass the packer emits
 *   after the --max-steps-th train batch is not read; one at the end of the stream is reported first. SIGINT/SIGTERM: no checkpoint is
 *   written (the last one stands), exit 3.
 */
#include "core/bus.h"
#include "core/check.h"
#include "core/desc.h"
#include "core/err.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/relay.h"
#include "core/rings.h"
#include "core/stage.h"
#include "export/export.h"
#include "kernels/common.h"
#include "kernels/lmhead_loss.h"
#include "train/ckpt.h"
#include "train/drafter.h"
#include "train/mask_token.h"
#include "train/optim.h"
#include "train/sched.h"
#include "train/vocab.h"

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#include "train/optim_gpu.h"
#endif

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const loss_names[] = {"kl", "ce", NULL};                  /* LMHEAD_LOSS_* order */
static const char *const weighting_names[] = {"none", "exp-decay", "dpace", NULL}; /* LMHEAD_WEIGHT_* */
static const char *const optimizer_names[] = {"muon", "adamw", NULL};        /* enum optim_kind */
static const char *const schedule_names[] = {"linear", "cosine", "none", NULL}; /* enum sched_kind */
static const char *const convention_names[] = {"zlab", "speculators", NULL}; /* DRAFTER_IDS_* */
static const char *const layer_type_names[] = {"sliding", "full", NULL};     /* DRAFTER_LAYER_* */

struct opts {
    struct stage_common common;
    const char *target_model, *in_ring, *draft_vocab, *dump_dir;
    int tokens, block_size, max_anchors, sliding_window, non_causal, sample_from_anchor;
    int layer_types[DRAFTER_MAX_LAYERS], n_layer_types;
    int layer_ids[DESC_MAX_LAYERS], n_layer_ids, convention;
    int64_t mask_token_id;
    double noise, gamma, alpha, init_std;
    int loss, weighting, optimizer, schedule;
    double lr, muon_lr, weight_decay, muon_weight_decay, clip, warmup_ratio;
    int64_t warmup_steps, max_steps, seed, dump_step;
    int grad_accum, ckpt_every, keep, resume, max_nonfinite, wait_ms;
    double heartbeat_s;
};

/* ---------------------------------------------------------------- the trainer's state */

struct trainer {
    const struct opts *o;
    struct drafter *d;
    const struct drafter_config *cfg;
    struct optim opt;
    struct optim_tensor *tens;
    int n_tens;
    struct optim_guard guard;
    struct sched sched;
    struct ckpt_table table;
    char *config_json;
    char ckpt_dir[PATH_MAX], state_path[PATH_MAX];
    float *hidden_f32, *last_f32;    /* planned widening buffers: (T_max, k·H), (T_max, H) */
    int64_t step;                    /* optimizer steps done */
    int64_t next_seq;                /* the next batch seq this run needs */
    int micro;                       /* micro-batches accumulated into the gradients */
    struct drafter_metrics acc;      /* metrics of the current optimizer step */
    double loss_sum;                 /* Σ per-batch losses of the current step */
    uint64_t step_tokens;
    double step_busy_s, last_step_t, lr;
    struct drafter_metrics val;      /* the open validation pass, pooled over its batches */
    int val_batches;                 /* batches in it (0: no pass open) */
    uint64_t val_first_seq, val_tokens;
    int64_t val_passes;
    struct relay *relay_;
    int gpu;                         /* 1: the GPU path (--device cuda:N); 0: the CPU path */
    /* the start-up timeline (issue 28): seconds of each phase since the previous mark, logged at the first step */
    double tl_launch, tl_last;
    const char *tl_name[12];
    double tl_s[12];
    int tl_n, tl_logged;
    double gpu_mem_gib;              /* device memory in use after start-up (the peak: a step allocates nothing) */
#ifdef DFLASH_CUDA
    struct drafter_gpu *g;
    struct optim_gpu *og;
    cudaStream_t stream;             /* every device call of the step, the copies and the optimizer */
    cudaStream_t side;               /* the copy of a device slot's batch arrays to the host for checking */
    cudaEvent_t copied;              /* recorded after the copies out of an input slot */
    void *h_batch;                   /* pinned: a device slot's batch arrays, checked on the host */
    size_t h_batch_cap;
    void **registered;               /* per input slot index: the host payload registered (cudaHostRegister) */
    uint32_t n_registered;
    int register_failed;             /* cudaHostRegister refused once: pageable copies from then on (logged) */
    int gpu_pending;                 /* train steps whose metrics are still on the device */
    int64_t host_fresh_step;         /* the host weights/optimizer state equal the device's at this step (-1) */
#endif
};

/* Close the start-up phase `name` (time since the previous mark). */
static void tl_mark(struct trainer *tr, const char *name) {
    double now = time_mono_s();
    if (tr->tl_n < (int)(sizeof tr->tl_s / sizeof tr->tl_s[0])) {
        tr->tl_name[tr->tl_n] = name;
        tr->tl_s[tr->tl_n++] = now - tr->tl_last;
    }
    tr->tl_last = now;
}

/* At the first optimizer step: one log line with every start-up phase and the time from launch. */
static void tl_log_first_step(struct trainer *tr) {
    if (tr->tl_logged) return;
    tr->tl_logged = 1;
    tl_mark(tr, "first batches and the first step");
    char line[1024];
    int n = 0;
    for (int i = 0; i < tr->tl_n && n < (int)sizeof line - 80; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s%s %.2f s", i ? ", " : "", tr->tl_name[i], tr->tl_s[i]);
    log_info("start-up timeline: %s; first optimizer step done %.2f s after launch", line, tr->tl_last - tr->tl_launch);
}

#ifdef DFLASH_CUDA
#define TRAIN_GPU_METRIC_SLOTS 256   /* drafter_step_gpu holds at most this many steps' metrics (drafter.h) */
#define CUDA_OK(call, what)                                                                                     \
    do {                                                                                                        \
        cudaError_t e_ = (call);                                                                                \
        if (e_ != cudaSuccess) return err_fail(err, err_len, "%s: %s", (what), cudaGetErrorString(e_));       \
    } while (0)

/* Collect the metrics of the train steps enqueued since the last collection into the step's accumulators
 * (waits for the last step's metrics copy). */
static int gpu_collect(struct trainer *tr, char *err, int err_len) {
    if (!tr->gpu_pending) return 0;
    struct drafter_metrics m;
    if (drafter_gpu_metrics(tr->g, &m, err, err_len)) return -1;
    drafter_metrics_add(&tr->acc, &m);
    tr->loss_sum += m.loss_sum;   /* Σ of the steps' per-batch losses, as the CPU path adds them */
    tr->gpu_pending = 0;
    return 0;
}

/* Device weights and optimizer state -> the host drafter and struct optim (checkpoints, exports). */
static int gpu_to_host(struct trainer *tr, char *err, int err_len) {
    if (tr->host_fresh_step == tr->step) return 0;
    if (drafter_gpu_download_weights(tr->g, err, err_len) || optim_gpu_download_state(tr->og, err, err_len)) return -1;
    tr->host_fresh_step = tr->step;
    return 0;
}
#endif

/* The configuration a checkpoint must match (everything that changes what the run computes). */
static char *config_to_json(const struct opts *o, const struct drafter_config *c, const struct optim_config *oc,
                            const struct sched *s) {
    json_t *j = json_object(), *types = json_array(), *ids = json_array();
    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(c, zl);
    for (int l = 0; l < c->L; l++) json_array_append_new(types, json_string(layer_type_names[c->layer_type[l]]));
    for (int i = 0; i < c->k; i++) json_array_append_new(ids, json_integer(zl[i]));
    json_object_set_new(j, "format", json_string("dflash-train config"));
    json_object_set_new(j, "version", json_integer(1));
    json_object_set_new(j, "target_model_type", json_string(c->target.model_type));
    json_object_set_new(j, "hidden_size", json_integer(c->H));
    json_object_set_new(j, "target_layers", json_integer(c->target.num_hidden_layers));
    json_object_set_new(j, "vocab_size", json_integer(c->V_t));
    json_object_set_new(j, "draft_vocab_size", json_integer(c->V_d));
    json_object_set_new(j, "block_size", json_integer(c->B));
    json_object_set_new(j, "layer_types", types);
    json_object_set_new(j, "sliding_window", json_integer(c->sliding_window));
    json_object_set_new(j, "sliding_window_non_causal", json_boolean(c->sliding_window_non_causal));
    json_object_set_new(j, "max_anchors", json_integer(c->N));
    json_object_set_new(j, "tokens", json_integer(c->T_max));
    json_object_set_new(j, "target_layer_ids_zlab", ids);
    json_object_set_new(j, "sample_from_anchor", json_boolean(c->sample_from_anchor));
    json_object_set_new(j, "mask_token_id", json_integer(c->mask_token_id));
    json_object_set_new(j, "noise", json_real(c->noise));
    json_object_set_new(j, "loss", json_string(loss_names[c->loss]));
    json_object_set_new(j, "weighting", json_string(weighting_names[c->weighting]));
    json_object_set_new(j, "gamma", json_real(c->gamma));
    json_object_set_new(j, "alpha", json_real(c->alpha));
    json_object_set_new(j, "init_std", json_real(c->init_std));
    json_object_set_new(j, "seed", json_integer(o->seed));
    json_object_set_new(j, "optimizer", json_string(optimizer_names[oc->kind]));
    json_object_set_new(j, "lr", json_real(oc->lr));
    json_object_set_new(j, "muon_lr", json_real(oc->muon_lr));
    json_object_set_new(j, "weight_decay", json_real(oc->weight_decay));
    json_object_set_new(j, "muon_weight_decay", json_real(oc->muon_weight_decay));
    json_object_set_new(j, "schedule", json_string(sched_kind_name(s->kind)));
    json_object_set_new(j, "total_steps", json_integer(s->total));
    json_object_set_new(j, "warmup_steps", json_integer(s->warmup));
    json_object_set_new(j, "grad_accum", json_integer(o->grad_accum));
    json_object_set_new(j, "clip", json_real(o->clip));
    char *text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    ALLOC_CHECK(text);
    return text;
}

static void ckpt_log(void *ctx, const char *line) { (void)ctx; log_warn("%s", line); }

/* Write checkpoint step-<step> and state/train.json. */
static void save(struct trainer *tr) {
    char err[1024], path[PATH_MAX];
#ifdef DFLASH_CUDA
    if (tr->gpu) LIB_CHECK(gpu_to_host(tr, err, sizeof err), err);
#endif
    struct ckpt_meta meta = {tr->step, tr->next_seq, tr->step, tr->config_json, NULL, 0};
    LIB_CHECK(ckpt_save(tr->ckpt_dir, &meta, tr->table.t, tr->table.n, tr->o->keep, path, sizeof path, err, sizeof err),
              err);
    LIB_CHECK(ckpt_write_state(tr->state_path, tr->step, tr->next_seq, path, err, sizeof err), err);
    log_info("checkpoint %s: step %lld, next batch seq %lld", path, (long long)tr->step, (long long)tr->next_seq);
}

/* Apply the accumulated micro-batches as one optimizer step (or skip it: non-finite guard). */
static int optimizer_step(struct trainer *tr, char *err, int err_len) {
    const struct opts *o = tr->o;
    double norm;
    if (!tr->gpu) {
        optim_scale_grads(tr->tens, tr->n_tens, 1.0f / (float)tr->micro);
        norm = optim_clip_grad_norm(tr->tens, tr->n_tens, o->clip);
    } else {
#ifdef DFLASH_CUDA
        /* g *= 1/A and the global norm on the device; the wait is the optimizer step's host synchronisation
         * (the metrics copies were enqueued before it on the same stream, so collecting them waits no more). */
        if (optim_gpu_grad_norm_start(tr->og, 1.0f / (float)tr->micro, err, err_len) ||
            optim_gpu_grad_norm_wait(tr->og, &norm, err, err_len) || gpu_collect(tr, err, err_len))
            return -1;
#else
        return err_fail(err, err_len, "the GPU path is not in this build");
#endif
    }
    double loss = tr->loss_sum / tr->micro;
    char msg[512];
    enum optim_guard_action act = optim_guard_check(&tr->guard, tr->step, loss, norm, msg, sizeof msg);
    if (act == OPTIM_GUARD_STOP) return err_fail(err, err_len, "%s", msg);
    double f = sched_factor(&tr->sched, tr->step);
    tr->lr = o->lr * f;
    if (act == OPTIM_GUARD_SKIP) log_warn("%s", msg);
#ifdef DFLASH_CUDA
    else if (tr->gpu) {
        if (optim_gpu_step(tr->og, f, o->clip, err, err_len)) return -1;   /* clips on the device to --clip */
    }
#endif
    else if (optim_step(&tr->opt, f, err, err_len)) return -1;
#ifdef DFLASH_CUDA
    if (tr->gpu) {
        if (drafter_gpu_zero_grad(tr->g, err, err_len)) return -1;
    } else
#endif
        optim_zero_grad(tr->tens, tr->n_tens);

    tl_log_first_step(tr);
    double now = time_mono_s(), wall = now - tr->last_step_t;
    tr->last_step_t = now;
    const struct drafter_metrics *m = &tr->acc;
    struct bus_kv kv[BUS_MAX_KV];
    int n = 0;
    kv[n++] = (struct bus_kv){BUS_K_LOSS, loss};
    kv[n++] = (struct bus_kv){BUS_K_EAL, m->eal_count ? m->eal_sum / (double)m->eal_count : 0};
    kv[n++] = (struct bus_kv){"eal_marginal", drafter_metrics_eal_marginal(m)};
    kv[n++] = (struct bus_kv){"full_acc", m->full_total ? (double)m->full_correct / (double)m->full_total : 0};
    kv[n++] = (struct bus_kv){BUS_K_LR, tr->lr};
    kv[n++] = (struct bus_kv){BUS_K_GRAD_NORM, norm};
    kv[n++] = (struct bus_kv){BUS_K_TOKENS_PER_S, wall > 0 ? (double)tr->step_tokens / wall : 0};
    kv[n++] = (struct bus_kv){"step_s", tr->step_busy_s};
    kv[n++] = (struct bus_kv){"skipped_steps", (double)tr->guard.skipped_total};
    kv[n++] = (struct bus_kv){BUS_K_TOTAL_STEPS, (double)tr->sched.total};
    kv[n++] = (struct bus_kv){"anchors", (double)m->n_anchors / tr->micro};
    if (tr->gpu) kv[n++] = (struct bus_kv){"gpu_mem_gib", tr->gpu_mem_gib};
    static char names[DRAFTER_MAX_B][24];
    for (int j = tr->cfg->sample_from_anchor ? 0 : 1; j < m->B && n < BUS_MAX_KV; j++) {
        snprintf(names[j], sizeof names[j], "position_%d_acc", j);
        kv[n++] = (struct bus_kv){names[j], m->total[j] ? (double)m->correct[j] / (double)m->total[j] : 0};
    }
    struct bus *bus = relay_bus(tr->relay_);
    char berr[256];
    if (bus && bus_metric(bus, tr->step, kv, n, berr, sizeof berr) < 0) log_warn("metric record refused: %s", berr);
    log_info("step %lld: loss %.4f, full acc %.3f, eal %.3f, lr %.3g, grad norm %.3g, %.0f tokens/s%s",
             (long long)tr->step, loss, kv[3].value, kv[1].value, tr->lr, norm, kv[6].value,
             act == OPTIM_GUARD_SKIP ? " (skipped: non-finite)" : "");

    tr->step++;
    tr->micro = 0;
    tr->loss_sum = 0;
    tr->step_tokens = 0;
    tr->step_busy_s = 0;
    drafter_metrics_zero(&tr->acc, tr->cfg->B);
    if (o->ckpt_every > 0 && tr->step % o->ckpt_every == 0) save(tr);
    return 0;
}

/* Close the open validation pass: one metric record (step = optimizer steps done) with the pooled val_loss
 * (mean of the batches' losses), val_full_acc, val_eal, val_eal_marginal and val_position_j_acc. */
static void flush_val(struct trainer *tr) {
    if (!tr->val_batches) return;
    const struct drafter_metrics *m = &tr->val;
    struct bus_kv kv[BUS_MAX_KV];
    int n = 0;
    double loss = m->loss_count ? m->loss_sum / (double)m->loss_count : 0;
    kv[n++] = (struct bus_kv){"val_loss", loss};
    kv[n++] = (struct bus_kv){"val_full_acc", m->full_total ? (double)m->full_correct / (double)m->full_total : 0};
    kv[n++] = (struct bus_kv){"val_eal", m->eal_count ? m->eal_sum / (double)m->eal_count : 0};
    kv[n++] = (struct bus_kv){"val_eal_marginal", drafter_metrics_eal_marginal(m)};
    kv[n++] = (struct bus_kv){"val_batches", (double)tr->val_batches};
    kv[n++] = (struct bus_kv){"val_tokens", (double)tr->val_tokens};
    if (tr->gpu) kv[n++] = (struct bus_kv){"gpu_mem_gib", tr->gpu_mem_gib};
    static char names[DRAFTER_MAX_B][32];
    for (int j = tr->cfg->sample_from_anchor ? 0 : 1; j < m->B && n < BUS_MAX_KV; j++) {
        snprintf(names[j], sizeof names[j], "val_position_%d_acc", j);
        kv[n++] = (struct bus_kv){names[j], m->total[j] ? (double)m->correct[j] / (double)m->total[j] : 0};
    }
    struct bus *bus = relay_bus(tr->relay_);
    char berr[256];
    if (bus && bus_metric(bus, tr->step, kv, n, berr, sizeof berr) < 0) log_warn("val metric record refused: %s", berr);
    log_info("validation after step %lld (seqs %llu..%llu, %d batches): val loss %.4f, full acc %.3f, eal %.3f",
             (long long)tr->step, (unsigned long long)tr->val_first_seq,
             (unsigned long long)(tr->val_first_seq + (uint64_t)tr->val_batches - 1), tr->val_batches, loss, kv[1].value,
             kv[2].value);
    tr->val_passes++;
    tr->val_batches = 0;
    tr->val_tokens = 0;
    drafter_metrics_zero(&tr->val, tr->cfg->B);
}

#ifdef DFLASH_CUDA
/* Register a host input slot's payload with CUDA once (pinned, so the host-to-device copies run at full speed
 * and asynchronously). A refusal is logged once and the copies run from pageable memory (correct, slower). */
static void gpu_register_slot(struct trainer *tr, const struct ring_slot *is) {
    if (tr->register_failed || is->index >= tr->n_registered || tr->registered[is->index] == is->payload) return;
    if (tr->registered[is->index]) cudaHostUnregister(tr->registered[is->index]);   /* a remap: not seen so far */
    tr->registered[is->index] = NULL;
    cudaError_t e = cudaHostRegister(is->payload, (size_t)is->payload_cap, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        tr->register_failed = 1;
        log_warn("cudaHostRegister of ring '%s' slot %u (%llu bytes) failed: %s; copying from pageable memory",
                 tr->o->in_ring, is->index, (unsigned long long)is->payload_cap, cudaGetErrorString(e));
        return;
    }
    tr->registered[is->index] = is->payload;
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

/* Fill the drafter_gpu's input buffers with one features item, all on tr->stream, and record tr->copied after
 * the copies out of the slot: host bf16 slots host-to-device (the batch arrays checked on the host in place),
 * device bf16 slots device-to-device (their batch arrays first copied to pinned memory on tr->side and checked
 * there: one extra host wait, device rings only), fp32 host slots through drafter_gpu_load_batch (checks,
 * rounds to bf16 on the host and copies synchronously: the slow path). */
static int gpu_load(struct trainer *tr, const struct ring_slot *is, const struct desc_features *fd, char *err,
                    int err_len) {
    const struct drafter_config *c = tr->cfg;
    const struct drafter_gpu_inputs *in = drafter_gpu_inputs(tr->g);
    cudaStream_t s = tr->stream;
    const size_t T = fd->batch.n_tokens, kH = (size_t)c->k * c->H, H = (size_t)c->H;
    const unsigned long long seq = (unsigned long long)fd->batch.seq;
    char e2[768];
    if (is->on_device && is->device != tr->o->common.cuda_device)
        return err_fail(err, err_len, "ring '%s' holds payloads on cuda:%d, the trainer runs on cuda:%d: use one device",
                        tr->o->in_ring, is->device, tr->o->common.cuda_device);
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
        if (drafter_gpu_load_batch(tr->g, &b, err, err_len)) return -1;   /* synchronous: the slot is read */
        CUDA_OK(cudaEventRecord(tr->copied, s), "cudaEventRecord");
        return 0;
    }
    enum cudaMemcpyKind kind = is->on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    const void *check_base = is->payload;
    if (is->on_device) {
        size_t nb = batch_arrays_end(&fd->batch);
        if (nb > tr->h_batch_cap)
            return err_fail(err, err_len, "features seq %llu: batch arrays of %zu bytes exceed the planned %zu", seq, nb,
                            tr->h_batch_cap);
        CUDA_OK(cudaMemcpyAsync(tr->h_batch, is->payload, nb, cudaMemcpyDeviceToHost, tr->side), "batch arrays copy");
        CUDA_OK(cudaStreamSynchronize(tr->side), "batch arrays copy");
        check_base = tr->h_batch;
    } else {
        gpu_register_slot(tr, is);
    }
    if (desc_batch_check_payload(&fd->batch, check_base, c->V_t, e2, sizeof e2))
        return err_fail(err, err_len, "features seq %llu: %s", seq, e2);
    struct desc_batch_arrays ba;   /* pointers into the slot (host or device) */
    desc_batch_arrays(&fd->batch, is->payload, &ba);
    const char *pl = is->payload;
    CUDA_OK(cudaMemcpyAsync(in->input_ids, ba.input_ids, 4 * T, kind, s), "input_ids copy");
    CUDA_OK(cudaMemcpyAsync(in->position_ids, ba.position_ids, 4 * T, kind, s), "position_ids copy");
    CUDA_OK(cudaMemcpyAsync(in->doc_ids, ba.doc_ids, 4 * T, kind, s), "doc_ids copy");
    CUDA_OK(cudaMemcpyAsync(in->loss_mask, ba.loss_mask, T, kind, s), "loss_mask copy");
    CUDA_OK(cudaMemcpyAsync(in->hidden, pl + fd->off_states, 2 * T * kH, kind, s), "hidden copy");
    CUDA_OK(cudaMemcpyAsync(in->last, pl + fd->off_last, 2 * T * H, kind, s), "last copy");
    CUDA_OK(cudaEventRecord(tr->copied, s), "cudaEventRecord");
    return 0;
}

/* compute_train on the GPU. Host waits per item: a train micro-batch waits for its slot's copies (tr->copied)
 * before returning, since the relay releases the slot then; the step itself runs on. The A-th micro-batch also
 * runs optimizer_step, whose grad-norm wait is the step's one synchronisation with the device's work. A val
 * batch waits for its own metrics (drafter_step_gpu with m), after collecting the pending train metrics (which
 * the metrics wait pools otherwise). A device slot adds the wait for its batch arrays (gpu_load). */
static int compute_train_gpu(struct trainer *tr, struct relay_item *it, const struct desc_features *fd, double t0,
                             char *err, int err_len) {
    const int T = (int)fd->batch.n_tokens, budget = (int)fd->batch.budget;
    const uint64_t seed = (uint64_t)tr->o->seed, seq = fd->batch.seq;
    int rc = gpu_load(tr, it->in, fd, err, err_len);
    if (!rc && fd->batch.split == DESC_SPLIT_VAL) {
        struct drafter_metrics m;
        rc = gpu_collect(tr, err, err_len);
        if (!rc) rc = drafter_step_gpu(tr->g, T, budget, seed, seq, 0, &m, err, err_len);
        if (!rc) {
            if (!tr->val_batches) tr->val_first_seq = seq;
            drafter_metrics_add(&tr->val, &m);
            tr->val_batches++;
            tr->val_tokens += (uint64_t)T;
        }
    } else if (!rc) {
        flush_val(tr);   /* a train batch after val batches closes that pass */
        if (tr->gpu_pending >= TRAIN_GPU_METRIC_SLOTS) rc = gpu_collect(tr, err, err_len);
        if (!rc) rc = drafter_step_gpu(tr->g, T, budget, seed, seq, 1, NULL, err, err_len);
        if (!rc) tr->gpu_pending++;
    }
    /* the slot is released when this returns: its copies must be done (also on failure) */
    cudaError_t e = cudaEventSynchronize(tr->copied);
    if (rc) return -1;
    if (e != cudaSuccess) return err_fail(err, err_len, "waiting for the copies out of the input slot: %s",
                                          cudaGetErrorString(e));
    tr->next_seq = (int64_t)seq + 1;
    it->n_tokens = (uint64_t)T;
    if (fd->batch.split == DESC_SPLIT_VAL) return RELAY_DONE;
    tr->micro++;
    tr->step_tokens += (uint64_t)T;
    tr->step_busy_s += time_mono_s() - t0;
    if (tr->micro == tr->o->grad_accum && optimizer_step(tr, err, err_len)) return -1;
    if (tr->o->max_steps > 0 && tr->step >= tr->o->max_steps) return RELAY_FINISH;
    return RELAY_DONE;
}
#endif

/* One features item: a micro-batch (split = train), or a batch of a validation pass (split = val). */
static int compute_train(void *ctx, struct relay_item *it, char *err, int err_len) {
    struct trainer *tr = ctx;
    const struct ring_slot *is = it->in;
    const struct drafter_config *c = tr->cfg;
    char e2[768];
    double t0 = time_mono_s();
    struct desc_features fd;
    if (desc_features_decode(is->desc, is->desc_len, is->payload_cap, &fd, e2, sizeof e2))
        return err_fail(err, err_len, "ring '%s' slot %u (seq %llu): %s", tr->o->in_ring, is->index,
                        (unsigned long long)is->seq, e2);
    if (drafter_check_features(c, &fd, e2, sizeof e2))
        return err_fail(err, err_len, "features seq %llu: %s", (unsigned long long)fd.batch.seq, e2);
    if (rings_check_budget(fd.batch.seq, fd.batch.n_tokens, fd.batch.budget, (uint32_t)c->T_max, err, err_len)) return -1;
#ifdef DFLASH_CUDA
    if (tr->gpu) return compute_train_gpu(tr, it, &fd, t0, err, err_len);
#endif
    if (is->on_device)
        return err_fail(err, err_len, "ring '%s' holds GPU payloads, but the trainer runs on the CPU: run with "
                        "--device cuda:N, or create the ring with dev=host", tr->o->in_ring);
    if (desc_batch_check_payload(&fd.batch, is->payload, c->V_t, e2, sizeof e2))
        return err_fail(err, err_len, "features seq %llu: %s", (unsigned long long)fd.batch.seq, e2);
    struct desc_batch_arrays ba;
    desc_batch_arrays(&fd.batch, is->payload, &ba);
    size_t T = fd.batch.n_tokens, kH = (size_t)c->k * c->H;
    const float *hidden = (const float *)((const char *)is->payload + fd.off_states);
    const float *last = (const float *)((const char *)is->payload + fd.off_last);
    if (fd.dtype == DESC_DTYPE_BF16) {   /* widened exactly into the planned buffers */
        floats_from_bf16(tr->hidden_f32, (const bf16 *)hidden, T * kH);
        floats_from_bf16(tr->last_f32, (const bf16 *)last, T * (size_t)c->H);
        hidden = tr->hidden_f32;
        last = tr->last_f32;
    }
    struct drafter_batch b = {(int)T, (int)fd.batch.budget, ba.input_ids, ba.loss_mask, ba.position_ids, ba.doc_ids,
                              hidden, last};
    struct drafter_metrics m;
    if (fd.batch.split == DESC_SPLIT_VAL) {
        /* Forward only: no noise, no backward, the gradients and the optimizer untouched; not a micro-batch.
         * Its seq still counts in next_seq, so a resume never asks for it again once a later step is saved. */
        if (drafter_step(tr->d, &b, (uint64_t)tr->o->seed, fd.batch.seq, 0, &m, err, err_len)) return -1;
        if (!tr->val_batches) tr->val_first_seq = fd.batch.seq;
        drafter_metrics_add(&tr->val, &m);
        tr->val_batches++;
        tr->val_tokens += T;
        tr->next_seq = (int64_t)fd.batch.seq + 1;
        it->n_tokens = T;
        return RELAY_DONE;
    }
    flush_val(tr);   /* a train batch after val batches closes that pass */
    if (drafter_step(tr->d, &b, (uint64_t)tr->o->seed, fd.batch.seq, 1, &m, err, err_len)) return -1;
    if (tr->micro == 0 && tr->o->dump_dir && tr->step == tr->o->dump_step) {
        /* The first micro-batch of this optimizer step: the gradients were zero before it. */
        struct drafter_dump_info info = {(uint64_t)tr->step, (uint64_t)tr->o->seed, "float32", tr->o->target_model};
        if (drafter_dump_step(tr->d, tr->o->dump_dir, &b, &m, &info, err, err_len)) return -1;
        log_info("dumped step %lld (batch seq %llu) into %s/step-%lld", (long long)tr->step,
                 (unsigned long long)fd.batch.seq, tr->o->dump_dir, (long long)tr->step);
    }
    drafter_metrics_add(&tr->acc, &m);
    tr->loss_sum += m.loss_sum;
    tr->micro++;
    tr->step_tokens += T;
    tr->next_seq = (int64_t)fd.batch.seq + 1;
    it->n_tokens = T;
    tr->step_busy_s += time_mono_s() - t0;
    if (tr->micro == tr->o->grad_accum && optimizer_step(tr, err, err_len)) return -1;
    if (tr->o->max_steps > 0 && tr->step >= tr->o->max_steps) return RELAY_FINISH;
    return RELAY_DONE;
}

static int train_heartbeat_kv(void *ctx, struct bus_kv *kv, int max) {
    struct trainer *tr = ctx;
    if (max < 2) return 0;
    kv[0] = (struct bus_kv){"steps_done", (double)tr->step};   /* "step" is a reserved record field (bus.h) */
    kv[1] = (struct bus_kv){"skipped_steps", (double)tr->guard.skipped_total};
    return 2;
}

/* ---------------------------------------------------------------- set-up */

static void build_config(const struct opts *o, struct drafter_config *c) {
    char err[1024];
    drafter_config_defaults(c);
    c->B = o->block_size;
    c->N = o->max_anchors;
    c->T_max = o->tokens;
    c->sliding_window = o->sliding_window;
    c->sliding_window_non_causal = o->non_causal;
    c->sample_from_anchor = o->sample_from_anchor;
    c->mask_token_id = o->mask_token_id;
    c->noise = (float)o->noise;
    c->loss = o->loss;
    c->weighting = o->weighting;
    c->gamma = (float)o->gamma;
    c->alpha = (float)o->alpha;
    c->init_std = (float)o->init_std;
    if (o->n_layer_types) {
        c->L = o->n_layer_types;
        memcpy(c->layer_type, o->layer_types, (size_t)o->n_layer_types * sizeof o->layer_types[0]);
    }
    c->ids_convention = o->convention;
    c->k = o->n_layer_ids;
    memcpy(c->layer_ids, o->layer_ids, (size_t)o->n_layer_ids * sizeof o->layer_ids[0]);
    LIB_CHECK(drafter_config_from_target(c, o->target_model, err, sizeof err), err);
}

#ifdef DFLASH_CUDA
/* log_info each line of a memory plan captured by open_memstream. */
static void log_lines(const char *what, char *text) {
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) log_info("%s: %s", what, line);
}

/* The GPU path's start-up, on --device cuda:N, after drafter_load_target and any checkpoint restore: the device
 * drafter (weights uploaded from the host), the device optimizer (state uploaded from the host struct optim),
 * a warm-up step at the full budget (cuBLASLt plans), the memory in use (the peak: a step allocates nothing),
 * and the pinned buffer for a device slot's batch arrays. Exits on failure. */
static void gpu_start(struct trainer *tr) {
    char err[1024];
    const struct opts *o = tr->o;
    cudaError_t e = cudaSetDevice(o->common.cuda_device);
    if (e != cudaSuccess) DIE("cudaSetDevice(%d): %s", o->common.cuda_device, cudaGetErrorString(e));
    if ((e = cudaFree(0)) != cudaSuccess) DIE("CUDA context creation: %s", cudaGetErrorString(e));   /* timed alone */
    tl_mark(tr, "CUDA init");
    /* a blocking stream: the synchronous cudaMemcpy uploads of drafter_gpu_init / optim_gpu_init run on the
     * legacy default stream, and pageable host-to-device copies may return before their DMA lands */
    if ((e = cudaStreamCreate(&tr->stream)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&tr->side, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&tr->copied, cudaEventDisableTiming)) != cudaSuccess)
        DIE("CUDA stream/event creation: %s", cudaGetErrorString(e));
    char *plan = NULL;
    size_t plan_len = 0;
    FILE *pf = open_memstream(&plan, &plan_len);
    ALLOC_CHECK(pf);
    tr->g = drafter_gpu_init(tr->d, tr->stream, pf, err, sizeof err);
    if (tr->g) tl_mark(tr, "drafter on the GPU (plan, weights upload)");
    if (tr->g) tr->og = optim_gpu_init(&tr->opt, tr->g, pf, err, sizeof err);
    fclose(pf);
    if (!tr->g || !tr->og) DIE("%s", err);
    tl_mark(tr, "optimizer plan (GPU state)");
    log_lines("device memory plan", plan);
    free(plan);
    LIB_CHECK(drafter_gpu_warmup(tr->g, o->tokens, err, sizeof err), err);
    e = cudaStreamSynchronize(tr->stream);
    if (e != cudaSuccess) DIE("warm-up step: %s", cudaGetErrorString(e));
    tl_mark(tr, "cuBLASLt heuristics (warm-up step)");
    size_t in_use = 0, total = 0;
    LIB_CHECK(drafter_gpu_memory(tr->g, &in_use, &total, err, sizeof err), err);
    tr->gpu_mem_gib = (double)in_use / 1073741824.0;
    tr->h_batch_cap = (size_t)desc_batch_max_payload_bytes((uint32_t)tr->cfg->T_max);
    if ((e = cudaMallocHost(&tr->h_batch, tr->h_batch_cap)) != cudaSuccess)
        DIE("cudaMallocHost of %zu bytes: %s", tr->h_batch_cap, cudaGetErrorString(e));
    tr->host_fresh_step = tr->step;
    log_info("GPU path on cuda:%d: peak device memory %.2f GiB in use of %.2f GiB (planned %.2f GiB drafter + "
             "%.2f GiB optimizer; every process on the device counts)", o->common.cuda_device, tr->gpu_mem_gib,
             (double)total / 1073741824.0, (double)drafter_gpu_planned_bytes(tr->g) / 1073741824.0,
             (double)optim_gpu_planned_bytes(tr->og) / 1073741824.0);
}

static void gpu_stop(struct trainer *tr) {
    if (tr->stream) cudaStreamSynchronize(tr->stream);
    for (uint32_t i = 0; i < tr->n_registered; i++)
        if (tr->registered[i]) cudaHostUnregister(tr->registered[i]);
    free(tr->registered);
    tr->registered = NULL;
    tr->n_registered = 0;
    optim_gpu_free(tr->og);
    drafter_gpu_free(tr->g);
    if (tr->h_batch) cudaFreeHost(tr->h_batch);
    if (tr->copied) cudaEventDestroy(tr->copied);
    if (tr->side) cudaStreamDestroy(tr->side);
    if (tr->stream) cudaStreamDestroy(tr->stream);
    tr->og = NULL;
    tr->g = NULL;
}
#endif

int main(int argc, char **argv) {
    const double t_launch = time_mono_s();
    log_init("dflash-train");
    struct opts o;
    memset(&o, 0, sizeof o);
    stage_common_defaults(&o.common);
    struct drafter_config dc;
    drafter_config_defaults(&dc);
    o.in_ring = RING_NAME_FEATURES;
    o.tokens = dc.T_max;
    o.block_size = dc.B;
    o.max_anchors = dc.N;
    o.sliding_window = dc.sliding_window;
    o.n_layer_types = dc.L;
    memcpy(o.layer_types, dc.layer_type, sizeof o.layer_types);
    o.convention = DRAFTER_IDS_ZLAB;
    o.mask_token_id = -1;
    o.noise = dc.noise;
    o.gamma = dc.gamma;
    o.alpha = dc.alpha;
    o.init_std = dc.init_std;
    o.loss = dc.loss;
    o.weighting = dc.weighting;
    struct optim_config oc;
    optim_config_default(&oc);
    o.optimizer = (int)oc.kind;
    o.lr = oc.lr;
    o.muon_lr = 0;
    o.weight_decay = oc.weight_decay;
    o.muon_weight_decay = oc.muon_weight_decay;
    o.schedule = SCHED_LINEAR;
    o.warmup_steps = -1;
    o.warmup_ratio = -1;
    o.clip = 1.0;
    o.grad_accum = 1;
    o.seed = 42;
    o.dump_step = -1;
    o.ckpt_every = 100;
    o.keep = 3;
    o.max_nonfinite = 3;
    o.wait_ms = 60000;
    o.heartbeat_s = 1.0;
    struct flag_list types = {o.layer_types, &o.n_layer_types, DRAFTER_MAX_LAYERS, layer_type_names};
    struct flag_list ids = {o.layer_ids, &o.n_layer_ids, DESC_MAX_LAYERS, NULL};
    struct flag_choice ch_conv = {&o.convention, convention_names}, ch_loss = {&o.loss, loss_names},
                       ch_w = {&o.weighting, weighting_names}, ch_opt = {&o.optimizer, optimizer_names},
                       ch_sched = {&o.schedule, schedule_names};
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&o.common),
        {"target-model", FLAG_STRING, &o.target_model, "the target's Hugging Face directory: config.json, tokenizer "
         "files and only the embedding, final norm and LM head tensors are read", 1, 0},
        {"in", FLAG_STRING, &o.in_ring, "input ring (features descriptors)", 1, 0},
        {"tokens", FLAG_INT, &o.tokens, "token budget of a batch (the packer's --tokens): plans memory and the anchor "
         "candidates (p < budget - B)", 2, 1 << 24},
        {"block-size", FLAG_INT, &o.block_size, "block size B", 2, DRAFTER_MAX_B},
        {"layer-types", FLAG_LIST, &types, "draft layer types, one per layer (the count is the layer count); "
         "all-sliding as speculators ships: sliding,sliding,sliding,sliding,sliding", 1, 0},
        {"sliding-window", FLAG_INT, &o.sliding_window, "window W of the sliding layers", 1, INT_MAX},
        {"sliding-window-non-causal", FLAG_BOOL, &o.non_causal, "sliding layers see their whole block (full layers "
         "always do)", 1, 0},
        {"max-anchors", FLAG_INT, &o.max_anchors, "anchors (blocks) per batch N", 1, 1 << 20},
        {"target-layer-ids", FLAG_LIST, &ids, "captured target layer ids in --layer-ids-convention, concat order "
         "(default: the z-lab formula for the layer count)", 0, 4096},
        {"layer-ids-convention", FLAG_CHOICE, &ch_conv, "how --target-layer-ids count: zlab (output of decoder layer "
         "i, what dflash-target --layers takes) or speculators (= zlab + 1)", 1, 0},
        {"sample-from-anchor", FLAG_BOOL, &o.sample_from_anchor, "train slot 0 too (DSpark mode; vLLM may not serve "
         "it)", 1, 0},
        {"mask-token-id", FLAG_INT64, &o.mask_token_id, "mask token id (default: the tokenizer's mask token, else the "
         "first unused embedding row; never pad or EOS)", -1, INT64_MAX},
        {"noise", FLAG_DOUBLE, &o.noise, "half-width of the uniform noise added to the captured states (train only)",
         0, 10},
        {"loss", FLAG_CHOICE, &ch_loss, "per-slot loss", 1, 0},
        {"weighting", FLAG_CHOICE, &ch_w, "per-position weights (dpace needs --loss ce)", 1, 0},
        {"gamma", FLAG_DOUBLE, &o.gamma, "exp-decay gamma", 0, 1000},
        {"alpha", FLAG_DOUBLE, &o.alpha, "D-PACE alpha in (0, 1]", 0, 1},
        {"init-std", FLAG_DOUBLE, &o.init_std, "std of the trainable matrices' normal init", 0, 10},
        {"optimizer", FLAG_CHOICE, &ch_opt, "muon (Muon for the matrices + AdamW for the rest) or adamw for all", 1, 0},
        {"lr", FLAG_DOUBLE, &o.lr, "AdamW learning rate", 0, 10},
        {"muon-lr", FLAG_DOUBLE, &o.muon_lr, "Muon learning rate (0: 10 x --lr)", 0, 100},
        {"weight-decay", FLAG_DOUBLE, &o.weight_decay, "AdamW decoupled weight decay", 0, 10},
        {"muon-weight-decay", FLAG_DOUBLE, &o.muon_weight_decay, "Muon weight decay", 0, 10},
        {"schedule", FLAG_CHOICE, &ch_sched, "learning-rate schedule over --max-steps", 1, 0},
        {"warmup-steps", FLAG_INT64, &o.warmup_steps, "warm-up steps (-1: --warmup-ratio, else 1% of --max-steps)", -1,
         INT64_MAX},
        {"warmup-ratio", FLAG_DOUBLE, &o.warmup_ratio, "warm-up as a fraction of --max-steps (-1: unset)", -1, 1},
        {"clip", FLAG_DOUBLE, &o.clip, "global gradient-norm clip (0: none)", 0, 1e9},
        {"grad-accum", FLAG_INT, &o.grad_accum, "packed batches per optimizer step", 1, 1 << 20},
        {"max-steps", FLAG_INT64, &o.max_steps, "optimizer steps to train (the schedule's length); the trainer leaves "
         "after them", 1, INT64_MAX},
        {"seed", FLAG_INT64, &o.seed, "seed of the init, the anchors and the noise", 0, INT64_MAX},
        {"ckpt-every", FLAG_INT, &o.ckpt_every, "checkpoint every N optimizer steps (and at the end; 0: end only)", 0,
         INT_MAX},
        {"keep", FLAG_INT, &o.keep, "checkpoints to keep (0: all)", 0, INT_MAX},
        {"resume", FLAG_BOOL, &o.resume, "continue from the newest valid checkpoint of this run (a fresh start when "
         "there is none)", 1, 0},
        {"max-nonfinite", FLAG_INT, &o.max_nonfinite, "stop after this many non-finite steps in a row", 1, INT_MAX},
        {"draft-vocab", FLAG_STRING, &o.draft_vocab, "directory with t2d.npy and d2t.npy (dflash-vocab) for a pruned "
         "draft vocabulary (default: the full target vocabulary)", 1, 0},
        {"dump-step", FLAG_INT64, &o.dump_step, "write a replayable dump of this optimizer step (0-based) into "
         "--dump-dir/step-N", -1, INT64_MAX},
        {"dump-dir", FLAG_STRING, &o.dump_dir, "where --dump-step writes", 1, 0},
        {"wait-ms", FLAG_INT, &o.wait_ms, "how long to wait for the input ring to appear", 0, INT_MAX},
        {"heartbeat-s", FLAG_DOUBLE, &o.heartbeat_s, "seconds between metrics heartbeats", 0, 86400},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--run DIR --target-model DIR --max-steps N [--device cpu] [--resume] ...",
                        "The DFlash drafter trainer: reads `features` items in sequence order, trains the drafter "
                        "(anchored blocks, block-sparse attention over the captured target states, fused LM-head "
                        "distillation loss; Muon + AdamW), pushes per-step metrics on the bus and writes lossless "
                        "checkpoints into RUN/checkpoints (state/train.json names the batch seq it needs next). "
                        "Batches marked split=val (dflash-pack --val-frac/--val-every) are evaluated forward only (no "
                        "noise, no backward, not a micro-batch); each pass sends one val_* metric record. "
                        "Exit 0 when --max-steps are done or the stream ends, 3 when stopped by a signal.",
                        NULL, 0);
    if (!o.target_model) { fprintf(stderr, "dflash-train: --target-model DIR is required (see --help)\n"); return 2; }
    if (!o.max_steps) { fprintf(stderr, "dflash-train: --max-steps N is required (it sets the schedule)\n"); return 2; }
    if (o.dump_step >= 0 && !o.dump_dir) { fprintf(stderr, "dflash-train: --dump-step needs --dump-dir\n"); return 2; }
    stage_start(&o.common, 1);
    if (o.common.cuda_device >= 0 && o.dump_dir) {
        fprintf(stderr, "dflash-train: --dump-dir/--dump-step run on the CPU path only (the dump records the fp32 "
                "step): add --device cpu\n");
        return 2;
    }
    char err[1024];

    struct trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.tl_launch = tr.tl_last = t_launch;
    tl_mark(&tr, "flags and bus");
    tr.o = &o;
    tr.gpu = o.common.cuda_device >= 0;
    build_config(&o, &dc);
    uint8_t *t2d = NULL;
    int64_t *d2t = NULL;
    if (o.draft_vocab) {
        int64_t V_d;
        LIB_CHECK(vocab_load(o.draft_vocab, dc.V_t, &V_d, &t2d, &d2t, err, sizeof err), err);
        dc.V_d = (int)V_d;
    }
    tr.d = drafter_init(&dc, (uint64_t)o.seed, err, sizeof err);
    if (!tr.d) DIE("%s", err);
    tl_mark(&tr, "drafter init (host weights)");
    tr.cfg = drafter_config_of(tr.d);
    if (t2d) LIB_CHECK(drafter_set_vocab(tr.d, t2d, d2t, dc.V_d, err, sizeof err), err);
    free(t2d);
    free(d2t);
    LIB_CHECK(drafter_load_target(tr.d, o.target_model, err, sizeof err), err);
    tl_mark(&tr, "weights read (the target's frozen tables)");

    tr.n_tens = drafter_n_params(tr.d);
    tr.tens = calloc((size_t)tr.n_tens, sizeof *tr.tens);
    ALLOC_CHECK(tr.tens);
    int64_t n_trainable = 0;
    for (int i = 0; i < tr.n_tens; i++) {
        const struct drafter_param *p = drafter_param(tr.d, i);
        tr.tens[i] = (struct optim_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}, p->w, p->g, p->trainable,
                                           p->is_matrix};
        if (p->trainable) n_trainable += p->numel;
    }
    oc.kind = (enum optim_kind)o.optimizer;
    oc.lr = o.lr;
    oc.muon_lr = o.muon_lr > 0 ? o.muon_lr : 10 * o.lr;
    oc.weight_decay = o.weight_decay;
    oc.muon_weight_decay = o.muon_weight_decay;
    LIB_CHECK(optim_init(&tr.opt, tr.tens, tr.n_tens, &oc, err, sizeof err), err);
    optim_guard_init(&tr.guard, o.max_nonfinite);
    LIB_CHECK(sched_init(&tr.sched, (enum sched_kind)o.schedule, o.max_steps, o.warmup_steps, o.warmup_ratio, err,
                         sizeof err), err);
    ckpt_table_init(&tr.table);
    LIB_CHECK(ckpt_table_add_optim(&tr.table, &tr.opt, err, sizeof err), err);
    LIB_CHECK(ckpt_table_add_guard(&tr.table, &tr.guard, err, sizeof err), err);
    tr.config_json = config_to_json(&o, tr.cfg, &oc, &tr.sched);
    size_t kH = (size_t)tr.cfg->k * tr.cfg->H;
    if (!tr.gpu) {   /* the GPU path copies bf16 features as they are */
        tr.hidden_f32 = malloc((size_t)tr.cfg->T_max * kH * sizeof(float));
        tr.last_f32 = malloc((size_t)tr.cfg->T_max * tr.cfg->H * sizeof(float));
        ALLOC_CHECK(tr.hidden_f32);
        ALLOC_CHECK(tr.last_f32);
    }
    drafter_metrics_zero(&tr.acc, tr.cfg->B);
    drafter_metrics_zero(&tr.val, tr.cfg->B);
    if (snprintf(tr.ckpt_dir, sizeof tr.ckpt_dir, "%s/checkpoints", o.common.run_dir) >= (int)sizeof tr.ckpt_dir ||
        snprintf(tr.state_path, sizeof tr.state_path, "%s/state/train.json", o.common.run_dir) >= (int)sizeof tr.state_path)
        DIE("--run path too long");
    char state_dir[PATH_MAX];
    snprintf(state_dir, sizeof state_dir, "%s/state", o.common.run_dir);
    LIB_CHECK(fs_mkdir_p(state_dir, err, sizeof err), err);

    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(tr.cfg, zl);
    char idl[256] = "";
    for (int i = 0, n = 0; i < tr.cfg->k && n < (int)sizeof idl - 12; i++)
        n += snprintf(idl + n, sizeof idl - (size_t)n, "%s%d", i ? "," : "", zl[i]);
    log_info("drafter: %d layers, block %d, %d anchors, H %d, target layers [%s] (z-lab ids), mask token %lld, "
             "vocab %d of %d, %lld trainable parameters, budget %d tokens; loss %s/%s, %s, lr %g, %lld steps",
             tr.cfg->L, tr.cfg->B, tr.cfg->N, tr.cfg->H, idl, (long long)tr.cfg->mask_token_id, tr.cfg->V_d,
             tr.cfg->V_t, (long long)n_trainable, tr.cfg->T_max, loss_names[tr.cfg->loss],
             weighting_names[tr.cfg->weighting], optimizer_names[o.optimizer], o.lr, (long long)o.max_steps);

    if (o.resume) {
        char path[PATH_MAX];
        struct ckpt_info info;
        memset(&info, 0, sizeof info);
        int found = ckpt_find_newest_valid(tr.ckpt_dir, tr.config_json, NULL, 0, ckpt_log, NULL, path, sizeof path,
                                           &info, err, sizeof err);
        if (found < 0) DIE("%s", err);
        if (found) {
            ckpt_info_free(&info);
            LIB_CHECK(ckpt_load(path, tr.table.t, tr.table.n, NULL, 0, &info, err, sizeof err), err);
            tr.step = info.step;
            tr.next_seq = info.next_seq;
            ckpt_info_free(&info);
            log_info("resuming from %s at step %lld", path, (long long)tr.step);
        } else {
            log_info("--resume: no checkpoint in %s yet; starting fresh", tr.ckpt_dir);
        }
    }
    LIB_CHECK(ckpt_write_state(tr.state_path, tr.step, tr.next_seq, NULL, err, sizeof err), err);
    printf("dflash-train: needs batch seq %lld next (step %lld)\n", (long long)tr.next_seq, (long long)tr.step);
    fflush(stdout);
    if (o.max_steps > 0 && tr.step >= o.max_steps) {
        log_info("already at step %lld of --max-steps %lld: nothing to train", (long long)tr.step,
                 (long long)o.max_steps);
        return 0;
    }
    tl_mark(&tr, "optimizer plan (host state), checkpoint restore");
#ifdef DFLASH_CUDA
    if (tr.gpu) gpu_start(&tr);   /* after the restore: the device copies start from the host state */
#endif

    struct relay_config rc = {
        .run_dir = o.common.run_dir, .in_ring = o.in_ring, .attach_wait_ms = o.wait_ms,
        .heartbeat_s = o.heartbeat_s, .use_bus = 1, .in_order = 1, .dedup = 1, .item_name = "features",
        .ctx = &tr, .compute = compute_train, .heartbeat_kv = train_heartbeat_kv,
    };
    check_hint("is dflash-shm running for this --run, with a `features` ring (dflash-hspack or dflash-replay feed it)?");
    tr.relay_ = relay_open(&rc, err, sizeof err);
    if (!tr.relay_) DIE("%s", err);
    tl_mark(&tr, "rings and bus attach");
    check_hint(NULL);
#ifdef DFLASH_CUDA
    if (tr.gpu) {
        tr.n_registered = ring_get_spec(relay_in(tr.relay_))->n_slots;
        tr.registered = calloc(tr.n_registered, sizeof *tr.registered);
        ALLOC_CHECK(tr.registered);
    }
#endif
    relay_set_next_seq(tr.relay_, (uint64_t)tr.next_seq);
    tr.last_step_t = time_mono_s();
    int res = relay_run(tr.relay_, err, sizeof err);
    if (res < 0) log_error("%s", err);
    if (res == RELAY_DONE) flush_val(&tr);   /* a pass at the end of the stream */
    if (res == RELAY_DONE) {
        if (tr.micro > 0 && optimizer_step(&tr, err, sizeof err)) {   /* a last partial accumulation */
            log_error("%s", err);
            res = -1;
        }
        if (res == RELAY_DONE && (o.ckpt_every == 0 || tr.step % o.ckpt_every != 0)) save(&tr);
        if (res == RELAY_DONE) {   /* the serving exports (issue 17): RUN/export/{zlab,speculators}, checked */
            char skipped[768];
#ifdef DFLASH_CUDA
            if (tr.gpu) LIB_CHECK(gpu_to_host(&tr, err, sizeof err), err);
#endif
            LIB_CHECK(export_write_run(tr.d, o.common.run_dir, o.target_model, skipped, sizeof skipped, err, sizeof err),
                      err);
            log_info("exports written to %s/export%s%s", o.common.run_dir, skipped[0] ? "; " : "", skipped);
        }
        if (res == RELAY_DONE) log_info("training done: %lld steps, %lld skipped, %lld validation passes", (long long)tr.step,
                                        (long long)tr.guard.skipped_total, (long long)tr.val_passes);
    }
#ifdef DFLASH_CUDA
    if (tr.gpu) gpu_stop(&tr);   /* before relay_close: the registered slots are still mapped */
#endif
    relay_close(tr.relay_);
    ckpt_table_free(&tr.table);
    optim_free(&tr.opt);
    drafter_free(tr.d);
    free(tr.tens);
    free(tr.hidden_f32);
    free(tr.last_f32);
    free(tr.config_json);
    return relay_exit_code(res);
}
