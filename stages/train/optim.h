/*
 * stages/train/optim.h — the trainer's optimizers (dflash-reference.md §9): Muon for the trainable
 * 2-D matrices plus AdamW for every other trainable tensor (the speculators default), or AdamW for
 * all; the global gradient-norm clip; gradient scaling for accumulation; and the non-finite guard.
 *
 * The optimizer works on a generic table of tensors (struct optim_tensor) that the stage fills
 * from the drafter's parameter table in a loop, so this module knows nothing of the model. All
 * state is fp32 and lives on the host: this is the CPU path (the --device cpu trainer and the
 * readable specification of a device version).
 *
 * Step order, as the speculators trainer does it (one optimizer step):
 *   1. the caller sums the micro-batch gradients into every g (gradient accumulation over A packed
 *      batches), then calls optim_scale_grads(t, n, 1/A): the step expects the MEAN of the A
 *      micro-batch gradients, i.e. the gradient of the mean of the A per-batch losses (each of which
 *      speculators already normalises per batch). With A = 1 nothing needs scaling.
 *   2. norm = optim_clip_grad_norm(t, n, 1.0): global L2 norm over ALL trainable gradients (both
 *      optimizers' tensors), accumulated in double; grads are scaled in place by torch's
 *      min(1, max_norm / (norm + 1e-6)) (kernels/adamw.h adamw_clip_factor).
 *   3. optim_guard_check(loss, norm): a step whose loss or grad norm is NaN/Inf is skipped (no
 *      weight or state changes, no step counted); after guard.max_consecutive in a row, stop.
 *   4. optim_step(o, sched_factor(s)): Muon first, then AdamW; each has its own step counter as
 *      torch keeps one per optimizer; one schedule multiplier scales both base lrs.
 *   5. optim_zero_grad before the next accumulation.
 *
 * Muon (torch.optim.Muon, torch 2.9–2.13) per matrix W (rows, cols) with gradient G:
 *   M ← lerp(M, G, 1-μ) = μM + (1-μ)G;  U = lerp(G, M, μ) (Nesterov) or M;
 *   X = U (transposed when rows > cols, so X is (m, n) with m <= n); X /= max(‖X‖_F, 1e-7);
 *   5 × { A = X·Xᵀ;  B = b·A + c·A·A;  X = a·X + B·X }  with (a, b, c) = (3.4445, -4.7750, 2.0315);
 *   transpose back; W ← W·(1 - lr·wd); W ← W - lr·0.2·sqrt(max(rows, cols))·X (match_rms_adamw).
 * bf16: torch runs the whole Newton–Schulz iteration on a bf16 tensor (X = bf16(U), and every
 * matmul/addmm result is a bf16 tensor computed with fp32 accumulation). With muon_bf16 = 1 (the
 * default) the CPU path rounds at exactly those points — U, the norm, X after the division, A, B
 * and X after each iteration — so a CPU run and the GPU run agree to the same bf16 values up to
 * accumulation order; with muon_bf16 = 0 it stays fp32 throughout (used by the tests to compare
 * against a plain double formula). The lerps follow torch's two-branch formula bit for bit.
 *
 * AdamW is kernels/adamw_ref.c adamw_step_ref (torch.optim.AdamW semantics), called per tensor
 * with clipping disabled because step 2 already scaled the grads.
 *
 * Thread safety: a struct optim is used by one thread. Functions return 0 or -1 with a sentence in
 * err; none exits. Deterministic: the same inputs give bit-identical weights and state.
 */
#ifndef STAGES_TRAIN_OPTIM_H
#define STAGES_TRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of the model, field for field the drafter's struct drafter_param. */
struct optim_tensor {
    const char *name;   /* speculators name, e.g. "layers.0.self_attn.q_proj.weight"; must outlive the optim */
    int ndim;           /* 1 or 2 */
    int64_t shape[2];   /* (rows, cols) for 2-D; shape[0] for 1-D */
    float *w;           /* (numel) fp32 master weights */
    float *g;           /* (numel) fp32 gradient; NULL if frozen */
    int trainable;
    int is_matrix;      /* Muon-eligible: 2-D, both dims > 1, name has neither embed_tokens nor lm_head */
};

enum optim_kind { OPTIM_MUON_ADAMW = 0, OPTIM_ADAMW = 1 };

struct optim_config {
    enum optim_kind kind;     /* OPTIM_MUON_ADAMW */
    double lr;                /* AdamW base lr, 1e-4 */
    double muon_lr;           /* Muon base lr; <= 0 means 10 × lr */
    double beta1, beta2;      /* 0.9, 0.999 */
    double eps;               /* 1e-8 */
    double weight_decay;      /* AdamW, 0.01 (decoupled; norms included) */
    double muon_weight_decay; /* 0.1 */
    double muon_momentum;     /* 0.95 */
    int muon_nesterov;        /* 1 */
    int ns_steps;             /* 5 */
    double ns_a, ns_b, ns_c;  /* 3.4445, -4.7750, 2.0315 */
    double ns_eps;            /* 1e-7, floor of the Frobenius norm */
    int muon_bf16;            /* 1: round the Newton–Schulz iterate to bf16 where torch does (see top) */
};

