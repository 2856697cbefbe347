/*
 * stages/train/optim_gpu.h — the trainer's optimizers on the GPU (issue 20): the device mirror of
 * stages/train/optim.h for a drafter_gpu's fp32 masters and gradients. Same step order and formulas:
 *   1. optim_gpu_grad_norm_start(scale = 1/A): g *= scale, then the global squared L2 norm of all trainable
 *      gradients into one device double, reduced in a fixed order (per tensor a fixed grid of 256 block partials
 *      in double, summed serially, tensors in table order), so it is bitwise repeatable (adamw_grad_sumsq's fp32
 *      atomics are not, so it is not used); copied asynchronously to pinned host memory.
 *   2. optim_gpu_grad_norm_wait: the optimizer step's one host synchronisation; returns the pre-clip norm for the
 *      non-finite guard (optim_guard_check on the host, unchanged).
 *   3. optim_gpu_step(lr_mult, max_norm): the clip factor min(1, max_norm / (norm + 1e-6)) is read from the device
 *      sumsq by every kernel (nothing returns to the host); Muon on the Muon group — momentum lerp (torch's
 *      two-branch formula), U rounded to bf16, ‖X‖ (bf16-rounded) by the same fixed-order reduction, X /= norm,
 *      5 Newton–Schulz iterations as cuBLASLt bf16 GEMMs with fp32 accumulation (A = X·Xᵀ, B = b·A + c·A·A,
 *      X = a·X + B·X; for a tall matrix the transposed forms A = XᵀX, X = a·X + X·B, which equal torch's transpose
 *      round trip since B is symmetric), decoupled decay and the match_rms_adamw scale — then AdamW
 *      (kernels/adamw.h adamw_step_multi) on the rest; the bf16 weight copies are refreshed by the same kernels.
 *   The step counters are the host struct optim's (muon_step, adamw_step), so checkpoints see them unchanged.
 * State: AdamW m, v and the Muon momentum in fp32 on the device, plus the Newton–Schulz scratch sized for the
 * largest shape batch and the device tables below, planned at init as one cudaMalloc. optim_gpu_download_state / _upload_state move it to and
 * from the host struct optim's arrays, which stages/train/ckpt.c saves and restores.
 * Functions return 0 or -1 with a sentence; everything is asynchronous on the drafter_gpu's stream except where
 * said.
 *
 * Launch shape (issue 28): the norm is one launch over a device table of all trainable gradients (the scale fused,
 * the same fixed reduction order, so the norm is bitwise what the per-tensor form gave). Muon groups its matrices
 * by shape (rows, cols) at init, in table order of first appearance, cut into batches of at most OG_NS_BATCH_ELEMS
 * elements (balanced); each batch runs the prep, norm, normalise and update kernels once (blockIdx.y = the matrix,
 * through a device table of pointers) and the 5 Newton–Schulz iterations as 3 strided-batched cuBLASLt GEMMs each
 * (blas_matmul_batched; B = b·A + c·A·A and X = a·X + B·X read C from A and X, no copies). Every elementwise and
 * reduction result is bitwise the per-matrix path's; the GEMMs may pick other algorithms, so X differs by bf16
 * accumulation order only (tests/gpu/test_optim_gpu.c compares both with the CPU reference).
 * optim_gpu_set_muon_batched(o, 0) selects the per-matrix path (one GEMM per matrix, as before; tests and
 * benchmarks). AdamW is one adamw_step_multi launch over all its tensors, its clip read from the device double norm.
 */
#ifndef STAGES_TRAIN_OPTIM_GPU_H
#define STAGES_TRAIN_OPTIM_GPU_H

#ifdef DFLASH_CUDA
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cuda_runtime_api.h>

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct optim;
struct drafter_gpu;
struct optim_gpu;

/* The device pointers of one table entry: fp32 master and gradient (both may be NULL when frozen: never read), bf16
 * copy (nullable). */
struct optim_gpu_tensor {
    float *w;
    float *g;
    bf16 *copy;
};

/* Most Newton–Schulz elements (bf16) in one batch: bounds the scratch (two such X buffers) at 512 MiB. */
#define OG_NS_BATCH_ELEMS ((size_t)1 << 27)

/* host: an optim_init'ed optimizer over the drafter's parameter table in table order (the host copy of the
 * state; its config and groups are used); g: the drafter_gpu. plan (nullable) gets the state plan and total.
 * NULL with a sentence. */
struct optim_gpu *optim_gpu_init(struct optim *host, struct drafter_gpu *g, FILE *plan, char *err, int err_len);
/* The same over a plain table of device tensors (dev (host->n), in host's table order) on stream s: tests and
 * benchmarks run the optimizer without a drafter. The tensors must outlive the optim_gpu. */
struct optim_gpu *optim_gpu_init_table(struct optim *host, const struct optim_gpu_tensor *dev, cudaStream_t s,
                                       FILE *plan, char *err, int err_len);
void optim_gpu_free(struct optim_gpu *o);
size_t optim_gpu_planned_bytes(const struct optim_gpu *o);
/* 1 (the default): Muon by shape batches; 0: one matrix at a time (the path before issue 28). */
void optim_gpu_set_muon_batched(struct optim_gpu *o, int batched);
/* The batched Newton–Schulz products exploiting symmetry (issue 28 item 1): A = X·Xᵀ and B = c·A·A + b·A are
 * symmetric, so for an even m (m/2 a multiple of 8) only their two diagonal and the lower-left (m/2)² blocks are
 * computed (3 of 4 block GEMMs each: 75% of those FLOPs; Y = B·X stays whole) and og_sym_mirror_batched fills the
 * upper-right block. Off by default until optim_bench has measured it on a GPU (tests/gpu/test_optim_gpu checks it
 * against the CPU reference under the same rule as the full products). */
