/*
 * stages/shmctl/control.c — encode/decode of dflash-shm's control messages (control.h).
 *
 * One table of ring fields (name, type, offset into struct ring_status) serves the encoder, the
 * decoder, the JSON rendering and --field, so they cannot disagree on names or types. The decoder
 * checks each key against the table (type, uniqueness), then the exact count.
 */
#include "shmctl/control.h"
#include "core/mpk.h"
#include "core/err.h"

#include <jansson.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- ring field table */

enum ftype { T_STR, T_INT, T_U32, T_U64, T_BOOL, T_SEQ, T_ATTACHED };

struct rfield { const char *name; enum ftype type; size_t off, size; };

#define RF(name, type, member) {name, type, offsetof(struct ring_status, member), sizeof(((struct ring_status *)0)->member)}
static const struct rfield g_ring_fields[] = {
    RF("name", T_STR, name),
    RF("segment", T_STR, segment),
    RF("device", T_INT, device),
    RF("slots", T_U32, n_slots),
    RF("payload_bytes", T_U64, payload_bytes),
    RF("desc_bytes", T_U32, desc_bytes),
    RF("producers", T_U32, n_producers),
    RF("closed", T_BOOL, closed),
    RF("drained", T_BOOL, drained),
    RF("owner_pid", T_INT, owner_pid),
    RF("owner_alive", T_BOOL, owner_alive),
    RF("free", T_U32, n_free),
    RF("writing", T_U32, n_writing),
    RF("ready", T_U32, n_ready),
    RF("reading", T_U32, n_reading),
    RF("published", T_U64, published),
    RF("consumed", T_U64, consumed),
    RF("redelivered", T_U64, redelivered),
    RF("recovered_writes", T_U64, recovered_writes),
    RF("lowest_ready_seq", T_SEQ, lowest_ready_seq),
    RF("attached", T_ATTACHED, n_attached),
};
#define N_RING_FIELDS (int)(sizeof g_ring_fields / sizeof g_ring_fields[0])
#define N_ATTACHED_FIELDS 4

const char *shm_ctl_kind_name(enum shm_ctl_kind kind) {
    return kind == SHM_CTL_STATUS ? "status" : kind == SHM_CTL_SHUTDOWN ? "shutdown" : kind == SHM_CTL_ERROR ? "error" : "?";
}

static const char *role_name(int role) { return role == RING_PRODUCER ? "producer" : role == RING_CONSUMER ? "consumer" : "?"; }

/* ---------------------------------------------------------------- encoding */

static void pack_head(msgpack_packer *pk, size_t n_fields, enum shm_ctl_kind kind) {
    msgpack_pack_map(pk, n_fields);
    mpk_pack_str(pk, "kind");
    mpk_pack_str(pk, shm_ctl_kind_name(kind));
    mpk_pack_str(pk, "version");
    msgpack_pack_uint32(pk, SHM_CTL_VERSION);
}

int shm_ctl_encode_request(enum shm_ctl_kind kind, void *buf, size_t cap, size_t *len, char *err, int err_len) {
    if (kind != SHM_CTL_STATUS && kind != SHM_CTL_SHUTDOWN)
        return err_fail(err, err_len, "control request: kind must be status or shutdown, got %d", (int)kind);
    struct mpk_fixbuf f = {buf, cap, 0, 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &f, mpk_fixbuf_write);
    pack_head(&pk, 2, kind);
    if (f.need > cap) return err_fail(err, err_len, "control request needs %zu bytes, buffer has %zu", f.need, cap);
    *len = f.len;
    return 0;
}

