/*
 * kernels/embedding_ref.c — reference embedding gather (kernels/embedding.h).
 */
#include "kernels/embedding.h"

int embedding_forward_ref(float *out, const int32_t *ids, const float *table, int T, int C, int V) {
    for (int t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= V)
            return kernels_fail("embedding_forward_ref: token %d has id %d, outside the vocabulary [0, %d)",
                                t, ids[t], V);
        memcpy(out + (size_t)t * C, table + (size_t)ids[t] * C, (size_t)C * sizeof *out);
    }
    return 0;
}
