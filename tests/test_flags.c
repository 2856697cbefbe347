/*
 * tests/test_flags.c — stages/core/flags: the choice and list types, double bounds, and every
 * error sentence they give; --help lists choices and defaults.
 */
#include "core/flags.h"
#include "testutil.h"

static const char *const loss_names[] = {"kl", "ce", NULL};
static const char *const type_names[] = {"sliding", "full", NULL};

struct o2 {
    int loss, layers[4], n_layers, types[3], n_types;
    double hb;
};

static enum flags_result parse2(struct o2 *o, int argc, char **argv, char *err) {
    struct flag_choice loss = {&o->loss, loss_names};
    struct flag_list layers = {o->layers, &o->n_layers, 4, NULL};
    struct flag_list types = {o->types, &o->n_types, 3, type_names};
    struct flag t[] = {
        {"loss", FLAG_CHOICE, &loss, "loss", 1, 0},
        {"layers", FLAG_LIST, &layers, "layer ids", 0, 100},
        {"layer-types", FLAG_LIST, &types, "attention per layer", 1, 0},
        {"heartbeat-s", FLAG_DOUBLE, &o->hb, "period", 0, 60},
        FLAGS_END,
    };
    return flags_parse(t, argc, argv, NULL, 0, NULL, err, 256);
}

START_TEST(choice_list_double_good) {
    struct o2 o = {.loss = 0, .hb = 1};
    char err[256] = "";
    char *argv[] = {"p", "--loss", "ce", "--layers", "1,9,17", "--layer-types=sliding,sliding,full", "--heartbeat-s", "0.25"};
    ck_assert_int_eq(parse2(&o, 8, argv, err), FLAGS_OK);
    ck_assert_int_eq(o.loss, 1);
    ck_assert_int_eq(o.n_layers, 3);
    ck_assert_int_eq(o.layers[0], 1);
    ck_assert_int_eq(o.layers[1], 9);
    ck_assert_int_eq(o.layers[2], 17);
    ck_assert_int_eq(o.n_types, 3);
    ck_assert_int_eq(o.types[0], 0);
    ck_assert_int_eq(o.types[2], 1);
    ck_assert_double_eq_tol(o.hb, 0.25, 1e-12);
    char *argv2[] = {"p", "--layers", "0x10"};   /* items take the int syntax --n does */
    ck_assert_int_eq(parse2(&o, 3, argv2, err), FLAGS_OK);
    ck_assert_int_eq(o.n_layers, 1);
    ck_assert_int_eq(o.layers[0], 16);
}
END_TEST

/* Each bad value gives FLAGS_ERROR with this exact sentence. */
START_TEST(choice_list_double_errors) {
    struct { const char *flag, *val, *msg; } cases[] = {
        {"--loss", "mse", "--loss: expected one of kl|ce, got 'mse'"},
        {"--loss", "", "--loss: expected one of kl|ce, got ''"},
        {"--layers", "1,x", "--layers: item 2 'x' is not an integer"},
        {"--layers", "1,,2", "--layers: empty item in '1,,2'"},
        {"--layers", "", "--layers: expected a comma-separated list, got ''"},
        {"--layers", "1,2,3,4,5", "--layers: at most 4 items, got more in '1,2,3,4,5'"},
        {"--layers", "5,101", "--layers: item 2 (101) is out of range [0, 100]"},
        {"--layers", "-1", "--layers: item 1 (-1) is out of range [0, 100]"},
        {"--layer-types", "sliding,local", "--layer-types: item 2 'local' is not one of sliding|full"},
        {"--heartbeat-s", "-1", "--heartbeat-s: -1 is out of range [0, 60]"},
        {"--heartbeat-s", "61", "--heartbeat-s: 61 is out of range [0, 60]"},
        {"--heartbeat-s", "nan", "--heartbeat-s: expected a number, got 'nan'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct o2 o = {.hb = 1};
        char err[256] = "";
        char *argv[] = {"p", (char *)cases[i].flag, (char *)cases[i].val};
        ck_assert_int_eq(parse2(&o, 3, argv, err), FLAGS_ERROR);
        ck_assert_msg(!strcmp(err, cases[i].msg), "case %zu: got '%s', want '%s'", i, err, cases[i].msg);
    }
    /* a failed list leaves the default count alone */
    struct o2 o = {.layers = {7}, .n_layers = 1};
    char err[256];
    char *argv[] = {"p", "--layers", "1,x"};
    ck_assert_int_eq(parse2(&o, 3, argv, err), FLAGS_ERROR);
    ck_assert_int_eq(o.n_layers, 1);
}
END_TEST

START_TEST(usage_lists_choices_and_defaults) {
    int loss = 1, layers[4] = {1, 9}, n_layers = 2, types[3], n_types = 0;
    double hb = 1.5;
    struct flag_choice lc = {&loss, loss_names};
    struct flag_list ll = {layers, &n_layers, 4, NULL}, tl = {types, &n_types, 3, type_names};
    struct flag t[] = {
        {"loss", FLAG_CHOICE, &lc, "loss", 1, 0},
        {"layers", FLAG_LIST, &ll, "layer ids", 0, 100},
        {"layer-types", FLAG_LIST, &tl, "attention per layer", 1, 0},
        {"heartbeat-s", FLAG_DOUBLE, &hb, "period", 0, 60},
        FLAGS_END,
    };
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    ck_assert_ptr_nonnull(f);
    flags_usage(f, "prog", NULL, NULL, t);
    fclose(f);
    ck_assert_msg(strstr(buf, "(one of kl|ce; default: ce)") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "(default: 1,9)") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "(items: sliding|full) (default: none)") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "(default: 1.5) [0, 60]") != NULL, "%s", buf);
}
END_TEST

int main(void) {
    Suite *s = suite_create("flags");
    TCase *tc = tcase_create("flags");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, choice_list_double_good);
    tcase_add_test(tc, choice_list_double_errors);
    tcase_add_test(tc, usage_lists_choices_and_defaults);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
