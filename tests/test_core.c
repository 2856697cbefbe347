/*
 * tests/test_core.c — stages/core: the flag parser, the atomic writer, the run directory helpers.
 */
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "testutil.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* ---------------------------------------------------------------- flags */

struct opts { int n; int64_t big; double lr; const char *name; int verbose; };

static int parse(struct opts *o, int argc, char **argv, char *err, char **pos, int maxpos, int *np) {
    struct flag t[] = {
        {"n", FLAG_INT, &o->n, "count", 1, 100},
        {"big", FLAG_INT64, &o->big, "bytes", 1, 0},
        {"lr", FLAG_DOUBLE, &o->lr, "learning rate", 1, 0},
        {"name", FLAG_STRING, &o->name, "a name", 1, 0},
        {"verbose", FLAG_BOOL, &o->verbose, "talk", 1, 0},
        FLAGS_END,
    };
    return flags_parse(t, argc, argv, pos, maxpos, np, err, 256);
}

START_TEST(flags_good) {
    struct opts o = {5, 7, 0.5, "x", 0};
    char err[256] = "", *pos[2];
    int np = -1;
    char *argv[] = {"prog", "--n", "42", "--big=8k", "--lr", "1e-3", "--name", "abc", "--verbose", "file1"};
    ck_assert_int_eq(parse(&o, 10, argv, err, pos, 2, &np), FLAGS_OK);
    ck_assert_int_eq(o.n, 42);
    ck_assert_int_eq(o.big, 8192);
    ck_assert_double_eq_tol(o.lr, 1e-3, 1e-12);
    ck_assert_str_eq(o.name, "abc");
    ck_assert_int_eq(o.verbose, 1);
    ck_assert_int_eq(np, 1);
    ck_assert_str_eq(pos[0], "file1");
    char *argv2[] = {"prog", "--no-verbose"};
    ck_assert_int_eq(parse(&o, 2, argv2, err, pos, 0, &np), FLAGS_OK);
    ck_assert_int_eq(o.verbose, 0);
}
END_TEST

START_TEST(flags_errors) {
    struct opts o = {5, 7, 0.5, "x", 0};
    char err[256];
    int np;
    char *a1[] = {"prog", "--bogus", "1"};
    ck_assert_int_eq(parse(&o, 3, a1, err, NULL, 0, &np), FLAGS_ERROR);
    ck_assert_str_eq(err, "unknown flag '--bogus'");
    char *a2[] = {"prog", "--n", "x1"};
    ck_assert_int_eq(parse(&o, 3, a2, err, NULL, 0, &np), FLAGS_ERROR);
    ck_assert_str_eq(err, "--n: expected an integer, got 'x1'");
    char *a3[] = {"prog", "--n"};
    ck_assert_int_eq(parse(&o, 2, a3, err, NULL, 0, &np), FLAGS_ERROR);
    ck_assert_str_eq(err, "--n: missing value");
    char *a4[] = {"prog", "--n", "101"};
    ck_assert_int_eq(parse(&o, 3, a4, err, NULL, 0, &np), FLAGS_ERROR);
    ck_assert_str_eq(err, "--n: 101 is out of range [1, 100]");
    char *a5[] = {"prog", "--lr", "nan"};
    ck_assert_int_eq(parse(&o, 3, a5, err, NULL, 0, &np), FLAGS_ERROR);
    char *a6[] = {"prog", "stray"};
    ck_assert_int_eq(parse(&o, 2, a6, err, NULL, 0, &np), FLAGS_ERROR);
    ck_assert_str_eq(err, "unexpected argument 'stray'");
    char *a7[] = {"prog", "--verbose=maybe"};
    ck_assert_int_eq(parse(&o, 2, a7, err, NULL, 0, &np), FLAGS_ERROR);
    char *a8[] = {"prog", "--help"};
    ck_assert_int_eq(parse(&o, 2, a8, err, NULL, 0, &np), FLAGS_HELP);
    ck_assert_int_eq(o.n, 5);   /* failed parses left the default alone */
}
END_TEST

START_TEST(flags_usage_shows_defaults) {
    int n = 8192;
    const char *s = NULL;
    struct flag t[] = {{"tokens", FLAG_INT, &n, "token budget", 1, 0}, {"data", FLAG_STRING, &s, "dataset", 1, 0}, FLAGS_END};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    flags_usage(f, "dflash-x", "[flags]", "does x", t);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "--tokens N"));
    ck_assert_ptr_nonnull(strstr(buf, "(default: 8192)"));
    ck_assert_ptr_nonnull(strstr(buf, "(no default)"));
    free(buf);
}
END_TEST

