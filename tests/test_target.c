/*
 * tests/test_target.c — the target forward with capture (stages/model/target.h) on tiny Qwen3 and
 * Llama checkpoints written by the test itself, against an INDEPENDENT plain-C double-precision
 * forward written here (it calls no kernel and reads the weights from the test's own memory, not
 * from the files): embedding, RMSNorm, fused-free q/k/v projections, Qwen3 q/k norm, RoPE
 * (rotate-half, Llama-3 scaling recomputed here), per-document causal GQA attention, SwiGLU MLP.
 *
 * The batch packs several documents (one of length 1) with positions reset per document; the
 * captured ids are in an unsorted order. Tolerance: the CPU path is fp32 with float GEMM chunks
 * summed in double, so its error is a few fp32 ulps per op; through 4 layers of residual stream
 * of magnitude up to ~15 the measured max abs error is 5e-6..1e-5 (relative ~1e-6, printed in the
 * log); we allow 2e-5 + 2e-5·|ref| (about 20x the measured error at the largest states) and show
 * the comparison can fail: attention across document boundaries, no rotation, or RoPE without
 * the Llama-3 scaling each move states by more than 1e-3.
 */
#include "model/hfconfig.h"
#include "core/safetensors.h"
#include "model/target.h"
#include "testutil.h"

#include <math.h>

/* ---------------------------------------------------------------- the tiny model, in memory */

struct ref_layer {
    float *wq, *wk, *wv, *wo;      /* (NH·HD, C), (NKV·HD, C) x2, (C, NH·HD) */
    float *wg, *wu, *wd;           /* (I, C) x2, (C, I) */
    float *ln1, *ln2, *qn, *kn;    /* (C), (C), (HD), (HD) */
};

struct ref_model {
    int qwen3;                     /* 1: Qwen3 (q/k norm, untied), 0: Llama (llama3 rope, tied) */
    int V, C, I, L, NH, NKV, HD;
    double eps, theta;
    int llama3; double factor, low, high; int orig;
    float *embed, *lm_head, *norm; /* (V, C), (V, C) or NULL when tied, (C) */
    struct ref_layer *layers;
};

static float *rnd(uint64_t *s, size_t n, float lo, float hi) {
    float *p = malloc(n * sizeof *p);
    ck_assert_ptr_nonnull(p);
    test_rng_fill(s, p, n, lo, hi);
    return p;
}

static void model_make(struct ref_model *m, int qwen3, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->qwen3 = qwen3;
    m->V = 512; m->C = 64; m->I = 128; m->L = 4; m->NH = 4; m->NKV = 2;
    m->HD = qwen3 ? 32 : 16;       /* Qwen3: NH·HD = 128 != C, as real Qwen3 configs may have */
    m->eps = qwen3 ? 1e-6 : 1e-5;
    m->theta = qwen3 ? 1e6 : 1e4;
    m->llama3 = !qwen3; m->factor = 8; m->low = 1; m->high = 4; m->orig = 64;
    uint64_t s = seed;
    int C = m->C, I = m->I, q = m->NH * m->HD, kv = m->NKV * m->HD;
    m->embed = rnd(&s, (size_t)m->V * C, -1, 1);
    m->lm_head = qwen3 ? rnd(&s, (size_t)m->V * C, -0.1f, 0.1f) : NULL;
    m->norm = rnd(&s, (size_t)C, 0.8f, 1.2f);
    m->layers = calloc((size_t)m->L, sizeof *m->layers);
    /* Weights of std ~0.2 (U(-0.35, 0.35)): attention and MLP change the residual stream by O(1),
     * so every part of a layer shows in the captured states. */
    for (int l = 0; l < m->L; l++) {
        struct ref_layer *y = &m->layers[l];
        y->wq = rnd(&s, (size_t)q * C, -0.35f, 0.35f);
        y->wk = rnd(&s, (size_t)kv * C, -0.35f, 0.35f);
        y->wv = rnd(&s, (size_t)kv * C, -0.35f, 0.35f);
        y->wo = rnd(&s, (size_t)C * q, -0.2f, 0.2f);
        y->wg = rnd(&s, (size_t)I * C, -0.3f, 0.3f);
        y->wu = rnd(&s, (size_t)I * C, -0.3f, 0.3f);
        y->wd = rnd(&s, (size_t)C * I, -0.15f, 0.15f);
        y->ln1 = rnd(&s, (size_t)C, 0.8f, 1.2f);
        y->ln2 = rnd(&s, (size_t)C, 0.8f, 1.2f);
        y->qn = qwen3 ? rnd(&s, (size_t)m->HD, 0.8f, 1.2f) : NULL;
        y->kn = qwen3 ? rnd(&s, (size_t)m->HD, 0.8f, 1.2f) : NULL;
    }
}

