/*
 * stages/dflash-mkmodel.c — write a random-weight target model in exactly the Hugging Face layout
 * (config.json + model.safetensors, or model-0000k-of-0000N.safetensors shards with
 * model.safetensors.index.json) and/or a synthetic JSONL dataset. The embedded default of
 * `make run`, the fixture of the tests, and the Qwen3-8B-shaped model of the benchmarks.
 *
 * Weights: matrices N(0, std^2) (the embedding N(0, embed_std^2) and the LM head N(0, lm_head_std^2)
 * when those flags are given: a learnable tiny target has a large embedding, ~1, small layer
 * matrices, ~0.06, and an LM head near 0.45), norm weights 1 + U(-norm_noise, norm_noise) (Qwen3.5's
 * zero-centred (1 + w) norms: U(-norm_noise, norm_noise); its Gated DeltaNet conv N(0, std^2),
 * A_log = log U(0.1, 1), dt_bias and the gated norm 1 + U(-norm_noise, norm_noise)), from a generator
 * seeded per (seed, tensor, 1M-element chunk), so the bytes depend only on the flags, never on the
 * thread count. Tensors are generated in batches by all cores and streamed to disk (st_writer), so
 * an 8B model (16 GB in bf16) needs ~100 MB of memory. Each file is written to a temporary name and
 * renamed when complete; stale model files in the output directory are removed first and
 * config.json is written last, so a directory with a config.json holds a complete model.
 *
 * Dataset: one {"input_ids": [...], "loss_mask": [...]} per line (dflash-reference.md §1.1),
 * lengths log-normal (median, sigma) clamped to [min, max], the first ~prompt_frac of each sample
 * a prompt with loss 0 and the rest the answer with loss 1, ids uniform in [0, vocab).
 */
#include <dirent.h>
#include <jansson.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/stage.h"
#include "kernels/common.h"
#include "model/hfconfig.h"
#include "core/safetensors.h"
#include "model/weights.h"

#define CHUNK_ELEMS (1 << 20)          /* one generator stream per chunk */
#define BATCH_CHUNKS 32                /* chunks generated per write (32M elements) */

/* ---------------------------------------------------------------- presets */

struct preset {
    const char *name;
    enum hf_arch arch;                 /* 0: from --arch */
    int vocab, hidden, inter, layers, heads, kv, head_dim, max_pos, tied;
    /* Qwen3.5 only: rotary dims, Gated DeltaNet k/v heads and dims, conv kernel, full-attention period */
    int rotary, lin_nk, lin_nv, lin_dk, lin_dv, conv_k, full_every;
};

static const struct preset presets[] = {
    {"tiny", 0, 512, 64, 128, 4, 4, 2, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-0.6b", HF_ARCH_QWEN3, 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-8b", HF_ARCH_QWEN3, 151936, 4096, 12288, 36, 32, 8, 128, 40960, 0, 0, 0, 0, 0, 0, 0, 0},
    {"llama3.2-1b", HF_ARCH_LLAMA, 128256, 2048, 8192, 16, 32, 8, 64, 131072, 1, 0, 0, 0, 0, 0, 0, 0},
    {"llama3.1-8b", HF_ARCH_LLAMA, 128256, 4096, 14336, 32, 32, 8, 128, 131072, 0, 0, 0, 0, 0, 0, 0, 0},
    /* a tiny hybrid: [linear, full, linear, full], GQA in both mixers, partial rotary */
    {"qwen3.5-tiny", HF_ARCH_QWEN3_5, 512, 64, 96, 4, 4, 2, 16, 4096, 0, 8, 2, 4, 8, 12, 4, 2},
    /* Qwen/Qwen3.6-27B's text model (model card): 64 layers as 16 x (3 DeltaNet + 1 gated attention) */
    {"qwen3.6-27b", HF_ARCH_QWEN3_5, 248320, 5120, 17408, 64, 24, 4, 256, 262144, 0, 64, 16, 48, 128, 128, 4, 4},
};

/* ---------------------------------------------------------------- tensors */

enum init_kind { INIT_NORMAL, INIT_ONES, INIT_ZEROS, INIT_ALOG };   /* ZEROS: 0 + U(-noise, noise) */

struct tdesc {
    char name[96];
    int ndim;
    int64_t shape[3];
    int64_t numel;
    enum init_kind kind;
    double std;          /* INIT_NORMAL: > 0 overrides --std (embedding, LM head) */
    int shard;
};

/* The checkpoint's tensors in Hugging Face module order (what save_pretrained writes). */
static int list_tensors_qwen35(const struct model_config *c, double embed_std, double head_std, struct tdesc **out);

