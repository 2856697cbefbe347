/*
 * stages/train/sched.c — lr schedule (stages/train/sched.h) over kernels/adamw_ref.c's formulas.
 */
#include "train/sched.h"

#include "core/err.h"
#include "kernels/adamw.h"

#include <math.h>
#include <string.h>

int sched_parse_kind(const char *s, enum sched_kind *kind, char *err, int err_len) {
    if (s && !strcmp(s, "linear")) { *kind = SCHED_LINEAR; return 0; }
    if (s && !strcmp(s, "cosine")) { *kind = SCHED_COSINE; return 0; }
    if (s && !strcmp(s, "none")) { *kind = SCHED_NONE; return 0; }
    return err_fail(err, err_len, "unknown lr schedule '%s': expected linear, cosine or none", s ? s : "(null)");
}

const char *sched_kind_name(enum sched_kind kind) {
    return kind == SCHED_LINEAR ? "linear" : kind == SCHED_COSINE ? "cosine" : kind == SCHED_NONE ? "none" : "?";
}

int sched_init(struct sched *s, enum sched_kind kind, int64_t total, int64_t warmup_steps,
               double warmup_ratio, char *err, int err_len) {
    memset(s, 0, sizeof *s);
    if (kind != SCHED_LINEAR && kind != SCHED_COSINE && kind != SCHED_NONE)
        return err_fail(err, err_len, "sched_init: unknown schedule kind %d", (int)kind);
    if (total < 1) return err_fail(err, err_len, "sched_init: total steps must be >= 1, got %lld", (long long)total);
    if (warmup_steps >= 0 && warmup_ratio >= 0)
        return err_fail(err, err_len, "sched_init: give the warm-up as steps (%lld) or as a ratio (%g), not both",
                        (long long)warmup_steps, warmup_ratio);
    int64_t w = total / 100;
    if (warmup_steps >= 0) w = warmup_steps;
    else if (warmup_ratio >= 0) {
        if (!(warmup_ratio <= 1)) return err_fail(err, err_len, "sched_init: warm-up ratio must be in [0, 1], got %g", warmup_ratio);
        w = (int64_t)floor(warmup_ratio * (double)total);
    }
    if (w > total) return err_fail(err, err_len, "sched_init: warm-up %lld steps exceeds the %lld total steps",
                                   (long long)w, (long long)total);
    s->kind = kind;
    s->total = total;
    s->warmup = w;
    return 0;
}

double sched_factor(const struct sched *s, int64_t step) {
    switch (s->kind) {
    case SCHED_LINEAR: return adamw_lr_linear((long)step, (long)s->total, (long)s->warmup);
    case SCHED_COSINE: return adamw_lr_cosine((long)step, (long)s->total, (long)s->warmup);
    case SCHED_NONE: return 1.0;
    }
    return 0;
}
