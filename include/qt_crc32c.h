/* qt_crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TensorBoard's
 * (TFRecord) event file records.
 *
 * qt_crc32c(0, "123456789", 9) == 0xE3069283 (the catalogued check value); chaining
 * qt_crc32c(qt_crc32c(0, a, na), b, nb) equals one pass over a then b. */
#ifndef QT_CRC32C_H
#define QT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of n bytes at p continuing from crc (0 to start). Byte at a time: event records are small. */
uint32_t qt_crc32c(uint32_t crc, const void *p, size_t n);

#endif