static int list_tensors(const struct model_config *c, double embed_std, double head_std, struct tdesc **out) {
    if (c->arch == HF_ARCH_QWEN3_5) return list_tensors_qwen35(c, embed_std, head_std, out);
    int per_layer = c->qk_norm ? 11 : 9;
    int n = 0, cap = 3 + c->num_hidden_layers * per_layer;
    struct tdesc *t = calloc((size_t)cap, sizeof *t);
    ALLOC_CHECK(t);
    int64_t C = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, d = c->head_dim;
    int64_t q = (int64_t)c->num_attention_heads * d, kv = (int64_t)c->num_key_value_heads * d;
#define ADD2(nm, a, b, k) do { snprintf(t[n].name, sizeof t[n].name, "%s", nm); t[n].ndim = 2; \
        t[n].shape[0] = (a); t[n].shape[1] = (b); t[n].kind = (k); n++; } while (0)
#define ADD1(nm, a) do { snprintf(t[n].name, sizeof t[n].name, "%s", nm); t[n].ndim = 1; \
        t[n].shape[0] = (a); t[n].kind = INIT_ONES; n++; } while (0)
    char nm[96];
    ADD2("model.embed_tokens.weight", V, C, INIT_NORMAL);
    for (int l = 0; l < c->num_hidden_layers; l++) {
#define LNAME(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        ADD2(LNAME("self_attn.q_proj.weight"), q, C, INIT_NORMAL);
        ADD2(LNAME("self_attn.k_proj.weight"), kv, C, INIT_NORMAL);
        ADD2(LNAME("self_attn.v_proj.weight"), kv, C, INIT_NORMAL);
        ADD2(LNAME("self_attn.o_proj.weight"), C, q, INIT_NORMAL);
        if (c->qk_norm) {
            ADD1(LNAME("self_attn.q_norm.weight"), d);
            ADD1(LNAME("self_attn.k_norm.weight"), d);
        }
        ADD2(LNAME("mlp.gate_proj.weight"), I, C, INIT_NORMAL);
        ADD2(LNAME("mlp.up_proj.weight"), I, C, INIT_NORMAL);
        ADD2(LNAME("mlp.down_proj.weight"), C, I, INIT_NORMAL);
        ADD1(LNAME("input_layernorm.weight"), C);
        ADD1(LNAME("post_attention_layernorm.weight"), C);
#undef LNAME
    }
    ADD1("model.norm.weight", C);
    if (!c->tie_word_embeddings) ADD2("lm_head.weight", V, C, INIT_NORMAL);
#undef ADD1
#undef ADD2
    for (int i = 0; i < n; i++) t[i].numel = t[i].ndim == 1 ? t[i].shape[0] : t[i].shape[0] * t[i].shape[1];
    t[0].std = embed_std;
    if (!c->tie_word_embeddings) t[n - 1].std = head_std;
    *out = t;
    return n;
}

/* Qwen3.5 text model (Qwen3_5ForCausalLM names), in module order. */
static int list_tensors_qwen35(const struct model_config *c, double embed_std, double head_std, struct tdesc **out) {
    int n = 0, cap = 3 + c->num_hidden_layers * 16;
    struct tdesc *t = calloc((size_t)cap, sizeof *t);
    ALLOC_CHECK(t);
    int64_t C = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, d = c->head_dim;
    int64_t q = (int64_t)c->num_attention_heads * d, kv = (int64_t)c->num_key_value_heads * d;
    int64_t nv = c->linear_num_value_heads, vd = nv * c->linear_value_head_dim, conv = hf_config_linear_conv_dim(c);
#define ADD(nm, k, nd, a, b, cc) do { snprintf(t[n].name, sizeof t[n].name, "%s", nm); t[n].ndim = (nd); \
        t[n].shape[0] = (a); t[n].shape[1] = (b); t[n].shape[2] = (cc); t[n].kind = (k); n++; } while (0)
    char nm[96];
    ADD("model.embed_tokens.weight", INIT_NORMAL, 2, V, C, 0);
    t[0].std = embed_std;
    for (int l = 0; l < c->num_hidden_layers; l++) {
#define LNAME(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        if (c->layer_linear[l]) {
            ADD(LNAME("linear_attn.dt_bias"), INIT_ONES, 1, nv, 0, 0);
            ADD(LNAME("linear_attn.A_log"), INIT_ALOG, 1, nv, 0, 0);
            ADD(LNAME("linear_attn.conv1d.weight"), INIT_NORMAL, 3, conv, 1, c->linear_conv_kernel_dim);
            ADD(LNAME("linear_attn.norm.weight"), INIT_ONES, 1, c->linear_value_head_dim, 0, 0);
            ADD(LNAME("linear_attn.out_proj.weight"), INIT_NORMAL, 2, C, vd, 0);
            ADD(LNAME("linear_attn.in_proj_qkv.weight"), INIT_NORMAL, 2, conv, C, 0);
            ADD(LNAME("linear_attn.in_proj_z.weight"), INIT_NORMAL, 2, vd, C, 0);
            ADD(LNAME("linear_attn.in_proj_b.weight"), INIT_NORMAL, 2, nv, C, 0);
            ADD(LNAME("linear_attn.in_proj_a.weight"), INIT_NORMAL, 2, nv, C, 0);
        } else {
            ADD(LNAME("self_attn.q_proj.weight"), INIT_NORMAL, 2, 2 * q, C, 0);   /* [query; gate] per head */
            ADD(LNAME("self_attn.k_proj.weight"), INIT_NORMAL, 2, kv, C, 0);
            ADD(LNAME("self_attn.v_proj.weight"), INIT_NORMAL, 2, kv, C, 0);
            ADD(LNAME("self_attn.o_proj.weight"), INIT_NORMAL, 2, C, q, 0);
            ADD(LNAME("self_attn.q_norm.weight"), INIT_ZEROS, 1, d, 0, 0);
            ADD(LNAME("self_attn.k_norm.weight"), INIT_ZEROS, 1, d, 0, 0);
        }
        ADD(LNAME("mlp.gate_proj.weight"), INIT_NORMAL, 2, I, C, 0);
        ADD(LNAME("mlp.up_proj.weight"), INIT_NORMAL, 2, I, C, 0);
        ADD(LNAME("mlp.down_proj.weight"), INIT_NORMAL, 2, C, I, 0);
        ADD(LNAME("input_layernorm.weight"), INIT_ZEROS, 1, C, 0, 0);
        ADD(LNAME("post_attention_layernorm.weight"), INIT_ZEROS, 1, C, 0, 0);
