/*
 * stages/export/eval.h — greedy speculative decoding with the frozen target and a drafter, and the acceptance
 * statistics z-lab's benchmark reports (issue 17 item 3; dflash-reference.md §12).
 *
 * DESIGN
 * - The target is stages/model/target.h on the CPU (fp32). There is no KV cache: every round recomputes the
 *   target forward over the whole committed prefix (for the drafter's context features) and over prefix + draft
 *   (to verify). That is O(L²) per response and fine for the tiny model; a server-sized eval needs the GPU path
 *   and a cache.
 * - One round, with committed tokens c[0..n) (c[n-1] is the anchor: the last committed token, which has no
 *   features in the drafter's context): the proposer gets c and the captured features of c, and returns B-1
 *   draft tokens d[1..B-1] for positions n..n+B-2; the target runs over c ++ d and its greedy prediction p[i]
 *   after position n-1+i (i = 0..B-1) verifies: acc = the leading run of d[1+i] == p[i]; d[1..acc] and the
 *   bonus p[acc] are committed; τ = acc + 1 is recorded. So every committed token is the target's own greedy
 *   choice, and the output equals plain greedy decoding token for token (eval_greedy), whatever the drafter.
 * - The drafter proposer (eval_drafter_propose) runs drafter_step (train = 0) on a batch whose only supervised
 *   position is the anchor: one block, slot 0 = the anchor, slots 1..B-1 the mask token, context = the features
 *   strictly before the anchor (the §6 mask); its per-row argmaxes are the draft (mapped through d2t when the
 *   draft vocabulary is pruned). This is the training forward, so eval measures exactly what was trained.
 * - Statistics: τ = mean over responses of the per-response mean τ (z-lab's benchmark), a histogram of τ over
 *   1..B, per-position acceptance (rounds with acc >= j over rounds, j = 1..B-1, the server metric
 *   acceptance_at_pos), and the micro-average 1 + accepted / rounds.
 *
 * Library code: 0/-1 with one sentence in err.
 */
#ifndef STAGES_EXPORT_EVAL_H
#define STAGES_EXPORT_EVAL_H

#include <stdint.h>

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
};

/* Load target_dir for sequences up to max_tokens, capturing the z-lab ids (k of them). 0/-1. */
int eval_target_open(struct eval_target *et, const char *target_dir, int max_tokens, const int *zlab_ids, int k,
                     char *err, int err_len);
void eval_target_close(struct eval_target *et);
/* Forward over tokens[0..n): fills et->states / et->last, and pred[i] = the greedy next token after position i
 * for i in [from, n) (pred has n entries; entries before from are untouched). 0/-1. */
int eval_target_forward(struct eval_target *et, const int32_t *tokens, int n, int from, int32_t *pred, char *err,
                        int err_len);

/* The target's logits (V) after one last-layer state x (H): lm_head · RMSNorm_final(x). */
void eval_target_logits(struct eval_target *et, const float *x, float *logits);

/* A proposer: given the committed tokens c[0..n) and the target's features of them (et->states after a forward
 * over c, k blocks of [n, H], and et->last), write draft[0..B-2] = the tokens for positions n..n+B-2. */
typedef int (*eval_propose_fn)(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft,
                               char *err, int err_len);

/* The drafter proposer's state (ctx of eval_drafter_propose); d planned with N >= 1 anchors and T_max >= the
 * longest sequence + B. */
struct eval_drafter {
    struct drafter *d;
    float *hidden;      /* (T_max, k·H) */
};
int eval_drafter_init(struct eval_drafter *ed, struct drafter *d, char *err, int err_len);
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

#ifdef __cplusplus
}
#endif
#endif /* STAGES_EXPORT_EVAL_H */
