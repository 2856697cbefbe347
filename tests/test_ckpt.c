/*
 * tests/test_ckpt.c — stages/train/ckpt.h: bit-exact round trip, truncated / corrupt / other-config
 * checkpoints (each a one-line error; nothing of the caller's overwritten), the newest-valid search,
 * keep-K, the state file, and exact resume of a toy model trained with the optimizers of
 * stages/train/optim.h (10 steps straight vs 5 + save + load into fresh buffers + 5).
 */
#include "train/ckpt.h"
#include "core/fsutil.h"
#include "train/optim.h"
#include "train/sched.h"
#include "testutil.h"

#include <sys/stat.h>

static const char *CFG = "{\"optim\": {\"kind\": \"muon+adamw\", \"lr\": 0.0001}, \"steps\": 10, \"data\": \"x.jsonl\"}";

struct small {
    float f[37];
    int64_t i[3];
    uint8_t u[5];
    uint64_t rng[2];
};

static void small_fill(struct small *s, uint64_t seed) {
    memset(s, 0, sizeof *s);   /* the padding too: the round trip compares whole structs with memcmp */
    uint64_t r = seed;
    memset(s, 0, sizeof *s);   /* the padding after f[37] too: the tests memcmp whole structs */
    test_rng_fill(&r, s->f, 37, -1, 1);
    s->f[3] = -0.0f;
    s->f[4] = NAN;   /* exact bits, NaN included */
    for (int k = 0; k < 3; k++) s->i[k] = (int64_t)test_rng_next(&r);
    for (int k = 0; k < 5; k++) s->u[k] = (uint8_t)test_rng_next(&r);
    s->rng[0] = test_rng_next(&r);
    s->rng[1] = test_rng_next(&r);
}