static void pack_ring(msgpack_packer *pk, const struct ring_status *st) {
    msgpack_pack_map(pk, N_RING_FIELDS);
    for (int i = 0; i < N_RING_FIELDS; i++) {
        const struct rfield *f = &g_ring_fields[i];
        const char *p = (const char *)st + f->off;
        mpk_pack_str(pk, f->name);
        switch (f->type) {
        case T_STR: mpk_pack_str(pk, p); break;
        case T_INT: msgpack_pack_int64(pk, *(const int *)p); break;
        case T_BOOL: if (*(const int *)p) msgpack_pack_true(pk); else msgpack_pack_false(pk); break;
        case T_U32: msgpack_pack_uint32(pk, *(const uint32_t *)p); break;
        case T_U64: msgpack_pack_uint64(pk, *(const uint64_t *)p); break;
        case T_SEQ:
            if (*(const uint64_t *)p == UINT64_MAX) msgpack_pack_nil(pk);
            else msgpack_pack_uint64(pk, *(const uint64_t *)p);
            break;
        case T_ATTACHED:
            msgpack_pack_array(pk, (size_t)st->n_attached);
            for (int j = 0; j < st->n_attached; j++) {
                const struct ring_attached *a = &st->attached[j];
                msgpack_pack_map(pk, N_ATTACHED_FIELDS);
                mpk_pack_str(pk, "pid");
                msgpack_pack_int64(pk, a->pid);
                mpk_pack_str(pk, "role");
                mpk_pack_str(pk, role_name(a->role));
                mpk_pack_str(pk, "alive");
                if (a->alive) msgpack_pack_true(pk); else msgpack_pack_false(pk);
                mpk_pack_str(pk, "drained");
                if (a->drained) msgpack_pack_true(pk); else msgpack_pack_false(pk);
            }
            break;
        }
    }
}

int shm_ctl_encode_reply(const struct shm_ctl_reply *r, char **buf, size_t *len, char *err, int err_len) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    switch (r->kind) {
    case SHM_CTL_SHUTDOWN: pack_head(&pk, 2, r->kind); break;
    case SHM_CTL_ERROR:
        pack_head(&pk, 3, r->kind);
        mpk_pack_str(&pk, "error");
        mpk_pack_str(&pk, r->error);
        break;
    case SHM_CTL_STATUS: {
        const struct shm_ctl_status *st = &r->status;
        if (st->n_rings < 0 || st->n_rings > SHM_CTL_MAX_RINGS) {
            msgpack_sbuffer_destroy(&sb);
            return err_fail(err, err_len, "control reply: %d rings, at most %d", st->n_rings, SHM_CTL_MAX_RINGS);
        }
        pack_head(&pk, 5, r->kind);
        mpk_pack_str(&pk, "pid");
        msgpack_pack_int64(&pk, st->pid);
        mpk_pack_str(&pk, "source");
        mpk_pack_str(&pk, st->source);
        mpk_pack_str(&pk, "rings");
        msgpack_pack_array(&pk, (size_t)st->n_rings);
        for (int i = 0; i < st->n_rings; i++) pack_ring(&pk, &st->rings[i]);
        break;
    }
    default:
        msgpack_sbuffer_destroy(&sb);
        return err_fail(err, err_len, "control reply: unknown kind %d", (int)r->kind);
    }
    if (!sb.data) return err_fail(err, err_len, "control reply: out of memory");
    *buf = sb.data;   /* msgpack_sbuffer's buffer is malloc'ed; the caller frees it */
    *len = sb.size;
    return 0;
}

/* ---------------------------------------------------------------- decoding */

/* A string value into out (cap bytes with the NUL). */
static int get_str(const char *what, const char *key, const msgpack_object *v, char *out, size_t cap, char *err, int err_len) {
    if (v->type != MSGPACK_OBJECT_STR)
        return err_fail(err, err_len, "%s field '%s': expected a string, found %s", what, key, mpk_type_name(v->type));
    if (v->via.str.size >= cap)
        return err_fail(err, err_len, "%s field '%s': %u-byte string, at most %zu", what, key, v->via.str.size, cap - 1);
    memcpy(out, v->via.str.ptr, v->via.str.size);
    out[v->via.str.size] = 0;
    return 0;
}

/* A signed value in [lo, hi]. */
static int get_int(const char *what, const char *key, const msgpack_object *v, int64_t lo, int64_t hi, int64_t *out,
                   char *err, int err_len) {
    if (!mpk_is_int(v)) return err_fail(err, err_len, "%s field '%s': expected an integer, found %s", what, key, mpk_type_name(v->type));
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? v->via.u64 > (uint64_t)hi : v->via.i64 < lo)
        return err_fail(err, err_len, "%s field '%s': value out of range [%lld, %lld]", what, key, (long long)lo, (long long)hi);
    *out = v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int64_t)v->via.u64 : v->via.i64;
    if (*out < lo || *out > hi)
        return err_fail(err, err_len, "%s field '%s': %lld is out of range [%lld, %lld]", what, key, (long long)*out,
                        (long long)lo, (long long)hi);
    return 0;
}

