/*
 * tests/test_tfevents.c — TensorBoard event files (stages/metrics/tfevents.h, issue 30 item 4): CRC32C against its
 * published check value; a written file read back record by record (both CRCs checked, every Event decoded with
 * protobuf-c: file_version first, then wall_time, step, tags and values exactly); a flipped byte and a torn tail
 * refused with the byte offset; the metrics sink writing every metric record beside metrics.jsonl; and
 * TensorBoard's own reader (tests/py/read_tfevents.py) finding the same scalars when python3 can import tensorboard
 * (skipped with a printed line otherwise).
 */
#include "testutil.h"

#include <dirent.h>
#include <sys/wait.h>

#include "core/bus.h"
#include "metrics/metrics_sink.h"
#include "metrics/tfevents.h"
#include "metrics/tfevents.pb-c.h"

static char err[512];

START_TEST(crc32c_check_value) {
    /* the CRC-32C check value (RFC 3720 B.4 / the CRC catalogue): "123456789" -> 0xe3069283 */
    ck_assert_uint_eq(tfevents_crc32c("123456789", 9), 0xe3069283u);
    ck_assert_uint_eq(tfevents_crc32c("", 0), 0);
    uint8_t zeros[32] = {0};
    ck_assert_uint_eq(tfevents_crc32c(zeros, 32), 0x8a9136aau);   /* RFC 3720 B.4: 32 bytes of zeros */
    uint32_t c = tfevents_crc32c("123456789", 9);
    ck_assert_uint_eq(tfevents_masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}
END_TEST

/* The whole file; the records' decoded events in ev[] (caller frees with tfevents__event__free_unpacked). */
static int read_events(const char *path, Tfevents__Event **ev, int max) {
    size_t len;
    char *buf = test_slurp(path, &len);
    ck_assert_msg(buf != NULL, "cannot read %s", path);
    size_t off = 0;
    const uint8_t *data;
    size_t dlen;
    int n = 0, rc;
    while ((rc = tfevents_read_record((const uint8_t *)buf, len, &off, &data, &dlen, err, sizeof err)) == 1) {
        ck_assert_int_lt(n, max);
        ev[n] = tfevents__event__unpack(NULL, dlen, data);
        ck_assert_msg(ev[n] != NULL, "record %d of %s is not an Event", n, path);
        n++;
    }
    ck_assert_msg(rc == 0, "%s: %s", path, err);
    free(buf);
    return n;
}

static const Tfevents__Summary__Value *value_of(const Tfevents__Event *e, const char *tag) {
    ck_assert_int_eq(e->what_case, TFEVENTS__EVENT__WHAT_SUMMARY);
    for (size_t i = 0; i < e->summary->n_value; i++)
        if (!strcmp(e->summary->value[i]->tag, tag)) return e->summary->value[i];
    return NULL;
}

START_TEST(write_and_read_back) {
    const char *dir = test_tmpdir("tfev");
    struct tfevents *w = tfevents_open(dir, err, sizeof err);
    ck_assert_msg(w != NULL, "%s", err);
    const char *tags[3] = {"loss", "eal", "lr"};
    for (int s = 0; s < 5; s++) {
        float v[3] = {5.0f - 0.5f * (float)s, 1.0f + 0.25f * (float)s, 3e-4f};
        ck_assert_msg(tfevents_add(w, 1796000000.25 + s, 10 * s, 3, tags, v, err, sizeof err) == 0, "%s", err);
        if (s == 2) ck_assert_int_eq(tfevents_flush(w, err, sizeof err), 0);
    }
    ck_assert_uint_eq(tfevents_records(w), 4);   /* file_version + 3 flushed */
    char path[1024];
    snprintf(path, sizeof path, "%s", tfevents_path(w));
    ck_assert_msg(strstr(path, "/events.out.tfevents."), "%s", path);
    tfevents_close(w);   /* flushes the rest */
    Tfevents__Event *ev[16];
    int n = read_events(path, ev, 16);
    ck_assert_int_eq(n, 6);
    ck_assert_int_eq(ev[0]->what_case, TFEVENTS__EVENT__WHAT_FILE_VERSION);
    ck_assert_str_eq(ev[0]->file_version, "brain.Event:2");
    ck_assert(ev[0]->wall_time > 1.5e9);
    for (int s = 0; s < 5; s++) {
        const Tfevents__Event *e = ev[1 + s];
        ck_assert_int_eq(e->step, 10 * s);
        ck_assert_double_eq(e->wall_time, 1796000000.25 + s);
        ck_assert_uint_eq(e->summary->n_value, 3);
        ck_assert_float_eq(value_of(e, "loss")->simple_value, 5.0f - 0.5f * (float)s);
        ck_assert_float_eq(value_of(e, "eal")->simple_value, 1.0f + 0.25f * (float)s);
        ck_assert_float_eq(value_of(e, "lr")->simple_value, 3e-4f);
    }
    for (int i = 0; i < n; i++) tfevents__event__free_unpacked(ev[i], NULL);

    /* corruption: a flipped data byte, a flipped length byte, a torn tail */
    size_t len;
    char *buf = test_slurp(path, &len);
    size_t off = 0;
    const uint8_t *data;
    size_t dlen;
    ck_assert_int_eq(tfevents_read_record((uint8_t *)buf, len, &off, &data, &dlen, err, sizeof err), 1);
    size_t second = off;
    buf[second + 14] ^= 0x10;
    ck_assert_int_eq(tfevents_read_record((uint8_t *)buf, len, &off, &data, &dlen, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "the data's CRC does not match") && off == second, "%s", err);
    buf[second + 14] ^= 0x10;
    buf[second + 1] ^= 0x01;
    ck_assert_int_eq(tfevents_read_record((uint8_t *)buf, len, &off, &data, &dlen, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "the length's CRC does not match"), "%s", err);
    buf[second + 1] ^= 0x01;
    off = second;
    ck_assert_int_eq(tfevents_read_record((uint8_t *)buf, second + 20, &off, &data, &dlen, err, sizeof err), -1);
    char want[64];
    snprintf(want, sizeof want, "byte %zu: a record of", second);
    ck_assert_msg(strstr(err, want), "%s", err);
    free(buf);
}
END_TEST

static void send_rec(struct msink *s, const char *stage, uint64_t step, int n, const char *const *k, const double *v) {
    struct bus_record r;
    memset(&r, 0, sizeof r);
    r.version = BUS_VERSION;
    r.kind = BUS_KIND_METRIC;
    snprintf(r.stage, sizeof r.stage, "%s", stage);
    r.pid = 4242;
    r.t = 1796000000.5 + (double)step;
    r.has_step = 1;
    r.step = step;
    for (int i = 0; i < n; i++) {
        snprintf(r.kv[i].name, BUS_NAME_MAX, "%s", k[i]);
        r.kv[i].value = v[i];
    }
    r.n_kv = n;
    void *buf;
    size_t len;
    ck_assert_msg(bus_encode(&r, &buf, &len, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(msink_handle(s, buf, len, 1.0, err, sizeof err), 0);
    free(buf);
}

/* The sink's event file after 4 trainer steps and 2 packer records. */
static void sink_run(const char *run, char *path, size_t cap) {
    struct msink_opts o = {.run_dir = run, .csv_stage = "dflash-train", .stall_s = 0, .progress_s = 0,
                           .plot_every_s = 0, .plot_timeout_s = 5, .gnuplot = "/nonexistent/gnuplot", .tty = 0};
    struct msink *s = msink_open(&o, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    const char *tk[4] = {"loss", "eal", "grad_norm", "tokens_per_s"};
    for (int st = 1; st <= 4; st++) {
        double v[4] = {4.0 / st, 1.0 + 0.125 * st, 0.5 * st, 1000.0 * st};
        send_rec(s, "dflash-train", (uint64_t)st, 4, tk, v);
        if (st == 2) {
            const char *pk[1] = {"batches"};
            double pv[1] = {7};
            send_rec(s, "dflash-pack", 2, 1, pk, pv);
            pv[0] = 9;
            send_rec(s, "dflash-pack", 3, 1, pk, pv);
        }
    }
    ck_assert_int_eq(msink_flush(s, err, sizeof err), 0);
    snprintf(path, cap, "%s", msink_tfevents_path(s));
    msink_close(s);
}

START_TEST(sink_writes_every_metric) {
    const char *run = test_tmpdir("tfev-sink");
    char path[1024];
    sink_run(run, path, sizeof path);
    char want[1024];
    snprintf(want, sizeof want, "%s/events.out.tfevents.", run);
    ck_assert_msg(!strncmp(path, want, strlen(want)), "%s is not in the run directory", path);
    Tfevents__Event *ev[16];
    int n = read_events(path, ev, 16);
    ck_assert_int_eq(n, 1 + 4 + 2);
    int train = 0, pack = 0;
    for (int i = 1; i < n; i++) {
        const Tfevents__Summary__Value *b = value_of(ev[i], "dflash-pack/batches");
        if (b) {
            ck_assert_float_eq(b->simple_value, ev[i]->step == 2 ? 7.0f : 9.0f);
            pack++;
            continue;
        }
        int st = (int)ev[i]->step;
        ck_assert_float_eq(value_of(ev[i], "loss")->simple_value, (float)(4.0 / st));
        ck_assert_float_eq(value_of(ev[i], "eal")->simple_value, (float)(1.0 + 0.125 * st));
        ck_assert_float_eq(value_of(ev[i], "grad_norm")->simple_value, (float)(0.5 * st));
        ck_assert_float_eq(value_of(ev[i], "tokens_per_s")->simple_value, (float)(1000.0 * st));
        ck_assert_double_eq(ev[i]->wall_time, 1796000000.5 + st);
        train++;
    }
    ck_assert_int_eq(train, 4);
    ck_assert_int_eq(pack, 2);
    for (int i = 0; i < n; i++) tfevents__event__free_unpacked(ev[i], NULL);
}
END_TEST

START_TEST(tensorboard_reads_it) {
    const char *py = getenv("DFLASH_PYTHON");
    if (!py || !*py) py = "python3";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s -c 'import tensorboard.backend.event_processing.event_accumulator' >/dev/null 2>&1",
             py);
    if (system(cmd) != 0) {
        printf("tensorboard_reads_it: SKIPPED: %s cannot import tensorboard (pip install tensorboard; or set "
               "DFLASH_PYTHON); the C reader above checks the same file\n", py);
        return;
    }
    const char *run = test_tmpdir("tfev-tb");
    char path[1024], script[1024];
    sink_run(run, path, sizeof path);
    snprintf(script, sizeof script, "tests/py/read_tfevents.py");
    if (access(script, R_OK) != 0) {
        const char *bin = getenv("DFLASH_BIN");
        snprintf(script, sizeof script, "%s/../../tests/py/read_tfevents.py", bin && *bin ? bin : "build/bin");
    }
    snprintf(cmd, sizeof cmd, "%s %s %s 2>/dev/null", py, script, run);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int rc = pclose(p);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s failed: %s", cmd, out);
    char want[4096];
    size_t w = 0;
    w += (size_t)snprintf(want + w, sizeof want - w, "dflash-pack/batches 2 7\ndflash-pack/batches 3 9\n");
    for (int st = 1; st <= 4; st++) w += (size_t)snprintf(want + w, sizeof want - w, "eal %d %.9g\n", st, (float)(1.0 + 0.125 * st));
    for (int st = 1; st <= 4; st++) w += (size_t)snprintf(want + w, sizeof want - w, "grad_norm %d %.9g\n", st, (float)(0.5 * st));
    for (int st = 1; st <= 4; st++) w += (size_t)snprintf(want + w, sizeof want - w, "loss %d %.9g\n", st, (float)(4.0 / st));
    for (int st = 1; st <= 4; st++)
        w += (size_t)snprintf(want + w, sizeof want - w, "tokens_per_s %d %.9g\n", st, (float)(1000.0 * st));
    ck_assert_msg(!strcmp(out, want), "TensorBoard read:\n%s\nexpected:\n%s", out, want);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tfevents");
    TCase *tc = tcase_create("tfevents");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, crc32c_check_value);
    tcase_add_test(tc, write_and_read_back);
    tcase_add_test(tc, sink_writes_every_metric);
    tcase_add_test(tc, tensorboard_reads_it);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