static void model_free(struct ref_model *m) {
    for (int l = 0; l < m->L; l++) {
        struct ref_layer *y = &m->layers[l];
        free(y->wq); free(y->wk); free(y->wv); free(y->wo); free(y->wg); free(y->wu); free(y->wd);
        free(y->ln1); free(y->ln2); free(y->qn); free(y->kn);
    }
    free(m->layers); free(m->embed); free(m->lm_head); free(m->norm);
}

/* Round every weight to bf16 in place (the reference then uses exactly what a BF16 file holds). */
static void round_bf16(float *p, size_t n) { for (size_t i = 0; p && i < n; i++) p[i] = bf16_round(p[i]); }
static void model_round_bf16(struct ref_model *m) {
    int C = m->C, I = m->I, q = m->NH * m->HD, kv = m->NKV * m->HD;
    round_bf16(m->embed, (size_t)m->V * C);
    round_bf16(m->lm_head, (size_t)m->V * C);
    round_bf16(m->norm, (size_t)C);
    for (int l = 0; l < m->L; l++) {
        struct ref_layer *y = &m->layers[l];
        round_bf16(y->wq, (size_t)q * C); round_bf16(y->wk, (size_t)kv * C); round_bf16(y->wv, (size_t)kv * C);
        round_bf16(y->wo, (size_t)C * q); round_bf16(y->wg, (size_t)I * C); round_bf16(y->wu, (size_t)I * C);
        round_bf16(y->wd, (size_t)C * I); round_bf16(y->ln1, (size_t)C); round_bf16(y->ln2, (size_t)C);
        round_bf16(y->qn, (size_t)m->HD); round_bf16(y->kn, (size_t)m->HD);
    }
}

