/*
 * tests/test_qwen35.c — the Qwen3.5 / Qwen3.6 hybrid target on the CPU path (issue 19).
 *
 * stored_reference: three tiny random hybrid models (GQA in both mixers, partial and full rotary,
 *   conv kernels 2..4, tied and untied, 3..5 layers; documents of 1..64 tokens) are regenerated
 *   with dflash-mkmodel from the flags recorded in tests/data/qwen35_ref.safetensors, whose
 *   states were produced by transformers 5.24 / torch 2.15 itself (Qwen3_5ForCausalLM, fp32,
 *   each document alone; scripts/compare_hf_qwen35.py --write-ref). Our packed forward must match
 *   every captured layer and `last` per document within relative L2 1e-5 (measured: <= 1.2e-6).
 * documents_independent: changing one document (its tokens and its length) leaves every other
 *   document's rows bitwise unchanged, in every captured layer.
 * bf16_points_baseline: the forward with cpu_bf16_points (the GPU test's baseline) rounds where the GPU does.
 * random_init_and_shapes: target_init_random on a hybrid config, z-lab default ids of the
 *   Qwen3.6-27B depth, FLOP count, a GPU request for a layout the GEMMs cannot take refused.
 * gpu_refuses_uncovered_head_layout / checkpoint_mismatch_refused_before_allocation: the GPU
 *   path's bad input (a DeltaNet key head dim above the kernel's 128, a tensor whose shape does not
 *   match its config) refused with the field or tensor named before anything is allocated.
 * bad_checkpoint: a missing DeltaNet tensor fails naming the tensor.
 * nested_checkpoint: the multimodal layout (text_config, model.language_model. weights, vision and
 *   MTP tensors beside them) loads and gives the flat checkpoint's bits.
 * transformers_crosscheck: runs scripts/compare_hf_qwen35.py when python3 (or $DFLASH_PYTHON) has
 *   torch and transformers with models/qwen3_5; otherwise prints why it is skipped.
 */
#include "model/hfconfig.h"
#include "core/safetensors.h"
#include "model/target.h"
#include "testutil.h"

#include <math.h>
#include <sys/wait.h>

static char err[1024];

static const char *ref_path(void) {
    static char p[1024];
    const char *rel = "tests/data/qwen35_ref.safetensors";
    if (access(rel, R_OK) == 0) return rel;
    const char *bin = getenv("DFLASH_BIN");   /* <repo>/build/bin */
    snprintf(p, sizeof p, "%s/../../%s", bin && *bin ? bin : "build/bin", rel);
    return p;
}

/* Run dflash-mkmodel --out dir --dtype f32 --threads 1 <flags, split on spaces>. */
static void mkmodel(const char *dir, const char *flags) {
    char buf[1024], log[600];
    snprintf(buf, sizeof buf, "%s", flags);
    snprintf(log, sizeof log, "%s.log", dir);
    const char *argv[64];
    int n = 0;
    argv[n++] = test_bin("dflash-mkmodel");
    argv[n++] = "--out"; argv[n++] = dir; argv[n++] = "--dtype"; argv[n++] = "f32"; argv[n++] = "--threads"; argv[n++] = "1";
    for (char *s = strtok(buf, " "); s && n < 62; s = strtok(NULL, " ")) argv[n++] = s;
    argv[n] = NULL;
    pid_t pid = test_spawn_log(log, argv);
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dflash-mkmodel %s failed (log %s)", flags, log);
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}

static const struct st_tensor *need(const struct st_file *f, const char *name) {
    const struct st_tensor *t = st_find(f, name);
    ck_assert_msg(t != NULL, "reference file lacks '%s'", name);
    return t;
}

