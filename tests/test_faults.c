/*
 * tests/test_faults.c — regression tests of issue 14 for the rings and dflash-shm, with real
 * processes (a real dflash-shm, forked stages, and for the cross-user cases a throwaway user
 * created here when we are root and useradd exists; skipped with a message otherwise).
 *
 * - corrupt_header_after_attach (item 8): the header's geometry is rewritten under attached
 *   stages; they keep the geometry read at attach (no out-of-bounds scan), a new attach is
 *   refused with a sentence, and a slot's desc_len/payload_len beyond the capacities give -1 with
 *   "corrupt" instead of out-of-bounds reads.
 * - seq_max_delivered (item 6): an item with seq UINT64_MAX is delivered, not waited on forever.
 * - stale_means_nothing_attached (item 3): dflash-shm SIGKILLed while a stage is attached:
 *   --remove-stale leaves the segment ("in use"); once the stage is gone it removes it.
 * - mode_not_0600_refused (item 7): a segment of ours with mode 0644 is refused by attach and by
 *   a restarted dflash-shm, with a sentence giving owner and mode.
 * - planted_by_other_user (item 7): another uid plants a segment (mode 0666, a header whose
 *   creator pid is alive): dflash-shm and attach refuse it naming the owner, --remove-stale
 *   leaves it alone ("foreign").
 * - control_socket_owner_only (item 9): under umask 000 the control socket is 0600, another uid
 *   cannot connect, and a client refuses a socket with group/other bits.
 * - consumer_learns_producer_left (item 2): a producer that exits 3 without draining: the
 *   consumer's log says so and its wait times out instead of ending the stream.
 * - nan_weight_refused (item 10): a NaN or infinite checkpoint weight fails the conversion with a
 *   sentence naming file, tensor and element (f32 and bf16 paths).
 * - list_stale_by_other_user (issue 24): another user's --list-stale gives a 0600 segment's true uid and mode.
 * - control_socket_path_too_long (issue 24): said before anything is created, with the right hint.
 * - shm_sigterm_mid_stream (item 2): dflash-shm SIGTERMed with items in a ring exits 3, leaves
 *   the segment, and its restart adopts it with the item intact.
 */
#include "model/weights.h"
#include "test_ring_util.h"

#include <grp.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

/* Offsets in the segment (shm/ring.c struct ring_header / struct slot_hdr; test_faults only). */
#define OFF_SLOTS_OFFSET 24
#define OFF_PAYLOAD_BYTES 56
#define OFF_N_SLOTS 64
#define OFF_OWNER_PID 84
#define SLOTS_AT 4096
#define SLOT_OFF_PAYLOAD_LEN 16
#define SLOT_OFF_DESC_LEN 24

static int g_capture_as_other;   /* run_capture's child becomes the throwaway user first */
static void become_other(void);

static int run_capture(char *const argv[], char *out, size_t cap) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (g_capture_as_other) become_other();
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(fds[0], out + n, cap - 1 - n)) > 0) n += (size_t)k;
    out[n] = 0;
    close(fds[0]);
    return tr_wait(pid);
}

static uint8_t *map_raw(const char *seg, size_t *len) {
    int fd = shm_open(seg, O_RDWR, 0);
    ck_assert_msg(fd >= 0, "shm_open(%s): %s", seg, strerror(errno));
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    *len = (size_t)sb.st_size;
    uint8_t *p = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert(p != MAP_FAILED);
    close(fd);
    return p;
}

static struct ring *att(const char *run, const char *name, int role) {
    char err[512];
    struct ring *r = ring_attach(run, name, role, 2000, err, sizeof err);
    ck_assert_msg(r != NULL, "attach %s: %s", name, err);
    return r;
}

static void put(struct ring *p, uint64_t seq) {
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_write(p, 1000, &s), 0);
    item_write(&s, seq);
    ck_assert_msg(ring_publish(p, &s, seq, sizeof(struct item_desc), item_len(seq)) == 0, "%s", ring_error());
}