static int get_bool(const char *what, const char *key, const msgpack_object *v, int *out, char *err, int err_len) {
    if (v->type != MSGPACK_OBJECT_BOOLEAN)
        return err_fail(err, err_len, "%s field '%s': expected a boolean, found %s", what, key, mpk_type_name(v->type));
    *out = v->via.boolean ? 1 : 0;
    return 0;
}

static int get_u64(const char *what, const char *key, const msgpack_object *v, uint64_t *out, char *err, int err_len) {
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return err_fail(err, err_len, "%s field '%s': expected an unsigned integer, found %s", what, key, mpk_type_name(v->type));
    *out = v->via.u64;
    return 0;
}

/* The leading kind + version of a message map. */
static int get_head(const msgpack_object *o, const char *what, enum shm_ctl_kind *kind, char *err, int err_len) {
    if (o->type != MSGPACK_OBJECT_MAP) return err_fail(err, err_len, "%s: expected a msgpack map, found %s", what, mpk_type_name(o->type));
    const msgpack_object_map *m = &o->via.map;
    if (m->size < 2 || !mpk_key_is(&m->ptr[0].key, "kind") || !mpk_key_is(&m->ptr[1].key, "version"))
        return err_fail(err, err_len, "%s: expected the map to start with 'kind' and 'version' (%u fields)", what, m->size);
    char k[16];
    if (get_str(what, "kind", &m->ptr[0].val, k, sizeof k, err, err_len)) return -1;
    int64_t ver;
    if (get_int(what, "version", &m->ptr[1].val, 0, UINT32_MAX, &ver, err, err_len)) return -1;
    if (ver != SHM_CTL_VERSION)
        return err_fail(err, err_len, "%s: protocol version %lld, this binary speaks version %u (rebuild dflash-shm and its clients from one tree)",
                        what, (long long)ver, SHM_CTL_VERSION);
    if (!strcmp(k, "status")) *kind = SHM_CTL_STATUS;
    else if (!strcmp(k, "shutdown")) *kind = SHM_CTL_SHUTDOWN;
    else if (!strcmp(k, "error")) *kind = SHM_CTL_ERROR;
    else return err_fail(err, err_len, "%s: kind '%s', expected status, shutdown or error", what, k);
    return 0;
}

static int unpack_one(const void *buf, size_t len, msgpack_unpacked *u, const char *what, char *err, int err_len) {
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(u, buf, len, &off);
    if (r != MSGPACK_UNPACK_SUCCESS)
        return err_fail(err, err_len, "%s: not a complete msgpack object (%zu bytes; unpack returned %d)", what, len, (int)r);
    if (off != len) return err_fail(err, err_len, "%s: %zu trailing bytes after the msgpack map", what, len - off);
    return 0;
}

int shm_ctl_decode_request(const void *buf, size_t len, enum shm_ctl_kind *kind, char *err, int err_len) {
    if (len > SHM_CTL_REQUEST_MAX) return err_fail(err, err_len, "control request: %zu bytes, at most %d", len, SHM_CTL_REQUEST_MAX);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = unpack_one(buf, len, &u, "control request", err, err_len);
    if (!rc) rc = get_head(&u.data, "control request", kind, err, err_len);
    if (!rc && *kind == SHM_CTL_ERROR) rc = err_fail(err, err_len, "control request: kind 'error' is a reply, expected status or shutdown");
    if (!rc && u.data.via.map.size != 2)
        rc = err_fail(err, err_len, "control request: %u fields, expected exactly 2 (kind, version)", u.data.via.map.size);
    msgpack_unpacked_destroy(&u);
    return rc;
}