/* Which optimizer updates a tensor. */
enum optim_group { OPTIM_GROUP_NONE = 0 /* frozen */, OPTIM_GROUP_MUON = 1, OPTIM_GROUP_ADAMW = 2 };

struct optim {
    struct optim_config cfg;
    int n;                    /* tensors in the table */
    struct optim_tensor *t;   /* (n) copy of the caller's table (pointers are the caller's) */
    int *group;               /* (n) enum optim_group */
    int64_t *numel;           /* (n) */
    float **m, **v;           /* (n) AdamW moments (NULL unless AdamW group) */
    float **mom;              /* (n) Muon momentum buffer (NULL unless Muon group) */
    int64_t muon_step;        /* optimizer steps taken by Muon (torch's state "step") */
    int64_t adamw_step;       /* by AdamW; its bias corrections use adamw_step + 1 */
    int n_muon, n_adamw;      /* tensor counts per group */
    /* private scratch for Newton–Schulz, sized for the largest Muon matrix */
    float *ns_x_, *ns_y_, *ns_a_, *ns_b_;
};

/* The speculators defaults (listed beside the fields above). */
void optim_config_default(struct optim_config *c);

/* Build the groups from the table and allocate zeroed state. A trainable tensor needs g != NULL;
 * with kind OPTIM_MUON_ADAMW, is_matrix tensors (which must be 2-D with both dims > 1 and not
 * embed_tokens/lm_head) go to Muon and the other trainable ones to AdamW. Fails with a sentence
 * naming the tensor on an inconsistent entry or bad hyper-parameters. Free with optim_free. */
int optim_init(struct optim *o, const struct optim_tensor *t, int n, const struct optim_config *c,
               char *err, int err_len);
void optim_free(struct optim *o);   /* safe on a zeroed or freed struct */

/* The global L2 norm of the gradients of all trainable tensors (double accumulation). */
double optim_grad_norm(const struct optim_tensor *t, int n);
/* Compute the global norm and, when it is finite and max_norm > 0, scale every trainable gradient
 * in place by adamw_clip_factor (torch clip_grad_norm_). Returns the pre-clip norm (NaN/Inf
 * returned as is, grads then untouched). */
double optim_clip_grad_norm(const struct optim_tensor *t, int n, double max_norm);
/* g *= s for every trainable tensor (1/A after accumulating A micro-batches). */
void optim_scale_grads(const struct optim_tensor *t, int n, float s);
/* g = 0 for every trainable tensor. */
void optim_zero_grad(const struct optim_tensor *t, int n);

/* One step: Muon on its matrices with lr = muon_lr·lr_mult, then AdamW with lr = lr·lr_mult.
 * Grads must already be averaged and clipped. Returns -1 when lr_mult is negative or not finite. */
int optim_step(struct optim *o, double lr_mult, char *err, int err_len);

/* The Muon direction of one matrix, as used by optim_step: out (rows, cols) = NS5(u) (not scaled by
 * the lr). scratch holds 2·rows·cols + 2·min(rows,cols)^2 floats. Exposed for tests. */
void optim_muon_orthogonalize(const struct optim_config *c, const float *u, int64_t rows, int64_t cols,
                              float *out, float *scratch);

/* ---------------------------------------------------------------- non-finite guard */

enum optim_guard_action { OPTIM_GUARD_OK = 0, OPTIM_GUARD_SKIP = 1, OPTIM_GUARD_STOP = 2 };

struct optim_guard {
    int max_consecutive;      /* stop after this many non-finite steps in a row (>= 1) */
    int consecutive;          /* current streak */
    int64_t skipped_total;    /* all skipped steps of the run */
    int64_t first_step;       /* the streak's first step */
    char first_what[16];      /* "loss" or "grad norm" */
    double first_value;       /* its non-finite value */
};

void optim_guard_init(struct optim_guard *g, int max_consecutive);
/* Decide for step `step`: OK (finite; resets the streak), SKIP (loss or grad norm is NaN/Inf: the
 * caller skips the update and zeroes grads; counted), or STOP after max_consecutive in a row. On
 * SKIP and STOP msg gets one line, e.g. "step 7: loss is nan (first non-finite value); 3
 * non-finite steps in a row, stopping" (naming the streak's first step and value); on SKIP it reads
 * "step 7: grad norm is inf; skipped (1 in a row, 1 in total)". */
enum optim_guard_action optim_guard_check(struct optim_guard *g, int64_t step, double loss,
                                          double grad_norm, char *msg, int msg_len);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_TRAIN_OPTIM_H */