START_TEST(corrupt_header_after_attach) {
    const char *run = tr_run("fhdr");
    ring_set_log(tr_quiet, NULL);
    pid_t shm = tr_start_shm(run, "c:slots=4,bytes=4k,desc=256,dev=host", NULL, NULL);
    struct ring *p = att(run, "c", RING_PRODUCER), *c = att(run, "c", RING_CONSUMER);
    char seg[256], err[512];
    ck_assert_int_eq(ring_segment_name(run, "c", seg, sizeof seg, err, sizeof err), 0);
    size_t len;
    uint8_t *raw = map_raw(seg, &len);
    put(p, 0);
    /* geometry rewritten under attached stages: they must not follow it */
    uint32_t huge = 1u << 20;
    uint64_t far = 1ull << 40;
    memcpy(raw + OFF_N_SLOTS, &huge, 4);
    memcpy(raw + OFF_SLOTS_OFFSET, &far, 8);
    memcpy(raw + OFF_PAYLOAD_BYTES, &far, 8);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_read(c, 1000, &s), 0);
    ck_assert_uint_eq(s.seq, 0);
    ck_assert_uint_eq(s.desc_cap, 256);
    ck_assert_uint_eq(s.payload_cap, 4096);
    ck_assert_int_eq(item_check(&s), 1);
    ck_assert_int_eq(ring_release(c, &s), 0);
    /* a new attach validates the header and refuses it with a sentence */
    ck_assert_ptr_null(ring_attach(run, "c", RING_CONSUMER, 0, err, sizeof err));
    ck_assert_msg(strstr(err, "header") != NULL, "%s", err);
    /* per-slot fields are untrusted: desc_len past the capacity -> -1, not a 4 GB read */
    put(p, 1);
    uint32_t slot_stride = 128 + 256;   /* round_up(128 + desc, 64) */
    int hit = 0;
    for (uint32_t i = 0; i < 4; i++) {
        uint8_t *sh = raw + SLOTS_AT + (uint64_t)i * slot_stride;
        uint64_t ctl, seq;
        memcpy(&ctl, sh, 8);
        memcpy(&seq, sh + 8, 8);
        if ((ctl >> 62) == 2 && seq == 1) {   /* READY seq 1 */
            uint32_t bad = 0xfffffff0u;
            memcpy(sh + SLOT_OFF_DESC_LEN, &bad, 4);
            hit = 1;
        }
    }
    ck_assert(hit);
    ck_assert_int_eq(ring_acquire_read(c, 500, &s), -1);
    ck_assert_msg(strstr(ring_error(), "corrupt") && strstr(ring_error(), "desc_len"), "%s", ring_error());
    /* the same for payload_len */
    for (uint32_t i = 0; i < 4; i++) {
        uint8_t *sh = raw + SLOTS_AT + (uint64_t)i * slot_stride;
        uint64_t seq;
        memcpy(&seq, sh + 8, 8);
        if (seq == 1) {
            uint32_t ok = sizeof(struct item_desc);
            uint64_t bad = 1ull << 38;
            memcpy(sh + SLOT_OFF_DESC_LEN, &ok, 4);
            memcpy(sh + SLOT_OFF_PAYLOAD_LEN, &bad, 8);
        }
    }
    ck_assert_int_eq(ring_acquire_read(c, 500, &s), -1);
    ck_assert_msg(strstr(ring_error(), "payload_len"), "%s", ring_error());
    /* restore the header so dflash-shm can close its ring */
    uint32_t four = 4;
    uint64_t at = 4096, pb = 4096;
    memcpy(raw + OFF_N_SLOTS, &four, 4);
    memcpy(raw + OFF_SLOTS_OFFSET, &at, 8);
    memcpy(raw + OFF_PAYLOAD_BYTES, &pb, 8);
    munmap(raw, len);
    ring_close(p);
    ring_close(c);
    kill(shm, SIGKILL);
    tr_wait(shm);
    ring_unlink(run, "c", err, sizeof err);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

START_TEST(seq_max_delivered) {
    const char *run = tr_run("fseq");
    pid_t shm = tr_start_shm(run, "m:slots=2,bytes=1k,desc=256,dev=host", NULL, NULL);
    struct ring *p = att(run, "m", RING_PRODUCER), *c = att(run, "m", RING_CONSUMER);
    put(p, UINT64_MAX);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_read(c, 1000, &s), 0);
    ck_assert(s.seq == UINT64_MAX);
    ck_assert_int_eq(ring_release(c, &s), 0);
    put(p, UINT64_MAX - 1);
    ck_assert_int_eq(ring_acquire_read_seq(c, UINT64_MAX - 1, 1000, &s), 0);
    ck_assert_int_eq(ring_release(c, &s), 0);
    ck_assert_int_eq(ring_mark_drained(p), 0);
    ck_assert_int_eq(ring_acquire_read(c, 1000, &s), RING_END);
    ring_close(p);
    ring_close(c);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