#undef LNAME
    }
    ADD("model.norm.weight", INIT_ZEROS, 1, C, 0, 0);
    if (!c->tie_word_embeddings) {
        ADD("lm_head.weight", INIT_NORMAL, 2, V, C, 0);
        t[n - 1].std = head_std;
    }
#undef ADD
    for (int i = 0; i < n; i++) {
        t[i].numel = 1;
        for (int k = 0; k < t[i].ndim; k++) t[i].numel *= t[i].shape[k];
    }
    *out = t;
    return n;
}

/* ---------------------------------------------------------------- generator */

struct gen_job {
    const struct tdesc *t;
    int tensor_index;
    uint64_t seed;
    double std, norm_noise;
    enum st_dtype dtype;
    int64_t first_chunk, n_chunks;     /* this batch's chunks */
    unsigned char *buf;                /* batch output, element (chunk - first_chunk) * CHUNK_ELEMS + k */
    int n_threads;
    int tid;
};

static void store(unsigned char *buf, int64_t i, enum st_dtype dt, float v) {
    if (dt == ST_F32) memcpy(buf + 4 * i, &v, 4);
    else {
        uint16_t h = dt == ST_BF16 ? float_to_bf16(v) : weights_float_to_f16(v);
        memcpy(buf + 2 * i, &h, 2);
    }
}

