/* test_tb_events.c — CRC-32C against its catalogued vectors, the TFRecord framing and the Event encoding
 * of qt_tb_events.h byte for byte. (tests/test_tensorboard.py reads a run's files back with the
 * tensorboard package.) */
#include <stdio.h>
#include <string.h>

#include "qt_crc32c.h"
#include "qt_tb_events.h"
#include "qt_test.h"

/* RFC 3720 (iSCSI) B.4 and the catalogue's check value. */
static void test_crc32c_vectors(void) {
    unsigned char zeros[32] = {0}, ones[32], inc[32], dec[32];
    memset(ones, 0xff, sizeof ones);
    for (int i = 0; i < 32; i++) inc[i] = (unsigned char)i, dec[i] = (unsigned char)(31 - i);
    QT_EXPECT(qt_crc32c(0, "123456789", 9) == 0xE3069283u, "check value %08x", qt_crc32c(0, "123456789", 9));
    QT_EXPECT(qt_crc32c(0, zeros, 32) == 0x8A9136AAu, "32 zeros: %08x", qt_crc32c(0, zeros, 32));
    QT_EXPECT(qt_crc32c(0, ones, 32) == 0x62A8AB43u, "32 x ff: %08x", qt_crc32c(0, ones, 32));
    QT_EXPECT(qt_crc32c(0, inc, 32) == 0x46DD794Eu, "0..31: %08x", qt_crc32c(0, inc, 32));
    QT_EXPECT(qt_crc32c(0, dec, 32) == 0x113FDB5Cu, "31..0: %08x", qt_crc32c(0, dec, 32));
    QT_EXPECT(qt_crc32c(qt_crc32c(0, "12345", 5), "6789", 4) == 0xE3069283u, "chained");
    QT_EXPECT(qt_crc32c(0, "", 0) == 0, "empty");
}

/* The word-at-a-time CRC against the byte-at-a-time definition, over every alignment and length up to 100 and a
 * few long buffers, chained at every split point of one of them. */
static uint32_t crc32c_bytewise(uint32_t crc, const unsigned char *p, size_t n) {
    uint32_t c = ~crc;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

static void test_crc32c_words(void) {
    static unsigned char buf[4096 + 16];
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < sizeof buf; i++) x ^= x << 13, x ^= x >> 7, x ^= x << 17, buf[i] = (unsigned char)x;
    for (int off = 0; off < 16; off++)
        for (size_t n = 0; n <= 100; n++)
            QT_EXPECT(qt_crc32c(7, buf + off, n) == crc32c_bytewise(7, buf + off, n), "offset %d, %zu bytes", off, n);
    size_t longs[] = {1000, 4093, 4096};
    for (int i = 0; i < 3; i++)
        QT_EXPECT(qt_crc32c(0, buf + 3, longs[i]) == crc32c_bytewise(0, buf + 3, longs[i]), "%zu bytes", longs[i]);
    uint32_t whole = crc32c_bytewise(0, buf, 257);
    for (size_t k = 0; k <= 257; k++)
        QT_EXPECT(qt_crc32c(qt_crc32c(0, buf, k), buf + k, 257 - k) == whole, "chained at %zu", k);
}

static unsigned le32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (unsigned)p[3] << 24; }

/* length (u64 LE), masked CRC of the length, data, masked CRC of the data; the masked CRC of
 * "123456789" is rotr15(0xE3069283) + 0xa282ead8 = 0xc78ab0e5. */
static void test_frame(void) {
    unsigned char out[9 + 16];
    size_t n = qt_tb_frame("123456789", 9, out);
    QT_REQUIRE(n == 25, "frame length %zu", n);
    static const unsigned char len[8] = {9, 0, 0, 0, 0, 0, 0, 0};
    QT_EXPECT(!memcmp(out, len, 8), "length field");
    unsigned c = qt_crc32c(0, len, 8), masked = ((c >> 15) | (c << 17)) + 0xa282ead8u;
    QT_EXPECT(le32(out + 8) == masked, "length crc %08x, expected %08x", le32(out + 8), masked);
    QT_EXPECT(!memcmp(out + 12, "123456789", 9), "data");
    QT_EXPECT(le32(out + 21) == 0xc78ab0e5u, "data crc %08x", le32(out + 21));
}

/* The Event protobuf, against bytes written out by hand from the .proto field numbers. */
static void test_event_bytes(void) {
    unsigned char buf[256];
    size_t n = qt_tb_event(buf, sizeof buf, 1.5, 300, "brain.Event:2", NULL, NULL, 0);
    static const unsigned char version[] = {0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, /* wall_time 1.5 */
                                            0x10, 0xac, 0x02,                   /* step 300 */
                                            0x1a, 13, 'b', 'r', 'a', 'i', 'n', '.', 'E', 'v', 'e', 'n', 't', ':', '2'};
    QT_EXPECT(n == sizeof version && !memcmp(buf, version, n), "file_version event (%zu bytes)", n);
    const char *tags[] = {"a/b"};
    float v[] = {2.0f};
    n = qt_tb_event(buf, sizeof buf, 0.0, 1, NULL, tags, v, 1);
    static const unsigned char scalar[] = {0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 1,
                                           0x2a, 12, 0x0a, 10,              /* summary { value { */
                                           0x0a, 3, 'a', '/', 'b',          /* tag */
                                           0x15, 0, 0, 0, 0x40};            /* simple_value 2.0f */
    QT_EXPECT(n == sizeof scalar && !memcmp(buf, scalar, n), "scalar event (%zu bytes)", n);
    QT_EXPECT(qt_tb_event(buf, 10, 0.0, 1, NULL, tags, v, 1) == 0, "a too small buffer is refused");
}

int main(void) {
    QT_RUN(test_crc32c_vectors);
    QT_RUN(test_crc32c_words);
    QT_RUN(test_frame);
    QT_RUN(test_event_bytes);
    return qt_test_end();
}
