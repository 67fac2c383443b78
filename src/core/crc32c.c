/* crc32c.c — CRC-32C (Castagnoli), byte at a time from a 256-entry table (qt_crc32c.h).
 *
 * The table of the reflected polynomial 0x82F63B78 is built once, on first use, under pthread_once; the
 * register is pre- and post-inverted (~crc), as the catalogued CRC-32C (iSCSI, TFRecord) is. */
#include "qt_crc32c.h"

#include <pthread.h>

static uint32_t table[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build_table(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;
        table[b] = c;
    }
}

uint32_t qt_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&once, build_table);
    const uint8_t *p = data;
    uint32_t c = ~crc;
    while (n--) c = table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}
