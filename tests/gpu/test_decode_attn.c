/*
 * tests/gpu/test_decode_attn.c — the GPU cache attention (kernels/decode_attn.h) against its reference on the same
 * bf16-rounded inputs: the append kernel puts every new row at its (slot, position), bitwise; the attention of each
 * row over keys 0..pos of its slot. Shapes: HD 16, 32, 64, 128, 256 (every NE branch), G 1, 2 and 4, T = 1, rows of
 * several slots in one step (a block of 4 per slot, positions 0 and max_len - 1 among them), a long cache (2047
 * positions, tails around the 8 warps' stride), and a production shape (16 sequences × block 4, 32 + 8 heads,
 * HD 128, 2000 cached tokens). Cache rows past each slot's length are NaN (0xFFFF) and the output starts NaN, so a
 * kernel that reads an unwritten row or skips an output fails.
 *
 * Tolerance: the kernel computes scores, softmax and the weighted sum in fp32 from the same bf16 inputs the
 * double reference reads, and rounds each output once to bf16 (relative 2^-9 = 2e-3); fp32 accumulation over
 * ≤ 2048 keys adds ~1e-6 relative. Outputs are convex combinations of values in [-1, 1]: rtol 1.6e-2 (style.md's
 * bf16 start) with atol 1e-3 for outputs near 0.
 */
#include "kernels/decode_attn.h"
#include "k1util.h"

static void one(int S, int max_len, int NH, int NKV, int HD, int n_seq, int blk, uint64_t seed) {
    int T = n_seq * blk;
    size_t row = (size_t)NKV * HD, cache = (size_t)S * max_len * row, nq = (size_t)T * NH * HD;
    float *kc = malloc(4 * cache), *vc = malloc(4 * cache);
    int32_t *slot = malloc(4 * (size_t)T), *pos = malloc(4 * (size_t)T), *len = calloc((size_t)S, 4);
    /* each sequence i uses slot (i * 7) % S (distinct while n_seq <= S) with a random cached length */
    for (int i = 0; i < n_seq; i++) {
        int s = (i * 7) % S, base = (int)(test_rng_next(&seed) % (uint64_t)(max_len - blk + 1));
        if (i == 0) base = 0;                      /* position 0 in the block */
        if (i == 1) base = max_len - blk;          /* the last position of the cache */
        len[s] = base + blk;
        for (int j = 0; j < blk; j++) {
            slot[i * blk + j] = s;
            pos[i * blk + j] = base + j;
        }
    }
    float *krows = k1_randn(&seed, (size_t)T * row, -1, 1), *vrows = k1_randn(&seed, (size_t)T * row, -1, 1);
    float *q = k1_randn(&seed, nq, -1, 1);
    test_rng_fill(&seed, kc, cache, -1, 1);
    test_rng_fill(&seed, vc, cache, -1, 1);
    bf16 *hk = malloc(2 * cache), *hv = malloc(2 * cache);
    for (size_t i = 0; i < cache; i++) {
        size_t s = i / ((size_t)max_len * row), p = (i / row) % (size_t)max_len;
        int beyond = (int)p >= len[s];
        hk[i] = beyond ? 0xFFFF : float_to_bf16(kc[i]);
        hv[i] = beyond ? 0xFFFF : float_to_bf16(vc[i]);
        kc[i] = bf16_to_float(hk[i]);
        vc[i] = bf16_to_float(hv[i]);
    }
    bf16 *d_kc = k1_malloc(2 * cache), *d_vc = k1_malloc(2 * cache);
    K1_CUDA(cudaMemcpy(d_kc, hk, 2 * cache, cudaMemcpyHostToDevice));
    K1_CUDA(cudaMemcpy(d_vc, hv, 2 * cache, cudaMemcpyHostToDevice));
    bf16 *d_k = k1_upload_bf16(krows, (size_t)T * row), *d_v = k1_upload_bf16(vrows, (size_t)T * row);
    bf16 *d_q = k1_upload_bf16(q, nq), *d_out = k1_malloc(2 * nq);
    int32_t *d_slot = k1_upload(slot, 4 * (size_t)T), *d_pos = k1_upload(pos, 4 * (size_t)T);
    k1_poison(d_out, 2 * nq);
    float scale = 1.0f / sqrtf((float)HD);
    K1_LAUNCH(decode_attn_append(d_kc, d_vc, d_k, d_v, d_slot, d_pos, T, max_len, NKV, HD, 0));
    K1_LAUNCH(decode_attn_forward(d_out, d_q, d_kc, d_vc, d_slot, d_pos, T, max_len, NH, NKV, HD, scale, 0));
    K1_CUDA(cudaDeviceSynchronize());
    ck_assert_int_eq(decode_attn_append_ref(kc, vc, krows, vrows, slot, pos, T, S, max_len, NKV, HD), 0);
    float *out = malloc(4 * nq), *got = malloc(4 * nq);
    double *scratch = malloc(sizeof(double) * ((size_t)max_len + HD + 1));
    ck_assert_int_eq(decode_attn_forward_ref(out, q, kc, vc, slot, pos, T, S, max_len, NH, NKV, HD, scale, scratch), 0);
    char what[128];
    snprintf(what, sizeof what, "decode_attn S=%d max_len=%d NH=%d NKV=%d HD=%d T=%d", S, max_len, NH, NKV, HD, T);
    /* the appended rows, bitwise (NaN-aware: compare bf16 patterns) */
    bf16 *back = malloc(2 * cache);
    K1_CUDA(cudaMemcpy(back, d_kc, 2 * cache, cudaMemcpyDeviceToHost));
    for (int r = 0; r < T; r++)
        for (size_t e = 0; e < row; e++)
            ck_assert_msg(back[((size_t)slot[r] * max_len + pos[r]) * row + e] == float_to_bf16(krows[(size_t)r * row + e]),
                          "%s: appended k row %d differs", what, r);
    k1_download_bf16(got, d_out, nq);
    ck_assert_msg(test_allclose("decode_attn out", got, out, nq, 1e-3, 1.6e-2), "%s", what);
    cudaFree(d_kc); cudaFree(d_vc); cudaFree(d_k); cudaFree(d_v); cudaFree(d_q); cudaFree(d_out);
    cudaFree(d_slot); cudaFree(d_pos);
    free(kc); free(vc); free(slot); free(pos); free(len); free(krows); free(vrows); free(q); free(hk); free(hv);
    free(out); free(got); free(scratch); free(back);
}

