/*
 * kernels/hsgather_ref.c — reference hidden-state concat/split (kernels/hsgather.h).
 */
#include "kernels/hsgather.h"

int hsgather_concat_ref(bf16 *out, const struct hs_parts *parts, const int32_t *rows, int L, int T_out,
                        int T_in, int C) {
    if (L < 1 || L > HSGATHER_MAX_PARTS)
        return kernels_fail("hsgather_concat_ref: L=%d parts, expected 1..%d", L, HSGATHER_MAX_PARTS);
    if (!rows && T_out != T_in)
        return kernels_fail("hsgather_concat_ref: without a row list T_out (%d) must equal T_in (%d)", T_out, T_in);
    for (int t = 0; t < T_out; t++) {
        int src = rows ? rows[t] : t;
        if (src < 0 || src >= T_in)
            return kernels_fail("hsgather_concat_ref: rows[%d] = %d is outside [0, %d)", t, src, T_in);
        for (int l = 0; l < L; l++)
            memcpy(out + ((size_t)t * L + l) * C, parts->p[l] + (size_t)src * C, (size_t)C * sizeof *out);
    }
    return 0;
}

int hsgather_split_ref(const struct hs_parts_out *parts, const bf16 *in, int L, int T, int C) {
    if (L < 1 || L > HSGATHER_MAX_PARTS)
        return kernels_fail("hsgather_split_ref: L=%d parts, expected 1..%d", L, HSGATHER_MAX_PARTS);
    for (int t = 0; t < T; t++)
        for (int l = 0; l < L; l++)
            memcpy(parts->p[l] + (size_t)t * C, in + ((size_t)t * L + l) * C, (size_t)C * sizeof *in);
    return 0;
}
