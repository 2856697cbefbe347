/*
 * stages/core/flags.c — the command-line parser (flags.h). Long options only; every error is one
 * sentence naming the flag and what was wrong with the value.
 */
#include "core/flags.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const struct flag *find_flag(const struct flag *t, const char *name, size_t len) {
    for (; t->name; t++)
        if (strlen(t->name) == len && !strncmp(t->name, name, len)) return t;
    return NULL;
}

static int parse_int64(const char *s, int64_t *out) {
    if (!s || !*s) return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 0);
    if (errno || *end) {
        /* accept 8k / 2M / 1G style suffixes for sizes */
        if (errno || end == s || end[1] != 0) return -1;
        long long mul = *end == 'k' || *end == 'K' ? 1024LL : *end == 'M' ? 1024LL * 1024 : *end == 'G' ? 1024LL * 1024 * 1024 : 0;
        if (!mul || v > INT64_MAX / mul || v < INT64_MIN / mul) return -1;
        v *= mul;
    }
    *out = v;
    return 0;
}

static int choice_index(const char *const *names, const char *val, size_t len) {
    for (int i = 0; names[i]; i++)
        if (strlen(names[i]) == len && !strncmp(names[i], val, len)) return i;
    return -1;
}

/* "a|b|c" into out, for errors and --help. */
static const char *choice_names(const char *const *names, char *out, size_t out_len) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; names[i] && n + 1 < out_len; i++) {
        int w = snprintf(out + n, out_len - n, "%s%s", i ? "|" : "", names[i]);
        if (w < 0) break;
        n += (size_t)w;
    }
    return out;
}

/* Comma-separated ints (bounded) or choice names into the caller's array. */
static int set_list(const struct flag *f, const char *val, char *err, int err_len) {
    const struct flag_list *l = f->value;
    int *arr = l->items, n = 0;
    char names[512];
    if (!*val) { snprintf(err, err_len, "--%s: expected a comma-separated list, got ''", f->name); return -1; }
    for (const char *p = val;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (n == l->max_count) { snprintf(err, err_len, "--%s: at most %d items, got more in '%s'", f->name, l->max_count, val); return -1; }
        if (!len) { snprintf(err, err_len, "--%s: empty item in '%s'", f->name, val); return -1; }
        if (l->names) {
            int i = choice_index(l->names, p, len);
            if (i < 0) {
                snprintf(err, err_len, "--%s: item %d '%.*s' is not one of %s", f->name, n + 1, (int)len, p,
                         choice_names(l->names, names, sizeof names));
                return -1;
            }
            arr[n++] = i;
        } else {
            char item[64];
            int64_t v;
            snprintf(item, sizeof item, "%.*s", (int)(len < 63 ? len : 63), p);
            if (len > 63 || parse_int64(item, &v)) {
                snprintf(err, err_len, "--%s: item %d '%.*s' is not an integer", f->name, n + 1, (int)len, p);
                return -1;
            }
            int64_t lo = f->min <= f->max ? f->min : INT32_MIN, hi = f->min <= f->max ? f->max : INT32_MAX;
            if (v < lo || v > hi) {
                snprintf(err, err_len, "--%s: item %d (%" PRId64 ") is out of range [%" PRId64 ", %" PRId64 "]", f->name,
                         n + 1, v, lo, hi);
                return -1;
            }
            arr[n++] = (int)v;
        }
        if (!comma) break;
        p = comma + 1;
    }
    *l->count = n;
    return 0;
}

static int set_value(const struct flag *f, const char *val, char *err, int err_len) {
    switch (f->type) {
    case FLAG_BOOL: {
        if (!strcmp(val, "1") || !strcmp(val, "true") || !strcmp(val, "yes")) *(int *)f->value = 1;
        else if (!strcmp(val, "0") || !strcmp(val, "false") || !strcmp(val, "no")) *(int *)f->value = 0;
        else { snprintf(err, err_len, "--%s: expected true or false, got '%s'", f->name, val); return -1; }
        return 0;
    }
    case FLAG_INT:
    case FLAG_INT64: {
        int64_t v;
        if (parse_int64(val, &v)) { snprintf(err, err_len, "--%s: expected an integer, got '%s'", f->name, val); return -1; }
        if (f->min <= f->max && (v < f->min || v > f->max)) {
            snprintf(err, err_len, "--%s: %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]", f->name, v, f->min, f->max);
            return -1;
        }
        if (f->type == FLAG_INT) {
            if (v < INT32_MIN || v > INT32_MAX) { snprintf(err, err_len, "--%s: %" PRId64 " does not fit in an int", f->name, v); return -1; }
            *(int *)f->value = (int)v;
        } else {
            *(int64_t *)f->value = v;
        }
        return 0;
    }
    case FLAG_DOUBLE: {
        errno = 0;
        char *end;
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v)) {
            snprintf(err, err_len, "--%s: expected a number, got '%s'", f->name, val);
            return -1;
        }
        if (f->min <= f->max && (v < (double)f->min || v > (double)f->max)) {
            snprintf(err, err_len, "--%s: %g is out of range [%" PRId64 ", %" PRId64 "]", f->name, v, f->min, f->max);
            return -1;
        }
        *(double *)f->value = v;
        return 0;
    }
    case FLAG_STRING:
        *(const char **)f->value = val;
        return 0;
    case FLAG_CHOICE: {
        const struct flag_choice *c = f->value;
        int i = choice_index(c->names, val, strlen(val));
        char names[512];
        if (i < 0) {
            snprintf(err, err_len, "--%s: expected one of %s, got '%s'", f->name, choice_names(c->names, names, sizeof names), val);
            return -1;
        }
        *c->index = i;
        return 0;
    }
    case FLAG_LIST:
        return set_list(f, val, err, err_len);
    }
    snprintf(err, err_len, "--%s: internal error: unknown flag type", f->name);
    return -1;
}

