/*
 * tests/test_export_util.h — what test_export and test_eval share: a per-test directory under TMPDIR removed by the
 * fixture, running a binary with its output captured in out_text, and the tiny target model. One translation unit
 * includes it once (static definitions).
 */
#ifndef TESTS_TEST_EXPORT_UTIL_H
#define TESTS_TEST_EXPORT_UTIL_H

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#include <jansson.h>
#include <string.h>

#include "train/ckpt.h"
#include "train/drafter.h"
#include "train/optim.h"

static char err[4096];
static char base_dir[512];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(p);
}
/* Every test's files under one directory (TMPDIR for test_tmpdir), removed by the fixture. */
static void setup(void) {
    const char *b = getenv("TMPDIR");
    snprintf(base_dir, sizeof base_dir, "%s/dflash-test-export-XXXXXX", b && *b ? b : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(base_dir));
    setenv("TMPDIR", base_dir, 1);
}
static void teardown(void) {
    if (base_dir[0]) nftw(base_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
static char out_text[16384];

static int run_argv(const char *const *argv) {
    char logf[] = "/tmp/dflash-test-export-XXXXXX";
    int fd = mkstemp(logf);
    ck_assert_int_ge(fd, 0);
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
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 127, "could not run %s", argv[0]);
    return WEXITSTATUS(st);
}

static const char *tiny_target(void) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("export-target"));
    const char *argv[] = {test_bin("dflash-mkmodel"), "--preset", "tiny", "--out", dir, NULL};
    ck_assert_msg(run_argv(argv) == 0, "dflash-mkmodel: %s", out_text);
    return dir;
}

/* Save d as dflash-train does (its config_to_json keys, optimizer + guard table) into a new run directory. */
static void save_ckpt(const struct drafter *d, char *ckpt, size_t len) {
    const struct drafter_config *dc = drafter_config_of(d);
    json_t *lt = json_array(), *ids = json_array();
    for (int l = 0; l < dc->L; l++)
        json_array_append_new(lt, json_string(dc->layer_type[l] == DRAFTER_LAYER_SLIDING ? "sliding" : "full"));
    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(dc, zl);
    for (int i = 0; i < dc->k; i++) json_array_append_new(ids, json_integer(zl[i]));
    json_t *j = json_pack("{s:s, s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:o, s:i, s:b, s:i, s:i, s:o, s:b, s:I, s:f, s:s, "
                          "s:s, s:f, s:f, s:f, s:i, s:s}",
                          "format", "dflash-train config", "version", 1, "target_model_type", "qwen3", "hidden_size",
                          dc->H, "target_layers", dc->target.num_hidden_layers, "vocab_size", dc->V_t,
                          "draft_vocab_size", dc->V_d, "block_size", dc->B, "layer_types", lt, "sliding_window",
                          dc->sliding_window, "sliding_window_non_causal", dc->sliding_window_non_causal, "max_anchors", dc->N, "tokens",
                          dc->T_max, "target_layer_ids_zlab", ids, "sample_from_anchor", dc->sample_from_anchor, "mask_token_id",
                          (json_int_t)dc->mask_token_id, "noise", (double)dc->noise, "loss", "ce", "weighting", "dpace", "gamma",
                          4.0, "alpha", 0.5, "init_std", 0.02, "seed", 7, "optimizer", "muon");
    ck_assert_ptr_nonnull(j);
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    int n = drafter_n_params(d);
    struct optim_tensor *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        t[i] = (struct optim_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}, p->w, p->g, p->trainable,
                                     p->is_matrix};
    }
    struct optim_config oc;
    optim_config_default(&oc);
    struct optim o;
    memset(&o, 0, sizeof o);
    ck_assert_msg(optim_init(&o, t, n, &oc, err, sizeof err) == 0, "%s", err);
    struct optim_guard g;
    optim_guard_init(&g, 3);
    struct ckpt_table tab;
    ckpt_table_init(&tab);
    ck_assert_int_eq(ckpt_table_add_optim(&tab, &o, err, sizeof err), 0);
    ck_assert_int_eq(ckpt_table_add_guard(&tab, &g, err, sizeof err), 0);
    char cdir[600];
    snprintf(cdir, sizeof cdir, "%s/checkpoints", test_tmpdir("export-run"));
    struct ckpt_meta meta = {5, 10, 5, text, NULL, 0};
    ck_assert_msg(ckpt_save(cdir, &meta, tab.t, tab.n, 0, ckpt, len, err, sizeof err) == 0, "%s", err);
    ckpt_table_free(&tab);
    optim_free(&o);
    free(t);
    free(text);
}

#endif /* TESTS_TEST_EXPORT_UTIL_H */