static void *gen_worker(void *arg) {
    const struct gen_job *j = arg;
    for (int64_t c = j->first_chunk + j->tid; c < j->first_chunk + j->n_chunks; c += j->n_threads) {
        uint64_t s = kernels_mix64(j->seed + KERNELS_RNG_GAMMA * (1 + kernels_mix64(((uint64_t)j->tensor_index << 40) ^ (uint64_t)c)));
        int64_t lo = c * CHUNK_ELEMS, hi = lo + CHUNK_ELEMS < j->t->numel ? lo + CHUNK_ELEMS : j->t->numel;
        int64_t base = (c - j->first_chunk) * CHUNK_ELEMS;
        if (j->t->kind == INIT_ONES || j->t->kind == INIT_ZEROS) {
            double mean = j->t->kind == INIT_ONES ? 1.0 : 0.0;
            for (int64_t i = lo; i < hi; i++) {
                double u = (double)(kernels_rng_next(&s) >> 11) * 0x1p-53;   /* [0, 1) */
                store(j->buf, base + i - lo, j->dtype, (float)(mean + j->norm_noise * (2.0 * u - 1.0)));
            }
        } else if (j->t->kind == INIT_ALOG) {   /* A = U(0.1, 1): decays exp(-A · softplus(.)) that keep some memory */
            for (int64_t i = lo; i < hi; i++) {
                double u = (double)(kernels_rng_next(&s) >> 11) * 0x1p-53;
                store(j->buf, base + i - lo, j->dtype, (float)log(0.1 + 0.9 * u));
            }
        } else {
            float sd = (float)(j->t->std > 0 ? j->t->std : j->std);
            for (int64_t i = lo; i < hi; i += 2) {   /* Box-Muller: two normals from one 64-bit draw */
                uint64_t r64 = kernels_rng_next(&s);
                float u1 = (float)((r64 >> 40) + 1) * 0x1p-24f;           /* (0, 1] */
                float u2 = (float)((r64 >> 8) & 0xffffffu) * 0x1p-24f;    /* [0, 1) */
                float r = sqrtf(-2.0f * logf(u1)) * sd, sn, cs;
                sincosf(6.2831853071795865f * u2, &sn, &cs);
                store(j->buf, base + i - lo, j->dtype, r * cs);
                if (i + 1 < hi) store(j->buf, base + i + 1 - lo, j->dtype, r * sn);
            }
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- model writer */

struct gen_opts {
    uint64_t seed;
    double std, norm_noise;
    double embed_std, lm_head_std;     /* 0: std */
    enum st_dtype dtype;
    int n_threads;
};

struct progress { uint64_t done, total; double t0, last; };

/* A progress line every 2 s (and a final one), so an 8B write visibly moves. */
static void progress_tick(struct progress *p, int final) {
    double now = time_mono_s();
    if (!final && now - p->last < 2.0) return;
    p->last = now;
    double mb = 1e-6 * (double)p->done, el = now - p->t0;
    log_info("%s %.1f / %.1f MB (%.0f%%, %.0f MB/s)", final ? "wrote" : "writing", mb, 1e-6 * (double)p->total,
             p->total ? 100.0 * (double)p->done / (double)p->total : 100.0, el > 0 ? mb / el : 0.0);
}

/* Stream tensors t[i] with t[i].shard == shard into `path`. */
static void write_shard(const char *path, struct tdesc *t, int n, int shard, const struct gen_opts *g,
                        unsigned char *buf, struct progress *prog) {
    char err[1024];
    struct st_writer *w = st_writer_create(path, err, sizeof err);
    if (!w) DIE("%s", err);
    int *idx = malloc((size_t)n * sizeof *idx);
    ALLOC_CHECK(idx);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].shard != shard) continue;
        LIB_CHECK(st_writer_add(w, t[i].name, g->dtype, t[i].ndim, t[i].shape, err, sizeof err), err);
        idx[m++] = i;
    }
    LIB_CHECK(st_writer_begin(w, err, sizeof err), err);
    size_t esz = st_dtype_size(g->dtype);
    pthread_t th[256];
    struct gen_job jobs[256];
    for (int k = 0; k < m; k++) {
        int di = st_writer_order(w, k, NULL, NULL);   /* one dtype: layout order = declaration order */
        const struct tdesc *td = &t[idx[di]];
        int64_t n_chunks = (td->numel + CHUNK_ELEMS - 1) / CHUNK_ELEMS;
        for (int64_t c0 = 0; c0 < n_chunks; c0 += BATCH_CHUNKS) {
            if (stage_stopping()) {
                st_writer_free(w);   /* removes the temporary */
                DIE("stopped by signal %d; %s not written", stage_stop_signal(), path);
            }
            int64_t nc = n_chunks - c0 < BATCH_CHUNKS ? n_chunks - c0 : BATCH_CHUNKS;
            int nt = g->n_threads < nc ? g->n_threads : (int)nc;
            for (int i = 0; i < nt; i++) {
                jobs[i] = (struct gen_job){td, idx[di], g->seed, g->std, g->norm_noise, g->dtype, c0, nc, buf, nt, i};
                if (nt == 1) gen_worker(&jobs[i]);
                else if (pthread_create(&th[i], NULL, gen_worker, &jobs[i]) != 0) DIE("pthread_create failed");
            }
            if (nt > 1)
                for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
            int64_t elems = (c0 + nc) * CHUNK_ELEMS < td->numel ? nc * CHUNK_ELEMS : td->numel - c0 * CHUNK_ELEMS;
            LIB_CHECK(st_writer_write(w, buf, (size_t)elems * esz, err, sizeof err), err);
            prog->done += (uint64_t)elems * esz;
            progress_tick(prog, 0);
        }
    }
    LIB_CHECK(st_writer_finish(w, err, sizeof err), err);
    st_writer_free(w);
    free(idx);
}

/* Remove what an earlier run may have left: config.json, the index, model.safetensors, shards. */
static void remove_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) DIE("cannot open %s: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int a, b, len = (int)strlen(e->d_name);
        char tail[32];
        int shard = len == 32 && sscanf(e->d_name, "model-%5d-of-%5d.%31s", &a, &b, tail) == 3 &&
                    strcmp(tail, "safetensors") == 0;
        if (shard || strcmp(e->d_name, "config.json") == 0 || strcmp(e->d_name, "model.safetensors") == 0 ||
            strcmp(e->d_name, "model.safetensors.index.json") == 0) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (unlink(p) != 0) DIE("cannot remove stale %s: %s", p, strerror(errno));
            log_info("removed stale %s", p);
        }
    }
    closedir(d);
}