static int child_hold(void *arg) {
    const char *run = arg;
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *r = ring_attach(run, "held", RING_CONSUMER, 3000, err, sizeof err);
    if (!r) return 10;
    for (;;) pause();
}

START_TEST(stale_means_nothing_attached) {
    const char *run = tr_run("fstale");
    pid_t shm = tr_start_shm(run, "held:slots=2,bytes=1k,dev=host", NULL, NULL);
    pid_t stage = tr_fork(child_hold, (void *)run);
    /* wait until the child is in the attach table */
    char out[16384];
    char *st[] = {(char *)test_bin("dflash-shm"), "--status", "--field", "held.attached", "--run", (char *)run, NULL};
    double t0 = tr_now();
    for (;;) {
        ck_assert_int_eq(run_capture(st, out, sizeof out), 0);
        if (atoi(out) == 1) break;
        ck_assert_msg(tr_now() - t0 < 5, "child never attached: %s", out);
        usleep(20000);
    }
    kill(shm, SIGKILL);
    tr_wait(shm);
    char *rm[] = {(char *)test_bin("dflash-shm"), "--remove-stale", NULL};
    ck_assert_int_eq(run_capture(rm, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "in use") != NULL, "--remove-stale did not report the segment in use: %s", out);
    ck_assert_int_eq(tr_count_segments(run), 1);   /* the live stage keeps it */
    kill(stage, SIGKILL);
    tr_wait(stage);
    char *rm_run[] = {(char *)test_bin("dflash-shm"), "--remove-stale", "--run", (char *)run, NULL};
    ck_assert_int_eq(run_capture(rm_run, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "removed"), "%s", out);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

START_TEST(mode_not_0600_refused) {
    const char *run = tr_run("fmode");
    char seg[256], err[512];
    ck_assert_int_eq(ring_segment_name(run, "x", seg, sizeof seg, err, sizeof err), 0);
    pid_t shm = tr_start_shm(run, "x:slots=2,bytes=1k,dev=host", NULL, NULL);
    int fd = shm_open(seg, O_RDWR, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fchmod(fd, 0644), 0);
    close(fd);
    ck_assert_ptr_null(ring_attach(run, "x", RING_CONSUMER, 0, err, sizeof err));
    ck_assert_msg(strstr(err, "refusing") && strstr(err, "0644"), "%s", err);
    kill(shm, SIGKILL);
    tr_wait(shm);
    /* a restarted dflash-shm refuses to adopt it and says why */
    char out[8192];
    char *argv[] = {(char *)test_bin("dflash-shm"), "--run", (char *)run, "--ring", "x:slots=2,bytes=1k,dev=host", NULL};
    ck_assert_int_ne(run_capture(argv, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "refusing") && strstr(out, "0644"), "%s", out);
    ck_assert_int_eq(shm_unlink(seg), 0);
}
END_TEST

/* ---------------------------------------------------------------- a second uid */

static char g_user[32];
static uid_t g_uid;
static gid_t g_gid;

/* Create a throwaway user (root + useradd only). 0 ok, -1 skip (message printed). */
static int other_user(void) {
    if (geteuid() != 0) { fprintf(stderr, "test_faults: not root; cross-user case skipped\n"); return -1; }
    if (access("/usr/sbin/useradd", X_OK) != 0) { fprintf(stderr, "test_faults: no useradd; cross-user case skipped\n"); return -1; }
    snprintf(g_user, sizeof g_user, "dflt%d", (int)getpid() % 100000);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "/usr/sbin/useradd -M -r -s /bin/false %s >/dev/null 2>&1", g_user);
    if (system(cmd) != 0) { fprintf(stderr, "test_faults: useradd failed; cross-user case skipped\n"); return -1; }
    struct passwd *pw = getpwnam(g_user);
    if (!pw) { fprintf(stderr, "test_faults: no passwd entry for %s; skipped\n", g_user); return -1; }
    g_uid = pw->pw_uid;
    g_gid = pw->pw_gid;
    return 0;
}

static void drop_user(void) {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "/usr/sbin/userdel %s >/dev/null 2>&1", g_user);
    if (system(cmd) != 0) fprintf(stderr, "test_faults: userdel %s failed\n", g_user);
}

