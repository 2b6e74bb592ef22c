#include "core/crc32c.h"

#include <pthread.h>

/* table[0][b] is the CRC register after shifting byte b through it bit by bit;
 * table[k][b] = table[k-1][b] shifted through 8 more zero bits, i.e. the contribution
 * of byte b when it sits k bytes before the end of an 8-byte block. XOR-ing the eight
 * lookups advances the register by 8 bytes at once (slice-by-8). */
static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_tables(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int i = 0; i < 8; i++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        table[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t c = table[k - 1][b];
            table[k][b] = (c >> 8) ^ table[0][c & 0xFF];
        }
}

static uint32_t load_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t ft_crc32c_extend(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&table_once, build_tables);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = c ^ load_le32(p), hi = load_le32(p + 4);
        c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^
            table[4][lo >> 24] ^ table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^
            table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
    }
    for (; n > 0; n--, p++)
        c = (c >> 8) ^ table[0][(c ^ *p) & 0xFF];
    return ~c;
}

uint32_t ft_crc32c(const void *data, size_t n)
{
    return ft_crc32c_extend(0, data, n);
}

uint32_t ft_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}