START_TEST(decode_attn_gpu_shapes) {
    one(1, 1, 1, 1, 64, 1, 1, 1);          /* a single key */
    one(3, 97, 4, 2, 128, 3, 4, 2);
    one(5, 300, 8, 2, 64, 4, 1, 3);
    one(2, 50, 2, 2, 16, 2, 3, 4);
    one(2, 50, 3, 1, 32, 2, 5, 5);
    one(3, 130, 4, 1, 256, 2, 4, 6);
    one(2, 2047, 4, 2, 128, 2, 16, 7);     /* long cache, the largest block */
}
END_TEST

START_TEST(decode_attn_gpu_production) {
    one(16, 2048, 32, 8, 128, 16, 4, 8);
}
END_TEST

START_TEST(decode_attn_gpu_preconditions) {
    bf16 *p = k1_malloc(4096);
    ck_assert_int_eq(decode_attn_forward(p, p, p, p, NULL, NULL, 1, 4, 6, 4, 64, 1.0f, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiple of NKV"));
    ck_assert_int_eq(decode_attn_append(p, p, p, p, NULL, NULL, 1, 4, 2, 12, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiple of 8"));
    cudaFree(p);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_decode_attn");
    TCase *tc = tcase_create("gpu_decode_attn");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, decode_attn_gpu_shapes);
    tcase_add_test(tc, decode_attn_gpu_production);
    tcase_add_test(tc, decode_attn_gpu_preconditions);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
