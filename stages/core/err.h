/*
 * stages/core/err.h — the one helper library code uses to report a failure: format a sentence
 * into the caller-supplied error buffer and return -1 (style.md: library code never exits).
 */
#ifndef STAGES_CORE_ERR_H
#define STAGES_CORE_ERR_H

#ifdef __cplusplus
extern "C" {
#endif

/* printf-style into err (err_len bytes, may be NULL/0); always returns -1. Thread-safe. */
int err_fail(char *err, int err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif

#endif /* STAGES_CORE_ERR_H */