/* ---------------------------------------------------------------- atomic writer */

START_TEST(atomic_write_roundtrip) {
    const char *dir = test_tmpdir("atomic");
    char path[600], err[256];
    snprintf(path, sizeof path, "%s/state.json", dir);
    ck_assert_int_eq(fs_write_atomic(path, "{\"a\":1}", 7, err, sizeof err), 0);
    ck_assert_int_eq(fs_write_atomic(path, "{\"a\":22}", 8, err, sizeof err), 0);
    char *data; size_t len;
    ck_assert_int_eq(fs_read_file(path, &data, &len, err, sizeof err), 0);
    ck_assert_uint_eq(len, 8);
    ck_assert_str_eq(data, "{\"a\":22}");
    free(data);
    /* no temporary file is left behind */
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    ck_assert(!fs_exists(tmp));
    /* a directory that does not exist is a one-line error naming the file */
    snprintf(path, sizeof path, "%s/missing/x", dir);
    ck_assert_int_eq(fs_write_atomic(path, "x", 1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "missing/x"));
}
END_TEST

/* A writer killed at random points must leave either the old or the new content, never a mix. */
START_TEST(atomic_write_survives_sigkill) {
    const char *dir = test_tmpdir("atomic-kill");
    char path[600], err[256];
    snprintf(path, sizeof path, "%s/cursor", dir);
    static char a[65536], b[65536];
    memset(a, 'A', sizeof a);
    memset(b, 'B', sizeof b);
    ck_assert_int_eq(fs_write_atomic(path, a, sizeof a, err, sizeof err), 0);
    for (int round = 0; round < 20; round++) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            for (;;) {
                fs_write_atomic(path, b, sizeof b, err, sizeof err);
                fs_write_atomic(path, a, sizeof a, err, sizeof err);
            }
        }
        usleep(1000 + round * 500);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        char *data; size_t len;
        ck_assert_int_eq(fs_read_file(path, &data, &len, err, sizeof err), 0);
        ck_assert_uint_eq(len, sizeof a);
        ck_assert(memcmp(data, a, len) == 0 || memcmp(data, b, len) == 0);
        free(data);
    }
}
END_TEST

/* ---------------------------------------------------------------- run directory */