void optim_gpu_set_ns_symmetric(struct optim_gpu *o, int on);
/* The Newton–Schulz FLOPs of one Muon step (2·M·N·K per GEMM: 5 × (4·m²·n + 2·m³) per matrix, m = min(rows, cols),
 * n = max), and the number of shape batches Muon runs per step. */
double optim_gpu_muon_flops(const struct optim_gpu *o);
int optim_gpu_muon_batches(const struct optim_gpu *o);

int optim_gpu_grad_norm_start(struct optim_gpu *o, float scale, char *err, int err_len);
/* Waits for the copy of optim_gpu_grad_norm_start; *norm = sqrt(sumsq) (NaN/Inf as they come). */
int optim_gpu_grad_norm_wait(struct optim_gpu *o, double *norm, char *err, int err_len);
/* After optim_gpu_grad_norm_start (and a finite norm): one step with lr = base · lr_mult, clipping to max_norm
 * (<= 0: none). Increments the host optimizer's step counters. */
int optim_gpu_step(struct optim_gpu *o, double lr_mult, double max_norm, char *err, int err_len);
/* Device state -> the host optim's m, v, mom (synchronous), and back. */
int optim_gpu_download_state(struct optim_gpu *o, char *err, int err_len);
int optim_gpu_upload_state(struct optim_gpu *o, char *err, int err_len);

/* ---- launchers of optim_gpu.cu (used by optim_gpu.c) */
int og_scale(float *g, size_t n, float s, cudaStream_t st);
/* partials (OG_PARTIALS) = per-block sums of x² in double, fixed grid; then *out (+= when accumulate) = their
 * serial sum, and *out_f = (float)*out when out_f != NULL. */
#define OG_PARTIALS 256
int og_sumsq_f32(const float *x, size_t n, double *partials, double *out, float *out_f, int accumulate, cudaStream_t st);
int og_sumsq_bf16(const bf16 *x, size_t n, double *partials, double *out, cudaStream_t st);
/* mom = lerp(mom, g·clip, 1 − mu); X = bf16(nesterov ? lerp(g·clip, mom, mu) : mom); clip from *sumsq. */
int og_muon_prep(float *mom, const float *g, bf16 *x, size_t n, float mu, int nesterov, const double *sumsq,
                 float max_norm, cudaStream_t st);
/* x = bf16(x / max(bf16(sqrt(*ss)), eps)). */
int og_muon_normalize(bf16 *x, size_t n, const double *ss, float eps, cudaStream_t st);
/* w = w·decay − adj·x; copy = bf16(w). */
int og_muon_update(float *w, bf16 *copy, const bf16 *x, size_t n, float decay, float adj, cudaStream_t st);

/* Device tables of the one-launch forms: a gradient (the norm), a Muon matrix's pointers. */
typedef struct {
    float *g;
    size_t n;
} og_vec;
typedef struct {
    float *w;
    const float *g;
    bf16 *copy;   /* nullable */
    float *mom;
} og_muon_ptrs;
/* For every table entry t (nt <= 65535): g *= scale (when != 1) and its OG_PARTIALS partials into
 * partials[t·OG_PARTIALS..]; then *out = the tensors' sums in table order (og_sumsq_f32's arithmetic, bitwise), *out_f
 * = (float)*out when out_f != NULL. partials holds nt·OG_PARTIALS doubles. */
int og_grad_sumsq_multi(const og_vec *tab, int nt, float scale, double *partials, double *out, float *out_f,
                        cudaStream_t st);
/* The batched forms over nb matrices of ne elements each, x (nb, ne) contiguous; the per-matrix kernels' arithmetic:
 * prep with tab (nb) -> x; out[j] = sumsq of x[j] (partials nb·OG_PARTIALS); x[j] /= its norm; update w, copy of
 * tab[j] from x[j]. */
int og_muon_prep_batched(const og_muon_ptrs *tab, int nb, size_t ne, bf16 *x, float mu, int nesterov,
                         const double *sumsq, float max_norm, cudaStream_t st);
int og_sumsq_bf16_batched(const bf16 *x, size_t ne, int nb, double *partials, double *out, cudaStream_t st);
int og_muon_normalize_batched(bf16 *x, size_t ne, int nb, const double *ss, float eps, cudaStream_t st);
int og_muon_update_batched(const og_muon_ptrs *tab, int nb, size_t ne, const bf16 *x, float decay, float adj,
                           cudaStream_t st);
/* a (nb matrices (m, m) bf16 at stride elements, m even): the upper-right (m/2)² block = the lower-left one
 * transposed, bitwise (the symmetric Newton–Schulz products compute only the lower blocks). */
int og_sym_mirror_batched(bf16 *a, int m, int nb, long long stride, cudaStream_t st);
void og_sym_mirror_ref(bf16 *a, int m, int nb, long long stride);

#ifdef __cplusplus
}
#endif
#endif /* DFLASH_CUDA */
#endif /* STAGES_TRAIN_OPTIM_GPU_H */