/* ---------------------------------------------------------------- writing the checkpoint */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* config.json in the transformers layout, written by hand (not through hfconfig). */
static void write_config(const struct ref_model *m, const char *dir, const char *dtype) {
    char path[1024], text[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (m->qwen3)
        snprintf(text, sizeof text,
                 "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": %d,\n"
                 " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,\n"
                 " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,\n"
                 " \"rms_norm_eps\": %g, \"rope_theta\": %.1f, \"rope_scaling\": null, \"tie_word_embeddings\": false,\n"
                 " \"max_position_embeddings\": 4096, \"attention_bias\": false, \"hidden_act\": \"silu\",\n"
                 " \"use_sliding_window\": false, \"torch_dtype\": \"%s\"}\n",
                 m->V, m->C, m->I, m->L, m->NH, m->NKV, m->HD, m->eps, m->theta, dtype);
    else
        snprintf(text, sizeof text,
                 "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %d,\n"
                 " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,\n"
                 " \"num_attention_heads\": %d, \"num_key_value_heads\": %d,\n"
                 " \"rms_norm_eps\": %g, \"rope_theta\": %.1f, \"tie_word_embeddings\": true,\n"
                 " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.1f, \"low_freq_factor\": %.1f,\n"
                 "   \"high_freq_factor\": %.1f, \"original_max_position_embeddings\": %d},\n"
                 " \"max_position_embeddings\": 8192, \"attention_bias\": false, \"mlp_bias\": false,\n"
                 " \"hidden_act\": \"silu\", \"torch_dtype\": \"%s\"}\n",
                 m->V, m->C, m->I, m->L, m->NH, m->NKV, m->eps, m->theta, m->factor, m->low, m->high, m->orig,
                 dtype);
    write_text(path, text);
}

struct tensor_list { int n; struct st_write_tensor t[128]; char names[128][96]; void *bufs[128]; };

static void add(struct tensor_list *tl, const char *name, const float *data, int64_t rows, int64_t cols,
                enum st_dtype dt) {
    ck_assert_int_lt(tl->n, 128);
    struct st_write_tensor *t = &tl->t[tl->n];
    snprintf(tl->names[tl->n], sizeof tl->names[0], "%s", name);
    t->name = tl->names[tl->n];
    t->dtype = dt;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    if (dt == ST_BF16) {
        bf16 *b = malloc(n * sizeof *b);
        bf16_from_floats(b, data, n);
        t->data = tl->bufs[tl->n] = b;
    } else {
        t->data = data;
        tl->bufs[tl->n] = NULL;
    }
    tl->n++;
}

/* Everything but `skip` (a tensor name left out, for the missing-tensor test); `bad_shape` names
 * a tensor written with one row too few. */
static void write_model(const struct ref_model *m, const char *dir, enum st_dtype dt, const char *skip,
                        const char *bad_shape) {
    write_config(m, dir, dt == ST_BF16 ? "bfloat16" : "float32");
    struct tensor_list *tl = calloc(1, sizeof *tl);
    char name[96];
    int C = m->C, I = m->I, q = m->NH * m->HD, kv = m->NKV * m->HD;
#define ADD(nm, p, r, c) do { if (!skip || strcmp(skip, nm)) \
        add(tl, nm, p, (bad_shape && !strcmp(bad_shape, nm)) ? (r) - 1 : (r), c, dt); } while (0)
    ADD("model.embed_tokens.weight", m->embed, m->V, C);
    if (m->lm_head) ADD("lm_head.weight", m->lm_head, m->V, C);
    ADD("model.norm.weight", m->norm, C, 0);
    for (int l = 0; l < m->L; l++) {
        const struct ref_layer *y = &m->layers[l];
#define LADD(suffix, p, r, c) do { snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix); ADD(name, p, r, c); } while (0)
        LADD("self_attn.q_proj.weight", y->wq, q, C);
        LADD("self_attn.k_proj.weight", y->wk, kv, C);
        LADD("self_attn.v_proj.weight", y->wv, kv, C);
        LADD("self_attn.o_proj.weight", y->wo, C, q);
        if (m->qwen3) {
            LADD("self_attn.q_norm.weight", y->qn, m->HD, 0);
            LADD("self_attn.k_norm.weight", y->kn, m->HD, 0);
        }
        LADD("mlp.gate_proj.weight", y->wg, I, C);
        LADD("mlp.up_proj.weight", y->wu, I, C);
        LADD("mlp.down_proj.weight", y->wd, C, I);
        LADD("input_layernorm.weight", y->ln1, C, 0);
        LADD("post_attention_layernorm.weight", y->ln2, C, 0);
#undef LADD
    }
#undef ADD
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_msg(st_write_file(path, tl->n, tl->t, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < tl->n; i++) free(tl->bufs[i]);
    free(tl);
}

/* ---------------------------------------------------------------- the independent reference */

static void ref_rmsnorm(double *y, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (double)w[i];
}

/* y[r] = Σ_c W[r, c] x[c] */
static void ref_linear(double *y, const float *W, const double *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void ref_inv_freq(const struct ref_model *m, double *inv) {
    for (int i = 0; i < m->HD / 2; i++) {
        double f = 1.0 / pow(m->theta, 2.0 * i / m->HD);
        if (m->llama3) {
            double low_wl = m->orig / m->low, high_wl = m->orig / m->high, wl = 2 * M_PI / f;
            if (wl > low_wl) f = f / m->factor;
            else if (wl >= high_wl) {
                double sm = (m->orig / wl - m->low) / (m->high - m->low);
                f = (1 - sm) * f / m->factor + sm * f;
            }
        }
        inv[i] = f;
    }
}

static void ref_rope(double *x, int pos, const double *inv, int HD) {
    int h = HD / 2;
    for (int i = 0; i < h; i++) {
        double a = pos * inv[i], c = cos(a), s = sin(a), x0 = x[i], x1 = x[i + h];
        x[i] = x0 * c - x1 * s;
        x[i + h] = x1 * c + x0 * s;
    }
}

/* out [L][T][C]: the output of every decoder layer. pos: the positions the reference uses. */
static void ref_forward(const struct ref_model *m, const int32_t *ids, const int32_t *pos, const int32_t *cu,
                        int nd, int T, double *out) {
    int C = m->C, I = m->I, NH = m->NH, NKV = m->NKV, HD = m->HD, G = NH / NKV;
    int q = NH * HD, kv = NKV * HD;
    double *x = calloc((size_t)T * C, sizeof *x), *hn = malloc((size_t)C * sizeof *hn);
    double *Q = malloc((size_t)T * q * sizeof *Q), *K = malloc((size_t)T * kv * sizeof *K);
    double *Vv = malloc((size_t)T * kv * sizeof *Vv), *A = malloc((size_t)T * q * sizeof *A);
    double *g = malloc((size_t)I * sizeof *g), *u = malloc((size_t)I * sizeof *u), *tmp = malloc((size_t)(C + I + q) * sizeof *tmp);
    double *p = malloc((size_t)T * sizeof *p), inv[256];
    ref_inv_freq(m, inv);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) x[(size_t)t * C + c] = m->embed[(size_t)ids[t] * C + c];
    for (int l = 0; l < m->L; l++) {
        const struct ref_layer *y = &m->layers[l];
        for (int t = 0; t < T; t++) {
            ref_rmsnorm(hn, x + (size_t)t * C, y->ln1, C, m->eps);
            ref_linear(Q + (size_t)t * q, y->wq, hn, q, C);
            ref_linear(K + (size_t)t * kv, y->wk, hn, kv, C);
            ref_linear(Vv + (size_t)t * kv, y->wv, hn, kv, C);
            for (int h = 0; h < NH; h++) {
                double *qh = Q + (size_t)t * q + h * HD;
                if (m->qwen3) ref_rmsnorm(qh, qh, y->qn, HD, m->eps);
                ref_rope(qh, pos[t], inv, HD);
            }
            for (int h = 0; h < NKV; h++) {
                double *kh = K + (size_t)t * kv + h * HD;
                if (m->qwen3) ref_rmsnorm(kh, kh, y->kn, HD, m->eps);
                ref_rope(kh, pos[t], inv, HD);
            }
        }
        /* causal attention inside each document */
        for (int d = 0; d < nd; d++)
            for (int t = cu[d]; t < cu[d + 1]; t++)
                for (int h = 0; h < NH; h++) {
                    const double *qh = Q + (size_t)t * q + h * HD;
                    double mx = -INFINITY, z = 0;
                    for (int j = cu[d]; j <= t; j++) {
                        const double *kh = K + (size_t)j * kv + (h / G) * HD;
                        double s = 0;
                        for (int e = 0; e < HD; e++) s += qh[e] * kh[e];
                        p[j] = s / sqrt((double)HD);
                        if (p[j] > mx) mx = p[j];
                    }
                    for (int j = cu[d]; j <= t; j++) { p[j] = exp(p[j] - mx); z += p[j]; }
                    double *ah = A + (size_t)t * q + h * HD;
                    for (int e = 0; e < HD; e++) {
                        double s = 0;
                        for (int j = cu[d]; j <= t; j++) s += p[j] * Vv[(size_t)j * kv + (h / G) * HD + e];
                        ah[e] = s / z;
                    }
                }
        for (int t = 0; t < T; t++) {
            double *xt = x + (size_t)t * C;
            ref_linear(tmp, y->wo, A + (size_t)t * q, C, q);
            for (int c = 0; c < C; c++) xt[c] += tmp[c];
            ref_rmsnorm(hn, xt, y->ln2, C, m->eps);
            ref_linear(g, y->wg, hn, I, C);
            ref_linear(u, y->wu, hn, I, C);
            for (int i = 0; i < I; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            ref_linear(tmp, y->wd, g, C, I);
            for (int c = 0; c < C; c++) xt[c] += tmp[c];
        }
        memcpy(out + (size_t)l * T * C, x, (size_t)T * C * sizeof *x);
    }
    free(x); free(hn); free(Q); free(K); free(Vv); free(A); free(g); free(u); free(tmp); free(p);
}

/* ---------------------------------------------------------------- the batch */

#define ND 5
static const int doc_len[ND] = {9, 1, 23, 12, 6};   /* T = 51, one length-1 document */

struct batch { int T; int32_t ids[64], pos[64], cu[ND + 1]; };

static void make_batch(struct batch *b, int V, uint64_t seed) {
    uint64_t s = seed;
    b->T = 0;
    b->cu[0] = 0;
    for (int d = 0; d < ND; d++) {
        for (int i = 0; i < doc_len[d]; i++) {
            b->ids[b->T] = (int32_t)(test_rng_next(&s) % (uint64_t)V);
            b->pos[b->T] = i;
            b->T++;
        }
        b->cu[d + 1] = b->T;
    }
}

static struct target_batch as_target_batch(const struct batch *b, uint64_t seq) {
    struct target_batch tb = {seq, b->T, ND, b->ids, b->pos, b->cu};
    return tb;
}

/* Compare captured states and `last` to the reference; returns the max abs error seen. */
static double compare(const float *states, const float *last, const int *capture, int k, const double *ref,
                      int L, int T, int C, double atol, double rtol, int *ok, int quiet) {
    size_t plane = (size_t)T * C;
    float *r = malloc(plane * sizeof *r);
    double max_err = 0;
    *ok = 1;
    for (int j = 0; j <= k; j++) {
        int layer = j < k ? capture[j] : L - 1;
        const float *got = j < k ? states + (size_t)j * plane : last;
        for (size_t i = 0; i < plane; i++) {
            r[i] = (float)ref[(size_t)layer * plane + i];
            double e = fabs((double)got[i] - ref[(size_t)layer * plane + i]);
            if (e > max_err) max_err = e;
            if (quiet && !(e <= atol + rtol * fabs((double)r[i]))) *ok = 0;
        }
        char what[64];
        snprintf(what, sizeof what, j < k ? "state[%d] (layer %d)" : "last%.0d (layer %d)", j, layer);
        if (!quiet && !test_allclose(what, got, r, plane, atol, rtol)) *ok = 0;
    }
    free(r);
    return max_err;
}

#define ATOL 2e-5
#define RTOL 2e-5

static void run_model_case(int qwen3, enum st_dtype dt) {
    struct ref_model m;
    model_make(&m, qwen3, qwen3 ? 11 : 23);
    if (dt == ST_BF16) model_round_bf16(&m);
    const char *dir = test_tmpdir(qwen3 ? "target-qwen3" : "target-llama");
    write_model(&m, dir, dt, NULL, NULL);

    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 64;
    int capture[4] = {2, 0, 3, 1};     /* unsorted on purpose: storage follows the list order */
    opt.n_capture = 4;
    memcpy(opt.capture, capture, sizeof capture);
    char err[512] = "";
    struct target *t = target_load(dir, &opt, err, sizeof err);
    ck_assert_msg(t != NULL, "target_load: %s", err);
    ck_assert_int_eq(target_n_capture(t), 4);
    ck_assert_int_eq(target_config(t)->tie_word_embeddings, qwen3 ? 0 : 1);

    struct batch b;
    make_batch(&b, m.V, 99);
    struct target_batch tb = as_target_batch(&b, 7);
    size_t plane = (size_t)b.T * m.C;
    float *states = malloc(4 * plane * sizeof(float)), *last = malloc(plane * sizeof(float));
    for (size_t i = 0; i < 4 * plane; i++) states[i] = NAN;   /* poison */
    for (size_t i = 0; i < plane; i++) last[i] = NAN;
    ck_assert_msg(target_forward(t, &tb, states, last, err, sizeof err) == 0, "forward: %s", err);

    double *ref = malloc((size_t)m.L * plane * sizeof *ref);
    ref_forward(&m, b.ids, b.pos, b.cu, ND, b.T, ref);
    double maxabs = 0;
    for (size_t i = 0; i < (size_t)m.L * plane; i++) if (fabs(ref[i]) > maxabs) maxabs = fabs(ref[i]);
    int ok;
    double e = compare(states, last, capture, 4, ref, m.L, b.T, m.C, ATOL, RTOL, &ok, 0);
    fprintf(stderr, "%s %s: max |state| %.3f, max abs error vs double reference %.3g\n", qwen3 ? "qwen3" : "llama",
            dt == ST_BF16 ? "bf16 file" : "f32 file", maxabs, e);
    ck_assert_msg(ok, "captured states differ from the double-precision reference");

    /* The comparison can fail. (Continuous positions would NOT: RoPE only sees position
     * differences inside a document, so a constant offset per document changes nothing but
     * rounding.) Attention across document boundaries (one causal run over the whole batch) and
     * no rotation (every position 0) each move the states far outside the tolerance. */
    int32_t cu_one[2] = {0, b.T}, zero_pos[64] = {0};
    ref_forward(&m, b.ids, b.pos, cu_one, 1, b.T, ref);
    int ok2;
    double e2 = compare(states, last, capture, 4, ref, m.L, b.T, m.C, ATOL, RTOL, &ok2, 1);
    ck_assert_msg(!ok2 && e2 > 1e-2, "cross-document attention should differ (max err %g)", e2);
    ref_forward(&m, b.ids, zero_pos, b.cu, ND, b.T, ref);
    e2 = compare(states, last, capture, 4, ref, m.L, b.T, m.C, ATOL, RTOL, &ok2, 1);
    ck_assert_msg(!ok2 && e2 > 1e-2, "positions all 0 should differ (max err %g)", e2);

    /* The same batch twice gives identical results (nothing left over in the working memory). */
    float *states2 = malloc(4 * plane * sizeof(float));
    ck_assert_msg(target_forward(t, &tb, states2, NULL, err, sizeof err) == 0, "forward: %s", err);
    ck_assert_int_eq(memcmp(states, states2, 4 * plane * sizeof(float)), 0);

    /* Documents are independent: the third document alone gives its rows of the packed run. */
    struct target_batch one = {8, doc_len[2], 1, b.ids + b.cu[2], b.pos + b.cu[2], NULL};
    int32_t cu1[2] = {0, doc_len[2]};
    one.cu_seqlens = cu1;
    ck_assert_msg(target_forward(t, &one, states2, NULL, err, sizeof err) == 0, "forward: %s", err);
    for (int j = 0; j < 4; j++) {
        const float *packed = states + (size_t)j * plane + (size_t)b.cu[2] * m.C;
        ck_assert(test_allclose("doc alone", states2 + (size_t)j * doc_len[2] * m.C, packed,
                                (size_t)doc_len[2] * m.C, 1e-5, 1e-5));
    }
    free(states); free(states2); free(last); free(ref);
    target_free(t);
    model_free(&m);
}

START_TEST(qwen3_matches_double_reference) { run_model_case(1, ST_F32); }
END_TEST

START_TEST(llama_llama3_rope_tied_matches_double_reference) { run_model_case(0, ST_F32); }
END_TEST

START_TEST(bf16_checkpoint_matches_reference) { run_model_case(1, ST_BF16); run_model_case(0, ST_BF16); }
END_TEST

/* The llama3 scaling matters for this batch: the reference without it is far off. */
START_TEST(llama3_scaling_is_applied) {
    struct ref_model m;
    model_make(&m, 0, 23);
    const char *dir = test_tmpdir("target-l3");
    write_model(&m, dir, ST_F32, NULL, NULL);
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 64;
    opt.n_capture = 1;
    opt.capture[0] = 3;
    char err[512];
    struct target *t = target_load(dir, &opt, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    struct batch b;
    make_batch(&b, m.V, 5);
    struct target_batch tb = as_target_batch(&b, 1);
    size_t plane = (size_t)b.T * m.C;
    float *states = malloc(plane * sizeof(float));
    ck_assert_msg(target_forward(t, &tb, states, NULL, err, sizeof err) == 0, "%s", err);
    double *ref = malloc((size_t)m.L * plane * sizeof *ref);
    m.llama3 = 0;
    ref_forward(&m, b.ids, b.pos, b.cu, ND, b.T, ref);
    int ok;
    double e = compare(states, states, opt.capture, 1, ref, m.L, b.T, m.C, ATOL, RTOL, &ok, 1);
    ck_assert_msg(!ok && e > 1e-3, "unscaled rope should differ (max err %g)", e);
    free(states); free(ref);
    target_free(t);
    model_free(&m);
}
END_TEST

/* ---------------------------------------------------------------- bad input */

static struct target *load_tiny(const char *tag, int qwen3, const char *skip, const char *bad_shape,
                                char *err, int err_len) {
    struct ref_model m;
    model_make(&m, qwen3, 3);
    const char *dir = test_tmpdir(tag);
    write_model(&m, dir, ST_F32, skip, bad_shape);
    model_free(&m);
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 32;
    opt.n_capture = 2;
    opt.capture[0] = 1;
    opt.capture[1] = 2;
    return target_load(dir, &opt, err, err_len);
}

START_TEST(bad_token_id_names_seq_and_position) {
    char err[512];
    struct target *t = load_tiny("target-badid", 1, NULL, NULL, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    int32_t ids[6] = {1, 2, 3, 512, 5, 6}, pos[6] = {0, 1, 2, 0, 1, 2}, cu[3] = {0, 3, 6};
    struct target_batch b = {42, 6, 2, ids, pos, cu};
    float out[2 * 6 * 64];
    ck_assert_int_eq(target_forward(t, &b, out, NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "batch seq 42: input_ids[3] = 512 is outside the vocabulary [0, 512)");
    ids[3] = -1;
    ck_assert_int_eq(target_check_batch(t, &b, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "input_ids[3] = -1") != NULL, "%s", err);
    ids[3] = 4;
    ck_assert_int_eq(target_check_batch(t, &b, err, sizeof err), 0);
    cu[2] = 5;   /* a padding row */
    ck_assert_int_eq(target_check_batch(t, &b, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "batch seq 42") && strstr(err, "no padding"), "%s", err);
    cu[2] = 6;
    b.n_tokens = 33;   /* beyond the planned 32 */
    ck_assert_int_eq(target_check_batch(t, &b, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "planned for 1..32") != NULL, "%s", err);
    target_free(t);
}
END_TEST

START_TEST(missing_or_misshapen_tensor_named) {
    char err[512];
    struct target *t = load_tiny("target-miss", 1, "model.layers.2.mlp.up_proj.weight", NULL, err, sizeof err);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err, "model.layers.2.mlp.up_proj.weight") != NULL, "%s", err);
    t = load_tiny("target-shape", 0, NULL, "model.layers.1.self_attn.k_proj.weight", err, sizeof err);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err, "model.layers.1.self_attn.k_proj.weight") && strstr(err, "shape"), "%s", err);
    t = load_tiny("target-qn", 1, "model.layers.0.self_attn.q_norm.weight", NULL, err, sizeof err);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err, "q_norm") != NULL, "%s", err);
    t = load_tiny("target-lmh", 1, "lm_head.weight", NULL, err, sizeof err);   /* untied Qwen3 needs it */
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err, "lm_head.weight") != NULL, "%s", err);
}
END_TEST