START_TEST(run_dir_layout_and_id) {
    const char *dir = test_tmpdir("rundir");
    char run[600], err[256], p[700];
    snprintf(run, sizeof run, "%s/runs/my run", dir);
    ck_assert_int_eq(run_dir_init(run, err, sizeof err), 0);
    ck_assert_int_eq(run_dir_init(run, err, sizeof err), 0);   /* second caller is fine */
    const char *sub[] = {"bus", "logs", "state", "checkpoints", "export", "plots"};
    for (int i = 0; i < 6; i++) {
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", run, sub[i]);
        ck_assert_msg(stat(p, &st) == 0 && S_ISDIR(st.st_mode), "%s missing", p);
    }
    char id[128], id2[128];
    ck_assert_int_eq(run_id(run, id, sizeof id, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(id, "my_run-"));
    ck_assert_ptr_null(strchr(id, ' '));
    snprintf(p, sizeof p, "%s/other/my run", dir);
    ck_assert_int_eq(run_dir_init(p, err, sizeof err), 0);
    ck_assert_int_eq(run_id(p, id2, sizeof id2, err, sizeof err), 0);
    ck_assert_str_ne(id, id2);   /* same basename, different path: different ids */
}
END_TEST

/* ---------------------------------------------------------------- run directory permissions */

static unsigned mode_of(const char *path) {
    struct stat st;
    ck_assert_msg(stat(path, &st) == 0, "stat(%s): %s", path, strerror(errno));
    return (unsigned)(st.st_mode & 0777);
}

START_TEST(run_dir_private_by_default) {
    umask(0);   /* whatever the umask: the modes are set explicitly */
    /* private by default; --share-group: group-readable */
    static const unsigned dir_mode[2] = {0700, 0750}, file_mode[2] = {0600, 0640};
    for (int share = 0; share < 2; share++) {
        char run[700], sub[800], err[512];
        fs_set_share_group(share);
        snprintf(run, sizeof run, "%s/a/run", test_tmpdir("perm"));
        ck_assert_msg(run_dir_init(run, err, sizeof err) == 0, "%s", err);
        ck_assert_uint_eq(mode_of(run), dir_mode[share]);
        snprintf(sub, sizeof sub, "%s/logs", run);
        ck_assert_uint_eq(mode_of(sub), dir_mode[share]);
        snprintf(sub, sizeof sub, "%s/state/x", run);
        ck_assert_int_eq(fs_write_atomic(sub, "hi", 2, err, sizeof err), 0);
        ck_assert_uint_eq(mode_of(sub), file_mode[share]);
        snprintf(sub, sizeof sub, "%s/logs/t.log", run);
        ck_assert_int_eq(log_open_file(sub, err, sizeof err), 0);
        ck_assert_uint_eq(mode_of(sub), file_mode[share]);
    }
    fs_set_share_group(0);
}
END_TEST

/* A symlink planted at the log's name is refused (O_NOFOLLOW), not followed. */
START_TEST(log_refuses_symlink) {
    const char *d = test_tmpdir("logsym");
    char target[600], link[600], err[512];
    snprintf(target, sizeof target, "%s/elsewhere", d);
    snprintf(link, sizeof link, "%s/stage.log", d);
    ck_assert_int_eq(symlink(target, link), 0);
    ck_assert_int_eq(log_open_file(link, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "for the log failed") != NULL, "%s", err);
    ck_assert_int_eq(access(target, F_OK), -1);   /* nothing was created through the link */
    ck_assert_int_eq(fs_write_atomic(link, "x", 1, err, sizeof err), 0);   /* replaced by rename, not followed */
    ck_assert_int_eq(access(target, F_OK), -1);
}
END_TEST

/* Issue 24 defect 6: a symlink planted at a temporary's name (fs_create_tmp: checkpoints, safetensors, the
 * packer's cursor, datasets) or at a state file's name (fs_open_state: hspack, replay) is never written through,
 * and what they create is 0600 whatever the umask. */
START_TEST(tmp_and_state_refuse_symlinks) {
    const char *d = test_tmpdir("tmpsym");
    char target[600], link[600], tmp[600];
    snprintf(target, sizeof target, "%s/elsewhere", d);
    snprintf(link, sizeof link, "%s/hspack.features.next", d);
    ck_assert_int_eq(symlink(target, link), 0);
    ck_assert_int_eq(fs_open_state(link), -1);
    ck_assert_int_eq(access(target, F_OK), -1);
    snprintf(tmp, sizeof tmp, "%s/x.ckpt.tmp.%d", d, (int)getpid());
    ck_assert_int_eq(symlink(target, tmp), 0);
    mode_t old = umask(0);
    int fd = fs_create_tmp(tmp);
    umask(old);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "y", 1), 1);
    close(fd);
    ck_assert_int_eq(access(target, F_OK), -1);   /* the planted link was replaced, not followed */
    struct stat st;
    ck_assert_int_eq(lstat(tmp, &st), 0);
    ck_assert(S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600);
    snprintf(link, sizeof link, "%s/state.pos", d);
    old = umask(0);
    fd = fs_open_state(link);
    umask(old);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(stat(link, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
}
END_TEST

/* A run directory owned by someone else is refused with one sentence. */
START_TEST(run_dir_of_another_user_refused) {
    char run[700], err[512];
    snprintf(run, sizeof run, "%s/run", test_tmpdir("owner"));
    ck_assert_int_eq(mkdir(run, 0755), 0);
    uid_t other = geteuid() == 65534 ? 65533 : 65534;
    if (geteuid() == 0) ck_assert_int_eq(chown(run, other, (gid_t)-1), 0);
    else snprintf(run, sizeof run, "/");   /* not root: / belongs to root */
    if (geteuid() != 0) other = 0;
    ck_assert_int_eq(run_dir_init(run, err, sizeof err), -1);
    char want[900];
    snprintf(want, sizeof want, "run directory %s is owned by uid %u, not by this user (uid %u); refusing to write into it",
             run, (unsigned)other, (unsigned)geteuid());
    ck_assert_str_eq(err, want);
}
END_TEST

int main(void) {
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, flags_good);
    tcase_add_test(tc, flags_errors);
    tcase_add_test(tc, flags_usage_shows_defaults);
    tcase_add_test(tc, atomic_write_roundtrip);
    tcase_add_test(tc, atomic_write_survives_sigkill);
    tcase_add_test(tc, run_dir_layout_and_id);
    tcase_add_test(tc, run_dir_private_by_default);
    tcase_add_test(tc, log_refuses_symlink);
    tcase_add_test(tc, run_dir_of_another_user_refused);
    tcase_add_test(tc, tmp_and_state_refuse_symlinks);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
