/*
 * stages/metrics/metrics_sink.c — aggregation and outputs of dflash-metrics (metrics_sink.h).
 *
 * Sections: instances (per stage + pid aggregates), outputs (JSON lines, CSV), plots (gnuplot in a
 * child process group), progress and stalls, finish and summary.
 *
 * Invariants: metrics.jsonl and metrics.csv are only ever appended to (O_APPEND), except the one
 * atomic rewrite of metrics.csv when its header widens; a record is queued for metrics.jsonl only
 * after it decoded as valid; every instance with has_hb set is live until it sends a summary or
 * kill(pid, 0) says its process is gone.
 */
#include "metrics/metrics_sink.h"
#include "core/err.h"
#include "core/bus.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "metrics/tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_KIND_MSGS 16
#define RATE_SAMPLES 16
#define MAX_CSV_COLS 512    /* keeps the header under 64 KiB */

/* The plotted CSV columns and their titles. */
static const char *const plot_cols[] = {BUS_K_LOSS, BUS_K_EAL, BUS_K_TOKENS_PER_S};
static const char *const plot_titles[] = {"loss", "EAL (expected accepted length)", "tokens/s"};
#define N_PLOTS 3

struct inst {
    char stage[BUS_NAME_MAX];
    int64_t pid;
    uint64_t records;
    int have_seq;
    uint64_t first_seq, last_seq;
    uint64_t dropped_first, dropped_last;
    int has_hb, ended, gone;
    double items_in, items_out, busy_s, wait_s;
    int have_prev;
    double busy_frac;          /* smoothed busy share of the last heartbeats, -1 unknown */
    double tps;                /* tokens/s the stage's heartbeats report, NaN unknown */
    double last_move;          /* mono time items in/out last changed (or first seen) */
    char wait_on[BUS_TEXT_MAX];
};

struct msink {
    struct msink_opts o;
    char jsonl_path[PATH_MAX], csv_path[PATH_MAX];
    int jsonl_fd, csv_fd;
    struct tfevents *tb;       /* events.out.tfevents.* beside metrics.jsonl (metrics/tfevents.h) */
    int tb_fail_logged;
    char *jbuf;
    size_t jlen, jcap;

    char **cols;               /* CSV columns after step,t */
    int ncols;
    uint64_t csv_rows_new;     /* rows since the last plot */
    int csv_full_logged;

    struct inst *inst;
    int ninst;

    uint64_t records;
    uint64_t bad[MSINK_BAD_N];
    int bad_logged[MSINK_BAD_N];
    char *kind_msgs[MAX_KIND_MSGS];
    int n_kind_msgs;

    /* progress */
    int have_step;
    uint64_t step;
    double loss, eal, tps, total_steps;
    double rate_t[RATE_SAMPLES];
    uint64_t rate_step[RATE_SAMPLES];
    int rate_n, rate_head;
    double last_progress, last_gone_check;
    uint64_t records_at_progress;
    int progress_shown;

    /* stalls */
    double last_stall_warn;
    int stall_active;

    /* plots */
    pid_t plot_pid;
    double plot_started, last_plot;
    int plots_off, plot_fail_logged;
};

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;   /* retry: interrupted by a signal */
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Clear a \r progress line before a log line, so the two do not mix on a terminal. */
static void progress_clear(struct msink *s) {
    if (s->o.tty && s->progress_shown) {
        (void)write_all(2, "\r\033[K", 4);
        s->progress_shown = 0;
    }
}

/* ---------------------------------------------------------------- CSV */

/* CSV column names: the metric name with ',', '"' and control characters replaced by '_' (the
 * exact name stays in metrics.jsonl). */
static void csv_name(char *out, const char *name) {
    size_t i = 0;
    for (; i < BUS_NAME_MAX - 1 && name[i]; i++) {
        unsigned char c = (unsigned char)name[i];
        out[i] = (c == ',' || c == '"' || c < 0x20 || c == 0x7f) ? '_' : (char)c;
    }
    out[i] = 0;
}

static int csv_col_index(const struct msink *s, const char *cname) {
    for (int i = 0; i < s->ncols; i++)
        if (!strcmp(s->cols[i], cname)) return i;
    return -1;
}

static int csv_add_col(struct msink *s, const char *cname) {
    char **c = realloc(s->cols, sizeof *c * (size_t)(s->ncols + 1));
    if (!c) return -1;
    s->cols = c;
    if (!(c[s->ncols] = strdup(cname))) return -1;
    s->ncols++;
    return 0;
}

static size_t csv_header(const struct msink *s, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "step,t");
    for (int i = 0; i < s->ncols && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, ",%s", s->cols[i]);
    if (n < cap) n += (size_t)snprintf(out + n, cap - n, "\n");
    return n < cap ? n : cap;
}

/* Read back the header of an existing metrics.csv, and make sure the file ends with a newline (a
 * row torn by SIGKILL mid-write stays a short row instead of merging with the next one). */
