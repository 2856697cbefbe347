/* stages/core/err.c — err_fail (err.h). */
#include "core/err.h"

#include <stdarg.h>
#include <stdio.h>

int err_fail(char *err, int err_len, const char *fmt, ...) {
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, (size_t)err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}
