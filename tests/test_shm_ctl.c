/*
 * tests/test_shm_ctl.c — dflash-shm's control protocol (stages/shmctl/control.h): msgpack
 * encode/decode round trips, decoders refusing wrong types, missing/extra/duplicate fields,
 * other versions and trailing bytes with a sentence; --field and --json of a live dflash-shm,
 * and a raw request of another version answered with kind "error".
 */
#include "shmctl/control.h"
#include "test_ring_util.h"

#include <msgpack.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

static struct shm_ctl_reply g_a, g_b;

static void sample_status(struct shm_ctl_status *st) {
    memset(st, 0, sizeof *st);
    st->pid = 4242;
    snprintf(st->source, sizeof st->source, "dflash-shm");
    st->n_rings = 2;
    for (int i = 0; i < 2; i++) {
        struct ring_status *r = &st->rings[i];
        snprintf(r->name, sizeof r->name, i ? "hidden" : "batches");
        snprintf(r->segment, sizeof r->segment, "/dflash.run-1.%s", r->name);
        r->device = i ? 0 : -1;
        r->n_slots = 8;
        r->payload_bytes = 1ull << 33;
        r->desc_bytes = 4096;
        r->n_producers = 1;
        r->closed = 0;
        r->drained = i;
        r->owner_pid = 99;
        r->owner_alive = 1;
        r->n_free = 5;
        r->n_writing = 1;
        r->n_ready = 2;
        r->n_reading = 0;
        r->published = 123456789012ull;
        r->consumed = 7;
        r->redelivered = 1;
        r->recovered_writes = 2;
        r->lowest_ready_seq = i ? UINT64_MAX : 3;
        r->n_attached = 2;
        r->attached[0] = (struct ring_attached){100, RING_PRODUCER, 1, 1};
        r->attached[1] = (struct ring_attached){101, RING_CONSUMER, 0, 0};
    }
}

