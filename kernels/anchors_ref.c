/*
 * kernels/anchors_ref.c — CPU reference of anchor selection (kernels/anchors.h): sort the
 * candidates by (key, p), keep the first K, sort those by position.
 */
#include "kernels/anchors.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct { uint64_t key; int32_t p; } anchors_cand;

static int anchors_cmp_key(const void *a, const void *b) {
    const anchors_cand *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->p > y->p) - (x->p < y->p);
}
static int anchors_cmp_int(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int anchors_forward_ref(const uint8_t *loss_mask, int T, int B, int N, uint64_t seed, uint64_t step,
                        int32_t *anchors, uint8_t *valid, char *err, int err_len) {
    if (T < 1 || B < 1 || N < 1) {
        snprintf(err, err_len, "anchors_forward_ref: need T, B, N >= 1, got T=%d B=%d N=%d", T, B, N);
        return -1;
    }
    anchors_cand *c = malloc(sizeof *c * (size_t)T);
    if (!c) {
        snprintf(err, err_len, "anchors_forward_ref: malloc of %d candidates failed", T);
        return -1;
    }
    int n = 0;
    for (int p = 0; p < T - B; p++)
        if (loss_mask[p]) c[n++] = (anchors_cand){anchors_key(seed, step, (uint32_t)p), p};
    qsort(c, (size_t)n, sizeof *c, anchors_cmp_key);
    int K = n < N ? n : N;
    for (int i = 0; i < K; i++) anchors[i] = c[i].p;
    qsort(anchors, (size_t)K, sizeof *anchors, anchors_cmp_int);
    for (int i = 0; i < N; i++) {
        if (i >= K) anchors[i] = 0;
        valid[i] = i < K;
    }
    free(c);
    return K;
}