START_TEST(stored_reference) {
    struct st_file f;
    ck_assert_msg(st_open(&f, ref_path(), err, sizeof err) == 0, "%s", err);
    const char *cases[] = {"a", "b", "c"};
    double worst = 0;
    for (int ci = 0; ci < 3; ci++) {
        char key[64];
        snprintf(key, sizeof key, "%s.mkmodel", cases[ci]);
        const char *flags = st_metadata(&f, key);
        ck_assert_msg(flags != NULL, "no metadata %s", key);
        const char *dir = test_tmpdir("q35ref");
        mkmodel(dir, flags);
#define T_(suffix) (snprintf(key, sizeof key, "%s.%s", cases[ci], suffix), need(&f, key))
        const struct st_tensor *ids = T_("ids"), *cu = T_("cu"), *lay = T_("layers"), *st = T_("states"), *last = T_("last");
#undef T_
        int T = (int)ids->numel, nd = (int)cu->numel - 1, k = (int)lay->numel;
        struct target_options opt;
        target_options_defaults(&opt);
        opt.max_tokens = T;
        opt.n_capture = k;
        for (int j = 0; j < k; j++) opt.capture[j] = ((const int32_t *)lay->data)[j];
        struct target *t = target_load(dir, &opt, err, sizeof err);
        ck_assert_msg(t != NULL, "%s", err);
        int C = target_config(t)->hidden_size;
        ck_assert_int_eq(st->shape[2], C);
        int32_t *pos = malloc((size_t)T * 4);
        const int32_t *cus = cu->data;
        for (int d = 0; d < nd; d++)
            for (int i = cus[d]; i < cus[d + 1]; i++) pos[i] = i - cus[d];
        struct target_batch b = {7, T, nd, ids->data, pos, cus};
        float *states = malloc((size_t)k * T * C * 4), *lst = malloc((size_t)T * C * 4);
        ck_assert_msg(target_forward(t, &b, states, lst, err, sizeof err) == 0, "%s", err);
        const float *ref = st->data, *refl = last->data;
        for (int d = 0; d < nd; d++) {
            size_t lo = (size_t)cus[d] * C, n = (size_t)(cus[d + 1] - cus[d]) * C;
            for (int j = 0; j <= k; j++) {
                const float *a = j < k ? states + (size_t)j * T * C + lo : lst + lo;
                const float *r = j < k ? ref + (size_t)j * T * C + lo : refl + lo;
                double e = rel_l2(a, r, n);
                if (e > worst) worst = e;
                ck_assert_msg(e <= 1e-5, "case %s doc %d (len %d) %s: relative L2 %.3g vs transformers", cases[ci], d,
                              cus[d + 1] - cus[d], j < k ? "captured layer" : "last", e);
            }
        }
        free(states); free(lst); free(pos);
        target_free(t);
    }
    printf("qwen35 stored reference (transformers, per document): worst relative L2 %.3g over 3 models\n", worst);
    st_close(&f);
}
END_TEST