static int decode_attached(const msgpack_object *v, struct ring_status *st, char *err, int err_len) {
    if (v->type != MSGPACK_OBJECT_ARRAY)
        return err_fail(err, err_len, "ring '%s' field 'attached': expected an array, found %s", st->name, mpk_type_name(v->type));
    if (v->via.array.size > RING_MAX_ATTACH)
        return err_fail(err, err_len, "ring '%s' field 'attached': %u entries, at most %d", st->name, v->via.array.size, RING_MAX_ATTACH);
    st->n_attached = (int)v->via.array.size;
    for (uint32_t j = 0; j < v->via.array.size; j++) {
        const msgpack_object *e = &v->via.array.ptr[j];
        struct ring_attached *a = &st->attached[j];
        if (e->type != MSGPACK_OBJECT_MAP || e->via.map.size != N_ATTACHED_FIELDS)
            return err_fail(err, err_len, "ring '%s' attached[%u]: expected a map of %d fields (pid, role, alive, drained)", st->name, j,
                            N_ATTACHED_FIELDS);
        unsigned seen = 0;
        for (uint32_t k = 0; k < e->via.map.size; k++) {
            const msgpack_object *key = &e->via.map.ptr[k].key, *val = &e->via.map.ptr[k].val;
            int64_t x;
            unsigned bit;
            if (mpk_key_is(key, "pid")) { bit = 1; if (get_int("attached entry", "pid", val, 0, INT32_MAX, &x, err, err_len)) return -1; a->pid = (int)x; }
            else if (mpk_key_is(key, "role")) {
                bit = 2;
                char role[16];
                if (get_str("attached entry", "role", val, role, sizeof role, err, err_len)) return -1;
                if (!strcmp(role, "producer")) a->role = RING_PRODUCER;
                else if (!strcmp(role, "consumer")) a->role = RING_CONSUMER;
                else return err_fail(err, err_len, "ring '%s' attached[%u] role '%s', expected producer or consumer", st->name, j, role);
            } else if (mpk_key_is(key, "alive")) { bit = 4; if (get_bool("attached entry", "alive", val, &a->alive, err, err_len)) return -1; }
            else if (mpk_key_is(key, "drained")) { bit = 8; if (get_bool("attached entry", "drained", val, &a->drained, err, err_len)) return -1; }
            else return err_fail(err, err_len, "ring '%s' attached[%u]: unknown field", st->name, j);
            if (seen & bit) return err_fail(err, err_len, "ring '%s' attached[%u]: a field appears twice", st->name, j);
            seen |= bit;
        }
    }
    return 0;
}

static int decode_ring(const msgpack_object *o, int idx, struct ring_status *st, char *err, int err_len) {
    memset(st, 0, sizeof *st);
    if (o->type != MSGPACK_OBJECT_MAP)
        return err_fail(err, err_len, "status rings[%d]: expected a map, found %s", idx, mpk_type_name(o->type));
    const msgpack_object_map *m = &o->via.map;
    if (m->size != N_RING_FIELDS)
        return err_fail(err, err_len, "status rings[%d]: %u fields, expected exactly %d", idx, m->size, N_RING_FIELDS);
    int seen[N_RING_FIELDS] = {0};
    char what[64];
    snprintf(what, sizeof what, "status rings[%d]", idx);
    for (uint32_t i = 0; i < m->size; i++) {
        int f = -1;
        for (int k = 0; k < N_RING_FIELDS; k++)
            if (mpk_key_is(&m->ptr[i].key, g_ring_fields[k].name)) f = k;
        if (f < 0) return err_fail(err, err_len, "%s: unknown field (%s key)", what, mpk_type_name(m->ptr[i].key.type));
        if (seen[f]++) return err_fail(err, err_len, "%s: field '%s' appears twice", what, g_ring_fields[f].name);
        const struct rfield *fd = &g_ring_fields[f];
        const msgpack_object *v = &m->ptr[i].val;
        char *p = (char *)st + fd->off;
        int64_t x;
        switch (fd->type) {
        case T_STR: if (get_str(what, fd->name, v, p, fd->size, err, err_len)) return -1; break;
        case T_INT: if (get_int(what, fd->name, v, INT32_MIN, INT32_MAX, &x, err, err_len)) return -1; *(int *)p = (int)x; break;
        case T_BOOL: if (get_bool(what, fd->name, v, (int *)p, err, err_len)) return -1; break;
        case T_U32: if (get_int(what, fd->name, v, 0, UINT32_MAX, &x, err, err_len)) return -1; *(uint32_t *)p = (uint32_t)x; break;
        case T_U64: if (get_u64(what, fd->name, v, (uint64_t *)p, err, err_len)) return -1; break;
        case T_SEQ:
            if (v->type == MSGPACK_OBJECT_NIL) *(uint64_t *)p = UINT64_MAX;
            else if (get_u64(what, fd->name, v, (uint64_t *)p, err, err_len)) return -1;
            break;
        case T_ATTACHED: break;   /* after the name is known, below */
        }
    }
    for (uint32_t i = 0; i < m->size; i++)
        if (mpk_key_is(&m->ptr[i].key, "attached") && decode_attached(&m->ptr[i].val, st, err, err_len)) return -1;
    return 0;
}

