/* qt_tb_events.h — TensorBoard event files written from C: scalars that `tensorboard --logdir` shows.
 *
 * A file is a sequence of TFRecord records: uint64 length (little-endian), the masked CRC-32C of those
 * 8 bytes, the data, the masked CRC-32C of the data (mask: rotate right 15, add 0xa282ead8). Each
 * record's data is an Event protobuf, hand-encoded: wall_time (1, double), step (2, int64), then
 * file_version (3, "brain.Event:2") in the first record, or summary (5) in the others: a Summary of
 * Values, each a tag (1, string) and a simple_value (2, float). */
#ifndef QT_TB_EVENTS_H
#define QT_TB_EVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct qt_tb qt_tb;

/* Creates dir (and its parents) and in it a new events.out.tfevents.<unix time>.<host>.<pid> file,
 * whose first record says the file version. The caller owns the writer: qt_tb_close frees it.
 * Returns NULL with err naming log.tensorboard and the file. */
qt_tb *qt_tb_open(const char *dir, char *err, size_t errlen);
/* One Event at step with n scalars tags[i] = values[i], written whole with one write(). Returns 0, or
 * -1 with err naming the file (a full disk). */
int qt_tb_scalars(qt_tb *tb, double wall_time, long step, const char *const *tags, const float *values, int n,
                  char *err, size_t errlen);
/* The file's path. */
const char *qt_tb_path(const qt_tb *tb);
/* Closes and frees; NULL is a no-op. */
void qt_tb_close(qt_tb *tb);

/* The TFRecord framing of n bytes of data into out (n + 16 bytes). Returns n + 16. */
size_t qt_tb_frame(const void *data, size_t n, uint8_t *out);
/* An Event's bytes into buf (see above; file_version NULL: a summary of the n scalars). Returns the
 * length, or 0 when cap is too small. */
size_t qt_tb_event(uint8_t *buf, size_t cap, double wall_time, long step, const char *file_version,
                   const char *const *tags, const float *values, int n);

#endif