START_TEST(documents_independent) {
    const char *dir = test_tmpdir("q35ind");
    mkmodel(dir, "--preset qwen3.5-tiny --std 0.15 --embed-std 1.0 --lm-head-std 0.45 --seed 5");
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 128;
    opt.n_capture = 4;
    for (int j = 0; j < 4; j++) opt.capture[j] = j;
    struct target *t = target_load(dir, &opt, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    int C = target_config(t)->hidden_size, V = target_config(t)->vocab_size;
    /* docs: lengths 9, 1, 17, 3 then doc 2 changed in content and length (17 -> 30) */
    int lens1[4] = {9, 1, 17, 3}, lens2[4] = {9, 1, 30, 3};
    int32_t ids1[128], ids2[128], pos1[128], pos2[128], cu1[5] = {0}, cu2[5] = {0};
    uint64_t rng = 99;
    int32_t docs[4][32];
    for (int d = 0; d < 4; d++)
        for (int i = 0; i < 32; i++) docs[d][i] = (int32_t)(test_rng_next(&rng) % (uint64_t)V);
    for (int d = 0; d < 4; d++) { cu1[d + 1] = cu1[d] + lens1[d]; cu2[d + 1] = cu2[d] + lens2[d]; }
    for (int d = 0; d < 4; d++) {
        for (int i = 0; i < lens1[d]; i++) { ids1[cu1[d] + i] = docs[d][i]; pos1[cu1[d] + i] = i; }
        for (int i = 0; i < lens2[d]; i++) {
            ids2[cu2[d] + i] = d == 2 ? (docs[d][i] + 1) % V : docs[d][i];
            pos2[cu2[d] + i] = i;
        }
    }
    int T1 = cu1[4], T2 = cu2[4];
    struct target_batch b1 = {1, T1, 4, ids1, pos1, cu1}, b2 = {2, T2, 4, ids2, pos2, cu2};
    float *s1 = malloc((size_t)4 * T1 * C * 4), *s2 = malloc((size_t)4 * T2 * C * 4);
    float *l1 = malloc((size_t)T1 * C * 4), *l2 = malloc((size_t)T2 * C * 4);
    ck_assert_msg(target_forward(t, &b1, s1, l1, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(target_forward(t, &b2, s2, l2, err, sizeof err) == 0, "%s", err);
    int changed = 0;
    for (int d = 0; d < 4; d++) {
        size_t n = (size_t)lens1[d] * C;
        for (int j = 0; j <= 4; j++) {
            const float *a = j < 4 ? s1 + (size_t)j * T1 * C + (size_t)cu1[d] * C : l1 + (size_t)cu1[d] * C;
            const float *c = j < 4 ? s2 + (size_t)j * T2 * C + (size_t)cu2[d] * C : l2 + (size_t)cu2[d] * C;
            int same = memcmp(a, c, n * 4) == 0;
            if (d == 2) changed += !same;
            else ck_assert_msg(same, "doc %d layer %d changed when only doc 2 changed", d, j);
        }
    }
    ck_assert_int_eq(changed, 5);   /* and doc 2 itself did change, in every layer */
    /* a document alone gives the same bits as inside the pack (doc 3 of b1: 3 tokens) */
    struct target_batch b3 = {3, 3, 1, ids1 + cu1[3], pos1 + cu1[3], (int32_t[]){0, 3}};
    float *s3 = malloc((size_t)4 * 3 * C * 4);
    ck_assert_msg(target_forward(t, &b3, s3, NULL, err, sizeof err) == 0, "%s", err);
    for (int j = 0; j < 4; j++)
        ck_assert_msg(memcmp(s3 + (size_t)j * 3 * C, s1 + (size_t)j * T1 * C + (size_t)cu1[3] * C, (size_t)3 * C * 4) == 0,
                      "doc 3 alone differs from doc 3 packed in layer %d", j);
    free(s1); free(s2); free(l1); free(l2); free(s3);
    target_free(t);
}
END_TEST

/* cpu_bf16_points (the GPU test's precision baseline): every captured value and `last` is a bf16 value, the
 * forward stays within bf16 drift of plain fp32 (relative L2 in (1e-4, 3e-2)), and it is refused for a GPU. */
START_TEST(bf16_points_baseline) {
    const char *dir = test_tmpdir("q35bf");
    mkmodel(dir, "--preset qwen3.5-tiny --std 0.15 --embed-std 1.0 --seed 9");
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 96;
    opt.n_capture = 2;
    opt.capture[0] = 0; opt.capture[1] = 2;
    struct target *f = target_load(dir, &opt, err, sizeof err);
    ck_assert_msg(f != NULL, "%s", err);
    opt.cpu_bf16_points = 1;
    struct target *r = target_load(dir, &opt, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    int C = target_config(f)->hidden_size, V = target_config(f)->vocab_size, T = 96;
    int32_t ids[96], pos[96], cu[4] = {0, 5, 70, 96};
    uint64_t rng = 3;
    for (int d = 0; d < 3; d++)
        for (int i = cu[d]; i < cu[d + 1]; i++) { ids[i] = (int32_t)(test_rng_next(&rng) % (uint64_t)V); pos[i] = i - cu[d]; }
    struct target_batch b = {1, T, 3, ids, pos, cu};
    size_t n = (size_t)3 * T * C;
    float *a = malloc(n * 4), *c = malloc(n * 4);
    ck_assert_msg(target_forward(f, &b, a, a + (size_t)2 * T * C, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(target_forward(r, &b, c, c + (size_t)2 * T * C, err, sizeof err) == 0, "%s", err);
    double se = 0, sr = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(c[i] == bf16_round(c[i]), "value %zu (%g) is not a bf16 value", i, (double)c[i]);
        se += ((double)c[i] - a[i]) * ((double)c[i] - a[i]);
        sr += (double)a[i] * a[i];
    }
    double rel = sqrt(se / sr);
    fprintf(stderr, "bf16 points vs fp32: relative L2 %.3g\n", rel);
    ck_assert_msg(rel > 1e-4 && rel < 3e-2, "bf16 points vs fp32: relative L2 %g outside (1e-4, 3e-2)", rel);
    target_free(f);
    target_free(r);
    free(a); free(c);
    opt.cuda_device = 0;
    ck_assert(target_load(dir, &opt, err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "cpu_bf16_points") || strstr(err, "no CUDA"), "%s", err);
}
END_TEST

START_TEST(random_init_and_shapes) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.arch = HF_ARCH_QWEN3_5;
    snprintf(c.architecture, sizeof c.architecture, "Qwen3_5ForCausalLM");
    c.vocab_size = 100; c.hidden_size = 32; c.intermediate_size = 48; c.num_hidden_layers = 4;
    c.num_attention_heads = 2; c.num_key_value_heads = 1; c.head_dim = 16; c.rotary_dim = 4; c.qk_norm = 1;
    c.rms_norm_eps = 1e-6; c.rope_theta = 1e7; c.linear_conv_kernel_dim = 4; c.linear_key_head_dim = 8;
    c.linear_value_head_dim = 8; c.linear_num_key_heads = 1; c.linear_num_value_heads = 2;
    for (int l = 0; l < 4; l++) c.layer_linear[l] = (l + 1) % 4 != 0;
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 16;
    struct target *t = target_init_random(&c, &opt, 3, 0.1f, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    ck_assert_int_eq(target_n_capture(t), TARGET_DEFAULT_DRAFT_LAYERS);
    int32_t ids[16], pos[16], cu[3] = {0, 1, 16};
    for (int i = 0; i < 16; i++) { ids[i] = (i * 7) % 100; pos[i] = i == 0 ? 0 : i - 1; }
    struct target_batch b = {1, 16, 2, ids, pos, cu};
    float *s = malloc((size_t)5 * 16 * 32 * 4), last[16 * 32];
    ck_assert_msg(target_forward(t, &b, s, last, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 16 * 32; i++) ck_assert_msg(isfinite(last[i]), "last[%d] = %g", i, last[i]);
    ck_assert(target_flops(t, cu, 2) > 0);
    free(s);
    target_free(t);
    /* z-lab default ids for the Qwen3.6-27B depth */
    int ids5[5];
    ck_assert_int_eq(hf_zlab_layer_ids(64, 5, ids5), 0);
    int want[5] = {1, 16, 31, 46, 61};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(ids5[i], want[i]);
    /* this layout's Gated DeltaNet projection rows (52 wide) cannot feed the GPU GEMMs: refused
     * from the config alone, before any allocation, on either build */
    opt.cuda_device = 0;
    ck_assert(target_init_random(&c, &opt, 3, 0.1f, err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "projection width 52") && strstr(err, "multiples of 8"), "%s", err);
}
END_TEST

START_TEST(bad_checkpoint) {
    const char *dir = test_tmpdir("q35bad");
    mkmodel(dir, "--preset qwen3.5-tiny --seed 1");
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct st_file f;
    ck_assert_msg(st_open(&f, p, err, sizeof err) == 0, "%s", err);
    /* rewrite the file without layer 0's A_log */
    struct st_write_tensor w[128];
    int n = 0;
    for (int i = 0; i < f.n_tensors && n < 128; i++) {
        const struct st_tensor *x = &f.tensors[i];
        if (strcmp(x->name, "model.layers.0.linear_attn.A_log") == 0) continue;
        w[n].name = x->name; w[n].dtype = x->dtype; w[n].ndim = x->ndim; w[n].data = x->data;
        for (int k = 0; k < x->ndim; k++) w[n].shape[k] = x->shape[k];
        n++;
    }
    const char *dir2 = test_tmpdir("q35bad2");
    char p2[1024], cfg1[1024], cfg2[1024];
    snprintf(p2, sizeof p2, "%s/model.safetensors", dir2);
    ck_assert_msg(st_write_file(p2, n, w, err, sizeof err) == 0, "%s", err);
    st_close(&f);
    snprintf(cfg1, sizeof cfg1, "%s/config.json", dir);
    snprintf(cfg2, sizeof cfg2, "%s/config.json", dir2);
    struct model_config c;
    ck_assert_int_eq(hf_config_load(&c, cfg1, err, sizeof err), 0);
    ck_assert_msg(hf_config_write(&c, cfg2, err, sizeof err) == 0, "%s", err);
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 8;
    ck_assert(target_load(dir2, &opt, err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "model.layers.0.linear_attn.A_log"), "%s", err);
    printf("missing tensor: %s\n", err);
}
END_TEST

/* A multimodal checkpoint (Qwen3_5ForConditionalGeneration: text model nested in text_config,
 * weights under model.language_model., a vision tower and an MTP layer beside them) gives the same
 * bits as the flat text checkpoint it was made from. */
START_TEST(nested_checkpoint) {
    const char *flat = test_tmpdir("q35flat"), *nest = test_tmpdir("q35nest");
    mkmodel(flat, "--preset qwen3.5-tiny --std 0.15 --embed-std 1.0 --seed 21");
    char p[1024], cfgtext_path[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", flat);
    struct st_file f;
    ck_assert_msg(st_open(&f, p, err, sizeof err) == 0, "%s", err);
    struct st_write_tensor w[160];
    static char names[160][128];
    float extra[8] = {0};
    int n = 0;
    for (int i = 0; i < f.n_tensors && n < 150; i++) {
        const struct st_tensor *x = &f.tensors[i];
        if (strncmp(x->name, "model.", 6) == 0) snprintf(names[n], sizeof names[n], "model.language_model.%s", x->name + 6);
        else snprintf(names[n], sizeof names[n], "%s", x->name);
        w[n].name = names[n]; w[n].dtype = x->dtype; w[n].ndim = x->ndim; w[n].data = x->data;
        for (int k = 0; k < x->ndim; k++) w[n].shape[k] = x->shape[k];
        n++;
    }
    const char *ignored[2] = {"model.visual.blocks.0.attn.qkv.weight", "mtp.fc.weight"};
    for (int j = 0; j < 2; j++) {
        w[n].name = ignored[j]; w[n].dtype = ST_F32; w[n].ndim = 2; w[n].shape[0] = 2; w[n].shape[1] = 4;
        w[n].data = extra;
        n++;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", nest);
    ck_assert_msg(st_write_file(p, n, w, err, sizeof err) == 0, "%s", err);
    st_close(&f);
    snprintf(cfgtext_path, sizeof cfgtext_path, "%s/config.json", flat);
    FILE *fc = fopen(cfgtext_path, "r");
    ck_assert_ptr_nonnull(fc);
    static char text[16384], full[20000];
    size_t len = fread(text, 1, sizeof text - 1, fc);
    fclose(fc);
    text[len] = '\0';
    snprintf(full, sizeof full, "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\", "
             "\"tie_word_embeddings\": false, \"vision_config\": {\"depth\": 1}, \"text_config\": %s}", text);
    snprintf(p, sizeof p, "%s/config.json", nest);
    fc = fopen(p, "w");
    ck_assert_ptr_nonnull(fc);
    ck_assert_int_eq(fputs(full, fc) >= 0, 1);
    ck_assert_int_eq(fclose(fc), 0);

    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 32;
    struct target *a = target_load(flat, &opt, err, sizeof err);
    ck_assert_msg(a != NULL, "%s", err);
    struct target *b = target_load(nest, &opt, err, sizeof err);
    ck_assert_msg(b != NULL, "%s", err);
    ck_assert_int_eq(target_config(b)->nested, 1);
    int32_t ids[20], pos[20], cu[3] = {0, 12, 20};
    for (int i = 0; i < 20; i++) { ids[i] = (i * 37 + 5) % 512; pos[i] = i < 12 ? i : i - 12; }
    struct target_batch bt = {1, 20, 2, ids, pos, cu};
    int C = target_config(a)->hidden_size;
    float *sa = malloc((size_t)5 * 20 * C * 4), *sb = malloc((size_t)5 * 20 * C * 4);
    ck_assert_msg(target_forward(a, &bt, sa, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(target_forward(b, &bt, sb, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(memcmp(sa, sb, (size_t)5 * 20 * C * 4), 0);
    /* the multimodal config names the vision placeholders (defaults 248056 / 248057, outside this
     * vocabulary); a config giving an in-vocabulary one makes a batch holding it fail */
    ck_assert_int_eq(target_config(b)->image_token_id, 248056);
    struct model_config mc = *target_config(b);
    mc.image_token_id = 77;
    struct target *r = target_init_random(&mc, &opt, 1, 0.1f, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    ids[5] = 77;
    ck_assert_int_eq(target_check_batch(r, &bt, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "input_ids[5] = 77") && strstr(err, "image_token_id") && strstr(err, "vision"), "%s", err);
    target_free(r);
    free(sa); free(sb);
    target_free(a);
    target_free(b);
}
END_TEST

/* Bad input the GPU path must refuse from the config and the file headers alone, before anything
 * is allocated (issue 27): a Gated DeltaNet head layout the kernels do not cover, and a checkpoint
 * whose tensor shapes do not match its config. Both run on a CPU build too: the refusal comes
 * before the "no CUDA" check, which proves it precedes every allocation. */
START_TEST(gpu_refuses_uncovered_head_layout) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.arch = HF_ARCH_QWEN3_5;
    snprintf(c.architecture, sizeof c.architecture, "Qwen3_5ForCausalLM");
    c.vocab_size = 100; c.hidden_size = 64; c.intermediate_size = 64; c.num_hidden_layers = 4;
    c.num_attention_heads = 2; c.num_key_value_heads = 1; c.head_dim = 16; c.rotary_dim = 4; c.qk_norm = 1;
    c.rms_norm_eps = 1e-6; c.rope_theta = 1e7; c.linear_conv_kernel_dim = 4; c.linear_key_head_dim = 192;
    c.linear_value_head_dim = 16; c.linear_num_key_heads = 1; c.linear_num_value_heads = 4;
    for (int l = 0; l < 4; l++) c.layer_linear[l] = (l + 1) % 4 != 0;
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 16;
    opt.cuda_device = 0;
    ck_assert(target_init_random(&c, &opt, 3, 0.1f, err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "linear_key_head_dim") && strstr(err, "192"), "%s", err);
    /* the CPU path takes it (the reference has no such limit) */
    opt.cuda_device = -1;
    struct target *t = target_init_random(&c, &opt, 3, 0.1f, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    target_free(t);
    /* value heads not a multiple of key heads: hfconfig refuses it for both devices */
    c.linear_key_head_dim = 16;
    c.linear_num_key_heads = 3;
    opt.cuda_device = 0;
    ck_assert(target_init_random(&c, &opt, 3, 0.1f, err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "linear heads k 3 / v 4"), "%s", err);
}
END_TEST

START_TEST(checkpoint_mismatch_refused_before_allocation) {
    const char *dir = test_tmpdir("q35shape");
    mkmodel(dir, "--preset qwen3.5-tiny --seed 2");
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *text = test_slurp(p, NULL);
    ck_assert_ptr_nonnull(text);
    /* the config now says conv width 3; the file's conv1d weights are [80, 1, 4] */
    char *at = strstr(text, "\"linear_conv_kernel_dim\": 4");
    ck_assert_msg(at != NULL, "config.json has no linear_conv_kernel_dim 4: %s", text);
    at[strlen("\"linear_conv_kernel_dim\": ")] = '3';
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fputs(text, f) >= 0, 1);
    ck_assert_int_eq(fclose(f), 0);
    free(text);
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = 16;
    opt.cuda_device = 0;   /* a GPU request: refused by the header check before any device work */
    ck_assert(target_load(dir, &opt, err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "model.layers.0.linear_attn.conv1d.weight") && strstr(err, "expected"), "%s", err);
    opt.cuda_device = -1;
    ck_assert(target_load(dir, &opt, err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "conv1d.weight"), "%s", err);
}
END_TEST

START_TEST(transformers_crosscheck) {
    const char *py = getenv("DFLASH_PYTHON");
    if (!py || !*py) py = "python3";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s -c 'import torch, transformers.models.qwen3_5.modeling_qwen3_5' >/dev/null 2>&1", py);
    if (system(cmd) != 0) {
        printf("transformers_crosscheck: SKIPPED: %s lacks torch / transformers>=5 (models/qwen3_5); set DFLASH_PYTHON "
               "to an interpreter that has them (the stored-reference test above still compares with transformers' "
               "outputs)\n", py);
        return;
    }
    const char *bin = getenv("DFLASH_BIN");
    char script[1024];
    snprintf(script, sizeof script, "scripts/compare_hf_qwen35.py");
    if (access(script, R_OK) != 0) snprintf(script, sizeof script, "%s/../../scripts/compare_hf_qwen35.py", bin ? bin : "build/bin");
    snprintf(cmd, sizeof cmd, "%s %s --bin %s", py, script, bin && *bin ? bin : "build/bin");
    int rc = system(cmd);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s failed (exit %d)", cmd, WEXITSTATUS(rc));
}
END_TEST

int main(void) {
    Suite *s = suite_create("qwen35");
    TCase *tc = tcase_create("qwen35");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stored_reference);
    tcase_add_test(tc, documents_independent);
    tcase_add_test(tc, bf16_points_baseline);
    tcase_add_test(tc, random_init_and_shapes);
    tcase_add_test(tc, bad_checkpoint);
    tcase_add_test(tc, nested_checkpoint);
    tcase_add_test(tc, gpu_refuses_uncovered_head_layout);
    tcase_add_test(tc, checkpoint_mismatch_refused_before_allocation);
    tcase_add_test(tc, transformers_crosscheck);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
