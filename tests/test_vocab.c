/*
 * tests/test_vocab.c — stages/train/vocab.h and the dflash-vocab binary: the §1.6 rules (count
 * order, ties by id, padding with the smallest unseen ids, ascending draft order, d2t offsets),
 * numpy's exact .npy header bytes, the reader's checks, and a small JSONL run end to end.
 */
#include "train/vocab.h"
#include "core/fsutil.h"
#include "testutil.h"

#include <sys/wait.h>

START_TEST(build_rules) {
    /* counts: id 5 most frequent, then a 3-way tie (2, 7, 9) at 4, then 1 at 1 */
    uint64_t c[12] = {0, 1, 4, 0, 0, 9, 0, 4, 0, 4, 0, 0};
    uint8_t t2d[12];
    int64_t d2t[12];
    char err[256];
    /* V_d 3: 5, then the tie broken by smaller id: 2, 7 (9 loses); ascending: 2, 5, 7 */
    ck_assert_int_eq(vocab_build(c, 12, 3, t2d, d2t, err, sizeof err), 0);
    uint8_t want3[12] = {0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0};
    ck_assert_int_eq(memcmp(t2d, want3, 12), 0);
    ck_assert_int_eq(d2t[0], 2);   /* d 0 -> 2 */
    ck_assert_int_eq(d2t[1], 4);   /* d 1 -> 5 */
    ck_assert_int_eq(d2t[2], 5);   /* d 2 -> 7 */
    /* V_d 8: all 5 seen ids, padded with the smallest unseen 0, 3, 4 */
    ck_assert_int_eq(vocab_build(c, 12, 8, t2d, d2t, err, sizeof err), 0);
    int64_t ids[8] = {0, 1, 2, 3, 4, 5, 7, 9};
    for (int d = 0; d < 8; d++) ck_assert_int_eq(d + d2t[d], ids[d]);
    ck_assert_int_eq(t2d[6], 0);
    ck_assert_int_eq(t2d[8], 0);
    /* V_d = V_t: identity */
    ck_assert_int_eq(vocab_build(c, 12, 12, t2d, d2t, err, sizeof err), 0);
    for (int d = 0; d < 12; d++) ck_assert_int_eq(d2t[d], 0);
    ck_assert_int_eq(vocab_build(c, 12, 13, t2d, d2t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "13"));
    /* the check catches a broken mapping */
    ck_assert_int_eq(vocab_build(c, 12, 3, t2d, d2t, err, sizeof err), 0);
    d2t[1] = 5;   /* d 1 -> 6, not set in t2d */
    ck_assert_int_eq(vocab_check(t2d, 12, d2t, 3, err, sizeof err), -1);
    d2t[1] = 40;
    ck_assert_int_eq(vocab_check(t2d, 12, d2t, 3, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "outside"));
}
END_TEST

/* np.save(f, np.zeros(32000, np.int64)) writes exactly this 128-byte header (numpy >= 1.24). */
START_TEST(npy_header_bytes) {
    char h[256];
    int n = vocab_npy_header(h, sizeof h, "<i8", 32000);
    ck_assert_int_eq(n, 128);
    char want[129];
    const char *dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (32000,), }";
    memcpy(want, "\x93NUMPY\x01\x00\x76\x00", 10);
    memset(want + 10, ' ', 118);
    memcpy(want + 10, dict, strlen(dict));
    want[127] = '\n';
    ck_assert_int_eq(memcmp(h, want, 128), 0);
    /* t2d of Qwen3's 151936 ids: '|b1', still 128 bytes */
    n = vocab_npy_header(h, sizeof h, "|b1", 151936);
    ck_assert_int_eq(n, 128);
    ck_assert_ptr_nonnull(memmem(h, 128, "'descr': '|b1'", 14));
    ck_assert_ptr_nonnull(memmem(h, 128, "(151936,)", 9));
    ck_assert_int_eq(h[127], '\n');
}
END_TEST

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