START_TEST(request_round_trip_and_refusals) {
    char buf[SHM_CTL_REQUEST_MAX], err[512];
    size_t len;
    enum shm_ctl_kind k;
    ck_assert_int_eq(shm_ctl_encode_request(SHM_CTL_STATUS, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(shm_ctl_decode_request(buf, len, &k, err, sizeof err), 0);
    ck_assert_int_eq(k, SHM_CTL_STATUS);
    ck_assert_int_eq(shm_ctl_encode_request(SHM_CTL_SHUTDOWN, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(shm_ctl_decode_request(buf, len, &k, err, sizeof err), 0);
    ck_assert_int_eq(k, SHM_CTL_SHUTDOWN);
    ck_assert_int_eq(shm_ctl_encode_request(SHM_CTL_ERROR, buf, sizeof buf, &len, err, sizeof err), -1);
    /* trailing byte */
    ck_assert_int_eq(shm_ctl_encode_request(SHM_CTL_STATUS, buf, sizeof buf, &len, err, sizeof err), 0);
    buf[len] = 0;
    ck_assert_int_eq(shm_ctl_decode_request(buf, len + 1, &k, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "trailing"), "%s", err);
    /* the old text protocol, another version, an extra field, a wrong type */
    ck_assert_int_eq(shm_ctl_decode_request("status", 6, &k, err, sizeof err), -1);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    struct { int n; const char *k2; int ver; int extra; const char *kind; } cases[] = {
        {2, "version", 2, 0, "status"}, {3, "version", 1, 1, "status"}, {2, "versio", 1, 0, "status"}, {2, "version", 1, 0, "error"},
        {2, "version", 1, 0, "reboot"}};
    const char *want[] = {"version 2", "exactly 2", "start with", "is a reply", "reboot"};
    for (int i = 0; i < 5; i++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, (size_t)cases[i].n);
        msgpack_pack_str_with_body(&pk, "kind", 4);
        msgpack_pack_str_with_body(&pk, cases[i].kind, strlen(cases[i].kind));
        msgpack_pack_str_with_body(&pk, cases[i].k2, strlen(cases[i].k2));
        msgpack_pack_uint32(&pk, (uint32_t)cases[i].ver);
        if (cases[i].extra) { msgpack_pack_str_with_body(&pk, "x", 1); msgpack_pack_nil(&pk); }
        ck_assert_int_eq(shm_ctl_decode_request(sb.data, sb.size, &k, err, sizeof err), -1);
        ck_assert_msg(strstr(err, want[i]), "case %d: %s", i, err);
        msgpack_sbuffer_destroy(&sb);
    }
    /* version as a string: a type error that says so */
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "kind", 4);
    msgpack_pack_str_with_body(&pk, "status", 6);
    msgpack_pack_str_with_body(&pk, "version", 7);
    msgpack_pack_str_with_body(&pk, "1", 1);
    ck_assert_int_eq(shm_ctl_decode_request(sb.data, sb.size, &k, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "expected an integer, found a string"), "%s", err);
    msgpack_sbuffer_destroy(&sb);
}
END_TEST

START_TEST(status_round_trip_json_and_fields) {
    char err[512], *buf;
    size_t len;
    g_a.kind = SHM_CTL_STATUS;
    sample_status(&g_a.status);
    ck_assert_int_eq(shm_ctl_encode_reply(&g_a, &buf, &len, err, sizeof err), 0);
    ck_assert_msg(shm_ctl_decode_reply(buf, len, &g_b, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(g_b.kind, SHM_CTL_STATUS);
    ck_assert_int_eq(g_b.status.pid, 4242);
    ck_assert_int_eq(g_b.status.n_rings, 2);
    for (int i = 0; i < 2; i++) {
        const struct ring_status *x = &g_a.status.rings[i], *y = &g_b.status.rings[i];
        ck_assert_str_eq(x->name, y->name);
        ck_assert_str_eq(x->segment, y->segment);
        ck_assert_int_eq(x->device, y->device);
        ck_assert(x->payload_bytes == y->payload_bytes && x->published == y->published);
        ck_assert(x->lowest_ready_seq == y->lowest_ready_seq);
        ck_assert_int_eq(x->drained, y->drained);
        ck_assert_int_eq(y->n_attached, 2);
        ck_assert_int_eq(y->attached[0].pid, 100);
        ck_assert_int_eq(y->attached[0].role, RING_PRODUCER);
        ck_assert_int_eq(y->attached[1].role, RING_CONSUMER);
        ck_assert_int_eq(y->attached[1].alive, 0);
    }
    /* every truncation of the buffer is refused with a sentence, never a crash */
    for (size_t n = 0; n < len; n += 7) ck_assert_int_eq(shm_ctl_decode_reply(buf, n, &g_b, err, sizeof err), -1);
    free(buf);
    char *js = shm_ctl_status_json(&g_a.status, 0);
    ck_assert_ptr_nonnull(js);
    ck_assert_msg(strstr(js, "\"lowest_ready_seq\":null") && strstr(js, "\"published\":123456789012") && strstr(js, "\"role\":\"consumer\""),
                  "%s", js);
    free(js);
    char v[64];
    ck_assert_int_eq(shm_ctl_field(&g_a.status, "hidden.drained", v, sizeof v, err, sizeof err), 0);
    ck_assert_str_eq(v, "yes");
    ck_assert_int_eq(shm_ctl_field(&g_a.status, "batches.lowest_ready_seq", v, sizeof v, err, sizeof err), 0);
    ck_assert_str_eq(v, "3");
    ck_assert_int_eq(shm_ctl_field(&g_a.status, "hidden.lowest_ready_seq", v, sizeof v, err, sizeof err), 0);
    ck_assert_str_eq(v, "none");
    ck_assert_int_eq(shm_ctl_field(&g_a.status, "batches.attached", v, sizeof v, err, sizeof err), 0);
    ck_assert_str_eq(v, "1");
    ck_assert_int_eq(shm_ctl_field(&g_a.status, "pid", v, sizeof v, err, sizeof err), 0);
    ck_assert_str_eq(v, "4242");
    ck_assert_int_eq(shm_ctl_field(&g_a.status, "nosuch.ready", v, sizeof v, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no ring 'nosuch'"), "%s", err);
    ck_assert_int_eq(shm_ctl_field(&g_a.status, "batches.colour", v, sizeof v, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no key 'colour'"), "%s", err);
    /* error and shutdown replies */
    g_a.kind = SHM_CTL_ERROR;
    snprintf(g_a.error, sizeof g_a.error, "expected status");
    ck_assert_int_eq(shm_ctl_encode_reply(&g_a, &buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(shm_ctl_decode_reply(buf, len, &g_b, err, sizeof err), 0);
    ck_assert_int_eq(g_b.kind, SHM_CTL_ERROR);
    ck_assert_str_eq(g_b.error, "expected status");
    free(buf);
}
END_TEST

START_TEST(reply_refusals) {
    char err[512];
    msgpack_sbuffer sb;
    msgpack_packer pk;
    /* status with a ring whose 'ready' is a string, and a ring with a field missing */
    for (int variant = 0; variant < 3; variant++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 5);
        msgpack_pack_str_with_body(&pk, "kind", 4);
        msgpack_pack_str_with_body(&pk, "status", 6);
        msgpack_pack_str_with_body(&pk, "version", 7);
        msgpack_pack_uint32(&pk, 1);
        msgpack_pack_str_with_body(&pk, "pid", 3);
        msgpack_pack_int32(&pk, 1);
        msgpack_pack_str_with_body(&pk, "source", 6);
        msgpack_pack_str_with_body(&pk, "x", 1);
        msgpack_pack_str_with_body(&pk, "rings", 5);
        if (variant == 2) { msgpack_pack_uint32(&pk, 3); }
        else {
            msgpack_pack_array(&pk, 1);
            msgpack_pack_map(&pk, variant == 0 ? 21 : 1);
            msgpack_pack_str_with_body(&pk, "ready", 5);
            msgpack_pack_str_with_body(&pk, "two", 3);
            for (int i = 1; variant == 0 && i < 21; i++) {   /* 20 duplicates of 'name' */
                msgpack_pack_str_with_body(&pk, "name", 4);
                msgpack_pack_str_with_body(&pk, "r", 1);
            }
        }
        ck_assert_int_eq(shm_ctl_decode_reply(sb.data, sb.size, &g_b, err, sizeof err), -1);
        const char *want = variant == 0 ? "expected an integer, found a string" : variant == 1 ? "expected exactly 21" : "expected an array";
        ck_assert_msg(strstr(err, want), "variant %d: %s", variant, err);
        msgpack_sbuffer_destroy(&sb);
    }
}
END_TEST

static int run_capture(char *const argv[], char *out, size_t cap) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
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

START_TEST(live_field_json_and_version_mismatch) {
    const char *run = tr_run("ctl");
    pid_t shm = tr_start_shm(run, "a:slots=3,bytes=1k,dev=host", "b:slots=2,bytes=1k,producers=2,dev=host", NULL);
    char out[16384];
    char *f[] = {(char *)test_bin("dflash-shm"), "--status", "--run", (char *)run, "--field", "a.slots,a.free,b.producers,a.drained,rings", NULL};
    ck_assert_int_eq(run_capture(f, out, sizeof out), 0);
    ck_assert_str_eq(out, "3 3 2 no 2\n");
    char *bad[] = {(char *)test_bin("dflash-shm"), "--status", "--run", (char *)run, "--field", "a.nope", NULL};
    ck_assert_int_eq(run_capture(bad, out, sizeof out), 2);
    char *js[] = {(char *)test_bin("dflash-shm"), "--status", "--json", "--run", (char *)run, NULL};
    ck_assert_int_eq(run_capture(js, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "\"source\": \"dflash-shm\"") && strstr(out, "\"slots\": 3"), "%s", out);
    /* a request of another version gets kind "error" back, and the server keeps serving */
    char url[800];
    snprintf(url, sizeof url, "ipc://%s/bus/control.sock", run);
    int s = nn_socket(AF_SP, NN_REQ);
    ck_assert_int_ge(s, 0);
    int ms = 2000;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &ms, sizeof ms);
    ck_assert_int_ge(nn_connect(s, url), 0);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "kind", 4);
    msgpack_pack_str_with_body(&pk, "status", 6);
    msgpack_pack_str_with_body(&pk, "version", 7);
    msgpack_pack_uint32(&pk, 9);
    ck_assert_int_ge(nn_send(s, sb.data, sb.size, 0), 0);
    msgpack_sbuffer_destroy(&sb);
    char *buf = NULL, err[512];
    int n = nn_recv(s, &buf, NN_MSG, 0);
    ck_assert_int_gt(n, 0);
    ck_assert_msg(shm_ctl_decode_reply(buf, (size_t)n, &g_b, err, sizeof err) == 0, "%s", err);
    nn_freemsg(buf);
    nn_close(s);
    ck_assert_int_eq(g_b.kind, SHM_CTL_ERROR);
    ck_assert_msg(strstr(g_b.error, "version 9"), "%s", g_b.error);
    ck_assert_int_eq(run_capture(f, out, sizeof out), 0);
    ck_assert_str_eq(out, "3 3 2 no 2\n");
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("shm_ctl");
    TCase *tc = tcase_create("control");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, request_round_trip_and_refusals);
    tcase_add_test(tc, status_round_trip_json_and_fields);
    tcase_add_test(tc, reply_refusals);
    tcase_add_test(tc, live_field_json_and_version_mismatch);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