int shm_ctl_decode_reply(const void *buf, size_t len, struct shm_ctl_reply *r, char *err, int err_len) {
    memset(r, 0, sizeof *r);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = unpack_one(buf, len, &u, "control reply", err, err_len);
    if (!rc) rc = get_head(&u.data, "control reply", &r->kind, err, err_len);
    if (rc) goto out;
    const msgpack_object_map *m = &u.data.via.map;
    rc = -1;
    uint32_t want = r->kind == SHM_CTL_SHUTDOWN ? 2 : r->kind == SHM_CTL_ERROR ? 3 : 5;
    if (m->size != want) {
        err_fail(err, err_len, "control reply '%s': %u fields, expected exactly %u", shm_ctl_kind_name(r->kind), m->size, want);
        goto out;
    }
    if (r->kind == SHM_CTL_ERROR) {
        if (!mpk_key_is(&m->ptr[2].key, "error")) { err_fail(err, err_len, "control reply 'error': third field must be 'error'"); goto out; }
        if (get_str("control reply", "error", &m->ptr[2].val, r->error, sizeof r->error, err, err_len)) goto out;
    } else if (r->kind == SHM_CTL_STATUS) {
        struct shm_ctl_status *st = &r->status;
        static const char *names[3] = {"pid", "source", "rings"};
        for (int i = 0; i < 3; i++)
            if (!mpk_key_is(&m->ptr[2 + i].key, names[i])) {
                err_fail(err, err_len, "control reply 'status': field %d must be '%s'", 3 + i, names[i]);
                goto out;
            }
        int64_t pid;
        if (get_int("control reply", "pid", &m->ptr[2].val, 0, INT32_MAX, &pid, err, err_len)) goto out;
        st->pid = (int)pid;
        if (get_str("control reply", "source", &m->ptr[3].val, st->source, sizeof st->source, err, err_len)) goto out;
        const msgpack_object *rings = &m->ptr[4].val;
        if (rings->type != MSGPACK_OBJECT_ARRAY) {
            err_fail(err, err_len, "control reply field 'rings': expected an array, found %s", mpk_type_name(rings->type));
            goto out;
        }
        if (rings->via.array.size > SHM_CTL_MAX_RINGS) {
            err_fail(err, err_len, "control reply field 'rings': %u rings, at most %d", rings->via.array.size, SHM_CTL_MAX_RINGS);
            goto out;
        }
        st->n_rings = (int)rings->via.array.size;
        for (int i = 0; i < st->n_rings; i++)
            if (decode_ring(&rings->via.array.ptr[i], i, &st->rings[i], err, err_len)) goto out;
    }
    rc = 0;
out:
    msgpack_unpacked_destroy(&u);
    return rc;
}

/* ---------------------------------------------------------------- JSON and fields */