static void write_model(const char *dir, const struct model_config *c, int n_shards, const struct gen_opts *g) {
    char err[1024], path[4096];
    LIB_CHECK(fs_mkdir_p(dir, err, sizeof err), err);
    remove_stale(dir);
    struct tdesc *t;
    int n = list_tensors(c, g->embed_std, g->lm_head_std, &t);
    if (n_shards > n) DIE("--shards %d exceeds the %d tensors of this model", n_shards, n);
    size_t esz = st_dtype_size(g->dtype);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += (uint64_t)t[i].numel * esz;
    /* Shards: cut when a shard reaches total/N bytes, but keep at least one tensor per shard. */
    int s = 0, in_s = 0;
    uint64_t cum = 0;
    for (int i = 0; i < n; i++) {
        if (in_s > 0 && (cum >= (uint64_t)((double)total * (s + 1) / n_shards) || n - i == n_shards - 1 - s)) {
            s++;
            in_s = 0;
        }
        t[i].shard = s;
        in_s++;
        cum += (uint64_t)t[i].numel * esz;
    }
    log_info("writing %s: %s, %d layers, hidden %d, vocab %d, %.2f M parameters, %s, %.1f MB in %d file(s), %d threads",
             dir, c->architecture, c->num_hidden_layers, c->hidden_size, c->vocab_size,
             1e-6 * (double)hf_config_n_params(c), st_dtype_name(g->dtype), 1e-6 * (double)total, n_shards,
             g->n_threads);
    unsigned char *buf = malloc((size_t)BATCH_CHUNKS * CHUNK_ELEMS * esz);
    ALLOC_CHECK(buf);
    struct progress prog = {0, total, time_mono_s(), time_mono_s()};
    if (n_shards == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        write_shard(path, t, n, 0, g, buf, &prog);
    } else {
        json_t *map = json_object(), *root = json_object(), *meta = json_object();
        if (!map || !root || !meta) DIE("out of memory");
        for (int k = 0; k < n_shards; k++) {
            char fname[64];
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
            snprintf(path, sizeof path, "%s/%s", dir, fname);
            write_shard(path, t, n, k, g, buf, &prog);
            for (int i = 0; i < n; i++)
                if (t[i].shard == k) json_object_set_new(map, t[i].name, json_string(fname));
        }
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
        json_object_set_new(root, "metadata", meta);
        json_object_set_new(root, "weight_map", map);
        char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
        ALLOC_CHECK(text);
        json_decref(root);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        size_t len = strlen(text);
        char *full = realloc(text, len + 2);
        ALLOC_CHECK(full);
        full[len] = '\n';
        LIB_CHECK(fs_write_atomic(path, full, len + 1, err, sizeof err), err);
        free(full);
    }
    progress_tick(&prog, 1);
    snprintf(path, sizeof path, "%s/config.json", dir);
    LIB_CHECK(hf_config_write(c, path, err, sizeof err), err);

    /* Self-check: the directory loads back with every tensor at its shape. */
    struct model_config back;
    LIB_CHECK(hf_config_load(&back, dir, err, sizeof err), err);
    struct hf_weights w;
    LIB_CHECK(hf_weights_open(&w, dir, err, sizeof err), err);
    if (w.n_tensors != n) DIE("%s: wrote %d tensors but %d load back", dir, n, w.n_tensors);
    for (int i = 0; i < n; i++) {
        const struct st_tensor *x;
        LIB_CHECK(hf_weights_get(&w, t[i].name, &x, err, sizeof err), err);
        int same = x->ndim == t[i].ndim && x->dtype == g->dtype;
        for (int k = 0; same && k < t[i].ndim; k++) same = x->shape[k] == t[i].shape[k];
        if (!same)
            DIE("%s: tensor '%s' loads back with another shape or dtype", dir, t[i].name);
    }
    hf_weights_close(&w);
    free(buf);
    free(t);
    log_info("model written to %s", dir);
}

/* ---------------------------------------------------------------- dataset */

struct ds_opts {
    int samples, median_len, min_len, max_len, vocab;
    double sigma, prompt_frac;
    uint64_t seed;
};

