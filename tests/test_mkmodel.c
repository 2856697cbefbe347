/*
 * tests/test_mkmodel.c — dflash-mkmodel: the files it writes load back (hfconfig + safetensors)
 * with exactly the Hugging Face names and shapes, weights have the asked statistics and depend
 * only on the seed (not the thread count), sharding and stale-file cleanup work, bad flags fail
 * with a sentence, and the synthetic dataset obeys its lengths, masks and vocabulary.
 * Runs the real binary (fork + exec), as the pipeline does.
 */
#include "core/fsutil.h"
#include "model/hfconfig.h"
#include "core/safetensors.h"
#include "model/weights.h"
#include "testutil.h"

#include <jansson.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char err[2048];
static char out_text[8192];   /* stderr + stdout of the last run */

/* Run dflash-mkmodel with NULL-terminated args; returns the exit status, output in out_text. */
static int run_mk(const char *const *args) {
    char logf[] = "/tmp/dflash-test-mk-XXXXXX";
    int fd = mkstemp(logf);
    ck_assert_int_ge(fd, 0);
    const char *argv[64];
    int n = 0;
    argv[n++] = test_bin("dflash-mkmodel");
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ssize_t r = pread(fd, out_text, sizeof out_text - 1, 0);
    out_text[r > 0 ? r : 0] = '\0';
    close(fd);
    unlink(logf);
    ck_assert_msg(WIFEXITED(st), "dflash-mkmodel did not exit normally");
    ck_assert_msg(WEXITSTATUS(st) != 127, "could not exec %s", argv[0]);
    return WEXITSTATUS(st);
}

/* dir/name in one of 64 rotating static buffers (a test keeps far fewer paths alive). */
static char *path_in(const char *dir, const char *name) {
    static char buf[64][1024];
    static unsigned k;
    char *p = buf[k++ % 64], tmp[1024];
    snprintf(tmp, sizeof tmp, "%s/%s", dir, name);   /* dir may be an older path_in result */
    memcpy(p, tmp, sizeof tmp);
    return p;
}

/* Every tensor the architecture needs, exactly: the count matches and each is present with its
 * shape and dtype. */