static void become_other(void) {
    if (setgroups(0, NULL) != 0 || setgid(g_gid) != 0 || setuid(g_uid) != 0) _exit(90);
}

struct plant { const char *seg; int alive_pid; };

static int child_plant(void *arg) {
    struct plant *pl = arg;
    become_other();
    umask(0);
    int fd = shm_open(pl->seg, O_RDWR | O_CREAT | O_EXCL, 0666);
    if (fd < 0) return 11;
    if (ftruncate(fd, 16384) != 0) return 12;
    uint8_t *p = mmap(NULL, 16384, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return 13;
    uint64_t magic = RING_MAGIC;
    memcpy(p + OFF_OWNER_PID, &pl->alive_pid, 4);   /* a creator that is alive: the test itself */
    memcpy(p, &magic, 8);
    return 0;
}

static const char *g_sock;
static int child_connect(void *arg) {
    (void)arg;
    become_other();
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0) return 20;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", g_sock);
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) return 21;   /* must not be allowed */
    return errno == EACCES ? 0 : 22;
}

START_TEST(planted_by_other_user) {
    if (other_user() != 0) return;
    const char *run = tr_run("fplant");
    char seg[256], err[512];
    ck_assert_int_eq(ring_segment_name(run, "p", seg, sizeof seg, err, sizeof err), 0);
    shm_unlink(seg);
    struct plant pl = {seg, (int)getpid()};
    int rc = tr_wait(tr_fork(child_plant, &pl));
    drop_user();
    ck_assert_int_eq(rc, 0);
    char out[8192], uid[32];
    snprintf(uid, sizeof uid, "uid %u", (unsigned)g_uid);
    char *argv[] = {(char *)test_bin("dflash-shm"), "--run", (char *)run, "--ring", "p:slots=2,bytes=1k,dev=host", NULL};
    ck_assert_int_ne(run_capture(argv, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "refusing") && strstr(out, uid), "dflash-shm adopted or misreported a planted segment: %s", out);
    ck_assert_ptr_null(ring_attach(run, "p", RING_CONSUMER, 0, err, sizeof err));
    ck_assert_msg(strstr(err, "refusing") && strstr(err, uid), "%s", err);
    char *rm[] = {(char *)test_bin("dflash-shm"), "--remove-stale", "--run", (char *)run, NULL};
    ck_assert_int_eq(run_capture(rm, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "foreign"), "%s", out);
    ck_assert_int_eq(tr_count_segments(run), 1);
    ck_assert_int_eq(shm_unlink(seg), 0);
}
END_TEST

/* Issue 24: another user's --list-stale showed mode 0000 (and uid 0) for a 0600 segment it cannot open: the
 * owner and mode now come from the directory entry. */
START_TEST(list_stale_by_other_user) {
    if (other_user() != 0) return;
    const char *run = tr_run("flist");
    char seg[256], err[512], out[8192];
    ck_assert_int_eq(ring_segment_name(run, "q", seg, sizeof seg, err, sizeof err), 0);
    shm_unlink(seg);
    int fd = shm_open(seg, O_RDWR | O_CREAT | O_EXCL, 0600);   /* ours (root's), 0600, no header: not openable by them */
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fchmod(fd, 0600), 0);
    ck_assert_int_eq(ftruncate(fd, 8192), 0);
    close(fd);
    char *ls[] = {(char *)test_bin("dflash-shm"), "--list-stale", NULL};   /* no --run: they cannot resolve our run dir */
    g_capture_as_other = 1;
    int rc = run_capture(ls, out, sizeof out);
    g_capture_as_other = 0;
    drop_user();
    shm_unlink(seg);
    ck_assert_msg(rc == 0, "status %d: %s", rc, out);
    char want[400];
    snprintf(want, sizeof want, "%s (uid %u, mode 0600:", seg + 1, (unsigned)geteuid());
    ck_assert_msg(strstr(out, want), "want '%s' in: %s", want, out);
}
END_TEST

/* Issue 24: a run path too long for the control socket is said at once, with the right hint (nanomsg's "Invalid
 * argument" came with "is another dflash-shm serving this run?"), and no segment is left. */