static int csv_load(struct msink *s, char *err, int err_len) {
    struct stat st;
    if (fstat(s->csv_fd, &st) != 0) return err_fail(err, err_len, "fstat(%s) failed: %s", s->csv_path, strerror(errno));
    if (st.st_size == 0) return 0;
    char *text;
    size_t len;
    if (fs_read_file(s->csv_path, &text, &len, err, err_len)) return -1;
    int torn = text[len - 1] != '\n';
    char *nl = strchr(text, '\n');
    if (nl) *nl = 0;
    if (strncmp(text, "step,t", 6) || (text[6] && text[6] != ',')) {
        err_fail(err, err_len, "%s does not start with a 'step,t,...' header (found '%.60s'); move it away", s->csv_path, text);
        free(text);
        return -1;
    }
    for (char *p = text[6] ? text + 7 : NULL; p;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        if (*p && csv_col_index(s, p) < 0 && s->ncols < MAX_CSV_COLS && csv_add_col(s, p)) { free(text); return err_fail(err, err_len, "out of memory"); }
        p = comma ? comma + 1 : NULL;
    }
    free(text);
    if (torn && write_all(s->csv_fd, "\n", 1)) return err_fail(err, err_len, "write(%s) failed: %s", s->csv_path, strerror(errno));
    return 0;
}

/* A new column: rewrite the file once with the wider header and every old row padded. */
static int csv_widen(struct msink *s, int old_ncols, char *err, int err_len) {
    char *text = NULL;
    size_t len = 0;
    struct stat st;
    if (fstat(s->csv_fd, &st) != 0) return err_fail(err, err_len, "fstat(%s) failed: %s", s->csv_path, strerror(errno));
    if (st.st_size > 0 && fs_read_file(s->csv_path, &text, &len, err, err_len)) return -1;
    int add = s->ncols - old_ncols;
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    size_t cap = len + (lines + 2) * (size_t)add + 65536 + (size_t)s->ncols * BUS_NAME_MAX;
    char *out = malloc(cap);
    if (!out) { free(text); return err_fail(err, err_len, "out of memory rewriting %s", s->csv_path); }
    size_t n = csv_header(s, out, cap);
    char *p = text ? strchr(text, '\n') : NULL;   /* skip the old header */
    if (p) p++;
    while (p && *p) {
        char *e = strchr(p, '\n');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        memcpy(out + n, p, l);
        n += l;
        for (int i = 0; i < add; i++) out[n++] = ',';
        out[n++] = '\n';
        p = e ? e + 1 : NULL;
    }
    free(text);
    int rc = fs_write_atomic(s->csv_path, out, n, err, err_len);
    free(out);
    if (rc) return -1;
    /* the old fd points at the replaced inode: reopen */
    int fd = open(s->csv_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, (mode_t)fs_file_mode());
    if (fd < 0) return err_fail(err, err_len, "open(%s) failed: %s", s->csv_path, strerror(errno));
    close(s->csv_fd);
    s->csv_fd = fd;
    return 0;
}

static int csv_row(struct msink *s, const struct bus_record *r, char *err, int err_len) {
    int old = s->ncols;
    int idx[BUS_MAX_KV];
    for (int i = 0; i < r->n_kv; i++) {
        char cname[BUS_NAME_MAX];
        csv_name(cname, r->kv[i].name);
        idx[i] = csv_col_index(s, cname);
        if (idx[i] < 0 && s->ncols < MAX_CSV_COLS) {
            if (csv_add_col(s, cname)) return err_fail(err, err_len, "out of memory");
            idx[i] = s->ncols - 1;
        } else if (idx[i] < 0 && !s->csv_full_logged) {
            s->csv_full_logged = 1;
            progress_clear(s);
            log_warn("metrics.csv already has %d metric columns; '%s' and later new names go to metrics.jsonl only",
                     MAX_CSV_COLS, cname);
        }
    }
    struct stat st;
    if (fstat(s->csv_fd, &st) != 0) return err_fail(err, err_len, "fstat(%s) failed: %s", s->csv_path, strerror(errno));
    if (st.st_size == 0) {
        char hdr[65536];
        size_t n = csv_header(s, hdr, sizeof hdr);
        if (write_all(s->csv_fd, hdr, n)) return err_fail(err, err_len, "write(%s) failed: %s", s->csv_path, strerror(errno));
    } else if (s->ncols != old) {
        if (csv_widen(s, old, err, err_len)) return -1;
        progress_clear(s);
        log_info("metrics.csv: header now has %d metric columns", s->ncols);
    }
    double *vals = malloc(sizeof *vals * (size_t)(s->ncols + 1));
    char *row = malloc((size_t)s->ncols * 32 + 128);
    if (!vals || !row) { free(vals); free(row); return err_fail(err, err_len, "out of memory"); }
    for (int i = 0; i < s->ncols; i++) vals[i] = NAN;
    for (int i = 0; i < r->n_kv; i++)
        if (idx[i] >= 0) vals[idx[i]] = r->kv[i].value;
    size_t n = (size_t)sprintf(row, fabs(r->t) < 1e12 ? "%llu,%.6f" : "%llu,%.6g", (unsigned long long)r->step, r->t);
    for (int i = 0; i < s->ncols; i++) {
        row[n++] = ',';
        if (isfinite(vals[i])) n += (size_t)sprintf(row + n, "%.9g", vals[i]);   /* empty cell: absent or NaN/inf */
    }
    row[n++] = '\n';
    int rc = write_all(s->csv_fd, row, n);
    free(vals);
    free(row);
    if (rc) return err_fail(err, err_len, "write(%s) failed: %s", s->csv_path, strerror(errno));
    s->csv_rows_new++;
    return 0;
}