static void small_table(struct ckpt_table *tab, struct small *s) {
    char err[256];
    ckpt_table_init(tab);
    ck_assert_int_eq(ckpt_table_add(tab, "layers.0.mlp.up_proj.weight", CKPT_F32, 37, s->f, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_table_add(tab, "counters", CKPT_I64, 3, s->i, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_table_add(tab, "mask", CKPT_U8, 5, s->u, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_table_add(tab, "mask", CKPT_U8, 5, s->u, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "twice"));
}

static void write_small(const char *path, struct small *s, int64_t step, const char *cfg) {
    struct ckpt_table tab;
    small_table(&tab, s);
    struct ckpt_meta m = { step, 1000 + step, step - 1, cfg, s->rng, sizeof s->rng };
    char err[256];
    ck_assert_msg(ckpt_write(path, &m, tab.t, tab.n, err, sizeof err) == 0, "%s", err);
    ckpt_table_free(&tab);
}

START_TEST(round_trip_bit_exact) {
    const char *dir = test_tmpdir("ckpt");
    char path[600];
    snprintf(path, sizeof path, "%s/step-7.ckpt", dir);
    struct small a, b;
    small_fill(&a, 1);
    small_fill(&b, 2);
    write_small(path, &a, 7, CFG);
    struct ckpt_table tab;
    small_table(&tab, &b);
    struct ckpt_info info;
    char err[256];
    ck_assert_msg(ckpt_load(path, tab.t, tab.n, b.rng, sizeof b.rng, &info, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(memcmp(&a, &b, sizeof a), 0);
    ck_assert_int_eq(info.step, 7);
    ck_assert_int_eq(info.next_seq, 1007);
    ck_assert_int_eq(info.sched_pos, 6);
    ck_assert_str_eq(info.config_json, CFG);
    ck_assert_int_eq(info.n_tensors, 3);
    ckpt_info_free(&info);
    ckpt_table_free(&tab);
    char tmp[700];   /* the temporary is gone */
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    ck_assert(!fs_exists(tmp));
}
END_TEST

/* ckpt_tensor_bytes is the file's size less its config and RNG sections (each padded to 8 bytes); ckpt_check_space passes what fits and
 * refuses, with one sentence naming the path and the sizes, what does not, also for a path not created yet. */
START_TEST(space_is_checked) {
    const char *dir = test_tmpdir("ckpt-space");
    char path[600], deep[700], err[512];
    snprintf(path, sizeof path, "%s/step-7.ckpt", dir);
    struct small a;
    small_fill(&a, 1);
    write_small(path, &a, 7, CFG);
    struct ckpt_table tab;
    small_table(&tab, &a);
    struct ckpt_info info;
    ck_assert_msg(ckpt_verify(path, &info, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(ckpt_tensor_bytes(tab.t, tab.n), info.file_bytes - (strlen(CFG) + 7) / 8 * 8 - sizeof a.rng);
    ckpt_info_free(&info);
    ckpt_table_free(&tab);
    snprintf(deep, sizeof deep, "%s/not/yet/checkpoints", dir);
    ck_assert_msg(ckpt_check_space(deep, 4096, "a checkpoint", err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(ckpt_check_space(deep, (uint64_t)1 << 62, "a checkpoint (4.6e9 GB)", err, sizeof err), -1);
    ck_assert_msg(strstr(err, deep) && strstr(err, "a checkpoint (4.6e9 GB) needs") && strstr(err, "GB free") &&
                  strstr(err, dir) && !strchr(err, '\n'), "got: %s", err);
    ck_assert(!fs_exists(deep));   /* the check creates nothing */
}
END_TEST

/* Byte surgery on a written file; each bad file gives one sentence naming the file and the cause. */
static void expect_bad(const char *path, const char *what) {
    char err[512];
    struct ckpt_info info;
    ck_assert_int_eq(ckpt_verify(path, &info, err, sizeof err), -1);
    ck_assert_msg(strstr(err, path) && strstr(err, what), "got: %s (want '%s')", err, what);
    ck_assert_ptr_null(strchr(err, '\n'));
    /* loading it overwrites nothing */
    struct small b, keep;
    small_fill(&b, 9);
    keep = b;
    struct ckpt_table tab;
    small_table(&tab, &b);
    ck_assert_int_eq(ckpt_load(path, tab.t, tab.n, b.rng, sizeof b.rng, NULL, err, sizeof err), -1);
    ck_assert_int_eq(memcmp(&b, &keep, sizeof b), 0);
    ckpt_table_free(&tab);
}

static void poke(const char *path, long off, uint8_t xor) {
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, off, off < 0 ? SEEK_END : SEEK_SET), 0);
    int c = fgetc(f);
    ck_assert_int_ne(c, EOF);
    ck_assert_int_eq(fseek(f, -1, SEEK_CUR), 0);
    fputc(c ^ xor, f);
    ck_assert_int_eq(fclose(f), 0);
}

START_TEST(truncated_and_corrupt) {
    const char *dir = test_tmpdir("ckpt");
    char path[600];
    snprintf(path, sizeof path, "%s/step-1.ckpt", dir);
    struct small a;
    small_fill(&a, 1);
    struct stat st;
    long cuts[] = { 0, 100, 1200, -1 };
    for (int k = 0; k < 4; k++) {
        write_small(path, &a, 1, CFG);
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert_int_eq(truncate(path, cuts[k] >= 0 ? cuts[k] : st.st_size - 1), 0);
        expect_bad(path, "truncated");
    }
    write_small(path, &a, 1, CFG);
    poke(path, -20, 0x01);                    /* a bit of the last tensor */
    expect_bad(path, "checksum mismatch");
    write_small(path, &a, 1, CFG);
    poke(path, CKPT_HEADER_BYTES + 3, 0x40);  /* the config text */
    expect_bad(path, "checksum mismatch");
    write_small(path, &a, 1, CFG);
    poke(path, 20, 0x01);                     /* the header's step field */
    expect_bad(path, "header hash");
    write_small(path, &a, 1, CFG);
    poke(path, 0, 0x01);
    expect_bad(path, "bad magic");
    write_small(path, &a, 1, CFG);
    poke(path, 8, 0x02);                      /* version 3 */
    expect_bad(path, "version 3");
}
END_TEST

START_TEST(load_checks_the_table) {
    const char *dir = test_tmpdir("ckpt");
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/step-1.ckpt", dir);
    struct small a, b;
    small_fill(&a, 1);
    write_small(path, &a, 1, CFG);
    small_fill(&b, 2);
    struct small keep = b;
    struct ckpt_table tab;
    small_table(&tab, &b);
    tab.t[0].n = 36;    /* another shape */
    ck_assert_int_eq(ckpt_load(path, tab.t, tab.n, b.rng, sizeof b.rng, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "up_proj.weight is f32[37], this run expects f32[36]"), "%s", err);
    tab.t[0].n = 37;
    ck_assert_int_eq(ckpt_load(path, tab.t, tab.n - 1, b.rng, sizeof b.rng, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "tensor mask is not part of this run"), "%s", err);
    ck_assert_int_eq(ckpt_load(path, tab.t, tab.n, b.rng, 8, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "RNG state of 16 bytes"), "%s", err);
    float extra[2];
    ck_assert_int_eq(ckpt_table_add(&tab, "norm.weight", CKPT_F32, 2, extra, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_load(path, tab.t, tab.n, b.rng, sizeof b.rng, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "tensor norm.weight is missing"), "%s", err);
    ck_assert_int_eq(memcmp(&b, &keep, sizeof b), 0);
    ckpt_table_free(&tab);
}
END_TEST

START_TEST(config_diff) {
    char err[512];
    ck_assert_int_eq(ckpt_config_diff(CFG, CFG, NULL, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_config_diff("{\"a\": 1, \"b\": {\"c\": 2.0}}", "{\"b\": {\"c\": 2}, \"a\": 1}", NULL, err, sizeof err), 0);
    const char *other = "{\"optim\": {\"kind\": \"muon+adamw\", \"lr\": 0.0003}, \"steps\": 10, \"data\": \"x.jsonl\"}";
    ck_assert_int_eq(ckpt_config_diff(CFG, other, NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "field optim.lr: the checkpoint has 0.0001, this run has 0.00029999999999999997");
    const char *ign[] = { "optim.lr", NULL };
    ck_assert_int_eq(ckpt_config_diff(CFG, other, ign, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_config_diff(CFG, "{\"optim\": {\"kind\": \"muon+adamw\", \"lr\": 0.0001}, \"steps\": 10, \"data\": \"x.jsonl\", \"seed\": 4}", NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "field seed is missing in the checkpoint, this run has 4");
    ck_assert_int_eq(ckpt_config_diff(CFG, "{\"optim\": {\"kind\": \"muon+adamw\", \"lr\": 0.0001}, \"steps\": 10}", NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "field data: the checkpoint has \"x.jsonl\", this run does not set it");
    ck_assert_int_eq(ckpt_config_diff("[1]", CFG, NULL, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "not a JSON object"));
}
END_TEST

struct logbuf { char lines[8][1200]; int n; };
static void log_to(void *ctx, const char *line) {
    struct logbuf *l = ctx;
    if (l->n < 8) snprintf(l->lines[l->n++], sizeof l->lines[0], "%s", line);
}

START_TEST(newest_valid) {
    const char *dir = test_tmpdir("ckpt");
    char path[600], found[700], err[1024];
    struct small a;
    small_fill(&a, 1);
    struct logbuf lg = { .n = 0 };
    struct ckpt_info info;
    ck_assert_int_eq(ckpt_find_newest_valid(dir, CFG, NULL, 0, log_to, &lg, found, sizeof found, &info, err, sizeof err), 0);
    char missing[700];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    ck_assert_int_eq(ckpt_find_newest_valid(missing, CFG, NULL, 0, log_to, &lg, found, sizeof found, &info, err, sizeof err), 0);
    const char *other = "{\"optim\": {\"kind\": \"adamw\", \"lr\": 0.0001}, \"steps\": 10, \"data\": \"x.jsonl\"}";
    for (int s = 10; s <= 30; s += 10) {
        ck_assert_int_eq(ckpt_path(path, sizeof path, dir, s), 0);
        write_small(path, &a, s, s == 20 ? other : CFG);
    }
    const char *junk[] = { "step-40.ckpt.tmp.123" /* a killed writer's leftover */, "step-050.ckpt", "step-x.ckpt", "notes.txt" };
    for (int j = 0; j < 4; j++) {   /* ignored by the search */
        snprintf(path, sizeof path, "%s/%s", dir, junk[j]);
        FILE *lf = fopen(path, "w");
        ck_assert_ptr_nonnull(lf);
        fclose(lf);
    }
    ck_assert_int_eq(ckpt_path(path, sizeof path, dir, 30), 0);
    ck_assert_int_eq(truncate(path, 1300), 0);
    /* 30 is truncated (skipped, logged); 20 is of another configuration: refused */
    ck_assert_int_eq(ckpt_find_newest_valid(dir, CFG, NULL, 0, log_to, &lg, found, sizeof found, &info, err, sizeof err), -1);
    ck_assert_int_eq(lg.n, 1);
    ck_assert_msg(strstr(lg.lines[0], "skipping checkpoint ") && strstr(lg.lines[0], "step-30.ckpt: ") && strstr(lg.lines[0], "truncated"), "%s", lg.lines[0]);
    ck_assert_msg(strstr(err, "step-20.ckpt was written with another configuration: field optim.kind: the checkpoint has \"adamw\", this run has \"muon+adamw\""), "%s", err);
    /* skipping other configurations instead: 10 is used */
    lg.n = 0;
    ck_assert_int_eq(ckpt_find_newest_valid(dir, CFG, NULL, 1, log_to, &lg, found, sizeof found, &info, err, sizeof err), 1);
    ck_assert_int_eq(lg.n, 2);
    ck_assert_msg(strstr(lg.lines[1], "skipping checkpoint ") && strstr(lg.lines[1], "step-20.ckpt: written with another configuration: field optim.kind"), "%s", lg.lines[1]);
    ck_assert_ptr_nonnull(strstr(found, "/step-10.ckpt"));
    ck_assert_int_eq(info.step, 10);
    ck_assert_int_eq(info.next_seq, 1010);
    ckpt_info_free(&info);
}
END_TEST

START_TEST(keep_last_k) {
    const char *dir = test_tmpdir("ckpt");
    char sub[600], err[512], out[700], stale[700];
    snprintf(sub, sizeof sub, "%s/checkpoints", dir);
    struct small a;
    small_fill(&a, 1);
    struct ckpt_table tab;
    small_table(&tab, &a);
    snprintf(stale, sizeof stale, "%s/step-3.ckpt.tmp.999", sub);
    for (int s = 1; s <= 5; s++) {
        struct ckpt_meta m = { s * 100, s, s, CFG, a.rng, sizeof a.rng };
        ck_assert_msg(ckpt_save(sub, &m, tab.t, tab.n, 2, out, sizeof out, err, sizeof err) == 0, "%s", err);
        ck_assert(fs_exists(out));
        if (s == 3) { FILE *f = fopen(stale, "w"); ck_assert_ptr_nonnull(f); fclose(f); }
    }
    int64_t *steps;
    ck_assert_int_eq(ckpt_list(sub, &steps, err, sizeof err), 2);
    ck_assert_int_eq(steps[0], 500);
    ck_assert_int_eq(steps[1], 400);
    free(steps);
    ck_assert(!fs_exists(stale));
    ckpt_table_free(&tab);
}
END_TEST

START_TEST(state_file) {
    const char *dir = test_tmpdir("ckpt");
    char path[600], err[512], ck[600];
    snprintf(path, sizeof path, "%s/train.json", dir);
    ck_assert_int_eq(ckpt_write_state(path, 40, 163, "/r/checkpoints/step-40.ckpt", err, sizeof err), 0);
    int64_t step, seq;
    ck_assert_int_eq(ckpt_read_state(path, &step, &seq, ck, sizeof ck, err, sizeof err), 0);
    ck_assert_int_eq(step, 40);
    ck_assert_int_eq(seq, 163);
    ck_assert_str_eq(ck, "/r/checkpoints/step-40.ckpt");
    FILE *f = fopen(path, "w");
    fputs("{\"step\": 3}\n", f);
    fclose(f);
    ck_assert_int_eq(ckpt_read_state(path, &step, &seq, ck, sizeof ck, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "field next_seq"));
}
END_TEST

/* ---------------------------------------------------------------- exact resume */

/* A toy quadratic model: loss = Σ 0.5·(w - target)², grad = (w - target) + noise, with noise from
 * the run's RNG, accumulated over 2 micro-batches per step (mean), clipped to 1.0, guarded; one
 * poisoned step (a NaN loss) is skipped. Everything a resume needs is in the checkpoint. */
enum { RT = 4 };
static const int64_t rs_shape[RT][2] = { {4, 6}, {7, 3}, {5, 0}, {3, 3} };
static const char *rs_name[RT] = { "fc.weight", "layers.0.mlp.down_proj.weight", "norm.weight", "embed_tokens.weight" };

struct run {
    float w[RT][64], g[RT][64], target[RT][64];
    struct optim_tensor t[RT];
    struct optim o;
    struct sched sc;
    struct optim_guard guard;
    uint64_t rng;               /* the run's RNG state */
    int64_t step, sched_pos, next_seq;
    unsigned poison;            /* bit s: step s sees a NaN loss */
    int64_t stopped_at;         /* the step the guard stopped at, or -1 */
    char stop_msg[256];
};

static int64_t rs_numel(int i) { return rs_shape[i][0] * (rs_shape[i][1] ? rs_shape[i][1] : 1); }

static void run_init(struct run *r, uint64_t init_seed) {
    memset(r, 0, sizeof *r);
    uint64_t s = init_seed;
    for (int i = 0; i < RT; i++) {
        uint64_t fs = 5;   /* frozen weights come from the verifier: the same in every run */
        test_rng_fill(i == 3 ? &fs : &s, r->w[i], (size_t)rs_numel(i), -1, 1);
        uint64_t ts = 77 + i;   /* the targets are part of the "data", the same in every run */
        test_rng_fill(&ts, r->target[i], (size_t)rs_numel(i), -1, 1);
        struct optim_tensor t = { rs_name[i], rs_shape[i][1] ? 2 : 1, { rs_shape[i][0], rs_shape[i][1] },
                                  r->w[i], i == 3 ? NULL : r->g[i], i != 3, i < 2 };
        r->t[i] = t;
    }
    struct optim_config c;
    optim_config_default(&c);
    c.lr = 1e-2;
    char err[256];
    ck_assert_int_eq(optim_init(&r->o, r->t, RT, &c, err, sizeof err), 0);
    ck_assert_int_eq(sched_init(&r->sc, SCHED_COSINE, 10, 2, -1, err, sizeof err), 0);
    optim_guard_init(&r->guard, 3);
    r->rng = 12345;
    r->poison = 1u << 6;
    r->stopped_at = -1;
}

static void run_steps(struct run *r, int64_t until) {
    char err[256], msg[256];
    while (r->step < until && r->stopped_at < 0) {
        double loss = 0;
        for (int mb = 0; mb < 2; mb++) {
            for (int i = 0; i < 3; i++)
                for (int64_t j = 0; j < rs_numel(i); j++) {
                    float d = r->w[i][j] - r->target[i][j];
                    loss += 0.5 * d * d;
                    r->g[i][j] += d + test_rng_uniform(&r->rng, -0.5f, 0.5f);
                }
            r->next_seq++;
        }
        loss /= 2;
        if (r->poison >> r->step & 1) loss = NAN;   /* a poisoned batch: skipped, counted */
        optim_scale_grads(r->t, RT, 0.5f);
        double norm = optim_clip_grad_norm(r->t, RT, 1.0);
        enum optim_guard_action act = optim_guard_check(&r->guard, r->step, loss, norm, msg, sizeof msg);
        if (act == OPTIM_GUARD_STOP) { r->stopped_at = r->step; snprintf(r->stop_msg, sizeof r->stop_msg, "%s", msg); break; }
        if (act == OPTIM_GUARD_OK) {
            ck_assert_int_eq(optim_step(&r->o, sched_factor(&r->sc, r->sched_pos), err, sizeof err), 0);
            r->sched_pos++;
        }
        optim_zero_grad(r->t, RT);
        r->step++;
    }
}

static void run_table(struct run *r, struct ckpt_table *tab) {
    char err[256];
    ckpt_table_init(tab);
    ck_assert_int_eq(ckpt_table_add_optim(tab, &r->o, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_table_add_guard(tab, &r->guard, err, sizeof err), 0);
}

static void resume_case(unsigned poison) {
    static struct run a, b, c;
    run_init(&a, 1);
    a.poison = poison;
    run_steps(&a, 10);

    run_init(&b, 1);
    b.poison = poison;
    run_steps(&b, 5);
    const char *dir = test_tmpdir("resume");
    char err[512], path[700];
    struct ckpt_table tab;
    run_table(&b, &tab);
    ck_assert_int_eq(tab.n, 2 * 2 + 3 + 2 + 1);   /* 2 Muon (w, momentum), 1 AdamW (w, m, v), 2 steps, guard */
    struct ckpt_meta m = { b.step, b.next_seq, b.sched_pos, CFG, &b.rng, sizeof b.rng };
    ck_assert_msg(ckpt_save(dir, &m, tab.t, tab.n, 3, path, sizeof path, err, sizeof err) == 0, "%s", err);
    ckpt_table_free(&tab);

    /* a fresh process: other initial weights, zero state, then load */
    run_init(&c, 999);
    c.poison = poison;
    run_table(&c, &tab);
    struct ckpt_info info;
    ck_assert_int_eq(ckpt_find_newest_valid(dir, CFG, NULL, 0, NULL, NULL, path, sizeof path, &info, err, sizeof err), 1);
    ck_assert_msg(ckpt_load(path, tab.t, tab.n, &c.rng, sizeof c.rng, NULL, err, sizeof err) == 0, "%s", err);
    c.step = info.step;
    c.next_seq = info.next_seq;
    c.sched_pos = info.sched_pos;
    ckpt_info_free(&info);
    ckpt_table_free(&tab);
    run_steps(&c, 10);

    for (int i = 0; i < RT; i++) ck_assert_int_eq(memcmp(a.w[i], c.w[i], sizeof a.w[i]), 0);
    for (int i = 0; i < RT; i++) {
        int64_t k = rs_numel(i);
        if (a.o.m[i]) {
            ck_assert_int_eq(memcmp(a.o.m[i], c.o.m[i], k * sizeof(float)), 0);
            ck_assert_int_eq(memcmp(a.o.v[i], c.o.v[i], k * sizeof(float)), 0);
        }
        if (a.o.mom[i]) ck_assert_int_eq(memcmp(a.o.mom[i], c.o.mom[i], k * sizeof(float)), 0);
    }
    ck_assert_int_eq(a.o.adamw_step, c.o.adamw_step);
    ck_assert_int_eq(a.o.muon_step, c.o.muon_step);
    ck_assert_int_eq(a.next_seq, c.next_seq);
    ck_assert_int_eq(a.rng, c.rng);
    ck_assert_int_eq(a.guard.skipped_total, c.guard.skipped_total);
    ck_assert_int_eq(a.stopped_at, c.stopped_at);
    ck_assert_str_eq(a.stop_msg, c.stop_msg);
    if (poison == (1u << 6)) {
        /* the second half did move the weights (the test would pass trivially otherwise) */
        ck_assert_int_ne(memcmp(a.w[0], b.w[0], sizeof a.w[0]), 0);
        ck_assert_int_eq(a.stopped_at, -1);
        ck_assert_int_eq(a.guard.skipped_total, 1);
        ck_assert_int_eq(a.o.adamw_step, 9);
    } else {
        ck_assert_int_eq(a.stopped_at, 6);
        ck_assert_str_eq(a.stop_msg, "step 4: loss is nan (first non-finite value); 3 non-finite steps in a row, stopping");
    }
    optim_free(&a.o); optim_free(&b.o); optim_free(&c.o);
}

/* One poisoned step (6): skipped, and 5 + 5 steps end bit-identical to 10. */
START_TEST(exact_resume) { resume_case(1u << 6); }
END_TEST

/* Steps 4, 5, 6 poisoned: the streak spans the checkpoint after step 4, so the resumed run must
 * carry the guard's streak to stop at step 6 with the same message, as the straight run does. */
START_TEST(exact_resume_guard_streak) {
    resume_case(7u << 4);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ckpt");
    TCase *tc = tcase_create("ckpt");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, round_trip_bit_exact);
    tcase_add_test(tc, space_is_checked);
    tcase_add_test(tc, truncated_and_corrupt);
    tcase_add_test(tc, load_checks_the_table);
    tcase_add_test(tc, config_diff);
    tcase_add_test(tc, newest_valid);
    tcase_add_test(tc, keep_last_k);
    tcase_add_test(tc, state_file);
    tcase_add_test(tc, exact_resume);
    tcase_add_test(tc, exact_resume_guard_streak);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