static json_t *field_json(const struct rfield *f, const struct ring_status *st) {
    const char *p = (const char *)st + f->off;
    switch (f->type) {
    case T_STR: return json_string(p);
    case T_INT: return json_integer(*(const int *)p);
    case T_BOOL: return json_boolean(*(const int *)p);
    case T_U32: return json_integer(*(const uint32_t *)p);
    case T_U64: return json_integer((json_int_t) * (const uint64_t *)p);
    case T_SEQ: return *(const uint64_t *)p == UINT64_MAX ? json_null() : json_integer((json_int_t) * (const uint64_t *)p);
    case T_ATTACHED: {
        json_t *arr = json_array();
        for (int j = 0; arr && j < st->n_attached; j++) {
            const struct ring_attached *a = &st->attached[j];
            json_array_append_new(arr, json_pack("{s:i, s:s, s:b, s:b}", "pid", a->pid, "role", role_name(a->role), "alive",
                                                 a->alive, "drained", a->drained));
        }
        return arr;
    }
    }
    return json_null();
}

char *shm_ctl_status_json(const struct shm_ctl_status *st, int indent) {
    json_t *rings = json_array();
    for (int i = 0; rings && i < st->n_rings; i++) {
        json_t *o = json_object();
        for (int k = 0; o && k < N_RING_FIELDS; k++) json_object_set_new(o, g_ring_fields[k].name, field_json(&g_ring_fields[k], &st->rings[i]));
        json_array_append_new(rings, o);
    }
    json_t *top = json_pack("{s:s, s:i, s:i, s:s, s:o}", "kind", "status", "version", (int)SHM_CTL_VERSION, "pid", st->pid,
                            "source", st->source, "rings", rings);
    if (!top) return NULL;
    char *text = json_dumps(top, JSON_PRESERVE_ORDER | (indent > 0 ? JSON_INDENT(indent) : JSON_COMPACT));
    json_decref(top);
    return text;
}

int shm_ctl_field(const struct shm_ctl_status *st, const char *path, char *out, size_t out_len, char *err, int err_len) {
    if (!strcmp(path, "pid")) { snprintf(out, out_len, "%d", st->pid); return 0; }
    if (!strcmp(path, "source")) { snprintf(out, out_len, "%s", st->source); return 0; }
    if (!strcmp(path, "rings")) { snprintf(out, out_len, "%d", st->n_rings); return 0; }
    const char *dot = strchr(path, '.');
    if (!dot) return err_fail(err, err_len, "--field %s: expected pid, source, rings or RING.KEY", path);
    const struct ring_status *rs = NULL;
    for (int i = 0; i < st->n_rings; i++)
        if (strlen(st->rings[i].name) == (size_t)(dot - path) && !strncmp(st->rings[i].name, path, (size_t)(dot - path))) rs = &st->rings[i];
    if (!rs) return err_fail(err, err_len, "--field %s: no ring '%.*s' in this run", path, (int)(dot - path), path);
    const char *key = dot + 1;
    for (int k = 0; k < N_RING_FIELDS; k++) {
        const struct rfield *f = &g_ring_fields[k];
        if (strcmp(f->name, key) != 0) continue;
        const char *p = (const char *)rs + f->off;
        switch (f->type) {
        case T_STR: snprintf(out, out_len, "%s", p); break;
        case T_INT: snprintf(out, out_len, "%d", *(const int *)p); break;
        case T_BOOL: snprintf(out, out_len, "%s", *(const int *)p ? "yes" : "no"); break;
        case T_U32: snprintf(out, out_len, "%u", *(const uint32_t *)p); break;
        case T_U64: snprintf(out, out_len, "%llu", (unsigned long long)*(const uint64_t *)p); break;
        case T_SEQ:
            if (*(const uint64_t *)p == UINT64_MAX) snprintf(out, out_len, "none");
            else snprintf(out, out_len, "%llu", (unsigned long long)*(const uint64_t *)p);
            break;
        case T_ATTACHED: {
            int n = 0;
            for (int j = 0; j < rs->n_attached; j++) n += rs->attached[j].alive;
            snprintf(out, out_len, "%d", n);
            break;
        }
        }
        return 0;
    }
    return err_fail(err, err_len, "--field %s: ring '%s' has no key '%s' (keys: name, segment, device, slots, payload_bytes, "
                    "desc_bytes, producers, closed, drained, owner_pid, owner_alive, free, writing, ready, reading, published, "
                    "consumed, redelivered, recovered_writes, lowest_ready_seq, attached)", path, rs->name, key);
}