/* ---------------------------------------------------------------- JSON lines */

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }   /* JSON has no NaN */

/* jansson refuses invalid UTF-8; the decoder does not check it, so such bytes become '?'. */
static char *ascii_copy(const char *s) {
    char *c = strdup(s);
    for (char *p = c; p && *p; p++)
        if ((unsigned char)*p >= 0x80) *p = '?';
    return c;
}
static json_t *jstr(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    char *c = ascii_copy(s);
    j = json_string(c ? c : "");
    free(c);
    return j;
}
static void jset(json_t *o, const char *key, json_t *v) {
    if (json_object_set(o, key, v)) {
        char *c = ascii_copy(key);
        if (c) json_object_set(o, c, v);
        free(c);
    }
    json_decref(v);
}

static int queue_json(struct msink *s, const struct bus_record *r) {
    json_t *o = json_object();
    if (!o) return -1;
    json_object_set_new(o, "v", json_integer(r->version));
    json_object_set_new(o, "kind", json_string(bus_kind_name(r->kind)));
    json_object_set_new(o, "stage", jstr(r->stage));
    json_object_set_new(o, "pid", json_integer(r->pid));
    json_object_set_new(o, "t", json_real(r->t));
    if (r->has_seq) json_object_set_new(o, "seq", json_integer((json_int_t)r->seq));
    if (r->has_step) json_object_set_new(o, "step", json_integer((json_int_t)r->step));
    json_object_set_new(o, "dropped", json_integer((json_int_t)r->dropped));
    if (r->kind == BUS_KIND_EVENT) {
        json_object_set_new(o, "name", jstr(r->name));
        json_object_set_new(o, "text", jstr(r->text));
    }
    if (r->has_wait_on) json_object_set_new(o, "wait_on", jstr(r->wait_on));
    for (int i = 0; i < r->n_kv; i++) jset(o, r->kv[i].name, num(r->kv[i].value));
    char *line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    if (!line) return -1;
    size_t l = strlen(line);
    if (s->jlen + l + 1 > s->jcap) {
        size_t cap = (s->jcap ? s->jcap * 2 : 65536);
        while (cap < s->jlen + l + 1) cap *= 2;
        char *b = realloc(s->jbuf, cap);
        if (!b) { free(line); return -1; }
        s->jbuf = b;
        s->jcap = cap;
    }
    memcpy(s->jbuf + s->jlen, line, l);
    s->jbuf[s->jlen + l] = '\n';
    s->jlen += l + 1;
    free(line);
    return 0;
}

/* Every metric record as one TensorBoard event: tag = the metric's name for the main stage (the trainer's loss,
 * eal, lr, ... as TensorBoard's top-level charts), <stage>/<name> for the others; step = the record's step. */
static void queue_tfevent(struct msink *s, const struct bus_record *r) {
    if (!s->tb || r->kind != BUS_KIND_METRIC || r->n_kv < 1) return;
    char tags[BUS_MAX_KV][2 * BUS_NAME_MAX + 2];
    const char *tp[BUS_MAX_KV];
    float v[BUS_MAX_KV];
    int main_stage = !strcmp(r->stage, s->o.csv_stage);
    for (int i = 0; i < r->n_kv; i++) {
        if (main_stage)
            snprintf(tags[i], sizeof tags[i], "%s", r->kv[i].name);
        else
            snprintf(tags[i], sizeof tags[i], "%s/%s", r->stage, r->kv[i].name);
        tp[i] = tags[i];
        v[i] = (float)r->kv[i].value;
    }
    char err[256];
    if (tfevents_add(s->tb, r->t, r->has_step ? (int64_t)r->step : (int64_t)s->records, r->n_kv, tp, v, err,
                     sizeof err) && !s->tb_fail_logged) {
        s->tb_fail_logged = 1;
        progress_clear(s);
        log_warn("%s", err);
    }
}

int msink_flush(struct msink *s, char *err, int err_len) {
    if (s && s->tb && tfevents_flush(s->tb, err, err_len)) return -1;
    if (!s || !s->jlen) return 0;
    int rc = write_all(s->jsonl_fd, s->jbuf, s->jlen);
    s->jlen = 0;
    if (rc) return err_fail(err, err_len, "write(%s) failed: %s", s->jsonl_path, strerror(errno));
    return 0;
}

/* ---------------------------------------------------------------- open / close */

