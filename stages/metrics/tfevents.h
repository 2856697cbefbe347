/*
 * stages/metrics/tfevents.h — TensorBoard event files (events.out.tfevents.*) written beside metrics.jsonl, so
 * `tensorboard --logdir RUN` shows every scalar the stages report (issue 30 item 4).
 *
 * DESIGN
 * - The file is TFRecord framing around serialized tensorflow Event messages: per record
 *     uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes | data | uint32 masked CRC32C of data
 *   where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (TensorFlow's crc32c::Mask). The first record is an
 *   Event with file_version "brain.Event:2"; each later one an Event (wall_time, step) whose Summary holds one
 *   simple_value per scalar. The messages are encoded by protobuf-c from metrics/tfevents.proto (TensorFlow's field
 *   numbers; the generated .pb-c.{c,h} are committed).
 * - One file per writer: events.out.tfevents.<unix seconds>.<hostname>.<pid>, created exclusively. A restarted sink
 *   starts a new file in the same directory; TensorBoard reads them all, in name order.
 * - Records are queued in memory and written by tfevents_flush in one write() (O_APPEND), as metrics.jsonl is; a
 *   SIGKILL between flushes loses only the queued records, never tears an earlier one.
 * Library code: returns 0/-1 (NULL) with a sentence in err, never exits. One thread owns a struct tfevents.
 */
#ifndef STAGES_METRICS_TFEVENTS_H
#define STAGES_METRICS_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

struct tfevents;

/* Create dir/events.out.tfevents.<sec>.<host>.<pid>.<n> (dir must exist) and queue the file_version event.
 * Returns the writer (tfevents_close) or NULL with a sentence. */
struct tfevents *tfevents_open(const char *dir, char *err, int err_len);

/* Queue one Event at (wall_time, step) with n scalars tags[i] = values[i] (n >= 1; tags non-empty). 0, or -1 with a
 * sentence (out of memory, encoding). Nothing is written until tfevents_flush. */
int tfevents_add(struct tfevents *w, double wall_time, int64_t step, int n, const char *const *tags,
                 const float *values, char *err, int err_len);

/* Write the queued records in one write(). 0, or -1 with a sentence naming the file. */
int tfevents_flush(struct tfevents *w, char *err, int err_len);

/* The file's path (valid until tfevents_close); records written so far (flushed). */
const char *tfevents_path(const struct tfevents *w);
uint64_t tfevents_records(const struct tfevents *w);

/* Flush (a failure is lost: call tfevents_flush first to see it), close, free. NULL is fine. */
void tfevents_close(struct tfevents *w);

/* CRC32C (Castagnoli, reflected polynomial 0x82f63b78) of n bytes, and TensorFlow's masked form of it. */
uint32_t tfevents_crc32c(const void *p, size_t n);
uint32_t tfevents_masked_crc32c(const void *p, size_t n);

/* Read the record at buf[*off .. len): checks both CRCs and that the record fits; on success *data / *data_len point
 * at its payload inside buf and *off moves past it. Returns 1 (a record), 0 (clean end: *off == len), or -1 with a
 * sentence naming the byte offset (torn tail, bad CRC). For readers and tests. */
int tfevents_read_record(const uint8_t *buf, size_t len, size_t *off, const uint8_t **data, size_t *data_len,
                         char *err, int err_len);

#endif /* STAGES_METRICS_TFEVENTS_H */
