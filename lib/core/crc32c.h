/* CRC-32C (Castagnoli), the checksum of TFRecord / TensorBoard event files.
 *
 * Reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF (the iSCSI
 * CRC; crc32c("123456789") = 0xE3069283). Slice-by-8 over tables built once, on first
 * use (thread-safe). */
#ifndef FT_CRC32C_H
#define FT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CRC-32C of n bytes. */
uint32_t ft_crc32c(const void *data, size_t n);

/* Continues a finished CRC over more bytes: ft_crc32c_extend(ft_crc32c(a), b) is the
 * CRC of a followed by b; ft_crc32c_extend(0, ...) is ft_crc32c(...). */
uint32_t ft_crc32c_extend(uint32_t crc, const void *data, size_t n);

/* The TFRecord mask, so that a CRC stored next to the data it covers does not look like
 * data: rotate right by 15, add 0xA282EAD8 (mod 2^32). */
uint32_t ft_crc32c_mask(uint32_t crc);

#ifdef __cplusplus
}
#endif

#endif
