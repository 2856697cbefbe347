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
 * - Data-parallel ranks (issue 29; stages/train/dp.h): launched by `mpirun -np W` (a build with Open MPI), W
 *   ranks train one drafter on the CPU path. --grad-accum A (the plan's grad_accum) stays the optimizer step's
 *   TOTAL micro-batches over all ranks (so the plan, the packer's batch count and the checkpoint's config are
 *   the same as one rank's); it must divide by W, and each rank accumulates A/W of them: rank r takes the
 *   seqs s with s % W == r (ring_set_rank on the shared `features` ring), i.e. micro-batches r, r+W, ... of
 *   each step. The weights are checked identical at start (a hash over every parameter, step and next_seq);
 *   the fp32 gradients are summed over ranks once per step (MPI_Allreduce) and scaled by 1/A; the loss and
 *   metrics are summed over ranks; rank 0 alone prints the seq it needs, sends metric records and writes
 *   checkpoints (next_seq = the highest seq any rank consumed + 1), state/train.json and the exports. Two
 *   ranks with --grad-accum 2 end bit-identical to one rank with --grad-accum 2 (tests/test_scale.c).
 *   Validation items are refused with ranks (they break the stride). On the GPU path (rank i of a host on
 *   cuda:(train_device + i)) the sums go over NCCL (train/dp_nccl.h; written, not yet run on GPUs), and one rank's
 *   gradients accumulate inside the backward as before, so GPU ranks are not bit-equal to one GPU rank.
 * - Several hosts (topology (c), pipelines/slurm-train.sh; plan keys ranks and hosts, stages/plan/plan.h): the world
 *   must equal the plan's ranks; rank r lives on host r / (ranks / hosts) and reads the features of that host's
 *   chain, RUN/hosts/H (relay ring_dir), which holds exactly its host's ranks' seqs; a rank started on another node
 *   than its host's chain (RUN/hosts/H/node) refuses to start with one line. The plan, bus, checkpoints, state and
 *   exports stay in RUN (a filesystem every host mounts). The arithmetic is the one-host ranks', so 2 hosts x 1 rank
 *   end bit-identical to 1 rank with --grad-accum 2 (tests/test_slurm.c).
 * - Never a short success (issue 24): the run trains --max-steps steps or exits 1 with one line saying how many it
 *   trained (a stream that ends early; a partial --grad-accum accumulation at its end is never applied). A resume
 *   at --max-steps trains nothing and writes the exports again from the final checkpoint.
 * - Memory: the drafter plans every buffer at start-up from (--tokens, --max-anchors, the model); step_cpu.c
 *   adds two planned widening buffers (CPU path only), step_gpu.c the device plan. A step allocates nothing here.
 * - The device work of a step sits behind struct step_exec (stages/train/step.h): step_cpu.c (the fp32 step on
 *   host slots) or step_gpu.c (--device cuda:N, or auto on a machine with a GPU: the device drafter and optimizer,
 *   the copies out of the input slots, the host waits, the memory plan; its file comment says which). This file
 *   is the orchestration both share: decode and check, accumulate, guard, schedule, metrics, validation,
 *   checkpoints. --dump-dir is refused on the GPU (the dump records the fp32 CPU step: run that step with
 *   --device cpu). Numerics are the drafter_gpu's (bf16 storage, fp32 accumulation), so a GPU run tracks a CPU
 *   run (tests/gpu/test_train_stage_gpu: loss within 5% per step) but is not bit-equal to it; a GPU run is
 *   deterministic and resumes exactly on the GPU. step_s on the GPU is host time per step (the step runs
 *   asynchronously).
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
#include "plan/plan.h"
#include "export/export.h"
#include "kernels/common.h"
#include "kernels/lmhead_loss.h"
#include "train/ckpt.h"
#include "train/drafter.h"
#include "train/mask_token.h"
#include "train/optim.h"
#include "train/sched.h"
#include "train/dp.h"
#include "train/step.h"
#include "train/train_config.h"
#include "train/vocab.h"


#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct opts {
    struct stage_common common;
    const char *target_model, *in_ring, *draft_vocab, *dump_dir;
    struct drafter_config dc;        /* the drafter's options, defined once (drafter_config_defaults); the flags
                                      * write into it, the target's fields come from drafter_config_from_target */
    double noise, gamma, alpha, init_std;   /* FLAG_DOUBLE views of dc's float options */
    int optimizer, schedule;
    int allow_unservable;   /* issue 26: train a configuration no serving engine serves (research) */
    int round_features;     /* --round-features-bf16 (CPU path) */
    double lr, muon_lr, weight_decay, muon_weight_decay, clip, warmup_ratio;
    int64_t warmup_steps, max_steps, seed, dump_step;
    int grad_accum, ckpt_every, keep, resume, max_nonfinite, wait_ms, print_next_seq;
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
    int64_t step;                    /* optimizer steps done */
    int64_t next_seq;                /* the next batch seq this run needs */
    int micro;                       /* micro-batches accumulated into the gradients */
    uint64_t target_id;              /* desc_target_id of --target-model: what every features item must name */
    uint64_t plan;                   /* the run plan's hash (0: none): an item of another plan is refused */
    struct step_acc acc;             /* metrics and Σ per-batch losses of the current optimizer step */
    uint64_t step_tokens;
    double step_busy_s, last_step_t, lr;
    struct drafter_metrics val;      /* the open validation pass, pooled over its batches */
    int val_batches;                 /* batches in it (0: no pass open) */
    uint64_t val_first_seq, val_tokens;
    int64_t val_passes;
    struct relay *relay_;
    int gpu;                         /* 1: the GPU path (--device cuda:N); 0: the CPU path */
    struct step_exec x;              /* the step's device work: step_cpu_init or step_gpu_init (train/step.h) */
    struct dp dp;                    /* rank and world (train/dp.h): 0 of 1 without mpirun */
    int accum;                       /* micro-batches per step on this rank: --grad-accum / world */
    double *red;                     /* planned: the metrics summed over ranks each step */
    /* the start-up timeline (issue 28): seconds of each phase since the previous mark, logged at the first step */
    double tl_launch, tl_last;
    const char *tl_name[12];
    double tl_s[12];
    int tl_n, tl_logged;
};

/* The step's loss and metrics summed over the ranks (one record for all). */
static int reduce_metrics(struct trainer *tr, char *err, int err_len) {
    if (tr->dp.world <= 1) return 0;
    struct drafter_metrics *m = &tr->acc.m;
    int B = m->B, n = 0;
    double *x = tr->red;
    x[n++] = tr->acc.loss_sum;
    x[n++] = m->loss_sum;
    x[n++] = (double)m->loss_count;
    for (int j = 0; j < B; j++) { x[n++] = (double)m->correct[j]; x[n++] = (double)m->total[j]; }
    x[n++] = (double)m->full_correct;
    x[n++] = (double)m->full_total;
    x[n++] = m->eal_sum;
    x[n++] = (double)m->eal_count;
    x[n++] = (double)m->n_anchors;
    x[n++] = (double)tr->step_tokens;
    if (dp_sum_f64(&tr->dp, x, (size_t)n, err, err_len)) return -1;
    n = 0;
    tr->acc.loss_sum = x[n++];
    m->loss_sum = x[n++];
    m->loss_count = (int64_t)x[n++];
    for (int j = 0; j < B; j++) { m->correct[j] = (int64_t)x[n++]; m->total[j] = (int64_t)x[n++]; }
    m->full_correct = (int64_t)x[n++];
    m->full_total = (int64_t)x[n++];
    m->eal_sum = x[n++];
    m->eal_count = (int64_t)x[n++];
    m->n_anchors = (int)x[n++];
    tr->step_tokens = (uint64_t)x[n++];
    return 0;
}

/* A several-host run: the node this rank runs on is the node host `host`'s chain runs on (its rings are in that
 * node's /dev/shm). The host chain writes its node name into HOST_DIR/node (pipelines/slurm-train.sh); a rank placed
 * elsewhere by the launcher would wait for rings that are not there. 0 (also when the file is absent), or -1. */
static int check_host_node(const char *host_dir, int rank, int host, char *err, int err_len) {
    char path[PATH_MAX + 8], me[256] = "", *text = NULL, e2[256];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/node", host_dir);
    if (!fs_exists(path)) return 0;
    if (fs_read_file(path, &text, &len, e2, sizeof e2)) return err_fail(err, err_len, "%s", e2);
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = 0;
    gethostname(me, sizeof me - 1);
    int bad = strcmp(text, me) != 0;
    if (bad)
        err_fail(err, err_len, "rank %d runs on node %s, but host %d's chain (whose rings it reads) runs on node %s "
                 "(%s): start the ranks with ranks/hosts per node in rank order (mpirun --map-by ppr:L:node)", rank, me,
                 host, text, path);
    free(text);
    return bad ? -1 : 0;
}

/* The gradients summed over the ranks (MPI on the CPU path's host gradients, NCCL on the GPU's). */
static int reduce_grads(struct trainer *tr, char *err, int err_len) {
    if (tr->dp.world <= 1) return 0;
    return tr->x.sum_grads(tr->x.impl, &tr->dp, err, err_len);
}

/* The configuration a checkpoint must match (everything that changes what the run computes): its keys are
 * owned by stages/train/train_config.h, which dflash-export reads them back with. */
static char *config_to_json(const struct opts *o, const struct drafter_config *c, const struct optim_config *oc,
                            const struct sched *s) {
    struct train_hparams h = {.seed = o->seed, .optimizer = (int)oc->kind, .lr = oc->lr, .muon_lr = oc->muon_lr,
                              .weight_decay = oc->weight_decay, .muon_weight_decay = oc->muon_weight_decay,
                              .schedule = (int)s->kind, .total_steps = s->total, .warmup_steps = s->warmup,
                              .grad_accum = o->grad_accum, .clip = o->clip};
    char *text = train_config_json(c, &h);
    ALLOC_CHECK(text);
    return text;
}

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

static void ckpt_log(void *ctx, const char *line) { (void)ctx; log_warn("%s", line); }

/* Write checkpoint step-<step> and state/train.json. */
static void save(struct trainer *tr) {
    char err[1024], path[PATH_MAX];
    if (tr->dp.rank != 0) return;   /* one checkpoint, rank 0's: every rank holds the same state */
    LIB_CHECK(tr->x.to_host(tr->x.impl, err, sizeof err), err);   /* the GPU path: device -> host first */
    struct ckpt_meta meta = {tr->step, tr->next_seq, tr->step, tr->config_json, NULL, 0};
    LIB_CHECK(ckpt_save(tr->ckpt_dir, &meta, tr->table.t, tr->table.n, tr->o->keep, path, sizeof path, err, sizeof err),
              err);
    LIB_CHECK(ckpt_write_state(tr->state_path, tr->step, tr->next_seq, path, err, sizeof err), err);
    log_info("checkpoint %s: step %lld, next batch seq %lld", path, (long long)tr->step, (long long)tr->next_seq);
}

/* The serving exports (issue 17): RUN/export/{zlab,speculators}, each checked. Written at the end of training and
 * again by a run that resumes at --max-steps (issue 24: a fault after the final checkpoint left them missing). */
static void write_exports(struct trainer *tr) {
    char err[1024], skipped[768];
    if (tr->dp.rank != 0) return;
    /* the device path first copies its weights to the host drafter; a run resumed at --max-steps never started it */
    if (tr->x.to_host) LIB_CHECK(tr->x.to_host(tr->x.impl, err, sizeof err), err);
    LIB_CHECK(export_write_run(tr->d, tr->o->common.run_dir, tr->o->target_model, skipped, sizeof skipped, err,
                               sizeof err), err);
    log_info("exports written to %s/export%s%s", tr->o->common.run_dir, skipped[0] ? "; " : "", skipped);
}

/* A run asked for --max-steps optimizer steps trains them all or fails (issue 24): the stream ended early. One
 * line: how many steps were trained and why the rest were not. Never applies a partial accumulation. */
static void log_short_stream(const struct trainer *tr) {
    char partial[160] = "";
    if (tr->micro > 0)
        snprintf(partial, sizeof partial, " and %d of the %d batches of step %lld (a partial accumulation is not "
                 "applied)", tr->micro, tr->o->grad_accum, (long long)tr->step + 1);
    log_error("training incomplete: the features stream ended after %lld of --max-steps %lld optimizer steps%s; its "
              "producers gave fewer than --max-steps x --grad-accum = %lld train batches (the last checkpoint stays; "
              "nothing exported)", (long long)tr->step, (long long)tr->o->max_steps, partial,
              (long long)(tr->o->max_steps * tr->o->grad_accum));
}

/* Apply the accumulated micro-batches as one optimizer step (or skip it: non-finite guard). */
static int optimizer_step(struct trainer *tr, char *err, int err_len) {
    const struct opts *o = tr->o;
    double norm;   /* g *= 1/A, the global norm (the CPU clips here, the GPU in apply) */
    int total = tr->micro * tr->dp.world;   /* micro-batches of this step over all ranks */
    if (reduce_grads(tr, err, err_len) || dp_max_i64(&tr->dp, &tr->next_seq, err, err_len)) return -1;
    if (tr->x.grad_norm(tr->x.impl, &tr->acc, 1.0f / (float)total, o->clip, &norm, err, err_len)) return -1;
    if (reduce_metrics(tr, err, err_len)) return -1;   /* after grad_norm: the GPU path collects its metrics there */
    double loss = tr->acc.loss_sum / total;
    char msg[512];
    enum optim_guard_action act = optim_guard_check(&tr->guard, tr->step, loss, norm, msg, sizeof msg);
    if (act == OPTIM_GUARD_STOP) return err_fail(err, err_len, "%s", msg);
    double f = sched_factor(&tr->sched, tr->step);
    tr->lr = o->lr * f;
    if (act == OPTIM_GUARD_SKIP) log_warn("%s", msg);
    else if (tr->x.apply(tr->x.impl, f, o->clip, err, err_len)) return -1;
    if (tr->x.zero_grad(tr->x.impl, err, err_len)) return -1;

    tl_log_first_step(tr);
    double now = time_mono_s(), wall = now - tr->last_step_t;
    tr->last_step_t = now;
    const struct drafter_metrics *m = &tr->acc.m;
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
    kv[n++] = (struct bus_kv){"anchors", (double)m->n_anchors / total};
    if (tr->gpu) kv[n++] = (struct bus_kv){"gpu_mem_gib", tr->x.mem_gib};
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
    tr->acc.loss_sum = 0;
    tr->step_tokens = 0;
    tr->step_busy_s = 0;
    drafter_metrics_zero(&tr->acc.m, tr->cfg->B);
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
    if (tr->gpu) kv[n++] = (struct bus_kv){"gpu_mem_gib", tr->x.mem_gib};
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
    if (desc_check_plan(&fd.batch, tr->plan, tr->o->in_ring, err, err_len)) return -1;
    /* k, H, layout, dtype, layer ids, and the batch's tokens and budget against the planned T_max: checked once */
    if (drafter_check_features(c, &fd, e2, sizeof e2))
        return err_fail(err, err_len, "features seq %llu: %s", (unsigned long long)fd.batch.seq, e2);
    if (fd.target_id != tr->target_id)   /* same shape, another target (issue 24) */
        return err_fail(err, err_len, "features seq %llu: computed by another target (id %016llx), not by --target-model "
                        "%s (id %016llx: a hash of its config.json): train with the target that made the features",
                        (unsigned long long)fd.batch.seq, (unsigned long long)fd.target_id, tr->o->target_model,
                        (unsigned long long)tr->target_id);
    const int train = fd.batch.split != DESC_SPLIT_VAL;
    if (!train && tr->dp.world > 1)
        return err_fail(err, err_len, "features seq %llu is a validation batch: validation is not supported with %d "
                        "trainer ranks (it would break the seq %% ranks assignment); pack without --val-frac/--val-every",
                        (unsigned long long)fd.batch.seq, tr->dp.world);
    const uint64_t T = fd.batch.n_tokens, seq = fd.batch.seq;
    if (train) flush_val(tr);   /* a train batch after val batches closes that pass */
    struct step_dump dump = {tr->o->dump_dir, {(uint64_t)tr->step, (uint64_t)tr->o->seed, "float32", tr->o->target_model}};
    /* the first micro-batch of the step asked for: the gradients were zero before it */
    int dumping = train && tr->micro == 0 && tr->o->dump_dir && tr->step == tr->o->dump_step;
    struct drafter_metrics m;
    if (tr->x.micro(tr->x.impl, is, &fd, train, (uint64_t)tr->o->seed, &tr->acc, &m, dumping ? &dump : NULL, err,
                    err_len))
        return -1;
    if (dumping)
        log_info("dumped step %lld (batch seq %llu) into %s/step-%lld", (long long)tr->step, (unsigned long long)seq,
                 tr->o->dump_dir, (long long)tr->step);
    /* a val seq counts in next_seq too, so a resume never asks for it again once a later step is saved */
    tr->next_seq = (int64_t)seq + 1;
    it->n_tokens = T;
    if (!train) {   /* forward only: no noise, no backward, the gradients and the optimizer untouched */
        if (!tr->val_batches) tr->val_first_seq = seq;
        drafter_metrics_add(&tr->val, &m);
        tr->val_batches++;
        tr->val_tokens += T;
        return RELAY_DONE;
    }
    tr->micro++;
    tr->step_tokens += T;
    tr->step_busy_s += time_mono_s() - t0;
    if (tr->micro == tr->accum && optimizer_step(tr, err, err_len)) return -1;
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
    *c = o->dc;
    c->noise = (float)o->noise;
    c->gamma = (float)o->gamma;
    c->alpha = (float)o->alpha;
    c->init_std = (float)o->init_std;
    LIB_CHECK(drafter_config_from_target(c, o->target_model, err, sizeof err), err);
}

static void log_plan_line(const char *line) { log_info("%s", line); }

int main(int argc, char **argv) {
    const double t_launch = time_mono_s();
    log_init("dflash-train");
    struct opts o;
    memset(&o, 0, sizeof o);
    stage_common_defaults(&o.common);
    drafter_config_defaults(&o.dc);
    struct drafter_config dc;
    o.in_ring = RING_NAME_FEATURES;
    o.noise = o.dc.noise;
    o.gamma = o.dc.gamma;
    o.alpha = o.dc.alpha;
    o.init_std = o.dc.init_std;
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
    struct flag_list types = {o.dc.layer_type, &o.dc.L, DRAFTER_MAX_LAYERS, train_layer_type_names};
    struct flag_list ids = {o.dc.layer_ids, &o.dc.k, DESC_MAX_LAYERS, NULL};
    struct flag_choice ch_conv = {&o.dc.ids_convention, train_convention_names}, ch_loss = {&o.dc.loss, train_loss_names},
                       ch_w = {&o.dc.weighting, train_weighting_names}, ch_opt = {&o.optimizer, train_optimizer_names},
                       ch_sched = {&o.schedule, train_schedule_names};
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&o.common),
        {"target-model", FLAG_STRING, &o.target_model, "the target's Hugging Face directory: config.json, tokenizer "
         "files and only the embedding, final norm and LM head tensors are read", 1, 0},
        {"in", FLAG_STRING, &o.in_ring, "input ring (features descriptors)", 1, 0},
        {"tokens", FLAG_INT, &o.dc.T_max, "token budget of a batch (the packer's --tokens): plans memory and the anchor "
         "candidates (p < budget - B)", 2, 1 << 24},
        {"block-size", FLAG_INT, &o.dc.B, "block size B", 2, DRAFTER_MAX_B},
        {"layer-types", FLAG_LIST, &types, "draft layer types, one per layer (the count is the layer count); "
         "all-sliding as speculators ships: sliding,sliding,sliding,sliding,sliding", 1, 0},
        {"sliding-window", FLAG_INT, &o.dc.sliding_window, "window W of the sliding layers", 1, INT_MAX},
        {"sliding-window-non-causal", FLAG_BOOL, &o.dc.sliding_window_non_causal, "sliding layers see their whole block (full layers "
         "always do)", 1, 0},
        {"max-anchors", FLAG_INT, &o.dc.N, "anchors (blocks) per batch N", 1, 1 << 20},
        {"target-layer-ids", FLAG_LIST, &ids, "captured target layer ids in --layer-ids-convention, concat order "
         "(default: the z-lab formula for the layer count)", 0, 4096},
        {"layer-ids-convention", FLAG_CHOICE, &ch_conv, "how --target-layer-ids count: zlab (output of decoder layer "
         "i, what dflash-target --layers takes) or speculators (= zlab + 1)", 1, 0},
        {"sample-from-anchor", FLAG_BOOL, &o.dc.sample_from_anchor, "train slot 0 too (DSpark mode; no serving engine "
         "serves it: needs --allow-unservable)", 1, 0},
        {"allow-unservable", FLAG_BOOL, &o.allow_unservable, "train a configuration that neither vLLM nor SGLang "
         "serves as trained (refused at start-up otherwise; see dflash-export --help)", 1, 0},
        {"mask-token-id", FLAG_INT64, &o.dc.mask_token_id, "mask token id (default: tokenizer_config.json's mask_token, "
         "else the first embedding row past tokenizer.json's last id; without either (no tokenizer.json, or a tokenizer "
         "that fills the embedding) the trainer stops at start-up naming the file: pass this flag; never pad or EOS)", -1, INT64_MAX},
        {"noise", FLAG_DOUBLE, &o.noise, "half-width of the uniform noise added to the captured states (train only)",
         0, 10},
        {"round-features-bf16", FLAG_BOOL, &o.round_features, "CPU path: round fp32 features to bf16 on load, as the "
         "GPU path stores them (to compare the two trainers on equal inputs)", 1, 0},
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
        {"print-next-seq", FLAG_BOOL, &o.print_next_seq, "print the batch seq this run's trainer needs next (from "
         "RUN/state/train.json, which a starting trainer rewrites from its checkpoints before it takes an item) and exit; "
         "exit 1 when there is none yet", 1, 0},
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
                        "Exit 0 when --max-steps are done (a run resumed at --max-steps writes the exports again), "
                        "1 when the stream ends before them (the line says how many were trained), 3 when stopped by "
                        "a signal.",
                        NULL, 0);
    if (o.print_next_seq) {   /* the pipelines' resume handshake (pipelines/lib.sh train_next_seq) */
        char path[PATH_MAX], perr[PATH_MAX + 256];
        int64_t step, next;
        if (!o.common.run_dir) { fprintf(stderr, "dflash-train: --print-next-seq needs --run DIR\n"); return 2; }
        if (snprintf(path, sizeof path, "%s/state/train.json", o.common.run_dir) >= (int)sizeof path) {
            fprintf(stderr, "dflash-train: --run path too long\n");
            return 2;
        }
        if (ckpt_read_state(path, &step, &next, NULL, 0, perr, sizeof perr)) { fprintf(stderr, "dflash-train: %s\n", perr); return 1; }
        printf("%lld\n", (long long)next);
        return 0;
    }
    /* The run plan (RUN/plan.json, stages/plan/plan.h) owns the target, budget, captured ids, the drafter's layer
     * types and block size, the steps, the accumulation and the device. */
    struct plan plan;
    char perr[1024];
    int have_plan = plan_open_run(o.common.run_dir, &plan, perr, sizeof perr);
    if (have_plan < 0) { fprintf(stderr, "dflash-train: %s\n", perr); return 2; }
    if (have_plan) {
        int plan_ids[DESC_MAX_LAYERS], shift = o.dc.ids_convention == DRAFTER_IDS_SPECULATORS ? 1 : 0;
        for (int i = 0; i < plan.n_ids; i++) plan_ids[i] = plan.ids[i] + shift;
        if (plan_bind_str(&plan, "target-model", flags_given(argc, argv, "target-model"), &o.target_model, plan.model,
                          "model", perr, sizeof perr) ||
            plan_bind_int(&plan, "tokens", flags_given(argc, argv, "tokens"), &o.dc.T_max, plan.tokens, "tokens", perr,
                          sizeof perr) ||
            plan_bind_list(&plan, "target-layer-ids", flags_given(argc, argv, "target-layer-ids"), o.dc.layer_ids,
                           &o.dc.k, plan_ids, plan.n_ids, "capture.layer_ids", perr, sizeof perr) ||
            plan_bind_list(&plan, "layer-types", flags_given(argc, argv, "layer-types"), o.dc.layer_type,
                           &o.dc.L, plan.layer_types, plan.draft_layers, "drafter.layer_types (0 sliding, 1 full)",
                           perr, sizeof perr) ||
            plan_bind_int(&plan, "block-size", flags_given(argc, argv, "block-size"), &o.dc.B, plan.block_size,
                          "drafter.block_size", perr, sizeof perr) ||
            plan_bind_int64(&plan, "max-steps", flags_given(argc, argv, "max-steps"), &o.max_steps, plan.steps, "steps",
                            perr, sizeof perr) ||
            plan_bind_int(&plan, "grad-accum", flags_given(argc, argv, "grad-accum"), &o.grad_accum, plan.grad_accum,
                          "grad_accum", perr, sizeof perr) ||
            plan_bind_device(&plan, flags_given(argc, argv, "device"), &o.common.device, plan.train_device, perr, sizeof perr)) {
            fprintf(stderr, "dflash-train: %s\n", perr);
            return 2;
        }
    }
    struct dp dp;
    if (dp_init(&dp, &argc, &argv, perr, sizeof perr)) { fprintf(stderr, "dflash-train: %s\n", perr); return 2; }
    if (dp.world > 1) {
        char tag[48];
        /* the other ranks' lines say which rank wrote them; rank 0 keeps the stage's name (the bus's too) */
        snprintf(tag, sizeof tag, "dflash-train.r%d", dp.rank);
        if (dp.rank > 0) log_init(strdup(tag));
        if (o.grad_accum % dp.world) {
            fprintf(stderr, "dflash-train: --grad-accum %d (the step's micro-batches over all ranks) does not divide "
                    "by the %d ranks\n", o.grad_accum, dp.world);
            dp_abort(&dp, 2);
            return 2;
        }
    }
    /* The plan's ranks (when it says them) is the launcher's world; a several-host run's rank reads the rings of its
     * host's chain, RUN/hosts/H (plan.h), and keeps RUN for the plan, bus, checkpoints, state and exports. */
    char ring_dir[PATH_MAX] = "";
    int ring_host = -1;
    if (have_plan && (plan.ranks > 1 || plan.hosts > 1) && dp.world != plan.ranks) {
        fprintf(stderr, "dflash-train: the plan (%s) says %d trainer ranks but this one was launched as rank %d of %d "
                "(mpirun -np %d starts them)\n", plan.path, plan.ranks, dp.rank, dp.world, plan.ranks);
        dp_abort(&dp, 2);
        return 2;
    }
    if (have_plan && plan.hosts > 1) {
        if (plan.host >= 0) {
            fprintf(stderr, "dflash-train: %s is host %d's plan; the trainer ranks run with --run RUN (the run's plan), "
                    "not a host directory\n", plan.path, plan.host);
            dp_abort(&dp, 2);
            return 2;
        }
        ring_host = plan_rank_host(&plan, dp.rank);
        if (plan_host_dir(o.common.run_dir, ring_host, ring_dir, sizeof ring_dir)) DIE("--run path too long");
        if (check_host_node(ring_dir, dp.rank, ring_host, perr, sizeof perr)) {
            fprintf(stderr, "dflash-train: %s\n", perr);
            dp_abort(&dp, 2);
            return 2;
        }
    }
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
    tl_mark(&tr, "flags, bus and plan");
    tr.o = &o;
    if (dp.world > 1 && o.common.cuda_device >= 0) {   /* one GPU per rank of a host: the plan's device + local rank */
        o.common.cuda_device += dp_local_rank();
        log_info("rank %d of %d: cuda:%d", dp.rank, dp.world, o.common.cuda_device);
    }
    tr.gpu = o.common.cuda_device >= 0;
    if (tr.gpu && o.round_features)
        DIE("--round-features-bf16 is for the CPU path (the GPU path stores the features in bf16 already)");
    tr.dp = dp;
    tr.accum = o.grad_accum / dp.world;
    tr.red = calloc(16 + 2 * DRAFTER_MAX_B, sizeof *tr.red);
    ALLOC_CHECK(tr.red);
    if (!tr.gpu && dp.world > 1 && !dp.mpi)
        DIE("launched as one of %d ranks on the CPU path, but this dflash-train was built without MPI (install "
            "libopenmpi-dev and build again, or start one rank)", dp.world);
    build_config(&o, &dc);
    uint8_t *t2d = NULL;
    int64_t *d2t = NULL;
    if (o.draft_vocab) {
        int64_t V_d;
        LIB_CHECK(vocab_load(o.draft_vocab, dc.V_t, &V_d, &t2d, &d2t, err, sizeof err), err);
        dc.V_d = (int)V_d;
    }
    /* issue 26: a configuration no serving engine serves is refused now, not found out after the run */
    if (export_unservable(&dc, err, sizeof err)) {
        if (!o.allow_unservable) DIE("%s", err);
        log_warn("--allow-unservable: %s", err);
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
    LIB_CHECK(desc_target_id_of_model(o.target_model, &tr.target_id, err, sizeof err), err);
    tr.plan = have_plan ? plan.hash : 0;

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
    drafter_metrics_zero(&tr.acc.m, tr.cfg->B);
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
             tr.cfg->V_t, (long long)n_trainable, tr.cfg->T_max, train_loss_names[tr.cfg->loss],
             train_weighting_names[tr.cfg->weighting], train_optimizer_names[o.optimizer], o.lr, (long long)o.max_steps);
    if (dp.rank == 0) {   /* the checkpoint writer: one checkpoint beside the last kept, and the two bf16 exports */
        uint64_t need = ckpt_tensor_bytes(tr.table.t, tr.table.n) + 2 * 2 * (uint64_t)n_trainable;
        char what[96];
        snprintf(what, sizeof what, "a checkpoint (%.2f GB) and the exports", ckpt_tensor_bytes(tr.table.t, tr.table.n) / 1e9);
        LIB_CHECK(ckpt_check_space(tr.ckpt_dir, need, what, err, sizeof err), err);
    }

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
    if (dp.world > 1 && tr.gpu) {   /* NCCL between the ranks' GPUs; its id through the run's state directory */
        LIB_CHECK(dp_use_nccl(&dp, o.common.cuda_device, state_dir, 300, err, sizeof err), err);
        tr.dp = dp;
        log_info("rank %d of %d: NCCL communicator on cuda:%d", dp.rank, dp.world, o.common.cuda_device);
    }
    if (dp.world > 1) {   /* the same weights, step and data position on every rank, or no start */
        uint64_t h = DP_HASH_INIT;
        for (int i = 0; i < tr.n_tens; i++) {
            const struct optim_tensor *t = &tr.tens[i];
            h = dp_hash(h, t->w, (size_t)(t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0]) * sizeof(float));
        }
        h = dp_hash(h, &tr.step, sizeof tr.step);
        h = dp_hash(h, &tr.next_seq, sizeof tr.next_seq);
        if (dp_check_same(&dp, h, "initial weights (or step and data position)", err, sizeof err)) {
            log_error("%s", err);
            dp_abort(&dp, 1);
            return 1;
        }
        log_info("rank %d of %d: initial weights identical on every rank (hash %016llx); this rank takes seqs s with "
                 "s %% %d == %d, %d micro-batch(es) per step", dp.rank, dp.world, (unsigned long long)h, dp.world,
                 dp.rank, tr.accum);
    }
    if (dp.rank == 0) {
        LIB_CHECK(ckpt_write_state(tr.state_path, tr.step, tr.next_seq, NULL, err, sizeof err), err);
        printf("dflash-train: needs batch seq %lld next (step %lld)\n", (long long)tr.next_seq, (long long)tr.step);
        fflush(stdout);
    }
    if (o.max_steps > 0 && tr.step >= o.max_steps) {
        /* the exports may be missing (a fault after the final checkpoint): written again from that checkpoint */
        log_info("already at step %lld of --max-steps %lld: nothing to train; writing the exports again",
                 (long long)tr.step, (long long)o.max_steps);
        /* the device state was never started (tr.x is unset): the weights are the host copy just loaded */
        write_exports(&tr);
        dp_finish(&dp);
        return 0;
    }
    /* after the restore: the device copies start from the host state; before the rings (the GPU path makes its
     * device current, where the rings' IPC handles open) */
    tl_mark(&tr, "optimizer plan (host state), checkpoint restore");
    if (tr.gpu)
        LIB_CHECK(step_gpu_init(&tr.x, tr.d, &tr.opt, o.common.cuda_device, o.in_ring, log_plan_line, err, sizeof err),
                  err);
    else {
        LIB_CHECK(step_cpu_init(&tr.x, tr.d, &tr.opt, tr.tens, tr.n_tens, o.in_ring, err, sizeof err), err);
        step_cpu_round_features(&tr.x, o.round_features);
    }
    tl_mark(&tr, tr.gpu ? "CUDA init, device drafter and optimizer, cuBLASLt warm-up" : "CPU step init");

    if (ring_host >= 0)
        log_info("rank %d of %d: host %d of %d of the plan: reads the features of that host's chain (%s)", dp.rank,
                 dp.world, ring_host, plan.hosts, ring_dir);
    struct relay_config rc = {
        .run_dir = o.common.run_dir, .ring_dir = ring_dir[0] ? ring_dir : NULL, .in_ring = o.in_ring, .attach_wait_ms = o.wait_ms,
        .heartbeat_s = o.heartbeat_s, .use_bus = dp.rank == 0, .in_order = 1, .dedup = 1, .item_name = "features",
        .ctx = &tr, .compute = compute_train, .heartbeat_kv = train_heartbeat_kv, .plan = have_plan ? plan.hash : 0,
    };
    check_hint("is dflash-shm running for this --run, with a `features` ring (dflash-hspack or dflash-replay feed it)?");
    tr.relay_ = relay_open(&rc, err, sizeof err);
    if (!tr.relay_) DIE("%s", err);
    tl_mark(&tr, "rings and bus attach");
    check_hint(NULL);
    if (tr.gpu) LIB_CHECK(step_gpu_plan_slots(&tr.x, ring_get_spec(relay_in(tr.relay_))->n_slots, err, sizeof err), err);
    relay_set_next_seq(tr.relay_, (uint64_t)tr.next_seq);
    if (dp.world > 1) LIB_CHECK(relay_set_rank(tr.relay_, (uint32_t)dp.rank, (uint32_t)dp.world, err, sizeof err), err);
    tr.last_step_t = time_mono_s();
    int res = relay_run(tr.relay_, err, sizeof err);
    if (res < 0) log_error("%s", err);
    if (res == RELAY_DONE) flush_val(&tr);   /* a pass at the end of the stream */
    if (res == RELAY_DONE && tr.step < o.max_steps) {   /* the stream ended early: a failure, not "done" */
        log_short_stream(&tr);
        res = -1;
    }
    if (res == RELAY_DONE) {
        if (o.ckpt_every == 0 || tr.step % o.ckpt_every != 0) save(&tr);
        write_exports(&tr);
        log_info("training done: %lld steps, %lld skipped, %lld validation passes", (long long)tr.step,
                                        (long long)tr.guard.skipped_total, (long long)tr.val_passes);
    }
    tr.x.free(tr.x.impl);   /* before relay_close: registered slots are still mapped */
    relay_close(tr.relay_);
    ckpt_table_free(&tr.table);
    optim_free(&tr.opt);
    drafter_free(tr.d);
    free(tr.tens);
    free(tr.config_json);
    free(tr.red);
    if (res < 0 && dp.world > 1) {   /* the other ranks may wait in a collective: stop them all now */
        log_error("rank %d of %d failed; stopping every rank", dp.rank, dp.world);
        dp_abort(&dp, 1);
    }
    dp_finish(&dp);
    return relay_exit_code(res);
}