START_TEST(control_socket_path_too_long) {
    char run[600], out[8192];
    snprintf(run, sizeof run, "%s/%0120d", tr_run("flong"), 0);
    char *argv[] = {(char *)test_bin("dflash-shm"), "--run", run, "--ring", "x:slots=2,bytes=1k,dev=host", NULL};
    ck_assert_int_eq(run_capture(argv, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "a Unix socket allows 107") && strstr(out, "use a shorter --run path") &&
                  !strstr(out, "another dflash-shm"), "%s", out);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

static int child_shm_umask0(void *arg) {
    const char *run = arg;
    umask(0);
    execl(test_bin("dflash-shm"), "dflash-shm", "--run", run, "--ring", "u:slots=2,bytes=1k,dev=host", (char *)NULL);
    _exit(127);
}

START_TEST(control_socket_owner_only) {
    const char *run = tr_run("fsock");
    pid_t shm = tr_fork(child_shm_umask0, (void *)run);
    char sock[700], shmjson[700];
    snprintf(sock, sizeof sock, "%s/bus/control.sock", run);
    snprintf(shmjson, sizeof shmjson, "%s/shm.json", run);
    double t0 = tr_now();
    while (access(shmjson, F_OK) != 0) {
        ck_assert_msg(tr_now() - t0 < 10, "dflash-shm did not start");
        usleep(20000);
    }
    struct stat sb;
    ck_assert_int_eq(lstat(sock, &sb), 0);
    ck_assert_msg((sb.st_mode & 0777) == 0600, "control socket mode %04o under umask 000, expected 0600", sb.st_mode & 0777);
    if (other_user() == 0) {
        /* let the other user reach the directory, so only the socket's mode stops it */
        char dir[700];
        snprintf(dir, sizeof dir, "%s", run);
        for (char *slash; (slash = strrchr(dir, '/')) && slash != dir; *slash = 0) chmod(dir, 0755);
        chmod(run, 0755);
        char bus[700];
        snprintf(bus, sizeof bus, "%s/bus", run);
        chmod(bus, 0755);
        g_sock = sock;
        int rc = tr_wait(tr_fork(child_connect, NULL));
        drop_user();
        ck_assert_msg(rc == 0, "another uid could connect to the control socket (child status %d)", rc);
    }
    /* a client refuses a socket others may write to */
    ck_assert_int_eq(chmod(sock, 0666), 0);
    char out[8192];
    char *st[] = {(char *)test_bin("dflash-shm"), "--status", "--timeout-ms", "300", "--run", (char *)run, NULL};
    run_capture(st, out, sizeof out);
    ck_assert_msg(strstr(out, "refusing control socket") && strstr(out, "0666"), "%s", out);
    ck_assert_int_eq(chmod(sock, 0600), 0);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

START_TEST(shm_sigterm_mid_stream) {
    const char *run = tr_run("fterm");
    pid_t shm = tr_start_shm(run, "t:slots=4,bytes=1k,desc=256,dev=host", NULL, NULL);
    struct ring *p = att(run, "t", RING_PRODUCER);
    put(p, 0);
    ck_assert_int_eq(kill(shm, SIGTERM), 0);
    ck_assert_int_eq(tr_wait(shm), 3);   /* STAGE_EXIT_STOPPED (stages/core/stage.h) */
    ck_assert_int_eq(tr_count_segments(run), 1);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_write(p, 0, &s), 0);   /* not closed: the producer carries on */
    ck_assert_int_eq(ring_abandon(p, &s), 0);
    shm = tr_start_shm(run, "t:slots=4,bytes=1k,desc=256,dev=host", NULL, NULL);   /* adopts */
    struct ring *c = att(run, "t", RING_CONSUMER);
    ck_assert_int_eq(ring_acquire_read(c, 1000, &s), 0);
    ck_assert_uint_eq(s.seq, 0);
    ck_assert_int_eq(item_check(&s), 1);
    ck_assert_int_eq(ring_release(c, &s), 0);
    ck_assert_int_eq(ring_mark_drained(p), 0);
    ck_assert_int_eq(ring_acquire_read(c, 1000, &s), RING_END);
    ring_close(c);
    ring_close(p);
    tr_stop_shm(shm);   /* drained and empty: exit 0 and unlink */
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

static int child_produce_and_leave(void *arg) {
    const char *run = arg;
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *r = ring_attach(run, "left", RING_PRODUCER, 3000, err, sizeof err);
    if (!r) return 10;
    struct ring_slot s;
    if (ring_acquire_write(r, 1000, &s) != 0) return 11;
    item_write(&s, 0);
    if (ring_publish(r, &s, 0, sizeof(struct item_desc), item_len(0)) != 0) return 12;
    _exit(3);   /* stopped before the end of its stream: no ring_mark_drained */
}

static char g_logged[4096];
static void capture_log(void *ctx, const char *line) {
    (void)ctx;
    size_t n = strlen(g_logged);
    snprintf(g_logged + n, sizeof g_logged - n, "%s\n", line);
}

/* Item 2: a consumer learns that its producer left without draining (and keeps waiting for the
 * restart instead of ending the stream). */
START_TEST(consumer_learns_producer_left) {
    const char *run = tr_run("fleft");
    pid_t shm = tr_start_shm(run, "left:slots=2,bytes=1k,desc=256,dev=host", NULL, NULL);
    ck_assert_int_eq(tr_wait(tr_fork(child_produce_and_leave, (void *)run)), 3);
    g_logged[0] = 0;
    ring_set_log(capture_log, NULL);
    struct ring *c = att(run, "left", RING_CONSUMER);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_read(c, 1000, &s), 0);
    ck_assert_int_eq(ring_release(c, &s), 0);
    ck_assert_int_eq(ring_acquire_read(c, 500, &s), RING_TIMEOUT);   /* not RING_END: the stream is not over */
    ring_set_log(NULL, NULL);
    ck_assert_msg(strstr(g_logged, "exited before the end of its stream (not drained); waiting for its restart"), "log: %s", g_logged);
    ring_close(c);
    /* a dead producer that never drained keeps the ring in use: SIGTERM gives exit 3, segment kept */
    ck_assert_int_eq(kill(shm, SIGTERM), 0);
    ck_assert_int_eq(tr_wait(shm), 3);
    ck_assert_int_eq(tr_count_segments(run), 1);
    char err[256];
    ck_assert_int_eq(ring_unlink(run, "left", err, sizeof err), 0);
}
END_TEST

START_TEST(nan_weight_refused) {
    float v[6] = {1, 2, 3, NAN, 5, 6};
    struct st_tensor t = {.name = "model.norm.weight", .path = "ckpt.safetensors", .dtype = ST_F32, .ndim = 1,
                          .shape = {6}, .numel = 6, .nbytes = sizeof v, .data = v};
    float out[6];
    bf16 outb[6];
    char err[512];
    ck_assert_int_eq(weights_convert_f32(&t, 0, 6, out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "ckpt.safetensors") && strstr(err, "model.norm.weight") && strstr(err, "element 3 is NaN"), "%s", err);
    ck_assert_int_eq(weights_convert_bf16(&t, 0, 6, outb, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "element 3 is NaN"), "%s", err);
    ck_assert_int_eq(weights_convert_f32(&t, 0, 3, out, err, sizeof err), 0);   /* the finite part converts */
    v[3] = INFINITY;
    ck_assert_int_eq(weights_convert_f32(&t, 2, 4, out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "element 3 is infinite"), "%s", err);
    uint16_t h[2] = {0x3f80, 0x7fc0};   /* bf16 1.0 and NaN */
    struct st_tensor tb = {.name = "w", .path = "b.safetensors", .dtype = ST_BF16, .ndim = 1, .shape = {2}, .numel = 2, .nbytes = 4, .data = h};
    ck_assert_int_eq(weights_convert_bf16(&tb, 0, 2, outb, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "element 1 is NaN"), "%s", err);
    ck_assert_int_eq(weights_convert_f32(&tb, 0, 1, out, err, sizeof err), 0);
    ck_assert(out[0] == 1.0f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("faults");
    TCase *tc = tcase_create("rings");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, corrupt_header_after_attach);
    tcase_add_test(tc, seq_max_delivered);
    tcase_add_test(tc, stale_means_nothing_attached);
    tcase_add_test(tc, mode_not_0600_refused);
    tcase_add_test(tc, planted_by_other_user);
    tcase_add_test(tc, list_stale_by_other_user);
    tcase_add_test(tc, control_socket_path_too_long);
    tcase_add_test(tc, control_socket_owner_only);
    tcase_add_test(tc, shm_sigterm_mid_stream);
    tcase_add_test(tc, nan_weight_refused);
    tcase_add_test(tc, consumer_learns_producer_left);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
