/*
 * stages/metrics/metrics_sink.h — what dflash-metrics does with the records it pulls off the bus,
 * as a module the tests drive directly (the binary stages/dflash-metrics.c only owns the socket,
 * the flags and the loop).
 *
 * For every valid record (bus_decode): append it as one JSON line to <run>/metrics.jsonl, update
 * the per-stage-instance aggregates (stage + pid: records, seq gaps, reported drops, cumulative
 * items in/out, busy/wait seconds, what it waits on, ended/gone), and for metric records of the
 * CSV stage (the trainer) append one row to <run>/metrics.csv. Malformed records and unknown
 * kinds are counted and logged once per class (once per distinct unknown kind), never fatal.
 *
 * Files are opened with O_APPEND and never truncated, so a sink killed with SIGKILL and started
 * again keeps appending. JSON lines are buffered only between msink_handle and msink_flush (the
 * caller flushes after each burst it drained from the socket); each flush is one write(). The CSV
 * header is the union of metric names seen: it is read back from an existing file on open, and
 * when a new name appears the file is rewritten once, atomically, with the wider header and the
 * old rows padded (fs_write_atomic), so the file always has exactly one consistent header.
 *
 * TensorBoard: every metric record (any stage) also becomes one event in <run>/events.out.tfevents.<sec>.<host>.<pid>.<n>
 * (metrics/tfevents.h; a new file per sink start), tag = the metric's name for csv_stage, <stage>/<name> otherwise,
 * flushed with metrics.jsonl; `tensorboard --logdir <run>` reads it.
 *
 * Plots: plots/{loss,eal,tokens_per_s}.png drawn from metrics.csv by gnuplot, run as a child
 * process (never waited on in the loop; killed after plot_timeout_s); a missing gnuplot is one
 * warning and plots are off. Time arguments `now` are monotonic seconds (time_mono_s) so tests can
 * drive stall detection without sleeping. Not thread-safe: one thread owns a struct msink.
 */
#ifndef STAGES_METRICS_METRICS_SINK_H
#define STAGES_METRICS_METRICS_SINK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct msink_opts {
    const char *run_dir;      /* required; files go to <run_dir>/metrics.jsonl, metrics.csv, plots/ */
    const char *csv_stage;    /* the main stage: its metric records fill metrics.csv, the plots and the
                               * progress line's step, loss, EAL and tokens/s (default "dflash-train") */
    double stall_s;           /* nothing moved for this long -> stall warning (<= 0: off) */
    double progress_s;        /* progress line period (<= 0: off) */
    double plot_every_s;      /* plot refresh period (<= 0: only at the end) */
    double plot_timeout_s;    /* kill gnuplot after this long (default 20) */
    const char *gnuplot;      /* program to run (default "gnuplot"; tests point it elsewhere) */
    int tty;                  /* 1: \r-updated progress on stderr; 0: plain log lines */
};

/* Classes of bad input, for msink_bad_count. */
enum msink_bad { MSINK_BAD_MALFORMED = 0, MSINK_BAD_VERSION = 1, MSINK_BAD_KIND = 2, MSINK_BAD_N = 3 };

struct msink;

/* Open (create/append) metrics.jsonl and metrics.csv under o->run_dir (which must exist) and read
 * back the CSV header if the file exists. Returns NULL with a sentence in err on failure (open,
 * a CSV whose first line is not a "step,t,..." header). Caller owns the result (msink_close). */
struct msink *msink_open(const struct msink_opts *o, char *err, int err_len);

/* Handle one raw message: decode, aggregate, queue its JSON line, append a CSV row. Returns 0 for
 * a valid record, or the negative bus_decode class for bad input (counted, logged once per class).
 * Returns -100 with err filled only when writing metrics.csv failed (disk full...); the caller
 * decides whether that is fatal. */
int msink_handle(struct msink *s, const void *buf, size_t len, double now, char *err, int err_len);

/* Write the queued JSON lines to metrics.jsonl in one write(). Returns 0 or -1 with err. */
int msink_flush(struct msink *s, char *err, int err_len);

/* Periodic work: progress line, stall check (logs a warning naming each live stage and what it
 * waits on, at most once per stall_s), gone-process check (kill(pid, 0)), plot refresh and reaping
 * of a finished gnuplot. Cheap when nothing is due; call every ~100 ms. */
void msink_tick(struct msink *s, double now);

/* 1 when at least one stage instance sent a heartbeat and every such instance has sent its
 * summary or its process is gone (checked by msink_tick). */
int msink_done(const struct msink *s);

/* 1 when a stall is in progress at `now` (live instances exist and no items in/out changed for
 * stall_s); if report is non-NULL, writes the per-stage "what it waits on" text there. */
int msink_stalled(const struct msink *s, double now, char *report, size_t report_len);

/* Format the progress line at `now` into line (cap bytes) and advance the ETA's rate window; what
 * msink_tick prints. tokens/s is the trainer's metric when there is one, else the lowest rate a
 * live stage's heartbeats report (the pipeline runs at its slowest stage). Not thread-safe. */
void msink_progress(struct msink *s, double now, char *line, size_t cap);

/* Final work: clear the progress line, log "finishing (<why>)", flush, draw plots and wait for
 * gnuplot (bounded by plot_timeout_s), and log the summary table (one line per stage instance:
 * records, items in/out, busy %, wait % (shares of busy_s + wait_s), dropped (as the sender's
 * last record received reported it), lost (seq numbers neither received nor reported dropped),
 * state) and the bad-input counts. Counts cover this run of the sink; items and seconds are the
 * senders' own cumulative counters, so they survive a sink restart. */
void msink_finish(struct msink *s, double now, const char *why);

/* The event file this sink writes (valid until msink_close). */
const char *msink_tfevents_path(const struct msink *s);

/* Counters for tests and the summary. */
uint64_t msink_records(const struct msink *s);
uint64_t msink_bad_count(const struct msink *s, enum msink_bad which);
int msink_n_instances(const struct msink *s);
/* The CSV columns after "step,t" (count and i-th name), as currently in the header. */
int msink_csv_ncols(const struct msink *s);
const char *msink_csv_col(const struct msink *s, int i);

/* Flush, kill a running gnuplot, close files, free. NULL is fine. */
void msink_close(struct msink *s);

#endif /* STAGES_METRICS_METRICS_SINK_H */
