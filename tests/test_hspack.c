/*
 * tests/test_hspack.c — the ring-free parts of dflash-hspack (stages/hspack/hspack.h).
 *
 * Conversion: hidden items (f32 and bf16, T with a tail, k = 3, H = 8) into concat and split
 * features are checked element by element against the definition (row t of concat = [layer a_1 |
 * a_2 | ...]), batch arrays equal, alignment gaps zero (the output buffer starts as garbage), the
 * descriptor valid; a layer subset plus f32 -> bf16 keeps the right layers rounded to nearest
 * even; concat -> split -> concat is bit-exact; bad requests fail with a sentence. Window:
 * several producers finishing out of order (bounded displacement, duplicates injected) come out
 * as 0..N-1 exactly, depth never above the bound, a missing seq is waited for and never dropped;
 * spilling picks the highest held seq. Spill pool: bounded, reuses buffers.
 */
#include "testutil.h"

#include "core/desc.h"
#include "core/record.h"
#include "hspack/hspack.h"

#define T_TOK 37
#define N_DOC 2
#define K_LAY 3
#define H_DIM 8
#define CAP (64 * 1024)

static uint8_t g_in[CAP] __attribute__((aligned(256)));
static uint8_t g_out[CAP] __attribute__((aligned(256)));
static uint8_t g_out2[CAP] __attribute__((aligned(256)));
static uint8_t g_desc[DESC_MAX_BYTES];

/* The value of captured layer slot l, token t, element h of item seq. */
static float value(uint64_t seq, uint32_t l, uint32_t t, uint32_t h) {
    /* an integer below 256 times a power of two: exact in bf16, distinct per (l, t, h) */
    return (float)(l * 48 + t + 1) * ldexpf(1.0f, (int)h + (int)(seq % 3)) * (h % 2 ? -1.0f : 1.0f);
}

static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static size_t make_hidden(uint64_t seq, enum desc_dtype dt, struct desc_hidden *out) {
    struct desc_hidden d;
    memset(&d, 0, sizeof d);
    d.batch.seq = seq;
    d.batch.n_tokens = T_TOK;
    d.batch.budget = 64;
    d.batch.n_docs = N_DOC;
    d.n_layers = K_LAY;
    d.layers[0] = 1; d.layers[1] = 4; d.layers[2] = 7;
    d.dtype = dt;
    d.hidden_size = H_DIM;
    desc_hidden_layout(&d);
    memset(g_in, 0x5A, sizeof g_in);   /* garbage in the gaps, as a reused slot has */
    struct desc_batch_arrays a;
    desc_batch_arrays(&d.batch, g_in, &a);
    int cu[N_DOC + 1] = {0, 20, T_TOK};
    uint32_t n_loss = 0;
    for (int doc = 0; doc < N_DOC; doc++) {
        a.row_ids[doc] = (int64_t)(seq * 10 + (uint64_t)doc);
        a.cu_seqlens[doc] = cu[doc];
        for (int t = cu[doc]; t < cu[doc + 1]; t++) {
            a.input_ids[t] = t * 3;
            a.position_ids[t] = t - cu[doc];
            a.doc_ids[t] = doc;
            a.loss_mask[t] = t - cu[doc] >= 2;
            n_loss += a.loss_mask[t];
        }
    }
    a.cu_seqlens[N_DOC] = T_TOK;
    d.batch.n_loss = n_loss;
    for (uint32_t l = 0; l <= K_LAY; l++)   /* l == K_LAY: last */
        for (uint32_t t = 0; t < T_TOK; t++)
            for (uint32_t h = 0; h < H_DIM; h++) {
                uint64_t i = l < K_LAY ? ((uint64_t)l * T_TOK + t) * H_DIM + h : (uint64_t)t * H_DIM + h;
                uint64_t base = l < K_LAY ? d.off_states : d.off_last;
                float v = value(seq, l, t, h);
                if (dt == DESC_DTYPE_F32) memcpy(g_in + base + i * 4, &v, 4);
                else { uint16_t b = bf16_of(v); memcpy(g_in + base + i * 2, &b, 2); }
            }
    size_t len;
    char err[512];
    ck_assert_msg(desc_hidden_encode(&d, g_desc, sizeof g_desc, &len, err, sizeof err) == 0, "%s", err);
    if (out) *out = d;
    return len;
}