static double unif(uint64_t *s) { return (double)(kernels_rng_next(s) >> 11) * 0x1p-53; }
static double normal(uint64_t *s) {
    double u1 = (double)((kernels_rng_next(s) >> 11) + 1) * 0x1p-53, u2 = unif(s);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static void write_dataset(const char *path, const struct ds_opts *o) {
    char tmp[4096], err[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = fs_create_tmp(tmp);   /* private, O_EXCL | O_NOFOLLOW */
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    if (!f) DIE("cannot create %s: %s", tmp, strerror(errno));
    static char iobuf[1 << 20];
    setvbuf(f, iobuf, _IOFBF, sizeof iobuf);
    uint64_t s = kernels_mix64(o->seed ^ 0xDA7A5E7DA7A5E7ull);
    int32_t *ids = malloc((size_t)o->max_len * sizeof *ids);
    ALLOC_CHECK(ids);
    uint64_t n_tok = 0, n_loss = 0;
    for (int r = 0; r < o->samples; r++) {
        double len = rint((double)o->median_len * exp(o->sigma * normal(&s)));
        int L = len < o->min_len ? o->min_len : len > o->max_len ? o->max_len : (int)len;
        /* prompt ~ prompt_frac of the sample (jittered 0.5x..1.5x), at least one answer token */
        int P = (int)rint((double)L * o->prompt_frac * (0.5 + unif(&s)));
        if (o->prompt_frac > 0 && P < 1) P = 1;
        if (P > L - 1) P = L - 1;
        for (int i = 0; i < L; i++) ids[i] = (int32_t)(kernels_rng_next(&s) % (uint64_t)o->vocab);
        fputs("{\"input_ids\": [", f);
        for (int i = 0; i < L; i++) fprintf(f, i ? ", %d" : "%d", ids[i]);
        fputs("], \"loss_mask\": [", f);
        for (int i = 0; i < L; i++) fputs(i == 0 ? (i < P ? "0" : "1") : (i < P ? ", 0" : ", 1"), f);
        fputs("]}\n", f);
        n_tok += (uint64_t)L;
        n_loss += (uint64_t)(L - P);
        if (stage_stopping()) { fclose(f); unlink(tmp); DIE("stopped by signal %d; %s not written", stage_stop_signal(), path); }
    }
    free(ids);
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0) { fclose(f); unlink(tmp); DIE("write %s failed: %s", tmp, strerror(errno)); }
    if (fclose(f) != 0) { unlink(tmp); DIE("close %s failed: %s", tmp, strerror(errno)); }
    if (rename(tmp, path) != 0) { unlink(tmp); DIE("rename %s -> %s failed: %s", tmp, path, strerror(errno)); }
    (void)err;
    log_info("dataset written to %s: %d samples, %llu tokens (mean %.0f), %.1f%% with loss", path, o->samples,
             (unsigned long long)n_tok, (double)n_tok / (o->samples ? o->samples : 1),
             n_tok ? 100.0 * (double)n_loss / (double)n_tok : 0.0);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    log_init("dflash-mkmodel");
    struct stage_common common;
    stage_common_defaults(&common);
    common.device = "cpu";   /* generation is CPU work; no CUDA initialisation */
    const char *out = NULL, *arch = NULL, *preset = "tiny", *dtype = "bf16", *dataset = NULL;
    int hidden = 0, layers = 0, vocab = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0, max_pos = 0;
    int tied = -1, shards = 1, threads = 0;
    int64_t seed = 42;
    double std = 0.02, norm_noise = 0.1, rope_theta = 0, embed_std = 0, lm_head_std = 0;
    int rotary = 0, lin_nk = 0, lin_nv = 0, lin_dk = 0, lin_dv = 0, conv_k = 0, full_every = 0;
    int samples = 1000, median_len = 1200, min_len = 64, max_len = 8192;
    double sigma = 0.6, prompt_frac = 0.3;
    struct flag table[] = {
        {"out", FLAG_STRING, &out, "model directory to write (config.json + safetensors)", 1, 0},
        {"arch", FLAG_STRING, &arch, "qwen3 | llama | qwen3.5 (default: the preset's; tiny: qwen3)", 1, 0},
        {"preset", FLAG_STRING, &preset, "tiny | qwen3-0.6b | qwen3-8b | llama3.2-1b | llama3.1-8b | qwen3.5-tiny | "
                                        "qwen3.6-27b", 1, 0},
        {"hidden", FLAG_INT, &hidden, "hidden_size (0: preset)", 0, 1 << 20},
        {"layers", FLAG_INT, &layers, "num_hidden_layers (0: preset)", 0, 4096},
        {"vocab", FLAG_INT, &vocab, "vocab_size (0: preset)", 0, 1 << 30},
        {"heads", FLAG_INT, &heads, "num_attention_heads (0: preset)", 0, 4096},
        {"kv-heads", FLAG_INT, &kv_heads, "num_key_value_heads (0: preset)", 0, 4096},
        {"head-dim", FLAG_INT, &head_dim, "head_dim (0: preset)", 0, 4096},
        {"intermediate", FLAG_INT, &inter, "intermediate_size (0: preset)", 0, 1 << 22},
        {"max-pos", FLAG_INT, &max_pos, "max_position_embeddings (0: preset)", 0, 1 << 30},
        {"rope-theta", FLAG_DOUBLE, &rope_theta, "rope_theta (0: the architecture's usual)", 1, 0},
        {"tied", FLAG_BOOL, &tied, "tie_word_embeddings, no lm_head.weight (unset: as the preset)", 1, 0},
        {"dtype", FLAG_STRING, &dtype, "bf16 | f16 | f32 (on disk and in config.json)", 1, 0},
        {"seed", FLAG_INT64, &seed, "seed of weights and dataset", 1, 0},
        {"std", FLAG_DOUBLE, &std, "standard deviation of matrix weights", 1, 0},
        {"embed-std", FLAG_DOUBLE, &embed_std, "standard deviation of the embedding (0: --std; ~1 for a learnable "
                                               "tiny target)", 1, 0},
        {"lm-head-std", FLAG_DOUBLE, &lm_head_std, "standard deviation of lm_head.weight (0: --std; ~0.45 for a "
                                                   "learnable tiny target; tied models have none)", 1, 0},
        {"rotary-dim", FLAG_INT, &rotary, "qwen3.5: rotated dims per head (0: preset)", 0, 4096},
        {"lin-k-heads", FLAG_INT, &lin_nk, "qwen3.5: Gated DeltaNet key heads (0: preset)", 0, 4096},
        {"lin-v-heads", FLAG_INT, &lin_nv, "qwen3.5: Gated DeltaNet value heads (0: preset)", 0, 4096},
        {"lin-k-dim", FLAG_INT, &lin_dk, "qwen3.5: Gated DeltaNet key head dim (0: preset)", 0, 4096},
        {"lin-v-dim", FLAG_INT, &lin_dv, "qwen3.5: Gated DeltaNet value head dim (0: preset)", 0, 4096},
        {"conv-kernel", FLAG_INT, &conv_k, "qwen3.5: causal conv1d width (0: preset)", 0, 64},
        {"full-every", FLAG_INT, &full_every, "qwen3.5: every Nth layer is full attention (0: preset)", 0, 4096},
        {"norm-noise", FLAG_DOUBLE, &norm_noise, "norm weights are 1 + U(-x, x)", 1, 0},
        {"shards", FLAG_INT, &shards, "safetensors files (> 1: shards + model.safetensors.index.json)", 1, 99999},
        {"threads", FLAG_INT, &threads, "generator threads (0: every core)", 0, 256},
        {"dataset", FLAG_STRING, &dataset, "also write a synthetic JSONL dataset here", 1, 0},
        {"samples", FLAG_INT, &samples, "dataset samples", 1, 1 << 30},
        {"median-len", FLAG_INT, &median_len, "median sample length (log-normal)", 1, 1 << 30},
        {"len-sigma", FLAG_DOUBLE, &sigma, "sigma of log(length)", 1, 0},
        {"min-len", FLAG_INT, &min_len, "shortest sample", 2, 1 << 30},
        {"max-len", FLAG_INT, &max_len, "longest sample", 2, 1 << 30},
        {"prompt-frac", FLAG_DOUBLE, &prompt_frac, "mean share of prompt tokens (loss 0)", 1, 0},
        STAGE_COMMON_FLAGS(&common),
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "[--out DIR] [--dataset FILE] [flags]",
                        "Write a random-weight Hugging Face model (Qwen3, Llama or Qwen3.5 hybrid) and/or a synthetic JSONL dataset.",
                        NULL, 0);
    stage_start(&common, 0);
    if (!out && !dataset) DIE("nothing to do: give --out DIR and/or --dataset FILE (see --help)");

    const struct preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, preset) == 0) p = &presets[i];
    if (!p) DIE("--preset '%s' is unknown; use tiny, qwen3-0.6b, qwen3-8b, llama3.2-1b, llama3.1-8b, qwen3.5-tiny or "
                "qwen3.6-27b", preset);
    enum hf_arch a = p->arch ? p->arch : HF_ARCH_QWEN3;
    if (arch) {
        enum hf_arch want = strcmp(arch, "qwen3") == 0 ? HF_ARCH_QWEN3 : strcmp(arch, "llama") == 0 ? HF_ARCH_LLAMA
                          : strcmp(arch, "qwen3.5") == 0 ? HF_ARCH_QWEN3_5 : 0;
        if (!want) DIE("--arch '%s' is unknown; use qwen3, llama or qwen3.5", arch);
        if (want == HF_ARCH_QWEN3_5 && !p->arch) DIE("--arch qwen3.5 needs a qwen3.5 preset (--preset qwen3.5-tiny)");
        if (p->arch && want != p->arch) DIE("--arch %s contradicts --preset %s", arch, preset);
        a = want;
    }
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.arch = a;
    snprintf(c.architecture, sizeof c.architecture, "%s", a == HF_ARCH_QWEN3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM");
    snprintf(c.model_type, sizeof c.model_type, "%s", a == HF_ARCH_QWEN3 ? "qwen3" : "llama");
    c.qk_norm = a == HF_ARCH_QWEN3;
    c.vocab_size = vocab ? vocab : p->vocab;
    c.hidden_size = hidden ? hidden : p->hidden;
    c.intermediate_size = inter ? inter : p->inter;
    c.num_hidden_layers = layers ? layers : p->layers;
    c.num_attention_heads = heads ? heads : p->heads;
    c.num_key_value_heads = kv_heads ? kv_heads : p->kv;
    c.head_dim = head_dim ? head_dim : p->head_dim;
    c.max_position_embeddings = max_pos ? max_pos : p->max_pos ? p->max_pos : a == HF_ARCH_QWEN3 ? 40960 : 131072;
    c.tie_word_embeddings = tied >= 0 ? tied : p->tied;
    if (a == HF_ARCH_QWEN3_5) {
        snprintf(c.architecture, sizeof c.architecture, "Qwen3_5ForCausalLM");
        snprintf(c.model_type, sizeof c.model_type, "qwen3_5_text");
        c.qk_norm = 1;
        c.rms_norm_eps = 1e-6;
        c.rope_theta = rope_theta > 0 ? rope_theta : 1e7;
        c.rope_type = HF_ROPE_DEFAULT;
        c.rotary_dim = rotary ? rotary : p->rotary;
        c.linear_num_key_heads = lin_nk ? lin_nk : p->lin_nk;
        c.linear_num_value_heads = lin_nv ? lin_nv : p->lin_nv;
        c.linear_key_head_dim = lin_dk ? lin_dk : p->lin_dk;
        c.linear_value_head_dim = lin_dv ? lin_dv : p->lin_dv;
        c.linear_conv_kernel_dim = conv_k ? conv_k : p->conv_k;
        int every = full_every ? full_every : p->full_every;
        if (c.num_hidden_layers > HF_MAX_LAYERS) DIE("--layers %d exceeds %d", c.num_hidden_layers, HF_MAX_LAYERS);
        for (int l = 0; l < c.num_hidden_layers; l++) c.layer_linear[l] = (l + 1) % every != 0;
        if (c.rotary_dim < 2 || c.rotary_dim % 2 || c.rotary_dim > c.head_dim)
            DIE("--rotary-dim %d must be even and in [2, head_dim %d]", c.rotary_dim, c.head_dim);
        if (c.linear_num_value_heads % c.linear_num_key_heads)
            DIE("--lin-k-heads %d does not divide --lin-v-heads %d", c.linear_num_key_heads, c.linear_num_value_heads);
        int half = c.rotary_dim / 2;   /* M-RoPE sections as Qwen3.5's [11, 11, 10] of 32 */
        c.mrope_section[0] = c.mrope_section[1] = (half * 11 + 16) / 32;
        c.mrope_section[2] = half - 2 * c.mrope_section[0];
    } else if (a == HF_ARCH_QWEN3) {
        c.rms_norm_eps = 1e-6;
        c.rope_theta = rope_theta > 0 ? rope_theta : 1e6;
        c.rope_type = HF_ROPE_DEFAULT;
    } else {   /* Llama 3: rope scaling as published */
        c.rms_norm_eps = 1e-5;
        c.rope_theta = rope_theta > 0 ? rope_theta : 500000.0;
        c.rope_type = HF_ROPE_LLAMA3;
        c.rope_factor = strcmp(preset, "llama3.2-1b") == 0 ? 32.0 : 8.0;
        c.rope_low_freq_factor = 1.0;
        c.rope_high_freq_factor = 4.0;
        c.rope_original_max_position_embeddings = 8192;
    }
    if (strcmp(dtype, "bf16") == 0) c.dtype = ST_BF16;
    else if (strcmp(dtype, "f16") == 0) c.dtype = ST_F16;
    else if (strcmp(dtype, "f32") == 0) c.dtype = ST_F32;
    else DIE("--dtype '%s' is unknown; use bf16, f16 or f32", dtype);
    if (c.num_attention_heads % c.num_key_value_heads != 0)
        DIE("--kv-heads %d does not divide --heads %d", c.num_key_value_heads, c.num_attention_heads);
    if (c.head_dim % 2 != 0) DIE("--head-dim %d must be even (rotary halves)", c.head_dim);
    if (!(std > 0) || !(norm_noise >= 0) || !(sigma >= 0) || !(prompt_frac >= 0 && prompt_frac < 1) ||
        !(embed_std >= 0) || !(lm_head_std >= 0))
        DIE("--std must be > 0, --embed-std, --lm-head-std, --norm-noise and --len-sigma >= 0, --prompt-frac in [0, 1)");
    if (min_len > max_len) DIE("--min-len %d exceeds --max-len %d", min_len, max_len);

    if (out) {
        struct gen_opts g = {(uint64_t)seed, std, norm_noise, embed_std, lm_head_std, c.dtype, threads};
        if (g.n_threads <= 0) {
            long nc = sysconf(_SC_NPROCESSORS_ONLN);
            g.n_threads = nc < 1 ? 1 : nc > 64 ? 64 : (int)nc;
        }
        write_model(out, &c, shards, &g);
    }
    if (dataset) {
        struct ds_opts d = {samples, median_len, min_len, max_len, c.vocab_size, sigma, prompt_frac, (uint64_t)seed};
        write_dataset(dataset, &d);
    }
    return 0;
}
