/* crc32.c — CRC-32 (IEEE, zlib-compatible) by slicing-by-8.
 *
 * t[0] is the classic byte-at-a-time table of the reflected polynomial 0xEDB88320; t[k][b] is the CRC
 * of byte b followed by k zero bytes, so eight input bytes fold into the CRC with eight lookups and no
 * carried dependency between them. The register is pre- and post-inverted (~crc), as zlib does. The
 * tables (8 KiB) are built once, on first use, under pthread_once. */
#include "qt_crc32.h"

#include <pthread.h>

static uint32_t t[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int b = 0; b < 256; b++) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
}

uint32_t qt_crc32(uint32_t crc, const void *data, size_t n) {
    pthread_once(&once, build_tables);
    const uint8_t *p = data;
    uint32_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) { /* bytes assembled little-endian whatever the host */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
            t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    }
    while (n--) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}
