/*
 * stages/export/eval.h — greedy speculative decoding with the frozen target and a drafter, and the acceptance
 * statistics z-lab's benchmark reports (issue 17 item 3; dflash-reference.md §12).
 *
 * DESIGN
 * - The target is stages/model/target.h on the CPU (fp32) or a GPU (bf16; eval_target_open_dev). Two paths:
 *   - eval_generate (issue 30): KV-cached (model/decode.h) and batched: up to n_slots prompts advance together,
 *     each round is one decode_extend over every active prompt's block (verification) or token (plain decoding);
 *     per token, the cached step is bitwise the full forward, so speculative output equals plain greedy output.
 *     Also sampled decoding (temperature, top-p) with the speculative-sampling acceptance rule and stop tokens.
 *   - eval_speculative / eval_greedy: no cache, every round recomputes the target over the whole committed prefix
 *     (O(L²) per response); the reference the cached path is checked against, and --no-kv-cache.
 * - One round, with committed tokens c[0..n) (c[n-1] is the anchor: the last committed token, which has no
 *   features in the drafter's context): the proposer gets c and the captured features of c, and returns B-1
 *   draft tokens d[1..B-1] for positions n..n+B-2; the target runs over c ++ d and its greedy prediction p[i]
 *   after position n-1+i (i = 0..B-1) verifies: acc = the leading run of d[1+i] == p[i]; d[1..acc] and the
 *   bonus p[acc] are committed; τ = acc + 1 is recorded. So every committed token is the target's own greedy
 *   choice, and the output equals plain greedy decoding token for token (eval_greedy), whatever the drafter.
 * - The drafter proposer (eval_drafter_propose) runs drafter_step (train = 0; on a GPU drafter_step_gpu, with
 *   eval_drafter_init_dev) on a batch whose only supervised
 *   position is the anchor: one block, slot 0 = the anchor, slots 1..B-1 the mask token, context = the features
 *   strictly before the anchor (the §6 mask); its per-row argmaxes are the draft (mapped through d2t when the
 *   draft vocabulary is pruned). This is the training forward, so eval measures exactly what was trained.
 *   Under eval_generate on the CPU the same forward runs KV-cached (export/drafter_cache.h): each slot keeps its
 *   context rows' keys and values, and a round projects only the rows committed since the last one.
 * - Statistics: τ = mean over responses of the per-response mean τ (z-lab's benchmark), a histogram of τ over
 *   1..B, per-position acceptance (rounds with acc >= j over rounds, j = 1..B-1, the server metric
 *   acceptance_at_pos), and the micro-average 1 + accepted / rounds.
 *
 * Library code: 0/-1 with one sentence in err.
 */
#ifndef STAGES_EXPORT_EVAL_H
#define STAGES_EXPORT_EVAL_H

#include <stdint.h>

#include "export/drafter_cache.h"
#include "model/target.h"
#include "train/drafter.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The target and its final norm + full LM head (for greedy predictions), CPU. */
struct eval_target {
    struct target *t;
    const struct model_config *cfg;
    int H, V, k;
    float *norm;        /* (H) model.norm.weight */
    float *lm_head;     /* (V, H) lm_head.weight, or the embedding when tied */
    float *states;      /* planned: (k, max_tokens, H) */
    float *last;        /* (max_tokens, H) */
    float *xn;          /* (H) scratch */
    float *logits;      /* (V) scratch */
    double *probs;      /* (V) scratch (sampling) */
    int32_t *cand;      /* (V) scratch (top-p candidates) */
    /* The proposer's view of the committed tokens' features: k blocks of ctx_rows rows of H (row t = token t), and
     * the last layer's (ctx_rows, H). eval_target_forward points them at states / last (ctx_rows = n); the cached
     * path at one prompt's feature history. */
    const float *ctx_states, *ctx_last;
    int ctx_rows;
    /* Which sequence the features belong to, for a proposer that caches per sequence (eval_drafter's drafter
     * cache): eval_generate sets the KV-cache slot and a number unique to the prompt's stay in that slot (a slot
     * given a new prompt gets a new one); -1 (eval_target_forward, eval_speculative): no slot, nothing cached. */
    int ctx_slot;
    int64_t ctx_seq, seq_next;
    /* KV cache (eval_target_enable_cache), else NULL */
    struct decode *dc;
    int n_slots, max_len, max_step;
    int dev;                          /* -1 CPU, else the target's CUDA device */
    bf16 *states16, *last16;          /* GPU: target_forward's bf16 outputs on the host, widened into states/last */
    float *step_logits;               /* (n_slots · DRAFTER_MAX_B, V): the last step's logits (GPU) */
    int step_T, logits_all, logits_ready, logits_first, logits_pinned;
    int32_t *step_ids;                /* (n_slots · DRAFTER_MAX_B): the last step's greedy picks (GPU) */
    int ids_ready;
    float *hist, *hist_last;          /* (n_slots, k, max_len, H), (n_slots, max_len, H) */
    float *step_states, *step_last;   /* (k, max_step, H), (max_step, H) */
};