static void check_layout(const char *dir, const struct model_config *c, enum st_dtype dt) {
    struct hf_weights w;
    ck_assert_msg(hf_weights_open(&w, dir, err, sizeof err) == 0, "%s", err);
    int64_t C = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, d = c->head_dim;
    int64_t q = (int64_t)c->num_attention_heads * d, kv = (int64_t)c->num_key_value_heads * d;
    int expect = 2 + c->num_hidden_layers * (c->qk_norm ? 11 : 9) + (c->tie_word_embeddings ? 0 : 1);
    ck_assert_int_eq(w.n_tensors, expect);
    struct { const char *fmt; int nd; int64_t a, b; } per[] = {
        {"model.layers.%d.self_attn.q_proj.weight", 2, q, C}, {"model.layers.%d.self_attn.k_proj.weight", 2, kv, C},
        {"model.layers.%d.self_attn.v_proj.weight", 2, kv, C}, {"model.layers.%d.self_attn.o_proj.weight", 2, C, q},
        {"model.layers.%d.mlp.gate_proj.weight", 2, I, C}, {"model.layers.%d.mlp.up_proj.weight", 2, I, C},
        {"model.layers.%d.mlp.down_proj.weight", 2, C, I}, {"model.layers.%d.input_layernorm.weight", 1, C, 0},
        {"model.layers.%d.post_attention_layernorm.weight", 1, C, 0},
        {"model.layers.%d.self_attn.q_norm.weight", 1, d, 0}, {"model.layers.%d.self_attn.k_norm.weight", 1, d, 0},
    };
    int n_per = c->qk_norm ? 11 : 9;
    const struct st_tensor *t;
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int k = 0; k < n_per; k++) {
            char nm[128];
            snprintf(nm, sizeof nm, per[k].fmt, l);
            int64_t shape[2] = {per[k].a, per[k].b};
            ck_assert_msg(weights_lookup(&w, nm, per[k].nd, shape, &t, err, sizeof err) == 0, "%s", err);
            ck_assert_int_eq(t->dtype, dt);
        }
    int64_t emb[2] = {V, C}, nrm[1] = {C};
    ck_assert_msg(weights_lookup(&w, "model.embed_tokens.weight", 2, emb, &t, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(weights_lookup(&w, "model.norm.weight", 1, nrm, &t, err, sizeof err) == 0, "%s", err);
    if (c->tie_word_embeddings) ck_assert_ptr_null(hf_weights_find(&w, "lm_head.weight"));
    else ck_assert_msg(weights_lookup(&w, "lm_head.weight", 2, emb, &t, err, sizeof err) == 0, "%s", err);
    if (!c->qk_norm) ck_assert_ptr_null(hf_weights_find(&w, "model.layers.0.self_attn.q_norm.weight"));
    hf_weights_close(&w);
}

START_TEST(tiny_qwen3_default) {
    const char *dir = test_tmpdir("mk-q");
    const char *m = path_in(dir, "model");
    const char *a[] = {"--out", m, NULL};
    ck_assert_msg(run_mk(a) == 0, "%s", out_text);
    struct model_config c;
    ck_assert_msg(hf_config_load(&c, m, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.arch, HF_ARCH_QWEN3);
    ck_assert_int_eq(c.hidden_size, 64);
    ck_assert_int_eq(c.num_hidden_layers, 4);
    ck_assert_int_eq(c.num_attention_heads, 4);
    ck_assert_int_eq(c.num_key_value_heads, 2);
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert_int_eq(c.intermediate_size, 128);
    ck_assert_int_eq(c.vocab_size, 512);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.dtype, ST_BF16);
    ck_assert_int_eq(access(path_in(m, "model.safetensors"), F_OK), 0);
    ck_assert_int_ne(access(path_in(m, "model.safetensors.index.json"), F_OK), 0);
    check_layout(m, &c, ST_BF16);

    /* statistics: matrices N(0, 0.02^2), norms in 1 +- 0.1 and not constant */
    struct hf_weights w;
    ck_assert_int_eq(hf_weights_open(&w, m, err, sizeof err), 0);
    float *e = malloc(512 * 64 * sizeof *e);
    int64_t se[] = {512, 64};
    ck_assert_int_eq(weights_get_f32(&w, "model.embed_tokens.weight", 2, se, e, err, sizeof err), 0);
    double s1 = 0, s2 = 0;
    for (int i = 0; i < 512 * 64; i++) { s1 += e[i]; s2 += (double)e[i] * e[i]; }
    double mean = s1 / (512 * 64), sd = sqrt(s2 / (512 * 64) - mean * mean);
    ck_assert_msg(fabs(mean) < 0.001 && fabs(sd - 0.02) < 0.001, "embed mean %g std %g", mean, sd);
    float nw[64];
    int64_t sn[] = {64};
    ck_assert_int_eq(weights_get_f32(&w, "model.layers.2.post_attention_layernorm.weight", 1, sn, nw, err, sizeof err), 0);
    float lo = 2, hi = 0;
    for (int i = 0; i < 64; i++) { lo = fminf(lo, nw[i]); hi = fmaxf(hi, nw[i]); }
    ck_assert_msg(lo >= 0.899f && hi <= 1.101f && hi - lo > 0.05f, "norm weights in [%g, %g]", lo, hi);
    /* two matrices differ (independent streams per tensor) */
    const struct st_tensor *g = hf_weights_find(&w, "model.layers.0.mlp.gate_proj.weight");
    const struct st_tensor *u = hf_weights_find(&w, "model.layers.0.mlp.up_proj.weight");
    ck_assert_int_ne(memcmp(g->data, u->data, g->nbytes), 0);
    hf_weights_close(&w);
    free(e);
}
END_TEST

/* Mean and standard deviation of a tensor read as fp32. */
static void tensor_stats(const struct hf_weights *w, const char *name, double *mean, double *sd) {
    const struct st_tensor *t = hf_weights_find(w, name);
    ck_assert_msg(t != NULL, "no %s", name);
    float *x = malloc((size_t)t->numel * sizeof *x);
    ck_assert_int_eq(weights_convert_f32(t, 0, t->numel, x, err, sizeof err), 0);
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < t->numel; i++) { s1 += x[i]; s2 += (double)x[i] * x[i]; }
    *mean = s1 / (double)t->numel;
    *sd = sqrt(s2 / (double)t->numel - *mean * *mean);
    free(x);
}

