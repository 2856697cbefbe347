/* stages/core/mpk.c — see mpk.h. */
#include "core/mpk.h"

#include <string.h>

const char *mpk_type_name(msgpack_object_type t) {
    switch (t) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "an unsigned integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "a negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "a float";
    case MSGPACK_OBJECT_STR: return "a string";
    case MSGPACK_OBJECT_ARRAY: return "an array";
    case MSGPACK_OBJECT_MAP: return "a map";
    case MSGPACK_OBJECT_BIN: return "binary data";
    case MSGPACK_OBJECT_EXT: return "an extension";
    }
    return "an unknown type";
}

int mpk_str_is(const msgpack_object_str *s, const char *name) {
    size_t n = strlen(name);
    return s->size == n && !memcmp(s->ptr, name, n);
}

int mpk_key_is(const msgpack_object *k, const char *name) {
    return k->type == MSGPACK_OBJECT_STR && mpk_str_is(&k->via.str, name);
}

int mpk_is_int(const msgpack_object *v) {
    return v->type == MSGPACK_OBJECT_POSITIVE_INTEGER || v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
}

int mpk_fixbuf_write(void *data, const char *buf, size_t len) {
    struct mpk_fixbuf *f = data;
    if (f->len + len <= f->cap) {
        memcpy(f->p + f->len, buf, len);
        f->len += len;
    }
    f->need += len;
    return 0;
}

void mpk_pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}
