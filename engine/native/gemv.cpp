// Weight-only int4 and int8 matmuls for a few rows of fp32 activations (decode), y = x @ W.T + b,
// and the dequantizers prefill uses before its float GEMM. Called through ctypes (gemv.py).
//
// int4 (repacked at load by gemv.py from engine/layers/quant.py's layout): per output row, chunks
// of 32 columns in 16 bytes, byte j holding column j in its low nibble and column j + 16 in its
// high one, so one 16-byte load unpacks into two runs of 16 adjacent columns; scale and offset
// float32 (out, in / group), group a multiple of 32. The sum is scale * sum(q x) + offset * sum(x)
// per group: the dequantize-then-matmul math, summed in another order.
// int8: qweight int8 (out, in), scale float32 (out,), as engine/layers/quant.py holds it.
//
// AVX-512 where the compiler targets it (-march=native), else plain loops that compute the same.
// OpenMP splits the output rows; torch.set_num_threads sets how many threads.

#include <stdint.h>
#include <string.h>

#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

// Activation rows handled per pass over a weight row: the weight is unpacked once per pass and
// its row stays in L1 for the next pass.
constexpr int ROW_TILE = 4;

#ifdef __AVX512F__
// The sum of q x over one group, for MT rows, into part[]: the first chunk multiplies, so each
// chunk adds one dependent FMA per row.
template <int MT>
inline void int4_group(const float* x, long K, const uint8_t* q, long k0, long G, __m512* part) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (long k = k0; k < k0 + G; k += 32) {
        __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k / 2));
        __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask)));
        __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask)));
        for (int m = 0; m < MT; ++m) {
            __m512 p = _mm512_mul_ps(lo, _mm512_loadu_ps(x + m * K + k));
            p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + m * K + k + 16), p);
            part[m] = k == k0 ? p : _mm512_add_ps(part[m], p);
        }
    }
}

template <int MT>
void int4_row(const float* x, long K, const uint8_t* q, const float* scale, long G, float* acc_out) {
    // Two accumulators per row, for even and odd groups: a single one chains every group's FMA
    // on the last (4 cycles each), which made the kernel latency-bound at one row.
    __m512 even[MT], odd[MT], part[MT];
    for (int m = 0; m < MT; ++m) even[m] = odd[m] = _mm512_setzero_ps();
    long g0 = 0;
    for (; g0 + 2 * G <= K; g0 += 2 * G) {
        int4_group<MT>(x, K, q, g0, G, part);
        __m512 s = _mm512_set1_ps(scale[g0 / G]);
        for (int m = 0; m < MT; ++m) even[m] = _mm512_fmadd_ps(s, part[m], even[m]);
        int4_group<MT>(x, K, q, g0 + G, G, part);
        s = _mm512_set1_ps(scale[g0 / G + 1]);
        for (int m = 0; m < MT; ++m) odd[m] = _mm512_fmadd_ps(s, part[m], odd[m]);
    }
    if (g0 < K) {
        int4_group<MT>(x, K, q, g0, G, part);
        __m512 s = _mm512_set1_ps(scale[g0 / G]);
        for (int m = 0; m < MT; ++m) even[m] = _mm512_fmadd_ps(s, part[m], even[m]);
    }
    for (int m = 0; m < MT; ++m) acc_out[m] = _mm512_reduce_add_ps(_mm512_add_ps(even[m], odd[m]));
}

template <int MT>
void int8_row(const float* x, long K, const int8_t* q, float* acc_out) {
    // Four accumulators per row (columns k, k + 16, k + 32, k + 48): one would be latency-bound.
    __m512 acc[4][MT];
    for (int a = 0; a < 4; ++a)
        for (int m = 0; m < MT; ++m) acc[a][m] = _mm512_setzero_ps();
    long k = 0;
    for (; k + 64 <= K; k += 64)
        for (int a = 0; a < 4; ++a) {
            __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k + 16 * a))));
            for (int m = 0; m < MT; ++m)
                acc[a][m] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + m * K + k + 16 * a), acc[a][m]);
        }
    for (; k + 16 <= K; k += 16) {
        __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k))));
        for (int m = 0; m < MT; ++m) acc[0][m] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + m * K + k), acc[0][m]);
    }
    float tail[MT] = {};
    for (; k < K; ++k)
        for (int m = 0; m < MT; ++m) tail[m] += static_cast<float>(q[k]) * x[m * K + k];
    for (int m = 0; m < MT; ++m)
        acc_out[m] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0][m], acc[1][m]),
                                                        _mm512_add_ps(acc[2][m], acc[3][m]))) + tail[m];
}
#else
template <int MT>
void int4_row(const float* x, long K, const uint8_t* q, const float* scale, long G, float* acc_out) {
    for (int m = 0; m < MT; ++m) {
        float acc = 0.0f;
        for (long g0 = 0; g0 < K; g0 += G) {
            float part = 0.0f;
            for (long k = g0; k < g0 + G; k += 32)
                for (int j = 0; j < 16; ++j) {
                    uint8_t b = q[k / 2 + j];
                    part += static_cast<float>(b & 0x0F) * x[m * K + k + j];
                    part += static_cast<float>(b >> 4) * x[m * K + k + 16 + j];
                }
            acc += scale[g0 / G] * part;
        }
        acc_out[m] = acc;
    }
}