struct msink *msink_open(const struct msink_opts *o, char *err, int err_len) {
    if (!o || !o->run_dir) { err_fail(err, err_len, "msink_open: no run directory"); return NULL; }
    struct msink *s = calloc(1, sizeof *s);
    if (!s) { err_fail(err, err_len, "out of memory"); return NULL; }
    s->o = *o;
    if (!s->o.csv_stage) s->o.csv_stage = "dflash-train";
    if (!s->o.gnuplot) s->o.gnuplot = "gnuplot";
    if (s->o.plot_timeout_s <= 0) s->o.plot_timeout_s = 20;
    s->jsonl_fd = s->csv_fd = -1;
    s->loss = s->eal = s->tps = s->total_steps = NAN;
    s->last_plot = s->last_progress = s->last_gone_check = time_mono_s();
    char plots[PATH_MAX];
    if (run_path(s->jsonl_path, sizeof s->jsonl_path, o->run_dir, "metrics.jsonl") ||
        run_path(s->csv_path, sizeof s->csv_path, o->run_dir, "metrics.csv") ||
        run_path(plots, sizeof plots, o->run_dir, "plots")) {
        err_fail(err, err_len, "run directory path too long: %s", o->run_dir);
        goto fail;
    }
    if (fs_mkdir_p(plots, err, err_len)) goto fail;
    /* O_APPEND and never O_TRUNC: a restarted sink continues the same files. */
    s->jsonl_fd = open(s->jsonl_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, (mode_t)fs_file_mode());
    if (s->jsonl_fd < 0) { err_fail(err, err_len, "open(%s) failed: %s", s->jsonl_path, strerror(errno)); goto fail; }
    s->csv_fd = open(s->csv_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, (mode_t)fs_file_mode());
    if (s->csv_fd < 0) { err_fail(err, err_len, "open(%s) failed: %s", s->csv_path, strerror(errno)); goto fail; }
    if (csv_load(s, err, err_len)) goto fail;
    if (!(s->tb = tfevents_open(o->run_dir, err, err_len))) goto fail;
    /* a metrics.jsonl line torn by an old SIGKILL mid-write must not glue onto our first line */
    struct stat st;
    if (fstat(s->jsonl_fd, &st) == 0 && st.st_size > 0) {
        int rfd = open(s->jsonl_path, O_RDONLY | O_CLOEXEC);
        char last = '\n';
        if (rfd >= 0) {
            if (pread(rfd, &last, 1, st.st_size - 1) != 1) last = '\n';
            close(rfd);
        }
        if (last != '\n' && write_all(s->jsonl_fd, "\n", 1)) { err_fail(err, err_len, "write(%s) failed: %s", s->jsonl_path, strerror(errno)); goto fail; }
    }
    return s;
fail:
    msink_close(s);
    return NULL;
}

static void plot_kill(struct msink *s) {
    if (s->plot_pid > 0) {
        kill(-s->plot_pid, SIGKILL);
        kill(s->plot_pid, SIGKILL);
        waitpid(s->plot_pid, NULL, 0);
        s->plot_pid = 0;
    }
}

void msink_close(struct msink *s) {
    if (!s) return;
    char err[256];
    if (s->jsonl_fd >= 0 && msink_flush(s, err, sizeof err)) log_warn("%s", err);
    plot_kill(s);
    if (s->jsonl_fd >= 0) close(s->jsonl_fd);
    if (s->csv_fd >= 0) close(s->csv_fd);
    tfevents_close(s->tb);
    for (int i = 0; i < s->ncols; i++) free(s->cols[i]);
    for (int i = 0; i < s->n_kind_msgs; i++) free(s->kind_msgs[i]);
    free(s->cols);
    free(s->inst);
    free(s->jbuf);
    free(s);
}

/* ---------------------------------------------------------------- instances */

static struct inst *inst_get(struct msink *s, const char *stage, int64_t pid, double now) {
    for (int i = 0; i < s->ninst; i++)
        if (s->inst[i].pid == pid && !strcmp(s->inst[i].stage, stage)) return &s->inst[i];
    struct inst *n = realloc(s->inst, sizeof *n * (size_t)(s->ninst + 1));
    if (!n) return NULL;
    s->inst = n;
    struct inst *in = &n[s->ninst++];
    memset(in, 0, sizeof *in);
    snprintf(in->stage, sizeof in->stage, "%s", stage);
    in->pid = pid;
    in->busy_frac = -1;
    in->tps = NAN;
    in->last_move = now;
    return in;
}

