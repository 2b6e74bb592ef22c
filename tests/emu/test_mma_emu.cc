/* The tensor-core primitives of kernels/cuda/mma_sm80.cuh on the emulated device, against
 * plain arithmetic on the host: each lane's registers are built (or checked) by the PTX
 * ISA's fragment tables, written out here independently of the emulation:
 *   mma.m16n8k16 A: a[0] = A[g][2t..], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..],
 *                   a[3] = A[g+8][2t+8..];  B: b[0] = B[2t..][g], b[1] = B[2t+8..][g];
 *                   C: c[0..1] = C[g][2t..], c[2..3] = C[g+8][2t..]  (g = lane / 4, t = lane % 4)
 *   ldmatrix: lane 8j + i gives row i of matrix j; r[j] = matrix j [g][2t, 2t+1], or with
 *             .trans [2t][g], [2t+1][g].
 * Checked: D = A B + C of random bf16 against the fp32 matmul (products of bf16 are exact,
 * so only the order of the sums differs); ldmatrix x4, x2 and x4.trans register by
 * register from a padded shared-memory tile; and the chain the flash kernels rely on:
 * two C fragments of S = Q K^T, packed to bf16, used as the A fragment of P V. */
#include "cuda_emu.h"
#include "emu_check.h"

#include "cuda/mma_sm80.cuh"

using fa::pack_bf16;

struct mma_args {
    const float *A, *B, *C; /* [16][16], [16][8] (k, n), [16][8] */
    float *D;               /* [16][8] */
    uint32_t *ld;           /* [32 lanes][4 regs] x4, then x2 (2), then x4.trans */
    const uint16_t *tile;   /* [32 rows][24] bf16 bits: four 8 x 8 matrices, padded rows */
    const float *Q, *K, *V; /* [16][16], [16][16] (n, k), [16][8] (k, n) */
    float *O;               /* [16][8] = (Q K^T rounded to bf16) V */
};

__global__ void mma_kernel(mma_args p)
{
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    /* D = A B + C, fragments by the tables */
    uint32_t a[4] = {pack_bf16(p.A[g * 16 + 2 * t], p.A[g * 16 + 2 * t + 1]),
                     pack_bf16(p.A[(g + 8) * 16 + 2 * t], p.A[(g + 8) * 16 + 2 * t + 1]),
                     pack_bf16(p.A[g * 16 + 2 * t + 8], p.A[g * 16 + 2 * t + 9]),
                     pack_bf16(p.A[(g + 8) * 16 + 2 * t + 8], p.A[(g + 8) * 16 + 2 * t + 9])};
    uint32_t b[2] = {pack_bf16(p.B[(2 * t) * 8 + g], p.B[(2 * t + 1) * 8 + g]),
                     pack_bf16(p.B[(2 * t + 8) * 8 + g], p.B[(2 * t + 9) * 8 + g])};
    float c[4] = {p.C[g * 8 + 2 * t], p.C[g * 8 + 2 * t + 1], p.C[(g + 8) * 8 + 2 * t],
                  p.C[(g + 8) * 8 + 2 * t + 1]};
    float d[4];
    fa::mma_bf16_16816(d, a, b, c);
    p.D[g * 8 + 2 * t] = d[0];
    p.D[g * 8 + 2 * t + 1] = d[1];
    p.D[(g + 8) * 8 + 2 * t] = d[2];
    p.D[(g + 8) * 8 + 2 * t + 1] = d[3];

    /* ldmatrix: lane 8j + i points at row i of matrix j = rows 8j.. of the tile */
    const uint16_t *row = p.tile + l * 24;
    uint32_t r4[4], r2[2], rt[4];
    fa::ldmatrix_x4(r4, row);
    fa::ldmatrix_x2(r2, row);
    fa::ldmatrix_x4_trans(rt, row);
    for (int j = 0; j < 4; j++) {
        p.ld[l * 10 + j] = r4[j];
        p.ld[l * 10 + 6 + j] = rt[j];
    }
    p.ld[l * 10 + 4] = r2[0];
    p.ld[l * 10 + 5] = r2[1];

    /* S = Q K^T as two n-tiles (keys 0..7, 8..15), then O = P V with P = S in bf16 */
    float s[2][4];
    uint32_t qa[4] = {pack_bf16(p.Q[g * 16 + 2 * t], p.Q[g * 16 + 2 * t + 1]),
                      pack_bf16(p.Q[(g + 8) * 16 + 2 * t], p.Q[(g + 8) * 16 + 2 * t + 1]),
                      pack_bf16(p.Q[g * 16 + 2 * t + 8], p.Q[g * 16 + 2 * t + 9]),
                      pack_bf16(p.Q[(g + 8) * 16 + 2 * t + 8], p.Q[(g + 8) * 16 + 2 * t + 9])};
    for (int n = 0; n < 2; n++) {
        const float *kr = p.K + (n * 8 + g) * 16; /* B[k][n] = K[n][k] */
        uint32_t kb[2] = {pack_bf16(kr[2 * t], kr[2 * t + 1]),
                          pack_bf16(kr[2 * t + 8], kr[2 * t + 9])};
        const float z[4] = {0, 0, 0, 0};
        fa::mma_bf16_16816(s[n], qa, kb, z);
    }
    uint32_t pa[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]),
                      pack_bf16(s[1][0], s[1][1]), pack_bf16(s[1][2], s[1][3])};
    uint32_t vb[2] = {pack_bf16(p.V[(2 * t) * 8 + g], p.V[(2 * t + 1) * 8 + g]),
                      pack_bf16(p.V[(2 * t + 8) * 8 + g], p.V[(2 * t + 9) * 8 + g])};
    const float z[4] = {0, 0, 0, 0};
    float o[4];
    fa::mma_bf16_16816(o, pa, vb, z);
    p.O[g * 8 + 2 * t] = o[0];
    p.O[g * 8 + 2 * t + 1] = o[1];
    p.O[(g + 8) * 8 + 2 * t] = o[2];
    p.O[(g + 8) * 8 + 2 * t + 1] = o[3];
}

