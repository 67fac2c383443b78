/* crc32c.c — CRC-32C (Castagnoli) (qt_crc32c.h), eight bytes at a time ("slicing-by-8").
 *
 * table[0] is the byte-at-a-time table of the reflected polynomial 0x82F63B78; table[k][b] is the CRC of byte b
 * followed by k zero bytes, so eight lookups (one per byte of a 64-bit little-endian word, each table shifted by the
 * bytes that follow it) advance the register by eight bytes. Unaligned heads and tails go byte at a time. The
 * tables are built once, on first use, under pthread_once; the register is pre- and post-inverted (~crc), as the
 * catalogued CRC-32C (iSCSI, TFRecord) is. */
#include "qt_crc32c.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;
        table[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int b = 0; b < 256; b++) table[k][b] = table[0][table[k - 1][b] & 0xff] ^ (table[k - 1][b] >> 8);
}

uint32_t qt_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&once, build_tables);
    const uint8_t *p = data;
    uint32_t c = ~crc;
    for (; n && ((uintptr_t)p & 7); n--) c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo, hi; /* the word's bytes in memory order: lo holds bytes 0..3 (little-endian loads) */
        memcpy(&lo, p, 4), memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo), hi = __builtin_bswap32(hi);
#endif
        lo ^= c;
        c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
            table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^ table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
    }
    while (n--) c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}