static void inst_update(struct inst *in, const struct bus_record *r, double now) {
    in->records++;
    if (r->has_seq) {
        if (!in->have_seq) { in->first_seq = r->seq; in->dropped_first = r->dropped; in->have_seq = 1; }
        in->last_seq = r->seq;
    }
    in->dropped_last = r->dropped;
    if (r->kind == BUS_KIND_HEARTBEAT || r->kind == BUS_KIND_SUMMARY) {
        double it_in = bus_record_get(r, BUS_K_ITEMS_IN, in->items_in);
        double it_out = bus_record_get(r, BUS_K_ITEMS_OUT, in->items_out);
        double busy = bus_record_get(r, BUS_K_BUSY_S, in->busy_s);
        double wait = bus_record_get(r, BUS_K_WAIT_S, in->wait_s);
        if (it_in != in->items_in || it_out != in->items_out) in->last_move = now;
        double db = busy - in->busy_s, dw = wait - in->wait_s;
        if (in->have_prev && db >= 0 && dw >= 0 && db + dw > 0) {
            double f = db / (db + dw);
            in->busy_frac = in->busy_frac < 0 ? f : 0.7 * in->busy_frac + 0.3 * f;
        } else if (busy + wait > 0 && in->busy_frac < 0) {
            in->busy_frac = busy / (busy + wait);
        }
        in->tps = bus_record_get(r, BUS_K_TOKENS_PER_S, in->tps);
        in->items_in = it_in;
        in->items_out = it_out;
        in->busy_s = busy;
        in->wait_s = wait;
        in->have_prev = 1;
        if (r->kind == BUS_KIND_HEARTBEAT) {
            if (!in->has_hb) in->last_move = now;
            in->has_hb = 1;
            snprintf(in->wait_on, sizeof in->wait_on, "%s", r->wait_on);
        } else {
            in->ended = 1;
            in->wait_on[0] = 0;
        }
    }
}

static void progress_update(struct msink *s, const struct bus_record *r) {
    /* step, loss, EAL and tokens/s come from the main stage's metrics (--csv-stage, the trainer) */
    if (r->kind == BUS_KIND_METRIC && !strcmp(r->stage, s->o.csv_stage)) {
        if (!s->have_step || r->step >= s->step) { s->step = r->step; s->have_step = 1; }
        double v;
        if (!isnan(v = bus_record_get(r, BUS_K_LOSS, NAN))) s->loss = v;
        if (!isnan(v = bus_record_get(r, BUS_K_EAL, NAN))) s->eal = v;
        if (!isnan(v = bus_record_get(r, BUS_K_TOKENS_PER_S, NAN))) s->tps = v;
    }
    double total = bus_record_get(r, BUS_K_TOTAL_STEPS, NAN);
    if (isfinite(total) && total > 0) s->total_steps = total;
}

static void log_bad(struct msink *s, int rc, const char *why) {
    int cls = rc == BUS_EVERSION ? MSINK_BAD_VERSION : rc == BUS_EKIND ? MSINK_BAD_KIND : MSINK_BAD_MALFORMED;
    s->bad[cls]++;
    if (cls == MSINK_BAD_KIND) {
        /* once per distinct unknown kind (the sentence names it) */
        for (int i = 0; i < s->n_kind_msgs; i++)
            if (!strcmp(s->kind_msgs[i], why)) return;
        if (s->n_kind_msgs == MAX_KIND_MSGS) return;
        s->kind_msgs[s->n_kind_msgs++] = strdup(why);
    } else {
        if (s->bad_logged[cls]) return;
        s->bad_logged[cls] = 1;
    }
    progress_clear(s);
    log_warn("ignoring a bad metrics record (%s; further ones of this class are only counted): %s",
             cls == MSINK_BAD_VERSION ? "wrong version" : cls == MSINK_BAD_KIND ? "unknown kind" : "malformed", why);
}

int msink_handle(struct msink *s, const void *buf, size_t len, double now, char *err, int err_len) {
    struct bus_record *r = malloc(sizeof *r);
    if (!r) {
        err_fail(err, err_len, "out of memory");
        return -100;
    }
    char why[256];
    int rc = bus_decode(buf, len, r, why, sizeof why);
    if (rc < 0) {
        log_bad(s, rc, why);
        free(r);
        return rc;
    }
    s->records++;
    struct inst *in = inst_get(s, r->stage, r->pid, now);
    if (in) inst_update(in, r, now);
    progress_update(s, r);
    if (queue_json(s, r)) {
        /* only allocation can fail here; the record is counted but not written */
        progress_clear(s);
        log_warn("could not render a %s record of %s as JSON (out of memory)", bus_kind_name(r->kind), r->stage);
    }
    queue_tfevent(s, r);
    rc = 0;
    if (r->kind == BUS_KIND_METRIC && !strcmp(r->stage, s->o.csv_stage) && csv_row(s, r, err, err_len)) rc = -100;
    free(r);
    return rc;
}

/* ---------------------------------------------------------------- plots */

/* Runs in the plot child (its own process group): one gnuplot per plot, so a plot without data
 * does not stop the others; each png is drawn to a .tmp and renamed only when gnuplot succeeded,
 * so a reader never sees a half-written image. Only async-signal-safe calls (we forked a
 * multithreaded process). Exit 127: gnuplot could not be run. */