/* Load target_dir for sequences up to max_tokens, capturing the z-lab ids (k of them). 0/-1. */
int eval_target_open(struct eval_target *et, const char *target_dir, int max_tokens, const int *zlab_ids, int k,
                     char *err, int err_len);
/* The same with the target on CUDA device cuda_device (-1: the CPU): the decode step, the final norm and the LM
 * head run there (model/decode.h); the features and logits the host code reads come back as fp32. */
int eval_target_open_dev(struct eval_target *et, const char *target_dir, int max_tokens, const int *zlab_ids, int k,
                         int cuda_device, char *err, int err_len);
void eval_target_close(struct eval_target *et);
/* Forward over tokens[0..n): fills et->states / et->last, and pred[i] = the greedy next token after position i
 * for i in [from, n) (pred has n entries; entries before from are untouched). 0/-1. */
int eval_target_forward(struct eval_target *et, const int32_t *tokens, int n, int from, int32_t *pred, char *err,
                        int err_len);

/* Plan a KV cache for n_slots prompts of up to max_len tokens (prompt + generated + a block). 0, or -1 with a
 * sentence: decode_init refuses Qwen3.5 hybrids (callers fall back to eval_speculative / eval_greedy). */
int eval_target_enable_cache(struct eval_target *et, int n_slots, int max_len, char *err, int err_len);

/* The target's logits (V) after one last-layer state x (H): lm_head · RMSNorm_final(x). */
void eval_target_logits(struct eval_target *et, const float *x, float *logits);
/* Index of the largest of x[0..n) (n >= 1), the first on ties, as the plain loop `if (x[v] > x[best]) best = v`
 * (a NaN never wins; a NaN x[0] gives 0). Eight running maxima, then the first index holding the maximum: the
 * plain loop's dependent load of x[best] took 9.3 ms of a 17.4 ms decode step over 16 rows of 151936 logits
 * (decode_bench, RESULTS.md run 54). */
int32_t eval_argmax(const float *x, int n);

/* A proposer: given the committed tokens c[0..n) and the target's features of them (et->ctx_states: k blocks of
 * [ctx_rows, H], rows 0..n-2 at least, and et->ctx_last), write draft[0..B-2] = the tokens for positions n..n+B-2. */
typedef int (*eval_propose_fn)(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft,
                               char *err, int err_len);

/* The drafter proposer's state (ctx of eval_drafter_propose); d planned with N >= 1 anchors and T_max >= the
 * longest sequence + B.
 * On the CPU, a proposal for a sequence that eval_generate runs in a slot (et->ctx_slot >= 0) takes the KV-cached
 * path (export/drafter_cache.h): the context rows' keys and values are kept per slot and only the rows committed
 * since the last round are projected; it agrees with the uncached proposal to fp32 rounding. The cache is planned
 * by eval_drafter_enable_cache, or at the first such proposal from the target's plan (et->n_slots, et->max_len).
 * no_cache = 1 (set by the caller after init) keeps every proposal on the uncached path: drafter_step over the
 * whole committed context (what eval_speculative always runs, et->ctx_slot being -1 there). */
struct eval_drafter {
    struct drafter *d;
    float *hidden;      /* (T_max, k·H) */
    void *gpu;          /* struct drafter_gpu * when the proposal runs on a GPU, else NULL */
    int no_cache;       /* 1: never the cached path */
    struct drafter_cache *cache;   /* NULL until planned */
    void *gcache;       /* struct drafter_cache_gpu * when the GPU proposal is cached (eval_drafter_enable_cache) */
};
int eval_drafter_init(struct eval_drafter *ed, struct drafter *d, char *err, int err_len);
/* Plan the drafter cache for n_slots sequences of up to max_len tokens (the target cache's plan); allocates
 * everything the cached proposals use. On the CPU the cache is also planned by itself at the first proposal in a
 * slot; a GPU proposer is cached only through this call (export/drafter_cache.h's GPU half), and only while
 * eval_gpu_drafter_cache_on(). 0/-1 with a sentence (out of memory, a cache already planned, a shape the GPU
 * cache refuses, or the GPU cache off). */