enum flags_result flags_parse(const struct flag *table, int argc, char **argv, char **positional,
                              int max_positional, int *n_positional, char *err, int err_len) {
    int np = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return FLAGS_HELP;
        if (!strcmp(a, "--")) {   /* everything after is positional */
            for (i++; i < argc; i++) {
                if (np >= max_positional) { snprintf(err, err_len, "unexpected argument '%s'", argv[i]); return FLAGS_ERROR; }
                positional[np++] = argv[i];
            }
            break;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (np >= max_positional) {
                snprintf(err, err_len, a[0] == '-' ? "unknown option '%s' (options are --long-names)" : "unexpected argument '%s'", a);
                return FLAGS_ERROR;
            }
            positional[np++] = argv[i];
            continue;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const struct flag *f = find_flag(table, name, len);
        if (!f && !eq && len > 3 && !strncmp(name, "no-", 3)) {
            const struct flag *g = find_flag(table, name + 3, len - 3);
            if (g && g->type == FLAG_BOOL) { *(int *)g->value = 0; continue; }
        }
        if (!f) { snprintf(err, err_len, "unknown flag '--%.*s'", (int)len, name); return FLAGS_ERROR; }
        const char *val;
        if (eq) {
            val = eq + 1;
        } else if (f->type == FLAG_BOOL) {
            *(int *)f->value = 1;
            continue;
        } else {
            if (i + 1 >= argc) { snprintf(err, err_len, "--%s: missing value", f->name); return FLAGS_ERROR; }
            val = argv[++i];
        }
        if (set_value(f, val, err, err_len)) return FLAGS_ERROR;
    }
    if (n_positional) *n_positional = np;
    return FLAGS_OK;
}

static void print_default(FILE *out, const struct flag *f) {
    switch (f->type) {
    case FLAG_BOOL:   /* a negative default means "not given" (a tri-state, e.g. mkmodel's --tied) */
        fprintf(out, " (default: %s)", *(int *)f->value < 0 ? "unset" : *(int *)f->value ? "true" : "false"); break;
    case FLAG_INT: fprintf(out, " (default: %d)", *(int *)f->value); break;
    case FLAG_INT64: fprintf(out, " (default: %" PRId64 ")", *(int64_t *)f->value); break;
    case FLAG_DOUBLE: fprintf(out, " (default: %g)", *(double *)f->value); break;
    case FLAG_STRING: {
        const char *s = *(const char **)f->value;
        fprintf(out, s ? " (default: %s)" : " (no default)", s);
        break;
    }
    case FLAG_CHOICE: {
        const struct flag_choice *c = f->value;
        char names[512];
        int i = *c->index;
        fprintf(out, " (one of %s; default: %s)", choice_names(c->names, names, sizeof names), i >= 0 ? c->names[i] : "unset");
        break;
    }
    case FLAG_LIST: {
        const struct flag_list *l = f->value;
        char names[512];
        if (l->names) fprintf(out, " (items: %s)", choice_names(l->names, names, sizeof names));
        if (!*l->count) { fprintf(out, " (default: none)"); break; }
        fprintf(out, " (default: ");
        for (int i = 0; i < *l->count; i++) {
            if (l->names) fprintf(out, "%s%s", i ? "," : "", l->names[l->items[i]]);
            else fprintf(out, "%s%d", i ? "," : "", l->items[i]);
        }
        fprintf(out, ")");
        break;
    }
    }
    if (f->type == FLAG_DOUBLE && f->min <= f->max) fprintf(out, " [%" PRId64 ", %" PRId64 "]", f->min, f->max);
}

void flags_usage(FILE *out, const char *prog, const char *synopsis, const char *description,
                 const struct flag *table) {
    fprintf(out, "usage: %s %s\n", prog, synopsis ? synopsis : "[flags]");
    if (description && *description) fprintf(out, "\n%s\n", description);
    fprintf(out, "\nflags:\n");
    for (const struct flag *f = table; f->name; f++) {
        char lhs[64];
        static const char *meta[] = {"", " N", " N", " X", " S", " NAME", " A,B,..."};
        snprintf(lhs, sizeof lhs, "--%s%s", f->name, meta[f->type]);
        fprintf(out, "  %-26s %s", lhs, f->help ? f->help : "");
        print_default(out, f);
        fputc('\n', out);
    }
    fprintf(out, "  %-26s %s\n", "--help", "print this help and exit");
}

int flags_parse_or_exit(const struct flag *table, int argc, char **argv, const char *synopsis,
                        const char *description, char **positional, int max_positional) {
    char err[512];
    int np = 0;
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    switch (flags_parse(table, argc, argv, positional, max_positional, &np, err, sizeof err)) {
    case FLAGS_OK: return np;
    case FLAGS_HELP:
        flags_usage(stdout, prog, synopsis, description, table);
        exit(0);
    case FLAGS_ERROR:
    default:
        fprintf(stderr, "%s: %s\n", prog, err);
        flags_usage(stderr, prog, synopsis, description, table);
        exit(2);
    }
}

int flags_given(int argc, char **argv, const char *name) {
    size_t len = strlen(name);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (strncmp(a, "--", 2) != 0) continue;
        a += 2;
        if (!strncmp(a, "no-", 3) && !strcmp(a + 3, name)) return 1;
        if (!strncmp(a, name, len) && (a[len] == 0 || a[len] == '=')) return 1;
    }
    return 0;
}