static void plot_child(const char *run_dir, const char *gnuplot, char scripts[][32], char tmps[][40],
                       char pngs[][40], int n) {
    /* Every inherited descriptor closed, the sink's listening socket among them: a plotter that outlives a
     * SIGKILLed sink (its own process group) kept that socket answering, and the restarted sink refused to bind
     * ("another dflash-metrics is already bound"; issue 24: a sink is restarted like any stage). */
    closefrom(3);
    if (chdir(run_dir) != 0) _exit(126);
    int fails = 0;
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) _exit(125);
        if (p == 0) {
            int fd = open("logs/gnuplot.log", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, (mode_t)fs_file_mode());
            int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (nul >= 0) dup2(nul, 0);
            if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); }
            execl(gnuplot, gnuplot, scripts[i], (char *)NULL);
            _exit(127);
        }
        int st = 0;
        while (waitpid(p, &st, 0) < 0 && errno == EINTR) {}
        if (WIFEXITED(st) && WEXITSTATUS(st) == 127) _exit(127);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0 && rename(tmps[i], pngs[i]) == 0) continue;
        fails++;
    }
    _exit(fails ? 1 : 0);
}

/* Resolve the gnuplot program in PATH here, so the forked child needs only execl (execvp is not
 * async-signal-safe). Returns 0 with the path in out, or -1 when it cannot be found. */
static int find_program(const char *prog, char *out, size_t cap) {
    if (strchr(prog, '/')) {
        snprintf(out, cap, "%s", prog);
        return access(out, X_OK);
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t l = strcspn(path, ":");
        if ((size_t)snprintf(out, cap, "%.*s/%s", (int)l, path, prog) < cap && access(out, X_OK) == 0) return 0;
        path += l;
        if (*path == ':') path++;
    }
    return -1;
}

static void plot_start(struct msink *s, double now) {
    if (s->plots_off || s->plot_pid > 0) return;
    char prog[PATH_MAX];
    if (find_program(s->o.gnuplot, prog, sizeof prog)) {
        s->plots_off = 1;
        progress_clear(s);
        log_warn("plots: cannot find '%s' (is gnuplot-nox installed?); no plots this run", s->o.gnuplot);
        return;
    }
    char scripts[N_PLOTS][32], tmps[N_PLOTS][40], pngs[N_PLOTS][40];
    int n = 0;
    for (int i = 0; i < N_PLOTS; i++) {
        if (csv_col_index(s, plot_cols[i]) < 0) continue;
        snprintf(scripts[n], sizeof scripts[n], "plots/%s.gp", plot_cols[i]);
        snprintf(tmps[n], sizeof tmps[n], "plots/%s.png.tmp", plot_cols[i]);
        snprintf(pngs[n], sizeof pngs[n], "plots/%s.png", plot_cols[i]);
        char path[PATH_MAX], text[2048], err[256];
        int l = snprintf(text, sizeof text,
                         "# written by dflash-metrics: %s over training steps, from metrics.csv\n"
                         "set datafile separator ','\n"
                         "set datafile columnheaders\n"
                         "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1000,540 } "
                         "else { set terminal png size 1000,540 }\n"
                         "set output '%s'\n"
                         "set title '%s'\nset xlabel 'step'\nset grid\nset key off\n"
                         "plot 'metrics.csv' using (column('step')):(column('%s')) with lines lw 2\n",
                         plot_cols[i], tmps[n], plot_titles[i], plot_cols[i]);
        if (run_path(path, sizeof path, s->o.run_dir, scripts[n]) ||
            fs_write_atomic(path, text, (size_t)l, err, sizeof err)) {
            progress_clear(s);
            log_warn("plots: cannot write %s: %s", scripts[n], err);
            return;
        }
        n++;
    }
    s->last_plot = now;
    s->csv_rows_new = 0;
    if (!n) return;
    pid_t p = fork();
    if (p < 0) {
        progress_clear(s);
        log_warn("plots: fork failed: %s", strerror(errno));
        return;
    }
    if (p == 0) {
        setpgid(0, 0);
        plot_child(s->o.run_dir, prog, scripts, tmps, pngs, n);
    }
    setpgid(p, p);   /* also here: whichever runs first, the group exists before we may kill it */
    s->plot_pid = p;
    s->plot_started = now;
}

/* Reap a finished plot child (block: wait for it up to the timeout). */
static void plot_reap(struct msink *s, double now, int block) {
    if (s->plot_pid <= 0) return;
    int st;
    for (;;) {
        pid_t r = waitpid(s->plot_pid, &st, WNOHANG);
        if (r == s->plot_pid) break;
        if (r < 0 && errno != EINTR) { s->plot_pid = 0; return; }
        if (now - s->plot_started > s->o.plot_timeout_s) {
            progress_clear(s);
            log_warn("plots: gnuplot ran longer than %.0f s; killed", s->o.plot_timeout_s);
            plot_kill(s);
            return;
        }
        if (!block) return;
        usleep(20000);
        now = time_mono_s();
    }
    s->plot_pid = 0;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127) {
        s->plots_off = 1;
        progress_clear(s);
        log_warn("plots: cannot run '%s' (is gnuplot-nox installed?); no plots this run", s->o.gnuplot);
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (!s->plot_fail_logged) {
            progress_clear(s);
            log_warn("plots: gnuplot failed (exit status %d); see logs/gnuplot.log", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        }
        s->plot_fail_logged = 1;
    }
}

