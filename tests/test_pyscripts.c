/*
 * tests/test_pyscripts.c — the Python tools outside the pipeline, run from make test: scripts/make_jsonl.py through
 * tests/py/test_make_jsonl.py (every chat format, tool calls, loss masks, long conversations, bad rows by line; a
 * tiny tokenizer built locally, no network). Skipped with a printed line when python3 (or $DFLASH_PYTHON) cannot
 * import transformers and tokenizers.
 */
#include "testutil.h"

#include <sys/wait.h>

static const char *python(void) {
    const char *py = getenv("DFLASH_PYTHON");
    return py && *py ? py : "python3";
}

/* A repository file: relative to the working directory (make test runs at the root), else beside DFLASH_BIN. */
static void repo_file(const char *rel, char *out, size_t len) {
    snprintf(out, len, "%s", rel);
    if (access(out, R_OK) == 0) return;
    const char *bin = getenv("DFLASH_BIN");
    snprintf(out, len, "%s/../../%s", bin && *bin ? bin : "build/bin", rel);
}

START_TEST(make_jsonl_formats) {
    char cmd[2048], script[1024];
    snprintf(cmd, sizeof cmd, "%s -c 'import transformers, tokenizers' >/dev/null 2>&1", python());
    if (system(cmd) != 0) {
        printf("make_jsonl_formats: SKIPPED: %s cannot import transformers and tokenizers (pip install transformers; "
               "or set DFLASH_PYTHON)\n", python());
        return;
    }
    repo_file("tests/py/test_make_jsonl.py", script, sizeof script);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", python(), script);
    int rc = system(cmd);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s failed (exit %d)", cmd, WEXITSTATUS(rc));
}
END_TEST

int main(void) {
    Suite *s = suite_create("pyscripts");
    TCase *tc = tcase_create("pyscripts");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, make_jsonl_formats);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
