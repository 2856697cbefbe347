/*
 * tests/test_dataset.c — stages/core/dataset: JSONL parsing (a good file, and each kind of bad
 * line with its exact FILE:LINE message), skip mode, the indexed format's round trip, and
 * truncated or corrupt index files rejected with a sentence.
 */
#include "core/dataset.h"

#include <stddef.h>
#include <sys/wait.h>
#include "testutil.h"

#include <fcntl.h>
#include <sys/stat.h>

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "fopen %s", path);
    fputs(text, f);
    fclose(f);
}

static const char *GOOD =
    "{\"input_ids\": [5, 6, 7], \"loss_mask\": [0, 1, 1], \"seq_len\": 3}\n"
    "\n"
    "{\"loss_mask\": [false, false], \"input_ids\": [1, 2], \"messages\": []}\n"
    "   \n"
    "{\"input_ids\": [9, 0, 4, 3], \"loss_mask\": [0, 0, true, 1]}";   /* no final newline */

START_TEST(jsonl_good) {
    const char *dir = test_tmpdir("ds");
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/good.jsonl", dir);
    write_text(path, GOOD);
    struct dataset ds;
    struct dataset_load_stats st;
    ck_assert_msg(dataset_load_jsonl(&ds, path, NULL, &st, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(st.lines, 5);
    ck_assert_uint_eq(st.rows, 3);
    ck_assert_uint_eq(ds.n_rows, 3);
    ck_assert_uint_eq(ds.n_tokens, 9);
    ck_assert_uint_eq(ds.offsets[1], 3);
    ck_assert_uint_eq(ds.offsets[2], 5);
    ck_assert_uint_eq(dataset_row_len(&ds, 2), 4);
    ck_assert_int_eq(ds.tokens[5], 9);
    ck_assert_int_eq(ds.tokens[8], 3);
    ck_assert_uint_eq(ds.loss_mask[7], 1);
    ck_assert_uint_eq(ds.first_loss[0], 1);
    ck_assert_uint_eq(ds.first_loss[1], 2);   /* none: = length */
    ck_assert_uint_eq(ds.first_loss[2], 2);
    ck_assert_int_eq(ds.max_token_id, 9);
    ck_assert_uint_ne(ds.data_hash, 0);
    /* the vocab check passes at 10 and fails at 9 */
    struct dataset_load_opts o = {.vocab_size = 10};
    struct dataset ds2;
    ck_assert_int_eq(dataset_load_jsonl(&ds2, path, &o, NULL, err, sizeof err), 0);
    ck_assert_uint_eq(ds2.data_hash, ds.data_hash);
    dataset_free(&ds2);
    dataset_free(&ds);
    ck_assert_ptr_null(ds.tokens);
    dataset_free(&ds);   /* twice is fine */
}
END_TEST

/* A file whose line 3 is `bad` (after a good line and a blank line); the error must be exactly
 * "<path>:3<want>". */
static void expect_bad(const char *bad, int64_t vocab, const char *want) {
    const char *dir = test_tmpdir("bad");
    char path[600], text[4096], err[1024], expect[1024];
    snprintf(path, sizeof path, "%s/d.jsonl", dir);
    snprintf(text, sizeof text, "{\"input_ids\": [1, 2], \"loss_mask\": [0, 1]}\n\n%s\n{\"input_ids\": [3], \"loss_mask\": [1]}\n", bad);
    write_text(path, text);
    struct dataset ds;
    struct dataset_load_opts o = {.vocab_size = vocab};
    ck_assert_int_eq(dataset_load_jsonl(&ds, path, &o, NULL, err, sizeof err), -1);
    snprintf(expect, sizeof expect, "%s:3%s", path, want);
    ck_assert_str_eq(err, expect);
}

START_TEST(jsonl_bad_lines) {
    expect_bad("{\"input_ids\": [1, 2], \"loss_mask\": [0, 1]", 0, ":41: malformed JSON: '}' expected near end of file");
    expect_bad("{\"input_ids\": [1, 2,], \"loss_mask\": [0, 1]}", 0, ":21: malformed JSON: unexpected token near ']'");
    expect_bad("[1, 2, 3]", 0, ": expected a JSON object, found an array");
    expect_bad("{\"loss_mask\": [0, 1]}", 0, ": missing key 'input_ids'");
    expect_bad("{\"input_ids\": [1, 2]}", 0, ": missing key 'loss_mask'");
    expect_bad("{\"input_ids\": \"1 2\", \"loss_mask\": [0, 1]}", 0, ": 'input_ids' is a string, expected an array");
    expect_bad("{\"input_ids\": [1, \"2\"], \"loss_mask\": [0, 1]}", 0, ": input_ids[1] is a string, expected an integer");
    expect_bad("{\"input_ids\": [1.5, 2], \"loss_mask\": [0, 1]}", 0, ": input_ids[0] is a real number, expected an integer");
    expect_bad("{\"input_ids\": [1, null], \"loss_mask\": [0, 1]}", 0, ": input_ids[1] is null, expected an integer");
    expect_bad("{\"input_ids\": [1, -3], \"loss_mask\": [0, 1]}", 0, ": input_ids[1] = -3 is negative");
    expect_bad("{\"input_ids\": [1, 100], \"loss_mask\": [0, 1]}", 100, ": input_ids[1] = 100 is >= --vocab-size 100");
    expect_bad("{\"input_ids\": [1, 4294967296], \"loss_mask\": [0, 1]}", 0, ": input_ids[1] = 4294967296 does not fit in int32");
    expect_bad("{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1]}", 0, ": input_ids has 3 tokens but loss_mask has 2");
    expect_bad("{\"input_ids\": [], \"loss_mask\": []}", 0, ": empty sample (input_ids and loss_mask are [])");
    expect_bad("{\"input_ids\": [1, 2], \"loss_mask\": [0, 2]}", 0, ": loss_mask[1] = 2, expected 0 or 1");
    expect_bad("{\"input_ids\": [1, 2], \"loss_mask\": [0, \"1\"]}", 0, ": loss_mask[1] is a string, expected 0 or 1");
}
END_TEST

struct skipped { int n; char first[512]; };
static void on_bad(void *ctx, const char *msg) {
    struct skipped *s = ctx;
    if (!s->n++) snprintf(s->first, sizeof s->first, "%s", msg);
}

START_TEST(jsonl_skip_mode) {
    const char *dir = test_tmpdir("skip");
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/d.jsonl", dir);
    write_text(path, "{\"input_ids\": [1, 2], \"loss_mask\": [0, 1]}\n"
                     "{\"input_ids\": [1, 2, 3, 4], \"loss_mask\": [0, 1]}\n"
                     "not json\n"
                     "{\"input_ids\": [7, 8, 9], \"loss_mask\": [1, 1, 0]}\n");
    struct skipped sk = {0, ""};
    struct dataset_load_opts o = {.skip_bad = 1, .on_bad = on_bad, .ctx = &sk};
    struct dataset_load_stats st;
    struct dataset ds;
    ck_assert_msg(dataset_load_jsonl(&ds, path, &o, &st, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(st.skipped_bad, 2);
    ck_assert_int_eq(sk.n, 2);
    char want[700];
    snprintf(want, sizeof want, "%s:2: input_ids has 4 tokens but loss_mask has 2", path);
    ck_assert_str_eq(sk.first, want);
    /* the skipped sample left no tokens behind: rows are lines 1 and 4 */
    ck_assert_uint_eq(ds.n_rows, 2);
    ck_assert_uint_eq(ds.n_tokens, 5);
    ck_assert_int_eq(ds.tokens[2], 7);
    ck_assert_uint_eq(ds.first_loss[1], 0);
    dataset_free(&ds);
}
END_TEST

/* ---------------------------------------------------------------- indexed format */

/* A random dataset of n rows written as JSONL; returns it loaded. */
static void make_random(const char *path, int n, uint64_t seed, struct dataset *ds) {
    FILE *f = fopen(path, "wb");
    ck_assert(f != NULL);
    uint64_t s = seed;
    for (int r = 0; r < n; r++) {
        int len = 1 + (int)(test_rng_next(&s) % 300);
        fprintf(f, "{\"input_ids\": [");
        for (int i = 0; i < len; i++) fprintf(f, "%s%d", i ? ", " : "", (int)(test_rng_next(&s) % 50000));
        fprintf(f, "], \"loss_mask\": [");
        for (int i = 0; i < len; i++) fprintf(f, "%s%d", i ? ", " : "", (int)(test_rng_next(&s) % 3 == 0));
        fprintf(f, "]}\n");
    }
    fclose(f);
    char err[512];
    ck_assert_msg(dataset_load_jsonl(ds, path, NULL, NULL, err, sizeof err) == 0, "%s", err);
}

START_TEST(index_round_trip) {
    const char *dir = test_tmpdir("idx");
    char jpath[600], ipath[600], err[512];
    snprintf(jpath, sizeof jpath, "%s/d.jsonl", dir);
    snprintf(ipath, sizeof ipath, "%s/d.idx", dir);
    struct dataset a, b, c;
    make_random(jpath, 200, 42, &a);
    ck_assert_msg(dataset_write_index(&a, ipath, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(dataset_open_index(&b, ipath, 1, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(b.is_index, 1);
    ck_assert_uint_eq(b.n_rows, a.n_rows);
    ck_assert_uint_eq(b.n_tokens, a.n_tokens);
    ck_assert_int_eq(b.max_token_id, a.max_token_id);
    ck_assert_uint_eq(b.data_hash, a.data_hash);
    ck_assert(!memcmp(b.offsets, a.offsets, 8 * (a.n_rows + 1)));
    ck_assert(!memcmp(b.first_loss, a.first_loss, 4 * a.n_rows));
    ck_assert(!memcmp(b.tokens, a.tokens, 4 * a.n_tokens));
    ck_assert(!memcmp(b.loss_mask, a.loss_mask, a.n_tokens));
    /* dataset_open picks the format by its magic */
    ck_assert_int_eq(dataset_open(&c, ipath, NULL, NULL, 0, err, sizeof err), 0);
    ck_assert_int_eq(c.is_index, 1);
    dataset_free(&c);
    ck_assert_int_eq(dataset_open(&c, jpath, NULL, NULL, 0, err, sizeof err), 0);
    ck_assert_int_eq(c.is_index, 0);
    ck_assert_uint_eq(c.data_hash, a.data_hash);
    dataset_free(&c);
    /* the vocab check on an index names the row */
    struct dataset_load_opts o = {.vocab_size = a.max_token_id};
    ck_assert_int_eq(dataset_open(&c, ipath, &o, NULL, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ": row ") && strstr(err, "is >= --vocab-size"), "%s", err);
    o.vocab_size = a.max_token_id + 1;
    ck_assert_int_eq(dataset_open(&c, ipath, &o, NULL, 0, err, sizeof err), 0);
    dataset_free(&c);
    /* no temporary file is left behind */
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", ipath, (int)getpid());
    ck_assert(access(tmp, F_OK) != 0);
    dataset_free(&a);
    dataset_free(&b);
}
END_TEST

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    ck_assert(a && b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) ck_assert_uint_eq(fwrite(buf, 1, n, b), n);
    fclose(a);
    fclose(b);
}

static void poke(const char *path, long at, const void *bytes, size_t n) {
    int fd = open(path, O_WRONLY);
    ck_assert(fd >= 0);
    ck_assert_int_eq(pwrite(fd, bytes, n, at), (ssize_t)n);
    close(fd);
}

static void expect_open_fails(const char *path, int verify, const char *want) {
    struct dataset ds;
    char err[512] = "";
    ck_assert_msg(dataset_open_index(&ds, path, verify, err, sizeof err) == -1, "opened a bad index (want '%s')", want);
    ck_assert_msg(strstr(err, want) && strstr(err, path), "error '%s' lacks '%s' or the path", err, want);
}

START_TEST(index_corrupt_rejected) {
    const char *dir = test_tmpdir("corrupt");
    char jpath[600], good[600], bad[600], err[512];
    snprintf(jpath, sizeof jpath, "%s/d.jsonl", dir);
    snprintf(good, sizeof good, "%s/good.idx", dir);
    snprintf(bad, sizeof bad, "%s/bad.idx", dir);
    struct dataset a, b;
    make_random(jpath, 50, 7, &a);
    ck_assert_int_eq(dataset_write_index(&a, good, err, sizeof err), 0);
    struct dataset_index_header h;
    FILE *f = fopen(good, "rb");
    ck_assert_uint_eq(fread(&h, sizeof h, 1, f), 1);
    fclose(f);

    /* truncated: lost tail, and smaller than a header */
    copy_file(good, bad);
    ck_assert_int_eq(truncate(bad, (off_t)h.file_bytes - 10), 0);
    expect_open_fails(bad, 0, "truncated index: the header says");
    ck_assert_int_eq(truncate(bad, 100), 0);
    expect_open_fails(bad, 0, "truncated index: 100 bytes, smaller than the 4096-byte header");
    /* not an index */
    write_text(bad, "{\"input_ids\": [1], \"loss_mask\": [1]}\n");
    expect_open_fails(bad, 0, "truncated index");
    copy_file(good, bad);
    poke(bad, 0, "XX", 2);
    expect_open_fails(bad, 0, "not a dflash index (bad magic");
    /* another version */
    copy_file(good, bad);
    uint32_t v = 2;
    poke(bad, 8, &v, 4);
    expect_open_fails(bad, 0, "index version 2, this build reads version 1");
    /* a header field changed: the header hash catches it */
    copy_file(good, bad);
    uint64_t rows = h.n_rows - 1;
    poke(bad, (long)offsetof(struct dataset_index_header, n_rows), &rows, 8);
    expect_open_fails(bad, 0, "corrupt index: the header hash does not match");
    /* offsets out of order: caught without verify */
    copy_file(good, bad);
    uint64_t off = h.n_tokens + 5;
    poke(bad, (long)(h.off_offsets + 8 * 3), &off, 8);
    expect_open_fails(bad, 0, "corrupt index: row 2 has offsets");
    /* a flipped token: the cheap open accepts it, the verified open does not */
    copy_file(good, bad);
    int32_t tok = 123;
    poke(bad, (long)(h.off_tokens + 4 * 17), &tok, 4);
    ck_assert_int_eq(dataset_open_index(&b, bad, 0, err, sizeof err), 0);
    dataset_free(&b);
    expect_open_fails(bad, 1, "corrupt index: the data hash does not match");
    /* an extended file */
    copy_file(good, bad);
    f = fopen(bad, "ab");
    fputs("junk", f);
    fclose(f);
    expect_open_fails(bad, 0, "oversized index");
    /* the good one still opens with full verification */
    ck_assert_msg(dataset_open_index(&b, good, 1, err, sizeof err) == 0, "%s", err);
    dataset_free(&b);
    dataset_free(&a);
    /* a missing file */
    expect_open_fails("/nonexistent/x.idx", 0, "cannot open");
}
END_TEST

/* Issue 14 item 10: the checks that protect later stages run without --verify-index. */
START_TEST(index_values_checked_without_verify) {
    const char *dir = test_tmpdir("vals");
    char jpath[600], good[600], bad[600], err[512];
    snprintf(jpath, sizeof jpath, "%s/d.jsonl", dir);
    snprintf(good, sizeof good, "%s/good.idx", dir);
    snprintf(bad, sizeof bad, "%s/bad.idx", dir);
    struct dataset a, b;
    make_random(jpath, 50, 11, &a);
    ck_assert_int_eq(dataset_write_index(&a, good, err, sizeof err), 0);
    struct dataset_index_header h;
    FILE *f = fopen(good, "rb");
    ck_assert_uint_eq(fread(&h, sizeof h, 1, f), 1);
    fclose(f);
    /* a token above the header's maximum, a negative token, a mask value 2, a wrong first table */
    copy_file(good, bad);
    int32_t tok = h.max_token_id + 1;
    poke(bad, (long)(h.off_tokens + 4 * 20), &tok, 4);
    expect_open_fails(bad, 0, "is outside [0, ");
    copy_file(good, bad);
    tok = -7;
    poke(bad, (long)(h.off_tokens + 4 * 3), &tok, 4);
    expect_open_fails(bad, 0, "= -7 is outside");
    copy_file(good, bad);
    uint8_t two = 2;
    poke(bad, (long)(h.off_loss + 9), &two, 1);
    expect_open_fails(bad, 0, "loss_mask[");
    copy_file(good, bad);
    uint32_t first = 0;
    uint32_t cur;
    f = fopen(good, "rb");
    ck_assert_int_eq(fseek(f, (long)h.off_first, SEEK_SET), 0);
    ck_assert_uint_eq(fread(&cur, 4, 1, f), 1);
    fclose(f);
    first = cur == 0 ? 1 : 0;
    poke(bad, (long)h.off_first, &first, 4);
    expect_open_fails(bad, 0, "first supervised token");
    /* a header claiming a small maximum id (rehashed, so it passes the header check): the vocab
     * check cannot be fooled by it, because every token is checked against it at open */
    copy_file(good, bad);
    struct dataset_index_header h2 = h;
    h2.max_token_id = 10;
    h2.header_hash = dataset_hash64(&h2, offsetof(struct dataset_index_header, header_hash), 7);
    poke(bad, 0, &h2, sizeof h2);
    struct dataset_load_opts o = {.vocab_size = 100};
    ck_assert_int_eq(dataset_open(&b, bad, &o, NULL, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "outside [0, 10]"), "%s", err);
    dataset_free(&a);
}
END_TEST

START_TEST(jsonl_nul_and_bad_magic) {
    const char *dir = test_tmpdir("nul");
    char path[600], err[1024];
    snprintf(path, sizeof path, "%s/d.jsonl", dir);
    static const char text[] = "{\"input_ids\": [1, 2], \"loss_mask\": [0, 1]}\n{\"input_ids\": [1, 2\0, 3], \"loss_mask\": [0, 1, 1]}\n";
    FILE *f = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(text, 1, sizeof text - 1, f), sizeof text - 1);
    fclose(f);
    struct dataset ds;
    ck_assert_int_eq(dataset_load_jsonl(&ds, path, NULL, NULL, err, sizeof err), -1);
    char want[700];
    snprintf(want, sizeof want, "%s:2:20: malformed JSON: a NUL byte inside the line", path);
    ck_assert_str_eq(err, want);
    /* an index whose magic lost a byte: reported as a bad index magic, not as malformed JSON */
    char jpath[600], ipath[600];
    snprintf(jpath, sizeof jpath, "%s/r.jsonl", dir);
    snprintf(ipath, sizeof ipath, "%s/r.idx", dir);
    struct dataset a;
    make_random(jpath, 5, 3, &a);
    ck_assert_int_eq(dataset_write_index(&a, ipath, err, sizeof err), 0);
    dataset_free(&a);
    poke(ipath, 0, "XX", 2);
    ck_assert_int_eq(dataset_open(&ds, ipath, NULL, NULL, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "bad magic") && !strstr(err, "malformed JSON"), "%s", err);
    poke(ipath, 0, "DFLIDX\n\n", 8);
    ck_assert_int_eq(dataset_open(&ds, ipath, NULL, NULL, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "bad magic"), "%s", err);
}
END_TEST

/* A truncated index under a running reader: SIGBUS as before, but with a line naming the file. */
START_TEST(index_truncated_while_mapped) {
    const char *dir = test_tmpdir("bus");
    char jpath[600], ipath[600], err[512];
    snprintf(jpath, sizeof jpath, "%s/d.jsonl", dir);
    snprintf(ipath, sizeof ipath, "%s/d.idx", dir);
    struct dataset a;
    make_random(jpath, 400, 5, &a);
    ck_assert_int_eq(dataset_write_index(&a, ipath, err, sizeof err), 0);
    dataset_free(&a);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        struct dataset ds;
        if (dataset_open_index(&ds, ipath, 0, err, sizeof err) != 0) _exit(10);
        if (truncate(ipath, 8192) != 0) _exit(11);
        volatile int64_t sum = 0;
        for (uint64_t i = 0; i < ds.n_tokens; i++) sum += ds.tokens[i];
        _exit(12);   /* must not get here */
    }
    close(fds[1]);
    char out[2048];
    size_t n = 0;
    ssize_t k;
    while (n + 1 < sizeof out && (k = read(fds[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)k;
    out[n] = 0;
    close(fds[0]);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS, "child status 0x%x", st);
    ck_assert_msg(strstr(out, "SIGBUS reading") && strstr(out, ipath) && strstr(out, "truncated"), "stderr: %s", out);
}
END_TEST

START_TEST(hash_detects_changes) {
    uint8_t buf[1000];
    uint64_t s = 1;
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)test_rng_next(&s);
    uint64_t h0 = dataset_hash64(buf, sizeof buf, 0);
    ck_assert_uint_eq(h0, dataset_hash64(buf, sizeof buf, 0));
    ck_assert_uint_ne(h0, dataset_hash64(buf, sizeof buf, 1));
    ck_assert_uint_ne(h0, dataset_hash64(buf, sizeof buf - 1, 0));
    for (int i = 0; i < 1000; i += 37) {
        buf[i] ^= 4;
        ck_assert_uint_ne(h0, dataset_hash64(buf, sizeof buf, 0));
        buf[i] ^= 4;
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("dataset");
    TCase *tc = tcase_create("dataset");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, jsonl_good);
    tcase_add_test(tc, jsonl_bad_lines);
    tcase_add_test(tc, jsonl_skip_mode);
    tcase_add_test(tc, index_round_trip);
    tcase_add_test(tc, index_corrupt_rejected);
    tcase_add_test(tc, hash_detects_changes);
    tcase_add_test(tc, index_values_checked_without_verify);
    tcase_add_test(tc, jsonl_nul_and_bad_magic);
    tcase_add_test(tc, index_truncated_while_mapped);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