int eval_drafter_enable_cache(struct eval_drafter *ed, int n_slots, int max_len, char *err, int err_len);
/* Whether the GPU drafter's cached proposal may be used: written without a GPU to run it on, it stays off until
 * it has passed tests/gpu/test_decode_gpu on one; DFLASH_GPU_DRAFTER_CACHE=1 (which that test sets) turns it on.
 * Off, a GPU proposal runs uncached (drafter_step_gpu over the whole context) as before. */
int eval_gpu_drafter_cache_on(void);
/* The same with the proposal on CUDA device cuda_device (-1: the CPU): drafter_step_gpu (train = 0, bf16) over
 * the committed features, uploaded each round (drafter_gpu_load_batch), its block's argmaxes read back. */
int eval_drafter_init_dev(struct eval_drafter *ed, struct drafter *d, int cuda_device, char *err, int err_len);
void eval_drafter_free(struct eval_drafter *ed);   /* frees the buffers, not d */
int eval_drafter_propose(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft, char *err,
                         int err_len);

struct eval_stats {
    int B;
    int64_t responses, rounds, accepted;          /* accepted: Σ acc */
    double tau_sum;                               /* Σ over responses of the per-response mean τ */
    int64_t hist[DRAFTER_MAX_B + 1];              /* rounds with τ = i, i in 1..B */
    int64_t at_pos[DRAFTER_MAX_B];                /* rounds with acc >= j, j in 1..B-1 */
};
void eval_stats_init(struct eval_stats *s, int B);
double eval_stats_tau(const struct eval_stats *s);        /* mean of per-response means */
double eval_stats_tau_micro(const struct eval_stats *s);  /* 1 + accepted / rounds */

/* Speculative decoding of one prompt (P tokens) for max_new tokens: out[0..P+max_new) (prompt included).
 * Adds the response's rounds to s. 0/-1. */
int eval_speculative(struct eval_target *et, const int32_t *prompt, int P, int max_new, int B, eval_propose_fn fn,
                     void *ctx, int32_t *out, struct eval_stats *s, char *err, int err_len);
/* Plain greedy decoding (one target forward per token) into out[0..P+max_new). 0/-1. */
int eval_greedy(struct eval_target *et, const int32_t *prompt, int P, int max_new, int32_t *out, char *err,
                int err_len);

/* ---------------------------------------------------------------- KV-cached, batched generation */

struct eval_gen_opts {
    int max_new;                /* tokens to generate per prompt (fewer when a stop token comes first) */
    int B;                      /* speculative block size (2..DRAFTER_MAX_B) with fn; ignored without */
    eval_propose_fn fn;         /* NULL: plain decoding, one token per prompt per step */
    void *ctx;
    double temperature;         /* 0: greedy (argmax, first maximum on ties) */
    double top_p;               /* nucleus (0 or 1: off); with temperature > 0 */
    uint64_t seed;              /* sampling: prompt i draws from a stream keyed by (seed, index_base + i) */
    int64_t index_base;
    const int32_t *stop;        /* generation of a prompt ends after it emits one of these (kept in the output) */
    int n_stop;
};

/* Generate for n prompts (prompts[i], P[i] tokens, P[i] + max_new + B <= the cache's max_len) in groups of n_slots:
 * outs[i][0 .. out_len[i]) = prompt + generated tokens (outs[i] holds P[i] + max_new + B entries). With fn, each
 * round verifies the proposer's B-1 tokens: greedy, the leading run equal to the target's argmax is accepted;
 * sampled, draft token d is accepted with probability p(d) (the drafter's choice is deterministic, so q(d) = 1) and
 * the first rejection is replaced by a draw from p without d; the bonus token is the target's. s (may be NULL)
 * collects the rounds of speculative runs. Deterministic for a seed whatever the grouping. 0/-1. */
int eval_generate(struct eval_target *et, int n, const int32_t *const *prompts, const int *P,
                  const struct eval_gen_opts *o, int32_t **outs, int *out_len, struct eval_stats *s, char *err,
                  int err_len);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_EXPORT_EVAL_H */