/* ---------------------------------------------------------------- progress and stalls */

static int inst_live(const struct inst *in) { return in->has_hb && !in->ended && !in->gone; }

int msink_done(const struct msink *s) {
    int any = 0;
    for (int i = 0; i < s->ninst; i++) {
        if (!s->inst[i].has_hb && !s->inst[i].ended) continue;
        any = 1;
        if (inst_live(&s->inst[i])) return 0;
    }
    return any;
}

int msink_stalled(const struct msink *s, double now, char *report, size_t report_len) {
    if (s->o.stall_s <= 0) return 0;
    double last = -1;
    int live = 0;
    for (int i = 0; i < s->ninst; i++) {
        if (!inst_live(&s->inst[i])) continue;
        live++;
        if (s->inst[i].last_move > last) last = s->inst[i].last_move;
    }
    if (!live || now - last < s->o.stall_s) return 0;
    if (report && report_len) {
        size_t n = (size_t)snprintf(report, report_len, "no stage moved an item for %.0f s:", now - last);
        int k = 0;
        for (int i = 0; i < s->ninst && n < report_len; i++) {
            const struct inst *in = &s->inst[i];
            if (!inst_live(in)) continue;
            n += (size_t)snprintf(report + n, report_len - n, "%s %s[%lld] %s (in %.0f, out %.0f)", k++ ? ";" : "",
                                  in->stage, (long long)in->pid, in->wait_on[0] ? in->wait_on : "says it is not waiting",
                                  in->items_in, in->items_out);
        }
    }
    return 1;
}

static void fmt_rate(char *out, size_t cap, double v) {
    if (!isfinite(v)) snprintf(out, cap, "-");
    else if (v >= 1e6) snprintf(out, cap, "%.2fM", v / 1e6);
    else if (v >= 1e3) snprintf(out, cap, "%.1fk", v / 1e3);
    else snprintf(out, cap, "%.1f", v);
}