template <int MT>
void int8_row(const float* x, long K, const int8_t* q, float* acc_out) {
    for (int m = 0; m < MT; ++m) {
        float acc = 0.0f;
        for (long k = 0; k < K; ++k) acc += static_cast<float>(q[k]) * x[m * K + k];
        acc_out[m] = acc;
    }
}
#endif

template <int MT>
void int4_tile(const float* x, long M0, long K, long N, long G, const uint8_t* q, const float* scale,
               const float* offset, const float* xsum, const float* bias, float* y, long o) {
    float acc[MT];
    long groups = K / G;
    int4_row<MT>(x + M0 * K, K, q + o * (K / 2), scale + o * groups, G, acc);
    for (int m = 0; m < MT; ++m) {
        float off = 0.0f;
        const float* xs = xsum + (M0 + m) * groups;
        for (long g = 0; g < groups; ++g) off += offset[o * groups + g] * xs[g];
        y[(M0 + m) * N + o] = acc[m] + off + (bias ? bias[o] : 0.0f);
    }
}

template <int MT>
void int8_tile(const float* x, long M0, long K, long N, const int8_t* q, const float* scale,
               const float* bias, float* y, long o) {
    float acc[MT];
    int8_row<MT>(x + M0 * K, K, q + o * K, acc);
    for (int m = 0; m < MT; ++m) y[(M0 + m) * N + o] = acc[m] * scale[o] + (bias ? bias[o] : 0.0f);
}

}  // namespace

extern "C" {

// 1 when the AVX-512 kernels were compiled in, 0 for the portable loops.
int gemv_vectorized() {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

// y (M, N) = x (M, K) @ dequantize_int4(q, scale, offset, G).T + bias; q in the repacked layout.
void int4_linear(const float* x, long M, long K, const uint8_t* q, const float* scale,
                 const float* offset, long N, long G, const float* bias, float* y) {
    long groups = K / G;
    std::vector<float> xsum(M * groups);
    for (long m = 0; m < M; ++m)
        for (long g = 0; g < groups; ++g) {
            float s = 0.0f;
            for (long k = g * G; k < (g + 1) * G; ++k) s += x[m * K + k];
            xsum[m * groups + g] = s;
        }
    const float* xs = xsum.data();
#pragma omp parallel for schedule(static)
    for (long o = 0; o < N; ++o) {
        long m = 0;
        for (; m + ROW_TILE <= M; m += ROW_TILE) int4_tile<ROW_TILE>(x, m, K, N, G, q, scale, offset, xs, bias, y, o);
        switch (M - m) {
            case 3: int4_tile<3>(x, m, K, N, G, q, scale, offset, xs, bias, y, o); break;
            case 2: int4_tile<2>(x, m, K, N, G, q, scale, offset, xs, bias, y, o); break;
            case 1: int4_tile<1>(x, m, K, N, G, q, scale, offset, xs, bias, y, o); break;
            default: break;
        }
    }
}

// y (M, N) = x (M, K) @ (q * scale[:, None]).T + bias; q int8 (N, K).
void int8_linear(const float* x, long M, long K, const int8_t* q, const float* scale, long N,
                 const float* bias, float* y) {
#pragma omp parallel for schedule(static)
    for (long o = 0; o < N; ++o) {
        long m = 0;
        for (; m + ROW_TILE <= M; m += ROW_TILE) int8_tile<ROW_TILE>(x, m, K, N, q, scale, bias, y, o);
        switch (M - m) {
            case 3: int8_tile<3>(x, m, K, N, q, scale, bias, y, o); break;
            case 2: int8_tile<2>(x, m, K, N, q, scale, bias, y, o); break;
            case 1: int8_tile<1>(x, m, K, N, q, scale, bias, y, o); break;
            default: break;
        }
    }
}

// w (N, K) float32 = the weight the repacked int4 set stands for (q * scale + offset).
void int4_dequantize(const uint8_t* q, const float* scale, const float* offset, long N, long K,
                     long G, float* w) {
    long groups = K / G;
#pragma omp parallel for schedule(static)
    for (long o = 0; o < N; ++o)
        for (long k = 0; k < K; k += 32) {
            const uint8_t* b = q + o * (K / 2) + k / 2;
            float s = scale[o * groups + k / G], off = offset[o * groups + k / G];
            float* row = w + o * K + k;
            for (int j = 0; j < 16; ++j) {
                row[j] = static_cast<float>(b[j] & 0x0F) * s + off;
                row[j + 16] = static_cast<float>(b[j] >> 4) * s + off;
            }
        }
}

// w (N, K) float32 = q * scale[:, None].
void int8_dequantize(const int8_t* q, const float* scale, long N, long K, float* w) {
#pragma omp parallel for schedule(static)
    for (long o = 0; o < N; ++o)
        for (long k = 0; k < K; ++k) w[o * K + k] = static_cast<float>(q[o * K + k]) * scale[o];
}

}  // extern "C"
