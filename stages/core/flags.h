/*
 * stages/core/flags.h — the one command-line parser every binary uses.
 *
 * A binary declares a table of struct flag (long names only, `--name value` or `--name=value`,
 * booleans as `--name` / `--no-name`), calls flags_parse(), and gets either success, a request
 * for --help, or a one-line error naming the flag ("--tokens: expected an integer, got 'x'").
 * Defaults are whatever the pointed-to variables hold before parsing; --help shows them.
 * Positional arguments are collected when the table allows them.
 */
#ifndef STAGES_CORE_FLAGS_H
#define STAGES_CORE_FLAGS_H

#include <stdint.h>
#include <stdio.h>

enum flag_type { FLAG_BOOL, FLAG_INT, FLAG_INT64, FLAG_DOUBLE, FLAG_STRING };

struct flag {
    const char *name;      /* without the leading "--" */
    enum flag_type type;
    void *value;           /* bool* (int), int*, int64_t*, double*, const char** */
    const char *help;      /* one line; the default is appended by flags_usage */
    int64_t min, max;      /* inclusive bounds for FLAG_INT/FLAG_INT64; ignored when min > max */
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

#endif /* STAGES_CORE_FLAGS_H */