START_TEST(capture_ids_validated_and_default) {
    struct ref_model m;
    model_make(&m, 1, 3);
    const char *dir = test_tmpdir("target-cap");
    write_model(&m, dir, ST_F32, NULL, NULL);
    model_free(&m);
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 16;
    opt.n_capture = 1;
    opt.capture[0] = 4;   /* 4 layers: ids 0..3 */
    char err[512];
    ck_assert_ptr_null(target_load(dir, &opt, err, sizeof err));
    ck_assert_msg(strstr(err, "captured layer id 4 is outside [0, 4)") != NULL, "%s", err);
    /* default: the z-lab formula for 5 draft layers (degenerate on 4 layers: all 1) */
    opt.n_capture = 0;
    struct target *t = target_load(dir, &opt, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    int want[5];
    ck_assert_int_eq(hf_zlab_layer_ids(4, 5, want), 0);
    ck_assert_int_eq(target_n_capture(t), 5);
    for (int i = 0; i < 5; i++) ck_assert_int_eq(target_capture(t)[i], want[i]);
    ck_assert_int_eq((int)target_elem_bytes(t), 4);
    target_free(t);
    /* on the Qwen3-8B shape the default is [1, 9, 17, 25, 33] */
    ck_assert_int_eq(hf_zlab_layer_ids(36, 5, want), 0);
    ck_assert_int_eq(want[0], 1); ck_assert_int_eq(want[1], 9); ck_assert_int_eq(want[4], 33);
}
END_TEST

START_TEST(random_init_and_flops) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.arch = HF_ARCH_QWEN3;
    snprintf(c.architecture, sizeof c.architecture, "Qwen3ForCausalLM");
    c.vocab_size = 100; c.hidden_size = 32; c.intermediate_size = 48; c.num_hidden_layers = 2;
    c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 8; c.qk_norm = 1;
    c.rms_norm_eps = 1e-6; c.rope_theta = 1e6; c.dtype = ST_BF16;
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 8;
    opt.n_capture = 1;
    opt.capture[0] = 1;
    char err[512];
    struct target *t = target_init_random(&c, &opt, 5, 0.02f, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    int32_t ids[5] = {1, 2, 3, 4, 99}, pos[5] = {0, 1, 2, 0, 1}, cu[3] = {0, 3, 5};
    struct target_batch b = {0, 5, 2, ids, pos, cu};
    float st[5 * 32];
    ck_assert_msg(target_forward(t, &b, st, NULL, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 5 * 32; i++) ck_assert(isfinite(st[i]));
    /* per layer: 2·T·(C·QKV + NH·HD·C + 3·I·C) + 4·HD·NH·(6 + 3) visible pairs (3·4/2 + 2·3/2) */
    double per_layer = 2.0 * 5 * (32 * 64 + 32 * 32 + 3 * 48 * 32) + 4.0 * 8 * 4 * (6 + 3);
    ck_assert_double_eq_tol(target_flops(t, cu, 2), 2 * per_layer, 1e-6);
    target_free(t);
}
END_TEST

int main(void) {
    Suite *s = suite_create("target");
    TCase *tc = tcase_create("forward");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, qwen3_matches_double_reference);
    tcase_add_test(tc, llama_llama3_rope_tied_matches_double_reference);
    tcase_add_test(tc, bf16_checkpoint_matches_reference);
    tcase_add_test(tc, llama3_scaling_is_applied);
    suite_add_tcase(s, tc);
    TCase *bad = tcase_create("bad_input");
    tcase_set_timeout(bad, 30);
    tcase_add_test(bad, bad_token_id_names_seq_and_position);
    tcase_add_test(bad, missing_or_misshapen_tensor_named);
    tcase_add_test(bad, capture_ids_validated_and_default);
    tcase_add_test(bad, random_init_and_flops);
    suite_add_tcase(s, bad);
    return test_run_suite(s);
}