static float get_state(const struct desc_features *f, const uint8_t *p, uint32_t j, uint32_t t, uint32_t h) {
    uint64_t i = f->layout == DESC_LAYOUT_CONCAT ? ((uint64_t)t * f->n_layers + j) * H_DIM + h
                                                 : ((uint64_t)j * T_TOK + t) * H_DIM + h;
    if (f->dtype == DESC_DTYPE_F32) { float v; memcpy(&v, p + f->off_states + i * 4, 4); return v; }
    uint16_t b;
    memcpy(&b, p + f->off_states + i * 2, 2);
    uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* Every output value, batch array and gap of a converted item. sel: the input layer slot of
 * each output layer. */
static void check_features(const struct hspack_plan *p, const uint8_t *out, const struct desc_hidden *hd,
                           const uint32_t *sel) {
    const struct desc_features *f = &p->out;
    char err[512];
    struct desc_features dec;
    ck_assert_msg(desc_features_decode(p->out_desc, p->out_desc_len, CAP, &dec, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(dec.off_states, f->off_states);
    for (uint32_t j = 0; j < f->n_layers; j++) {
        ck_assert_int_eq(f->layers[j], hd->layers[sel[j]]);
        for (uint32_t t = 0; t < T_TOK; t++)
            for (uint32_t h = 0; h < H_DIM; h++) {
                float want = value(hd->batch.seq, sel[j], t, h), got = get_state(f, out, j, t, h);
                ck_assert_msg(got == want, "layer %u token %u elem %u: got %g want %g (%s)", j, t, h, got, want,
                              desc_layout_name(f->layout));
            }
    }
    struct desc_batch_arrays a, b;
    desc_batch_arrays(&hd->batch, g_in, &a);
    desc_batch_arrays(&f->batch, (void *)out, &b);
    ck_assert_int_eq(memcmp(a.input_ids, b.input_ids, T_TOK * 4), 0);
    ck_assert_int_eq(memcmp(a.cu_seqlens, b.cu_seqlens, (N_DOC + 1) * 4), 0);
    ck_assert_int_eq(memcmp(a.row_ids, b.row_ids, N_DOC * 8), 0);
    ck_assert_int_eq(memcmp(a.loss_mask, b.loss_mask, T_TOK), 0);
    ck_assert_msg(desc_batch_check_payload(&f->batch, out, 0, err, sizeof err) == 0, "%s", err);
    /* gaps: the bytes after row_ids up to input_ids are zero */
    for (uint64_t i = N_DOC * 8; i < f->batch.off_input_ids; i++) ck_assert_uint_eq(out[i], 0);
    struct record_info info;
    ck_assert_msg(record_check(p->out_desc, p->out_desc_len, f->batch.seq, out, f->batch.payload_bytes, CAP,
                               DESC_KIND_FEATURES, 0, &info, err, sizeof err) == 0, "%s", err);
}

START_TEST(layouts_from_hidden) {
    enum desc_dtype dts[] = {DESC_DTYPE_F32, DESC_DTYPE_BF16};
    enum desc_layout lays[] = {DESC_LAYOUT_CONCAT, DESC_LAYOUT_SPLIT};
    uint32_t all[] = {0, 1, 2};
    char err[512];
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            struct desc_hidden hd;
            size_t dl = make_hidden(5, dts[a], &hd);
            struct hspack_want w = {lays[b], 0, 0, {0}};
            struct hspack_plan p;
            ck_assert_msg(hspack_plan(g_desc, dl, CAP, &w, CAP, &p, err, sizeof err) == 0, "%s", err);
            memset(g_out, 0xEE, sizeof g_out);
            ck_assert_int_eq(hspack_convert_host(&p, g_in, g_out, err, sizeof err), 0);
            ck_assert_int_eq(p.out.layout, lays[b]);
            ck_assert_int_eq(p.out.dtype, dts[a]);
            check_features(&p, g_out, &hd, all);
            /* split of a hidden item is its [k][T, H] unchanged */
            if (lays[b] == DESC_LAYOUT_SPLIT)
                ck_assert_int_eq(memcmp(g_out + p.out.off_states, g_in + hd.off_states,
                                        (size_t)K_LAY * T_TOK * H_DIM * desc_dtype_bytes(dts[a])), 0);
            /* equal inputs, equal bytes, whatever the output buffer held before */
            memset(g_out2, 0x11, sizeof g_out2);
            ck_assert_int_eq(hspack_convert_host(&p, g_in, g_out2, err, sizeof err), 0);
            ck_assert_int_eq(memcmp(g_out, g_out2, p.out.batch.payload_bytes), 0);
        }
}
END_TEST

START_TEST(subset_dtype_and_roundtrip) {
    char err[512];
    struct desc_hidden hd;
    size_t dl = make_hidden(3, DESC_DTYPE_F32, &hd);
    /* layers 7 and 1 (in that order), stored as bf16 */
    struct hspack_want w = {DESC_LAYOUT_CONCAT, DESC_DTYPE_BF16, 2, {7, 1}};
    struct hspack_plan p;
    ck_assert_msg(hspack_plan(g_desc, dl, CAP, &w, CAP, &p, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(p.out.n_layers, 2);
    ck_assert_int_eq(hspack_convert_host(&p, g_in, g_out, err, sizeof err), 0);
    uint32_t sel[] = {2, 0};
    check_features(&p, g_out, &hd, sel);   /* the values are exact in bf16 */
    ck_assert_uint_lt(p.out.batch.payload_bytes, hd.batch.payload_bytes);
    /* rounding to nearest even: 1 + 2^-8 (a tie) -> 1, 1 + 3*2^-8 -> 1 + 2^-6 */
    float *s = (float *)(g_in + hd.off_states);
    s[0] = 1.0f + 1.0f / 256;
    s[1] = 1.0f + 3.0f / 256;
    struct hspack_want w2 = {DESC_LAYOUT_SPLIT, DESC_DTYPE_BF16, 0, {0}};
    ck_assert_int_eq(hspack_plan(g_desc, dl, CAP, &w2, CAP, &p, err, sizeof err), 0);
    ck_assert_int_eq(hspack_convert_host(&p, g_in, g_out, err, sizeof err), 0);
    uint16_t b0, b1;
    memcpy(&b0, g_out + p.out.off_states, 2);
    memcpy(&b1, g_out + p.out.off_states + 2, 2);
    ck_assert_uint_eq(b0, 0x3f80);
    ck_assert_uint_eq(b1, 0x3f82);

    /* features concat -> split -> concat: bit-exact */
    dl = make_hidden(9, DESC_DTYPE_BF16, &hd);
    struct hspack_want wc = {DESC_LAYOUT_CONCAT, 0, 0, {0}}, ws = {DESC_LAYOUT_SPLIT, 0, 0, {0}};
    struct hspack_plan pc, ps, pc2;
    ck_assert_int_eq(hspack_plan(g_desc, dl, CAP, &wc, CAP, &pc, err, sizeof err), 0);
    ck_assert_int_eq(hspack_convert_host(&pc, g_in, g_out, err, sizeof err), 0);
    ck_assert_msg(hspack_plan(pc.out_desc, pc.out_desc_len, CAP, &ws, CAP, &ps, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(hspack_convert_host(&ps, g_out, g_out2, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(g_out2 + ps.out.off_states, g_in + hd.off_states, (size_t)K_LAY * T_TOK * H_DIM * 2), 0);
    static uint8_t g3[CAP] __attribute__((aligned(256)));
    ck_assert_int_eq(hspack_plan(ps.out_desc, ps.out_desc_len, CAP, &wc, CAP, &pc2, err, sizeof err), 0);
    ck_assert_int_eq(hspack_convert_host(&pc2, g_out2, g3, err, sizeof err), 0);
    ck_assert_uint_eq(pc2.out_desc_len, pc.out_desc_len);
    ck_assert_int_eq(memcmp(pc2.out_desc, pc.out_desc, pc.out_desc_len), 0);
    ck_assert_int_eq(memcmp(g3, g_out, pc.out.batch.payload_bytes), 0);

    /* bad requests */
    struct hspack_want wb = {DESC_LAYOUT_CONCAT, 0, 1, {5}};
    ck_assert_int_eq(hspack_plan(g_desc, dl, CAP, &wb, CAP, &p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "layer 5 selected but the item captured layers [1,4,7]"), "%s", err);
    ck_assert_int_eq(hspack_plan(g_desc, dl, CAP, &wc, 1000, &p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "seq 9") && strstr(err, "the output slot holds 1000"), "%s", err);
    ck_assert_int_eq(hspack_plan(g_desc, dl, 1000, &wc, CAP, &p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "hidden descriptor rejected"), "%s", err);
    struct desc_batch bd = hd.batch;
    size_t bl;
    desc_batch_layout(&bd);
    ck_assert_int_eq(desc_batch_encode(&bd, g_desc, sizeof g_desc, &bl, err, sizeof err), 0);
    ck_assert_int_eq(hspack_plan(g_desc, bl, CAP, &wc, CAP, &p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "expected 'hidden' or 'features', found 'batch'"), "%s", err);
}
END_TEST

/* Three producers take seqs round-robin and finish with jitter: arrival order is a permutation of
 * 0..N-1 with bounded displacement, plus redelivered duplicates. The driver mirrors the stage:
 * it takes arrivals while the window has room, and when it is full with next missing it waits
 * for next (takes it out of the arrival list first: ring_acquire_read_seq). */
START_TEST(window_restores_order) {
    enum { N = 300, W = 4 };
    uint64_t arrivals[2 * N];
    int n_arr = 0;
    uint64_t rng = 42;
    uint64_t t_done[N];
    for (int q = 0; q < N; q++) t_done[q] = (uint64_t)(q / 3) * 10 + test_rng_next(&rng) % 25;   /* 3 producers */
    int done[N] = {0};
    for (int k = 0; k < N; k++) {   /* arrival order: by finish time */
        int best = -1;
        for (int q = 0; q < N; q++) if (!done[q] && (best < 0 || t_done[q] < t_done[best])) best = q;
        done[best] = 1;
        arrivals[n_arr++] = (uint64_t)best;
        if (k % 37 == 5) arrivals[n_arr++] = (uint64_t)best;   /* redelivered copy */
    }
    struct hspack_window w;
    char err[256];
    ck_assert_int_eq(hspack_window_init(&w, W, 0, 0, err, sizeof err), 0);
    uint64_t emitted[N];
    int n_out = 0, waits = 0, injected = 0, pos = 0;
    int taken[2 * N] = {0};
    for (int k = 0; k < n_arr; k++) injected += k > 0 && arrivals[k] == arrivals[k - 1];
    while (n_out < N) {
        struct hspack_entry e;
        if (hspack_window_take(&w, &e) == 0) { emitted[n_out++] = e.seq; continue; }
        int idx = -1;
        if (hspack_window_has_room(&w, HSPACK_HELD, UINT64_MAX)) {
            while (pos < n_arr && taken[pos]) pos++;
            idx = pos;
        } else {
            waits++;
            for (int k = 0; k < n_arr; k++) if (!taken[k] && arrivals[k] == w.next) { idx = k; break; }
        }
        ck_assert_msg(idx >= 0 && idx < n_arr, "ran out of arrivals at next %llu", (unsigned long long)w.next);
        taken[idx] = 1;
        uint64_t seq = arrivals[idx];
        if (hspack_window_is_dup(&w, seq)) { hspack_window_count_dup(&w); continue; }
        ck_assert_int_eq(hspack_window_put(&w, seq, HSPACK_HELD, idx, err, sizeof err), 0);
        ck_assert_uint_le(hspack_window_depth(&w), W);
    }
    for (int q = 0; q < N; q++) ck_assert_uint_eq(emitted[q], (uint64_t)q);
    ck_assert_uint_eq(w.n_out, N);
    ck_assert_uint_le(w.max_depth, W);
    ck_assert_uint_ge(w.max_depth, 2);   /* the arrivals were out of order */
    ck_assert_int_ge(waits, 0);
    /* duplicates: every redelivered copy that was taken counted (copies left over were never needed) */
    ck_assert_uint_le(w.n_dups, (uint64_t)injected);
    ck_assert_uint_ge(w.n_dups, 1);
    ck_assert_int_eq(hspack_window_put(&w, 3, HSPACK_HELD, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "duplicate"), "%s", err);
}
END_TEST

START_TEST(window_spill_and_pool) {
    struct hspack_window w;
    char err[256];
    ck_assert_int_eq(hspack_window_init(&w, 0, 2, 0, err, sizeof err), -1);
    ck_assert_int_eq(hspack_window_init(&w, 3, 2, 10, err, sizeof err), 0);
    ck_assert_int_eq(hspack_window_put(&w, 12, HSPACK_HELD, 0, err, sizeof err), 0);
    ck_assert_int_eq(hspack_window_put(&w, 14, HSPACK_HELD, 1, err, sizeof err), 0);
    ck_assert(!hspack_window_has_room(&w, HSPACK_HELD, 11));   /* the last place is next's */
    ck_assert_int_eq(hspack_window_put(&w, 11, HSPACK_HELD, 3, err, sizeof err), -1);
    ck_assert(hspack_window_has_room(&w, HSPACK_HELD, 10));
    ck_assert_int_eq(hspack_window_put(&w, 10, HSPACK_HELD, 2, err, sizeof err), 0);
    ck_assert(hspack_window_is_dup(&w, 9) && hspack_window_is_dup(&w, 12) && !hspack_window_is_dup(&w, 11));
    const struct hspack_entry *v = hspack_window_spill_victim(&w);
    ck_assert(v && v->seq == 14);
    ck_assert_int_eq(hspack_window_mark_spilled(&w, 14, 0, err, sizeof err), 0);
    ck_assert_uint_eq(w.n_held, 2);
    ck_assert_uint_eq(w.n_spilled, 1);
    ck_assert(!hspack_window_has_room(&w, HSPACK_HELD, 11));
    ck_assert_int_eq(hspack_window_put(&w, 11, HSPACK_SPILLED, 3, err, sizeof err), 0);
    uint64_t lo, hi;
    hspack_window_range(&w, &lo, &hi);
    ck_assert_uint_eq(lo, 10);
    ck_assert_uint_eq(hi, 14);
    ck_assert_uint_eq(w.max_depth, 4);
    struct hspack_entry e;
    uint64_t want[] = {10, 11, 12};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(hspack_window_take(&w, &e), 0);
        ck_assert_uint_eq(e.seq, want[i]);
    }
    ck_assert_int_eq(hspack_window_take(&w, &e), -1);   /* 13 missing: waited for, never skipped */
    ck_assert_uint_eq(w.next, 13);
    ck_assert_int_eq(hspack_window_put(&w, 13, HSPACK_SPILLED, 1, err, sizeof err), 0);
    ck_assert_int_eq(hspack_window_take(&w, &e), 0);
    ck_assert(e.seq == 13 && e.where == HSPACK_SPILLED && e.ref == 1);
    ck_assert_int_eq(hspack_window_take(&w, &e), 0);
    ck_assert(e.seq == 14 && e.where == HSPACK_SPILLED && e.ref == 0);
    ck_assert_uint_eq(w.n_spills, 3);

    static struct hspack_spill s;
    ck_assert_int_eq(hspack_spill_init(&s, 2, 1000, 0, err, sizeof err), 0);
    ck_assert_uint_eq(s.item_bytes, 1024);
    int a = hspack_spill_get(&s), b = hspack_spill_get(&s);
    ck_assert(a == 0 && b == 1);
    ck_assert_int_eq(hspack_spill_get(&s), -1);
    memset(hspack_spill_ptr(&s, b), 7, 1024);
    hspack_spill_put(&s, a);
    ck_assert_int_eq(hspack_spill_get(&s), 0);
    ck_assert_uint_eq((uintptr_t)hspack_spill_ptr(&s, 1) % 256, 0);
    hspack_spill_free(&s);
    ck_assert_int_eq(hspack_spill_init(&s, 0, 1000, 0, err, sizeof err), 0);
    ck_assert_int_eq(hspack_spill_get(&s), -1);
    hspack_spill_free(&s);
}
END_TEST

int main(void) {
    Suite *s = suite_create("hspack");
    TCase *m = tcase_create("module");
    tcase_set_timeout(m, 20);
    tcase_add_test(m, layouts_from_hidden);
    tcase_add_test(m, subset_dtype_and_roundtrip);
    tcase_add_test(m, window_restores_order);
    tcase_add_test(m, window_spill_and_pool);
    suite_add_tcase(s, m);
    return test_run_suite(s);
}
