/*
 * kernels/argmax_ref.c — reference row argmax (kernels/argmax.h): the plain first-maximum loop.
 */
#include "kernels/argmax.h"

void argmax_rows_ref(int32_t *out, const float *x, int R, int V) {
    for (int r = 0; r < R; r++) {
        const float *row = x + (size_t)r * V;
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        out[r] = best;
    }
}