START_TEST(embed_and_head_std) {
    const char *dir = test_tmpdir("mk-std");
    const char *m = path_in(dir, "model"), *m0 = path_in(dir, "plain");
    const char *a[] = {"--out", m, "--embed-std", "1.0", "--lm-head-std", "0.45", "--std", "0.06", NULL};
    ck_assert_msg(run_mk(a) == 0, "%s", out_text);
    const char *b[] = {"--out", m0, "--std", "0.06", NULL};
    ck_assert_msg(run_mk(b) == 0, "%s", out_text);
    struct hf_weights w, w0;
    ck_assert_int_eq(hf_weights_open(&w, m, err, sizeof err), 0);
    ck_assert_int_eq(hf_weights_open(&w0, m0, err, sizeof err), 0);
    double mean, sd;
    tensor_stats(&w, "model.embed_tokens.weight", &mean, &sd);
    ck_assert_msg(fabs(sd - 1.0) < 0.03, "embed std %g", sd);
    tensor_stats(&w, "lm_head.weight", &mean, &sd);
    ck_assert_msg(fabs(sd - 0.45) < 0.015, "lm_head std %g", sd);
    tensor_stats(&w, "model.layers.1.mlp.up_proj.weight", &mean, &sd);
    ck_assert_msg(fabs(sd - 0.06) < 0.003, "layer std %g", sd);
    /* the layer matrices are the same bytes as without the two flags (same streams) */
    const struct st_tensor *x = hf_weights_find(&w, "model.layers.1.mlp.up_proj.weight");
    const struct st_tensor *y = hf_weights_find(&w0, "model.layers.1.mlp.up_proj.weight");
    ck_assert_int_eq(memcmp(x->data, y->data, x->nbytes), 0);
    hf_weights_close(&w);
    hf_weights_close(&w0);
}
END_TEST