START_TEST(npy_round_trip_and_checks) {
    const char *dir = test_tmpdir("vocab");
    char p[600], err[512];
    int64_t x[5] = {0, -3, 1ll << 40, 7, 2};
    uint8_t b[4] = {1, 0, 0, 1};
    snprintf(p, sizeof p, "%s/x.npy", dir);
    ck_assert_int_eq(vocab_npy_write_i64(p, x, 5, err, sizeof err), 0);
    int64_t *xr, n;
    ck_assert_int_eq(vocab_npy_read_i64(p, &xr, &n, err, sizeof err), 0);
    ck_assert_int_eq(n, 5);
    ck_assert_int_eq(memcmp(x, xr, sizeof x), 0);
    free(xr);
    uint8_t *br;
    ck_assert_int_eq(vocab_npy_read_bool(p, &br, &n, err, sizeof err), -1);   /* an int64 file is not bool */
    ck_assert_msg(strstr(err, "dtype '<i8', expected '|b1'"), "%s", err);
    snprintf(p, sizeof p, "%s/b.npy", dir);
    ck_assert_int_eq(vocab_npy_write_bool(p, b, 4, err, sizeof err), 0);
    ck_assert_int_eq(vocab_npy_read_bool(p, &br, &n, err, sizeof err), 0);
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(memcmp(b, br, 4), 0);
    free(br);
    /* hand-made bad files */
    char h[256];
    int hl = vocab_npy_header(h, sizeof h, "|b1", 4);
    char buf[512];
    memcpy(buf, h, hl);
    memcpy(buf + hl, "\x01\x00\x02\x00", 4);
    write_bytes(p, buf, hl + 4);
    ck_assert_int_eq(vocab_npy_read_bool(p, &br, &n, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "element 2 is 2"), "%s", err);
    write_bytes(p, buf, hl + 3);
    ck_assert_int_eq(vocab_npy_read_bool(p, &br, &n, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "3 data bytes, shape (4,)"), "%s", err);
    const char *two_d = "\x93NUMPY\x01\x00\x36\x00{'descr': '|b1', 'fortran_order': False, 'shape': (2, 2), }   \n";
    memcpy(buf, two_d, 64);
    memset(buf + 64, 0, 4);
    write_bytes(p, buf, 68);
    ck_assert_int_eq(vocab_npy_read_bool(p, &br, &n, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "1-D"), "%s", err);
    write_bytes(p, "PK\x03\x04zip", 7);
    ck_assert_int_eq(vocab_npy_read_bool(p, &br, &n, err, sizeof err), -1);
    ck_assert_msg(strstr(err, p) && strstr(err, "bad magic"), "%s", err);
}
END_TEST

