/*
 * stages/core/mpk.h — the small msgpack-reading helpers every decoder of ours shares (ring descriptors,
 * the metrics bus, dflash-shm's control protocol), so each says "expected X, found Y" the same way.
 * Pure functions; thread-safe; never exit.
 */
#ifndef STAGES_CORE_MPK_H
#define STAGES_CORE_MPK_H

#include <msgpack.h>

/* "nil", "a boolean", "an unsigned integer", "a negative integer", "a float", "a string", "an array", "a map",
 * "binary data", "an extension", or "an unknown type": the found-part of a decoder's sentence. */
const char *mpk_type_name(msgpack_object_type t);
/* 1 if the string object s holds exactly name (no NUL needed in s). */
int mpk_str_is(const msgpack_object_str *s, const char *name);
/* 1 if k is a string object holding exactly name. */
int mpk_key_is(const msgpack_object *k, const char *name);
/* 1 if v is an integer (either sign). */
int mpk_is_int(const msgpack_object *v);

/* A fixed output buffer for msgpack_packer (msgpack_packer_init(&pk, &fb, mpk_fixbuf_write)): bytes past cap are
 * not written but counted in need, so an encoder can say how much room it wanted. */
struct mpk_fixbuf { char *p; size_t cap, len, need; };
int mpk_fixbuf_write(void *data, const char *buf, size_t len);
/* Pack a NUL-terminated string as a msgpack str. */
void mpk_pack_str(msgpack_packer *pk, const char *s);

#endif /* STAGES_CORE_MPK_H */