START_TEST(qwen35_presets) {
    const char *dir = test_tmpdir("mk-q35");
    const char *m = path_in(dir, "tiny"), *m2 = path_in(dir, "q36");
    const char *a[] = {"--out", m, "--preset", "qwen3.5-tiny", NULL};
    ck_assert_msg(run_mk(a) == 0, "%s", out_text);
    struct model_config c;
    ck_assert_msg(hf_config_load(&c, m, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.arch, HF_ARCH_QWEN3_5);
    ck_assert_int_eq(c.num_hidden_layers, 4);
    ck_assert_int_eq(c.rotary_dim, 8);
    ck_assert_int_eq(c.layer_linear[0] + c.layer_linear[1] * 2 + c.layer_linear[2] * 4 + c.layer_linear[3] * 8, 5);
    struct hf_weights w;
    ck_assert_int_eq(hf_weights_open(&w, m, err, sizeof err), 0);
    const struct st_tensor *t = hf_weights_find(&w, "model.layers.0.linear_attn.conv1d.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->ndim, 3);
    ck_assert_int_eq(t->shape[0], 2 * 2 * 8 + 4 * 12);
    ck_assert_int_eq(t->shape[1], 1);
    ck_assert_int_eq(t->shape[2], 4);
    t = hf_weights_find(&w, "model.layers.1.self_attn.q_proj.weight");   /* [query; gate] per head */
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->shape[0], 2 * 4 * 16);
    ck_assert_ptr_null(hf_weights_find(&w, "model.layers.0.self_attn.q_proj.weight"));
    double mean, sd;   /* zero-centred (1 + w) norms; A_log = log U(0.1, 1) */
    tensor_stats(&w, "model.layers.2.input_layernorm.weight", &mean, &sd);
    ck_assert_msg(fabs(mean) < 0.03 && sd > 0.02 && sd < 0.1, "norm mean %g sd %g", mean, sd);
    tensor_stats(&w, "model.layers.2.linear_attn.A_log", &mean, &sd);
    ck_assert_msg(mean < 0 && mean > -2.31, "A_log mean %g", mean);
    hf_weights_close(&w);
    /* the Qwen3.6-27B preset's head/mixer shape, shrunk in width and depth so the test stays small */
    const char *b[] = {"--out", m2, "--preset", "qwen3.6-27b", "--hidden", "64", "--layers", "4", "--vocab", "128",
                       "--intermediate", "32", "--head-dim", "16", "--rotary-dim", "4", "--lin-k-dim", "4",
                       "--lin-v-dim", "4", NULL};
    ck_assert_msg(run_mk(b) == 0, "%s", out_text);
    ck_assert_msg(hf_config_load(&c, m2, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.num_attention_heads, 24);
    ck_assert_int_eq(c.num_key_value_heads, 4);
    ck_assert_int_eq(c.linear_num_key_heads, 16);
    ck_assert_int_eq(c.linear_num_value_heads, 48);
    ck_assert_int_eq(c.max_position_embeddings, 262144);
    ck_assert_double_eq(c.rope_theta, 1e7);
    for (int l = 0; l < 4; l++) ck_assert_int_eq(c.layer_linear[l], l != 3);
    const char *bad[] = {"--out", m2, "--preset", "qwen3.5-tiny", "--lin-k-heads", "3", NULL};
    ck_assert_int_ne(run_mk(bad), 0);
    ck_assert_msg(strstr(out_text, "--lin-k-heads 3"), "%s", out_text);
}
END_TEST

static int files_equal(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    ck_assert_msg(fs_read_file(a, &x, &nx, err, sizeof err) == 0, "read %s", a);
    ck_assert_msg(fs_read_file(b, &y, &ny, err, sizeof err) == 0, "read %s", b);
    int eq = nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return eq;
}

START_TEST(deterministic_and_thread_independent) {
    const char *dir = test_tmpdir("mk-det");
    const char *a1[] = {"--out", path_in(dir, "a"), "--seed", "7", "--threads", "1", "--vocab", "3000", NULL};
    const char *a2[] = {"--out", path_in(dir, "b"), "--seed", "7", "--threads", "3", "--vocab", "3000", NULL};
    const char *a3[] = {"--out", path_in(dir, "c"), "--seed", "8", "--vocab", "3000", NULL};
    ck_assert_msg(run_mk(a1) == 0, "%s", out_text);
    ck_assert_msg(run_mk(a2) == 0, "%s", out_text);
    ck_assert_msg(run_mk(a3) == 0, "%s", out_text);
    /* vocab 3000 x 64 = 192k elements: the embedding spans several generator chunks per thread */
    ck_assert(files_equal(path_in(dir, "a/model.safetensors"), path_in(dir, "b/model.safetensors")));
    ck_assert(!files_equal(path_in(dir, "a/model.safetensors"), path_in(dir, "c/model.safetensors")));
}
END_TEST

START_TEST(llama_tied_sharded_f32) {
    const char *dir = test_tmpdir("mk-l");
    const char *m = path_in(dir, "llama");
    const char *a[] = {"--out", m, "--arch", "llama", "--tied", "--shards", "3", "--dtype", "f32", NULL};
    ck_assert_msg(run_mk(a) == 0, "%s", out_text);
    struct model_config c;
    ck_assert_msg(hf_config_load(&c, m, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.arch, HF_ARCH_LLAMA);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    ck_assert_int_eq(c.rope_type, HF_ROPE_LLAMA3);
    ck_assert_int_eq(c.dtype, ST_F32);
    ck_assert_int_eq(c.qk_norm, 0);
    check_layout(m, &c, ST_F32);
    struct hf_weights w;
    ck_assert_int_eq(hf_weights_open(&w, m, err, sizeof err), 0);
    ck_assert_int_eq(w.n_files, 3);
    ck_assert_ptr_nonnull(w.index_path);
    for (int k = 1; k <= 3; k++) {
        char nm[64];
        snprintf(nm, sizeof nm, "model-%05d-of-00003.safetensors", k);
        ck_assert_int_eq(access(path_in(m, nm), F_OK), 0);
    }
    hf_weights_close(&w);
    /* index metadata: total_size = every tensor's bytes */
    json_error_t je;
    json_t *idx = json_load_file(path_in(m, "model.safetensors.index.json"), 0, &je);
    ck_assert_ptr_nonnull(idx);
    int64_t total = json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size"));
    ck_assert_int_eq(total, hf_config_n_params(&c) * 4);
    json_decref(idx);

    /* rewriting the same directory unsharded removes the stale shards and index */
    const char *b[] = {"--out", m, "--arch", "llama", NULL};
    ck_assert_msg(run_mk(b) == 0, "%s", out_text);
    ck_assert_int_ne(access(path_in(m, "model.safetensors.index.json"), F_OK), 0);
    ck_assert_int_ne(access(path_in(m, "model-00001-of-00003.safetensors"), F_OK), 0);
    ck_assert_int_eq(hf_weights_open(&w, m, err, sizeof err), 0);
    ck_assert_int_eq(w.n_files, 1);
    ck_assert_ptr_nonnull(hf_weights_find(&w, "lm_head.weight"));
    hf_weights_close(&w);
}
END_TEST

START_TEST(overrides_and_f16) {
    const char *dir = test_tmpdir("mk-o");
    const char *m = path_in(dir, "o");
    const char *a[] = {"--out", m, "--hidden", "96", "--layers", "2", "--vocab", "1000", "--heads", "6",
                       "--kv-heads", "3", "--head-dim", "8", "--intermediate", "40", "--dtype", "f16",
                       "--tied", "--shards", "2", NULL};
    ck_assert_msg(run_mk(a) == 0, "%s", out_text);
    struct model_config c;
    ck_assert_msg(hf_config_load(&c, m, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.hidden_size, 96);
    ck_assert_int_eq(c.num_hidden_layers, 2);
    ck_assert_int_eq(c.vocab_size, 1000);
    ck_assert_int_eq(c.num_attention_heads, 6);
    ck_assert_int_eq(c.num_key_value_heads, 3);
    ck_assert_int_eq(c.head_dim, 8);
    ck_assert_int_eq(c.intermediate_size, 40);
    ck_assert_int_eq(c.dtype, ST_F16);
    check_layout(m, &c, ST_F16);
}
END_TEST

START_TEST(bad_flags) {
    const char *dir = test_tmpdir("mk-bad");
    const char *m = path_in(dir, "x");
    const char *a1[] = {"--out", m, "--preset", "gpt5", NULL};
    ck_assert_int_ne(run_mk(a1), 0);
    ck_assert_msg(strstr(out_text, "'gpt5'"), "%s", out_text);
    const char *a2[] = {"--out", m, "--preset", "qwen3-8b", "--arch", "llama", NULL};
    ck_assert_int_ne(run_mk(a2), 0);
    ck_assert_msg(strstr(out_text, "contradicts"), "%s", out_text);
    const char *a3[] = {"--out", m, "--kv-heads", "3", NULL};
    ck_assert_int_ne(run_mk(a3), 0);
    ck_assert_msg(strstr(out_text, "--kv-heads 3"), "%s", out_text);
    const char *a4[] = {"--out", m, "--shards", "1000", NULL};
    ck_assert_int_ne(run_mk(a4), 0);
    ck_assert_msg(strstr(out_text, "--shards 1000"), "%s", out_text);
    const char *a5[] = {"--dtype", "f8", "--out", m, NULL};
    ck_assert_int_ne(run_mk(a5), 0);
    ck_assert_msg(strstr(out_text, "f8"), "%s", out_text);
    const char *a6[] = {NULL};
    ck_assert_int_ne(run_mk(a6), 0);
    ck_assert_msg(strstr(out_text, "nothing to do"), "%s", out_text);
    ck_assert_int_ne(access(path_in(m, "config.json"), F_OK), 0);
    const char *a7[] = {"--help", NULL};
    ck_assert_int_eq(run_mk(a7), 0);
    ck_assert_msg(strstr(out_text, "--preset") && strstr(out_text, "--dataset"), "%s", out_text);
}
END_TEST

START_TEST(dataset_lines) {
    const char *dir = test_tmpdir("mk-ds");
    const char *ds = path_in(dir, "d.jsonl");
    const char *a[] = {"--dataset", ds, "--samples", "400", "--median-len", "100", "--min-len", "40",
                       "--max-len", "300", "--vocab", "777", "--seed", "3", NULL};
    ck_assert_msg(run_mk(a) == 0, "%s", out_text);
    FILE *f = fopen(ds, "r");
    ck_assert_ptr_nonnull(f);
    char *line = NULL;
    size_t cap = 0;
    int n = 0, at_min = 0, at_max = 0, lens[400];
    long tokens = 0, prompt = 0;
    int32_t max_id = -1;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        ck_assert_msg(o != NULL, "line %d: %s", n + 1, je.text);
        json_t *ids = json_object_get(o, "input_ids"), *mask = json_object_get(o, "loss_mask");
        ck_assert(json_is_array(ids) && json_is_array(mask));
        int L = (int)json_array_size(ids);
        ck_assert_int_eq((int)json_array_size(mask), L);
        ck_assert_msg(L >= 40 && L <= 300, "line %d: length %d", n + 1, L);
        at_min += L == 40;
        at_max += L == 300;
        int ones = 0, seen_one = 0;
        for (int i = 0; i < L; i++) {
            json_int_t id = json_integer_value(json_array_get(ids, (size_t)i));
            ck_assert(json_is_integer(json_array_get(ids, (size_t)i)));
            ck_assert_msg(id >= 0 && id < 777, "line %d: id %lld", n + 1, (long long)id);
            if (id > max_id) max_id = (int32_t)id;
            json_int_t mv = json_integer_value(json_array_get(mask, (size_t)i));
            ck_assert(mv == 0 || mv == 1);
            if (mv == 1) { ones++; seen_one = 1; }
            else ck_assert_msg(!seen_one, "line %d: prompt token after the answer began", n + 1);
        }
        ck_assert_msg(ones >= 1 && ones < L, "line %d: %d answer tokens of %d", n + 1, ones, L);
        tokens += L;
        prompt += L - ones;
        ck_assert_int_lt(n, 400);
        lens[n++] = L;
        json_decref(o);
    }
    free(line);
    fclose(f);
    ck_assert_int_eq(n, 400);
    ck_assert_int_gt(max_id, 700);   /* ids cover the vocabulary */
    double frac = (double)prompt / (double)tokens;
    ck_assert_msg(frac > 0.25 && frac < 0.35, "prompt share %.3f", frac);
    /* median near 100 (log-normal, sigma 0.6), clamped tails exist on the short side */
    for (int i = 1; i < n; i++)   /* insertion sort, n = 400 */
        for (int j = i; j > 0 && lens[j - 1] > lens[j]; j--) { int t = lens[j]; lens[j] = lens[j - 1]; lens[j - 1] = t; }
    ck_assert_msg(lens[n / 2] >= 85 && lens[n / 2] <= 115, "median length %d", lens[n / 2]);
    ck_assert_msg(at_min > 0, "no sample clamped to --min-len");
    (void)at_max;
    /* same seed: same file */
    const char *ds2 = path_in(dir, "d2.jsonl");
    const char *b[] = {"--dataset", ds2, "--samples", "400", "--median-len", "100", "--min-len", "40",
                       "--max-len", "300", "--vocab", "777", "--seed", "3", NULL};
    ck_assert_msg(run_mk(b) == 0, "%s", out_text);
    ck_assert(files_equal(ds, ds2));
}
END_TEST

int main(void) {
    Suite *s = suite_create("mkmodel");
    TCase *tc = tcase_create("mkmodel");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, tiny_qwen3_default);
    tcase_add_test(tc, deterministic_and_thread_independent);
    tcase_add_test(tc, llama_tied_sharded_f32);
    tcase_add_test(tc, embed_and_head_std);
    tcase_add_test(tc, qwen35_presets);
    tcase_add_test(tc, overrides_and_f16);
    tcase_add_test(tc, bad_flags);
    tcase_add_test(tc, dataset_lines);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
