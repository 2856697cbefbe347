/*
 * tests/test_hspack_items.h — synthetic hidden items for the multi-process suites of hspack,
 * replay and tap (header-only; tests only): item `seq` is a function of seq alone, so any process
 * can build it and any reader can check every value.
 *
 * - hi_make(seq, desc, desc_cap, payload, &d): a hidden item (f32, T = HI_T tokens in HI_D docs,
 *   k = HI_K layers [1, 4, 7], H = HI_H), alignment gaps filled with garbage; returns desc_len.
 * - hi_value(seq, l, t, h): the state value of captured slot l (l == HI_K: last).
 * - hi_check_features(desc, len, payload, seq, layout): a features item carries exactly item seq.
 * - hi_publish(r, seq): claim a slot of producer ring r (20 s at most) and publish item seq.
 */
#ifndef TESTS_TEST_HSPACK_ITEMS_H
#define TESTS_TEST_HSPACK_ITEMS_H

#include "testutil.h"
#include "test_ring_util.h"

#include "core/desc.h"
#include "shm/ring.h"

#define HI_T 40
#define HI_D 2
#define HI_K 3
#define HI_H 8
#define HI_CAP (16 * 1024)

static inline float hi_value(uint64_t seq, uint32_t l, uint32_t t, uint32_t h) {
    return (float)seq * 1000.0f + (float)l * 100.0f + (float)t + (float)h * 0.125f;
}

static inline size_t hi_make(uint64_t seq, void *desc, size_t desc_cap, uint8_t *payload, struct desc_hidden *out) {
    struct desc_hidden d;
    memset(&d, 0, sizeof d);
    d.batch.seq = seq;
    d.batch.n_tokens = HI_T;
    d.batch.budget = 64;
    d.batch.n_docs = HI_D;
    d.n_layers = HI_K;
    d.layers[0] = 1; d.layers[1] = 4; d.layers[2] = 7;
    d.dtype = DESC_DTYPE_F32;
    d.hidden_size = HI_H;
    desc_hidden_layout(&d);
    ck_assert_uint_le(d.batch.payload_bytes, HI_CAP);
    memset(payload, (int)(0x40 + seq % 64), d.batch.payload_bytes);   /* garbage in the gaps */
    struct desc_batch_arrays a;
    desc_batch_arrays(&d.batch, payload, &a);
    int cu[HI_D + 1] = {0, 17, HI_T};
    uint32_t n_loss = 0;
    for (int doc = 0; doc < HI_D; doc++) {
        a.row_ids[doc] = (int64_t)(seq * HI_D + (uint64_t)doc);
        a.cu_seqlens[doc] = cu[doc];
        for (int t = cu[doc]; t < cu[doc + 1]; t++) {
            a.input_ids[t] = (int32_t)((seq * 13 + (uint64_t)t) % 500);
            a.position_ids[t] = t - cu[doc];
            a.doc_ids[t] = doc;
            a.loss_mask[t] = t - cu[doc] >= 2;
            n_loss += a.loss_mask[t];
        }
    }
    a.cu_seqlens[HI_D] = HI_T;
    d.batch.n_loss = n_loss;
    float *st = (float *)(payload + d.off_states), *last = (float *)(payload + d.off_last);
    for (uint32_t l = 0; l < HI_K; l++)
        for (uint32_t t = 0; t < HI_T; t++)
            for (uint32_t h = 0; h < HI_H; h++) st[((uint64_t)l * HI_T + t) * HI_H + h] = hi_value(seq, l, t, h);
    for (uint32_t t = 0; t < HI_T; t++)
        for (uint32_t h = 0; h < HI_H; h++) last[(uint64_t)t * HI_H + h] = hi_value(seq, HI_K, t, h);
    size_t len = 0;
    char err[512];
    ck_assert_msg(desc_hidden_encode(&d, desc, desc_cap, &len, err, sizeof err) == 0, "%s", err);
    if (out) *out = d;
    return len;
}

/* 0 when the features item is exactly item seq in `layout`, else -1 with a reason printed. */
static inline int hi_check_features(const void *desc, size_t len, const uint8_t *payload, uint64_t seq,
                                    enum desc_layout layout) {
    struct desc_features f;
    char err[512];
    if (desc_features_decode(desc, len, 0, &f, err, sizeof err)) { fprintf(stderr, "seq %llu: %s\n", (unsigned long long)seq, err); return -1; }
    if (f.batch.seq != seq || f.layout != layout || f.n_layers != HI_K || f.hidden_size != HI_H || f.batch.n_tokens != HI_T) {
        fprintf(stderr, "seq %llu: descriptor says seq %llu layout %d k %u\n", (unsigned long long)seq,
                (unsigned long long)f.batch.seq, (int)f.layout, f.n_layers);
        return -1;
    }
    const float *st = (const float *)(payload + f.off_states), *last = (const float *)(payload + f.off_last);
    for (uint32_t l = 0; l < HI_K; l++)
        for (uint32_t t = 0; t < HI_T; t++)
            for (uint32_t h = 0; h < HI_H; h++) {
                uint64_t i = layout == DESC_LAYOUT_CONCAT ? ((uint64_t)t * HI_K + l) * HI_H + h : ((uint64_t)l * HI_T + t) * HI_H + h;
                if (st[i] != hi_value(seq, l, t, h)) {
                    fprintf(stderr, "seq %llu: state l %u t %u h %u = %g, want %g\n", (unsigned long long)seq, l, t, h,
                            st[i], hi_value(seq, l, t, h));
                    return -1;
                }
            }
    for (uint32_t i = 0; i < HI_T * HI_H; i++)
        if (last[i] != hi_value(seq, HI_K, i / HI_H, i % HI_H)) { fprintf(stderr, "seq %llu: last[%u]\n", (unsigned long long)seq, i); return -1; }
    if (desc_batch_check_payload(&f.batch, payload, 500, err, sizeof err)) { fprintf(stderr, "seq %llu: %s\n", (unsigned long long)seq, err); return -1; }
    return 0;
}

static inline void hi_publish(struct ring *r, uint64_t seq) {
    struct ring_slot s;
    double t0 = tr_now();
    int rc;
    while ((rc = ring_acquire_write(r, 200, &s)) == RING_TIMEOUT) ck_assert_msg(tr_now() - t0 < 20, "ring full for 20 s");
    ck_assert_int_eq(rc, 0);
    struct desc_hidden d;
    size_t dl = hi_make(seq, s.desc, s.desc_cap, s.payload, &d);
    ck_assert_int_eq(ring_publish(r, &s, seq, (uint32_t)dl, d.batch.payload_bytes), 0);
}

#endif /* TESTS_TEST_HSPACK_ITEMS_H */