START_TEST(count_and_load) {
    const char *dir = test_tmpdir("vocab");
    char p[600], err[512];
    snprintf(p, sizeof p, "%s/d.jsonl", dir);
    const char *rows = "{\"input_ids\":[5,3,3,9,1],\"loss_mask\":[0,1,1,1,1]}\n\n{\"input_ids\":[3,9,7],\"loss_mask\":[1,0,1]}\n";
    write_bytes(p, rows, strlen(rows));
    struct dataset ds;
    ck_assert_msg(dataset_load_jsonl(&ds, p, NULL, NULL, err, sizeof err) == 0, "%s", err);
    uint64_t c[10] = {0};
    ck_assert_int_eq(vocab_count_dataset(&ds, 10, c, err, sizeof err), 0);
    uint64_t want[10] = {0, 1, 0, 3, 0, 0, 0, 1, 0, 1};   /* id 5 is at loss 0: not counted */
    ck_assert_int_eq(memcmp(c, want, sizeof c), 0);
    ck_assert_int_eq(vocab_count_dataset(&ds, 8, c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "row 0") && strstr(err, "= 9 >= vocab size 8"), "%s", err);
    dataset_free(&ds);
    /* vocab_load's cross-checks */
    uint8_t t2d[10];
    int64_t d2t[4];
    ck_assert_int_eq(vocab_build(want, 10, 4, t2d, d2t, err, sizeof err), 0);
    char tp[700], dp[700];
    snprintf(tp, sizeof tp, "%s/t2d.npy", dir);
    snprintf(dp, sizeof dp, "%s/d2t.npy", dir);
    ck_assert_int_eq(vocab_npy_write_bool(tp, t2d, 10, err, sizeof err), 0);
    ck_assert_int_eq(vocab_npy_write_i64(dp, d2t, 4, err, sizeof err), 0);
    int64_t vd = 0, *d2 = NULL;
    uint8_t *t2 = NULL;
    ck_assert_msg(vocab_load(dir, 10, &vd, &t2, &d2, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(vd, 4);
    ck_assert_int_eq(memcmp(t2, t2d, 10), 0);
    free(t2); free(d2);
    vd = 5;
    ck_assert_int_eq(vocab_load(dir, 10, &vd, &t2, &d2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "d2t.npy: length 4, the draft vocab size is 5"), "%s", err);
    vd = 0;
    ck_assert_int_eq(vocab_load(dir, 11, &vd, &t2, &d2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "t2d.npy: length 10, the target vocab size is 11"), "%s", err);
    t2d[0] = !t2d[0];   /* popcount 5 vs 4 */
    ck_assert_int_eq(vocab_npy_write_bool(tp, t2d, 10, err, sizeof err), 0);
    ck_assert_int_eq(vocab_load(dir, 10, &vd, &t2, &d2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "ids set but"), "%s", err);
}
END_TEST

static int run_bin(const char *log, const char *const argv[]) {
    pid_t pid = test_spawn_log(log, argv);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

START_TEST(binary_end_to_end) {
    const char *dir = test_tmpdir("vocab");
    char data[600], out[600], log[600], err[512];
    snprintf(data, sizeof data, "%s/d.jsonl", dir);
    snprintf(out, sizeof out, "%s/vocab", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    const char *rows = "{\"input_ids\":[5,3,3,9,1],\"loss_mask\":[0,1,1,1,1],\"id\":\"a\"}\n{\"input_ids\":[3,9,7],\"loss_mask\":[1,0,1]}\n";
    write_bytes(data, rows, strlen(rows));
    const char *argv[] = { test_bin("dflash-vocab"), "--data", data, "--vocab-size", "12", "--draft-vocab-size", "6",
                           "--out", out, NULL };
    ck_assert_int_eq(run_bin(log, argv), 0);
    int64_t vd = 6, *d2t;
    uint8_t *t2d;
    ck_assert_msg(vocab_load(out, 12, &vd, &t2d, &d2t, err, sizeof err) == 0, "%s", err);
    /* counts 3:3, 1:1, 7:1, 9:1 -> top 6 = 3, 1, 7, 9, then padding 0, 2; ascending 0 1 2 3 7 9 */
    int64_t ids[6] = {0, 1, 2, 3, 7, 9};
    for (int d = 0; d < 6; d++) ck_assert_int_eq(d + d2t[d], ids[d]);
    free(t2d); free(d2t);
    char fp[700];
    snprintf(fp, sizeof fp, "%s/token_freq.npy", out);
    int64_t *freq, n;
    ck_assert_int_eq(vocab_npy_read_i64(fp, &freq, &n, err, sizeof err), 0);
    ck_assert_int_eq(n, 12);
    ck_assert_int_eq(freq[3], 3);
    ck_assert_int_eq(freq[5], 0);
    free(freq);
    char *text;
    size_t len;
    ck_assert_int_eq(fs_read_file(log, &text, &len, err, sizeof err), 0);
    ck_assert_msg(strstr(text, "6 supervised tokens, 4 distinct ids; kept 6 of 12 ids covering 100.00%"), "%s", text);
    free(text);
    /* an id beyond the vocab: non-zero exit naming the file and line */
    snprintf(log, sizeof log, "%s/log2", dir);
    const char *argv2[] = { test_bin("dflash-vocab"), "--data", data, "--vocab-size", "8", "--draft-vocab-size", "6",
                            "--out", out, NULL };
    ck_assert_int_ne(run_bin(log, argv2), 0);
    ck_assert_int_eq(fs_read_file(log, &text, &len, err, sizeof err), 0);
    ck_assert_msg(strstr(text, "d.jsonl:1:") && strstr(text, "input_ids[3] = 9"), "%s", text);
    free(text);
}
END_TEST

int main(void) {
    Suite *s = suite_create("vocab");
    TCase *tc = tcase_create("vocab");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, build_rules);
    tcase_add_test(tc, npy_header_bytes);
    tcase_add_test(tc, npy_round_trip_and_checks);
    tcase_add_test(tc, count_and_load);
    tcase_add_test(tc, binary_end_to_end);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
