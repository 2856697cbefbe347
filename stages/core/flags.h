/*
 * stages/core/flags.h — the one command-line parser every binary uses.
 *
 * A binary declares a table of struct flag (long names only, `--name value` or `--name=value`,
 * booleans as `--name` / `--no-name`), calls flags_parse(), and gets either success, a request
 * for --help, or a one-line error naming the flag ("--tokens: expected an integer, got 'x'").
 * Defaults are whatever the pointed-to variables hold before parsing; --help shows them.
 * Positional arguments are collected when the table allows them.
 *
 * Types: FLAG_BOOL (value: int*), FLAG_INT (int*) and FLAG_INT64 (int64_t*) within [min, max],
 * FLAG_DOUBLE (double*) within [min, max] as well (integral bounds; so --heartbeat-s -1 is refused),
 * FLAG_STRING (const char**), FLAG_CHOICE (value: struct flag_choice*: the index of the value in
 * a NULL-terminated list of names) and FLAG_LIST (value: struct flag_list*: comma-separated ints
 * within [min, max], or names of a list stored as indexes, into a caller array of max_count
 * items: `--layers 1,9,17`, `--layer-types sliding,sliding,full`). --help lists choices and
 * defaults. Bounds apply when min <= max (tables write `1, 0` for "no bounds").
 */
#ifndef STAGES_CORE_FLAGS_H
#define STAGES_CORE_FLAGS_H

#include <stdint.h>
#include <stdio.h>

enum flag_type { FLAG_BOOL, FLAG_INT, FLAG_INT64, FLAG_DOUBLE, FLAG_STRING, FLAG_CHOICE, FLAG_LIST };

struct flag {
    const char *name;      /* without the leading "--" */
    enum flag_type type;
    void *value;           /* bool* (int), int*, int64_t*, double*, const char**, struct flag_choice*, struct flag_list* */
    const char *help;      /* one line; the default is appended by flags_usage */
    int64_t min, max;      /* inclusive bounds for FLAG_INT/INT64/DOUBLE and FLAG_LIST ints; none when min > max */
};

/* FLAG_CHOICE's value: *index (the default before parsing, -1 for none) into names. */
struct flag_choice {
    int *index;
    const char *const *names;   /* NULL-terminated */
};

/* FLAG_LIST's value: items[0..*count) (the default before parsing; a failed parse leaves *count
 * and may have overwritten items). names NULL: ints within the
 * flag's [min, max]; else each item must be one of names and is stored as its index. */
struct flag_list {
    int *items;
    int *count;
    int max_count;
    const char *const *names;   /* NULL-terminated, or NULL for ints */
};

/* Sentinel ending a flag table. */
#define FLAGS_END { NULL, FLAG_BOOL, NULL, NULL, 1, 0 }

enum flags_result { FLAGS_OK = 0, FLAGS_HELP = 1, FLAGS_ERROR = -1 };

/* Parse argv[1..]. Positional args (not starting with "--") are stored in *positional (up to
 * max_positional, NULL/0 to forbid them). On FLAGS_ERROR, err holds a one-line reason.
 * Strings point into argv. Not thread-safe (writes the table's variables). */
enum flags_result flags_parse(const struct flag *table, int argc, char **argv,
                              char **positional, int max_positional, int *n_positional,
                              char *err, int err_len);

/* Print "usage: <prog> <synopsis>", the description, then one line per flag with its default. */
void flags_usage(FILE *out, const char *prog, const char *synopsis, const char *description,
                 const struct flag *table);

/* Convenience for stage mains: parse; on --help print usage to stdout and exit(0); on error print
 * "<prog>: <reason>" and the usage to stderr and exit(2). Returns the positional count. */
int flags_parse_or_exit(const struct flag *table, int argc, char **argv, const char *synopsis,
                        const char *description, char **positional, int max_positional);

/* 1 when --name (or --name=..., or --no-name) is on the command line before any "--": whether a value
 * came from the user or from the default (the run plan binds only what was not given, plan.h). */
int flags_given(int argc, char **argv, const char *name);

#endif /* STAGES_CORE_FLAGS_H */