static void fmt_eta(char *out, size_t cap, double sec) {
    if (!isfinite(sec) || sec < 0) { snprintf(out, cap, "-"); return; }
    long s = (long)(sec + 0.5);
    if (s >= 3600) snprintf(out, cap, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else snprintf(out, cap, "%ldm%02lds", s / 60, s % 60);
}

static void progress_line(struct msink *s, double now, char *line, size_t cap) {
    /* steps per second over the last RATE_SAMPLES progress periods */
    if (s->have_step) {
        s->rate_t[s->rate_head] = now;
        s->rate_step[s->rate_head] = s->step;
        s->rate_head = (s->rate_head + 1) % RATE_SAMPLES;
        if (s->rate_n < RATE_SAMPLES) s->rate_n++;
    }
    double eta = NAN;
    if (s->rate_n >= 2 && isfinite(s->total_steps)) {
        int oldest = (s->rate_head - s->rate_n + RATE_SAMPLES) % RATE_SAMPLES;
        double dt = now - s->rate_t[oldest];
        double ds = (double)s->step - (double)s->rate_step[oldest];
        if (dt > 0 && ds > 0) eta = (s->total_steps - (double)s->step) / (ds / dt);
    }
    const struct inst *slow = NULL;
    int live = 0;
    for (int i = 0; i < s->ninst; i++) {
        if (!inst_live(&s->inst[i])) continue;
        live++;
        if (s->inst[i].busy_frac >= 0 && (!slow || s->inst[i].busy_frac > slow->busy_frac)) slow = &s->inst[i];
    }
    /* Until a trainer reports tokens/s, the pipeline's rate is that of its slowest live stage. */
    double rate = s->tps;
    if (isnan(rate))
        for (int i = 0; i < s->ninst; i++)
            if (inst_live(&s->inst[i]) && isfinite(s->inst[i].tps) && s->inst[i].tps > 0 && !(s->inst[i].tps >= rate))
                rate = s->inst[i].tps;
    char tps[32], etas[32], step[64], slowest[BUS_NAME_MAX + 32], loss[32], eal[32];
    fmt_rate(tps, sizeof tps, rate);
    if (isnan(s->loss)) snprintf(loss, sizeof loss, "-"); else snprintf(loss, sizeof loss, "%.4g", s->loss);
    if (isnan(s->eal)) snprintf(eal, sizeof eal, "-"); else snprintf(eal, sizeof eal, "%.3g", s->eal);
    fmt_eta(etas, sizeof etas, eta);
    if (!s->have_step) snprintf(step, sizeof step, "-");
    else if (isfinite(s->total_steps)) snprintf(step, sizeof step, "%llu/%.0f", (unsigned long long)s->step, s->total_steps);
    else snprintf(step, sizeof step, "%llu", (unsigned long long)s->step);
    if (slow) snprintf(slowest, sizeof slowest, "%s %.0f%% busy", slow->stage, 100 * slow->busy_frac);
    else snprintf(slowest, sizeof slowest, "-");
    snprintf(line, cap, "step %s | %s tok/s | loss %s | EAL %s | ETA %s | slowest %s | %d live stage%s, %llu records",
             step, tps, loss, eal, etas, slowest, live, live == 1 ? "" : "s", (unsigned long long)s->records);
}

void msink_progress(struct msink *s, double now, char *line, size_t cap) { progress_line(s, now, line, cap); }

void msink_tick(struct msink *s, double now) {
    if (now - s->last_gone_check >= 1.0) {
        s->last_gone_check = now;
        for (int i = 0; i < s->ninst; i++) {
            struct inst *in = &s->inst[i];
            if (!inst_live(in)) continue;
            if (kill((pid_t)in->pid, 0) < 0 && errno == ESRCH) {
                in->gone = 1;
                progress_clear(s);
                log_info("%s[%lld] is gone without a summary (last seq %llu)", in->stage, (long long)in->pid,
                         (unsigned long long)in->last_seq);
            }
        }
    }
    char report[4096];
    if (msink_stalled(s, now, report, sizeof report)) {
        if (!s->stall_active || now - s->last_stall_warn >= s->o.stall_s) {
            progress_clear(s);
            log_warn("stall: %s", report);
            s->last_stall_warn = now;
        }
        s->stall_active = 1;
    } else if (s->stall_active) {
        s->stall_active = 0;
        progress_clear(s);
        log_info("stall over: items moved again, or the stalled stages ended");
    }
    if (s->o.progress_s > 0 && now - s->last_progress >= s->o.progress_s) {
        s->last_progress = now;
        char line[1024];
        if (s->o.tty) {
            progress_line(s, now, line, sizeof line);
            char out[1100];
            int n = snprintf(out, sizeof out, "\r\033[K%s", line);
            (void)write_all(2, out, (size_t)n);
            s->progress_shown = 1;
        } else if (s->records != s->records_at_progress) {
            /* plain lines only when something arrived, so an idle sink does not fill its log */
            progress_line(s, now, line, sizeof line);
            log_info("progress: %s", line);
        }
        s->records_at_progress = s->records;
    }
    plot_reap(s, now, 0);
    if (s->o.plot_every_s > 0 && s->csv_rows_new && now - s->last_plot >= s->o.plot_every_s) plot_start(s, now);
}

/* ---------------------------------------------------------------- finish */

void msink_finish(struct msink *s, double now, const char *why) {
    char err[256];
    progress_clear(s);
    log_info("finishing (%s) after %llu records", why ? why : "asked to", (unsigned long long)s->records);
    if (msink_flush(s, err, sizeof err)) log_warn("%s", err);
    plot_reap(s, now, 1);
    if (s->csv_rows_new) plot_start(s, now);
    plot_reap(s, time_mono_s(), 1);
    log_info("summary: %-24s %8s %8s %10s %10s %6s %6s %8s %6s %s", "stage", "pid", "records", "items_in", "items_out",
             "busy%", "wait%", "dropped", "lost", "state");
    for (int i = 0; i < s->ninst; i++) {
        const struct inst *in = &s->inst[i];
        double tot = in->busy_s + in->wait_s;
        /* lost: seq numbers this sink never saw that the sender did not count as dropped either */
        long long lost = 0;
        if (in->have_seq)
            lost = (long long)(in->last_seq - in->first_seq + 1) - (long long)in->records -
                   (long long)(in->dropped_last - in->dropped_first);
        if (lost < 0) lost = 0;
        log_info("summary: %-24s %8lld %8llu %10.0f %10.0f %6.1f %6.1f %8llu %6lld %s", in->stage, (long long)in->pid,
                 (unsigned long long)in->records, in->items_in, in->items_out, tot > 0 ? 100 * in->busy_s / tot : 0.0,
                 tot > 0 ? 100 * in->wait_s / tot : 0.0, (unsigned long long)in->dropped_last, lost,
                 in->ended ? "ended" : in->gone ? "gone" : in->has_hb ? "running" : "no-heartbeat");
    }
    log_info("summary: %llu records; bad records ignored: %llu malformed, %llu wrong version, %llu unknown kind",
             (unsigned long long)s->records, (unsigned long long)s->bad[MSINK_BAD_MALFORMED],
             (unsigned long long)s->bad[MSINK_BAD_VERSION], (unsigned long long)s->bad[MSINK_BAD_KIND]);
}

const char *msink_tfevents_path(const struct msink *s) { return s->tb ? tfevents_path(s->tb) : NULL; }

uint64_t msink_records(const struct msink *s) { return s->records; }
uint64_t msink_bad_count(const struct msink *s, enum msink_bad which) {
    return (unsigned)which < MSINK_BAD_N ? s->bad[which] : 0;
}
int msink_n_instances(const struct msink *s) { return s->ninst; }
int msink_csv_ncols(const struct msink *s) { return s->ncols; }
const char *msink_csv_col(const struct msink *s, int i) { return i >= 0 && i < s->ncols ? s->cols[i] : NULL; }