static std::vector<float> random_bf16(size_t n)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = round_bf16(uniform());
    return v;
}

int main(void)
{
    std::vector<float> A = random_bf16(256), B = random_bf16(128), C = random_bf16(128);
    std::vector<float> Q = random_bf16(256), K = random_bf16(256), V = random_bf16(128);
    std::vector<float> D(128), O(128);
    std::vector<uint32_t> ld(32 * 10);
    std::vector<uint16_t> tile(32 * 24);
    for (size_t i = 0; i < tile.size(); i++)
        tile[i] = (uint16_t)(i * 2654435761u >> 7);
    mma_args p = {A.data(), B.data(), C.data(), D.data(), ld.data(), tile.data(),
                  Q.data(),  K.data(), V.data(), O.data()};
    emu_launch(mma_kernel, 1, 1, 32, p);

    std::vector<float> Dref(128), Oref(128);
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double acc = C[m * 8 + n], o = 0;
            for (int k = 0; k < 16; k++)
                acc += (double)A[m * 16 + k] * B[k * 8 + n];
            Dref[m * 8 + n] = (float)acc;
            for (int j = 0; j < 16; j++) { /* P[m][j] = bf16(Q[m] . K[j]) */
                double sj = 0;
                for (int k = 0; k < 16; k++)
                    sj += (double)Q[m * 16 + k] * K[j * 16 + k];
                o += (double)round_bf16((float)sj) * V[j * 8 + n];
            }
            Oref[m * 8 + n] = (float)o;
        }
    expect_close("mma m16n8k16", "D = A B + C", D, Dref, 1e-6);
    expect_close("mma chain", "C fragments of Q K^T as the A fragment of P V", O, Oref, 1e-5);

    /* ldmatrix, register by register: matrix j = tile rows 8j .. 8j + 7, columns 0..7 */
    int bad4 = 0, bad2 = 0, badt = 0;
    auto at = [&](int j, int r, int c) { return (uint32_t)tile[(8 * j + r) * 24 + c]; };
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int j = 0; j < 4; j++) {
            uint32_t want = at(j, g, 2 * t) | at(j, g, 2 * t + 1) << 16;
            uint32_t want_t = at(j, 2 * t, g) | at(j, 2 * t + 1, g) << 16;
            bad4 += ld[l * 10 + j] != want;
            badt += ld[l * 10 + 6 + j] != want_t;
            if (j < 2)
                bad2 += ld[l * 10 + 4 + j] != want;
        }
    }
    check(!bad4, "ldmatrix x4: registers not as documented", bad4, 0);
    check(!bad2, "ldmatrix x2: registers not as documented", bad2, 0);
    check(!badt, "ldmatrix x4.trans: registers not as documented", badt, 0);
    printf("mma_emu: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
