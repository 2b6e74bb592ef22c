/* The emulated CUDA device (make CUDA=emu, and tests/emu/test_*_emu.cc): WMMA, the
 * 16 x 16 x 16 bf16 products with fp32 accumulators that the flash-attention kernels use,
 * by their documented meaning.
 *
 * A fragment's elements are spread over the warp's lanes in a layout of the emulation's
 * own (the hardware's is unspecified, and kernels must not depend on it): lane L owns the
 * eight accumulator elements (r, c) with c = L % 16 and r = L / 16 + 2i, i < 8, and holds
 * what it needs of A (those eight rows) and B (column c). load_matrix_sync reads that
 * share and then waits for the warp (the load is warp-wide: nobody writes the tile under
 * it); store_matrix_sync writes the lane's share only, so a read of the tile by another
 * lane needs the __syncwarp the hardware needs too. mma_sync multiplies in fp32: the
 * products of bf16 values are exact, the sums are fp32, in k order. */
#ifndef FT_EMU_MMA_H
#define FT_EMU_MMA_H

#ifndef __cplusplus
#error "mma.h is C++"
#endif

#include <type_traits>

#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment;

template <class T, class Layout> struct fragment<matrix_a, 16, 16, 16, T, Layout> {
    float a[8][16]; /* rows L/16 + 2i, every k */
};
template <class T, class Layout> struct fragment<matrix_b, 16, 16, 16, T, Layout> {
    float b[16]; /* column L % 16, every k */
};
template <> struct fragment<accumulator, 16, 16, 16, float, void> {
    static constexpr int num_elements = 8;
    float x[8]; /* (L/16 + 2i, L % 16) */
};

namespace detail {
inline int lane() { return (int)ft_emu::lane_id(); }
inline float value(const __nv_bfloat16 &h) { return __bfloat162float(h); }
inline float value(const float &f) { return f; }
} // namespace detail

template <class T, class Layout, class E>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, Layout> &f, const E *p, unsigned ldm)
{
    static_assert(std::is_same_v<T, E>, "load_matrix_sync: the fragment's type is not the memory's");
    const bool col = std::is_same_v<Layout, col_major>;
    const int r0 = detail::lane() / 16;
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 16; k++) {
            size_t r = (size_t)(r0 + 2 * i);
            f.a[i][k] = detail::value(col ? p[(size_t)k * ldm + r] : p[r * ldm + k]);
        }
    __syncwarp();
}

template <class T, class Layout, class E>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, Layout> &f, const E *p, unsigned ldm)
{
    static_assert(std::is_same_v<T, E>, "load_matrix_sync: the fragment's type is not the memory's");
    const bool col = std::is_same_v<Layout, col_major>;
    const size_t c = (size_t)(detail::lane() % 16);
    for (int k = 0; k < 16; k++)
        f.b[k] = detail::value(col ? p[c * ldm + k] : p[(size_t)k * ldm + c]);
    __syncwarp();
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t l)
{
    const int L = detail::lane();
    const size_t c = (size_t)(L % 16);
    for (int i = 0; i < 8; i++) {
        size_t r = (size_t)(L / 16 + 2 * i);
        f.x[i] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
    }
    __syncwarp();
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t l)
{
    const int L = detail::lane();
    const size_t c = (size_t)(L % 16);
    for (int i = 0; i < 8; i++) {
        size_t r = (size_t)(L / 16 + 2 * i);
        if (l == mem_row_major)
            p[r * ldm + c] = f.x[i];
        else
            p[c * ldm + r] = f.x[i];
    }
}

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v)
{
    for (int i = 0; i < 8; i++)
        f.x[i] = v;
}

template <class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
              const fragment<accumulator, 16, 16, 16, float> &c)
{
    for (int i = 0; i < 8; i++) {
        float s = c.x[i];
        for (int k = 0; k < 16; k++)
            s += a.a[i][k] * b.b[k];
        d.x[i] = s;
    }
}

} // namespace wmma
} // namespace nvcuda

#endif
