/*
 * tests/test_cast.c — reference casts (kernels/cast.h): exact round trip of bf16 values, round to
 * nearest even on ties, NaN stays NaN, infinities and overflow, against hand-computed bit patterns.
 */
#include "kernels/cast.h"
#include "testutil.h"

static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

START_TEST(cast_rounding_and_specials) {
    float src[] = {
        1.0f,
        from_bits(0x3f808000u),   /* exactly halfway between 0x3f80 and 0x3f81: ties to even -> 0x3f80 */
        from_bits(0x3f818000u),   /* halfway between 0x3f81 and 0x3f82 -> 0x3f82 (even) */
        from_bits(0x3f808001u),   /* just above halfway -> 0x3f81 */
        -2.5f, INFINITY, -INFINITY, NAN,
        from_bits(0x7f7fffffu),   /* FLT_MAX rounds up to +inf in bf16 */
        0.0f, -0.0f,
    };
    uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc020, 0x7f80, 0xff80, 0, 0x7f80, 0x0000, 0x8000};
    size_t n = sizeof src / sizeof src[0];
    bf16 out[16];
    cast_f32_to_bf16_ref(out, src, n);
    for (size_t i = 0; i < n; i++) {
        if (i == 7) { ck_assert_msg((out[i] & 0x7f80) == 0x7f80 && (out[i] & 0x7f), "NaN became 0x%04x", out[i]); continue; }
        ck_assert_msg(out[i] == want[i], "[%zu]: got 0x%04x want 0x%04x", i, out[i], want[i]);
    }
    /* every bf16 value survives bf16 -> f32 -> bf16 exactly */
    static bf16 all[65536], back[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++) all[i] = (bf16)i;
    cast_bf16_to_f32_ref(f, all, 65536);
    cast_f32_to_bf16_ref(back, f, 65536);
    for (int i = 0; i < 65536; i++) {
        int is_nan = (i & 0x7f80) == 0x7f80 && (i & 0x7f);
        if (!is_nan) ck_assert_msg(back[i] == all[i], "0x%04x came back as 0x%04x", i, back[i]);
        else ck_assert(isnan(f[i]));
    }
    ck_assert_float_eq(f[0x3f80], 1.0f);
    ck_assert_float_eq(f[0xc020], -2.5f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cast");
    TCase *tc = tcase_create("cast");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, cast_rounding_and_specials);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
