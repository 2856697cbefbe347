/*
 * stages/model/jobplan.c — the one-GPU memory plan of the whole job (jobplan.h).
 */
#include "model/jobplan.h"
#include "core/desc.h"
#include "core/err.h"
#include "model/target.h"

#include <string.h>

static void add(struct jobplan *p, const char *stage, const char *what, size_t bytes) {
    if (p->n >= JOBPLAN_MAX_LINES) return;
    struct jobplan_line *l = &p->line[p->n++];
    snprintf(l->stage, sizeof l->stage, "%s", stage);
    snprintf(l->what, sizeof l->what, "%s", what);
    l->bytes = bytes;
}

int jobplan_compute(const struct jobplan_inputs *in, struct jobplan *p, char *err, int err_len) {
    memset(p, 0, sizeof *p);
    const struct model_config *c = in->target;
    if (!c || in->tokens < 1 || in->n_capture < 1 || in->draft_layers < 1 || in->max_anchors < 1 ||
        in->block_size < 1 || in->draft_vocab < 0 || in->ring_slots < 1 || in->capacity_bytes == 0)
        return err_fail(err, err_len, "memory plan: --tokens, the captured layers, the drafter's layers, --max-anchors, "
                        "--block-size, the ring slots and the GPU capacity must be >= 1 (got %d, %d, %d, %d, %d, %d, "
                        "%zu)", in->tokens, in->n_capture, in->draft_layers, in->max_anchors, in->block_size,
                        in->ring_slots, in->capacity_bytes);
    /* ---- target: exactly target.c's allocation */
    size_t tw = 0, tk = 0;
    target_plan_bytes(c, in->tokens, 1, &tw, &tk);
    add(p, "target", "weights (bf16 matrices, fp32 norms)", tw);
    add(p, "target", "working memory for --tokens", tk);
    p->target_bytes = tw + tk;

    /* ---- drafter: parameters and their training state, as drafter_gpu_init + optim_gpu_init plan them */
    double H = c->hidden_size, T = in->tokens, k = in->n_capture;
    double nh = in->draft_heads ? in->draft_heads : c->num_attention_heads;
    double nkv = in->draft_kv_heads ? in->draft_kv_heads : c->num_key_value_heads;
    double dh = in->draft_head_dim ? in->draft_head_dim : c->head_dim;
    double I = in->draft_intermediate ? in->draft_intermediate : c->intermediate_size;
    double Vt = c->vocab_size, Vd = in->draft_vocab ? in->draft_vocab : c->vocab_size, L = in->draft_layers;
    double QD = nh * dh, KD = nkv * dh, R = (double)in->max_anchors * in->block_size, KV = T + R;
    double mat = H * k * H + L * (2 * QD * H + 2 * KD * H + 3 * I * H);   /* trainable 2-D */
    double vec = 2 * H + L * (2 * H + 2 * dh);                               /* trainable 1-D */
    p->draft_params = mat + vec;
    size_t state = (size_t)(mat * (4 + 4 + 2 + 8) + vec * (4 + 4 + 8));
    size_t frozen = (size_t)(2 * (Vt * H + Vd * H) + 4 * H);
    add(p, "trainer", "drafter masters, gradients, bf16 copies, optimizer", state);
    add(p, "trainer", "frozen embedding and LM head (bf16)", frozen);
    double per_layer = 2 * (4 * R * H + 3 * R * QD + 3 * KV * KD + 3 * R * I) + 4 * (2 * R + 2 * R * nh + KV * nkv);
    double once = 4 * T * 3 + T + 2 * T * k * H * 2 /* features + noisy copy */ + 2 * T * H   /* inputs */
                  + 2 * 2 * T * H + 4 * T                                                   /* context */
                  + 2 * 2 * R * H + 4 * R + 4 * KV + 4 * R + 4 * in->max_anchors + in->max_anchors + 8 * R
                  + 4 * 2 * R * H + 4 * R * H + 3 * 2 * R * I + 3 * 2 * R * QD + 4 * R * QD  /* backward */
                  + 3 * 2 * KV * KD + 2 * 4 * KV * KD + 4 * T * H + 2 * 2 * T * H;
    add(p, "trainer", "activations (per layer, for --tokens / --max-anchors)", (size_t)(L * per_layer + once));
    double one_chunk = 2 * R * Vd * 2;
    size_t lm = (size_t)(one_chunk <= (double)((size_t)2 << 30) ? one_chunk : 2 * R * 8192 * 2);
    add(p, "trainer", "LM-head loss workspace (logit chunks)", lm);
    p->trainer_bytes = state + frozen + (size_t)(L * per_layer + once) + lm;

    /* ---- rings on the device: hidden (target -> hspack) and features (hspack -> trainer) */
    uint64_t hid = desc_hidden_max_payload_bytes((uint32_t)in->tokens, (uint32_t)in->n_capture,
                                                 (uint32_t)c->hidden_size, DESC_DTYPE_BF16);
    uint64_t feat = desc_features_max_payload_bytes((uint32_t)in->tokens, (uint32_t)in->n_capture,
                                                    (uint32_t)c->hidden_size, DESC_DTYPE_BF16);
    p->ring_bytes = (size_t)in->ring_slots * (size_t)(hid + feat);
    add(p, "rings", "hidden + features rings (slots x payload)", p->ring_bytes);
    p->reserve_bytes = 3 * JOBPLAN_RESERVE_BYTES;
    add(p, "reserve", "CUDA contexts + cuBLASLt of 3 GPU processes", p->reserve_bytes);
    p->total_bytes = p->target_bytes + p->trainer_bytes + p->ring_bytes + p->reserve_bytes;
    p->capacity_bytes = in->capacity_bytes;
    return 0;
}

void jobplan_print(const struct jobplan *p, FILE *f) {
    for (int i = 0; i < p->n; i++)
        fprintf(f, "memory plan: %-8s %-56s %9.2f GB\n", p->line[i].stage, p->line[i].what, p->line[i].bytes / 1e9);
    fprintf(f, "memory plan: per stage: target %.2f GB, trainer %.2f GB (drafter %.2f B trainable parameters), rings "
            "%.2f GB, reserve %.2f GB\n", p->target_bytes / 1e9, p->trainer_bytes / 1e9, p->draft_params / 1e9,
            p->ring_bytes / 1e9, p->reserve_bytes / 1e9);
    fprintf(f, "memory plan: total %.2f GB of %.2f GB on one GPU (%s)\n", p->total_bytes / 1e9, p->capacity_bytes / 1e9,
            p->total_bytes <= p->capacity_bytes ? "fits" : "does NOT fit");
}

int jobplan_check(const struct jobplan *p, char *err, int err_len) {
    if (p->total_bytes <= p->capacity_bytes) return 0;
    return err_fail(err, err_len, "memory plan: the job needs %.1f GB on one GPU of %.1f GB (short by %.1f GB: target "
                    "%.1f GB, trainer %.1f GB, rings %.1f GB, reserve %.1f GB); lower --tokens (the target's working "
                    "memory, the features and the rings scale with it), --max-anchors (the drafter's activations "
                    "scale with anchors x block), use a --draft-vocab (smaller LM head and logits), or trade --tokens "
                    "for --grad-accum (same tokens per optimizer step)", p->total_bytes / 1e9, p->capacity_bytes / 1e9,
                    (p->total_bytes - p->capacity_bytes) / 1e9, p->target_bytes / 1e9, p->trainer_bytes / 1e9,
                    p->ring_bytes / 1e9, p->reserve_bytes / 1e9);
}
