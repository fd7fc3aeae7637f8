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
            if (MT == 1 || k == k0) {  // one row: no chain through part[] (the rows hide it)
                __m512 p = _mm512_mul_ps(lo, _mm512_loadu_ps(x + m * K + k));
                p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + m * K + k + 16), p);
                part[m] = k == k0 ? p : _mm512_add_ps(part[m], p);
            } else {
                part[m] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + m * K + k), part[m]);
                part[m] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + m * K + k + 16), part[m]);
            }
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


// One row of x against two output rows at once: each x vector loaded serves both (at one row the
// loads, not the FMAs, were what the single-output loop waited on).
void int4_pair(const float* x, long K, const uint8_t* q0, const uint8_t* q1, const float* s0,
               const float* s1, long G, float* out) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (long g0 = 0; g0 < K; g0 += G) {
        __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
        for (long k = g0; k < g0 + G; k += 32) {
            __m512 xl = _mm512_loadu_ps(x + k), xh = _mm512_loadu_ps(x + k + 16);
            __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q0 + k / 2));
            __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q1 + k / 2));
            __m512 l0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b0, mask)));
            __m512 h0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b0, 4), mask)));
            __m512 l1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b1, mask)));
            __m512 h1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b1, 4), mask)));
            p0 = _mm512_add_ps(p0, _mm512_fmadd_ps(h0, xh, _mm512_mul_ps(l0, xl)));
            p1 = _mm512_add_ps(p1, _mm512_fmadd_ps(h1, xh, _mm512_mul_ps(l1, xl)));
        }
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(s0[g0 / G]), p0, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(s1[g0 / G]), p1, a1);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
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

// sum over g of a[g] * b[g]
inline float dot(const float* a, const float* b, long n) {
#ifdef __AVX512F__
    __m512 acc = _mm512_setzero_ps();
    long g = 0;
    for (; g + 16 <= n; g += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + g), _mm512_loadu_ps(b + g), acc);
    if (g < n) {
        __mmask16 k = static_cast<__mmask16>((1u << (n - g)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + g), _mm512_maskz_loadu_ps(k, b + g), acc);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0.0f;
    for (long g = 0; g < n; ++g) s += a[g] * b[g];
    return s;
#endif
}

template <int MT>
void int4_tile(const float* x, long M0, long K, long N, long G, const uint8_t* q, const float* scale,
               const float* offset, const float* xsum, const float* bias, float* y, long o) {
    float acc[MT];
    long groups = K / G;
    int4_row<MT>(x + M0 * K, K, q + o * (K / 2), scale + o * groups, G, acc);
    for (int m = 0; m < MT; ++m) {
        float off = dot(offset + o * groups, xsum + (M0 + m) * groups, groups);
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


// The int8-activation tier (llama.cpp's Q8 activation blocks): each 32-column chunk of a row of x
// becomes int8 with its own scale (amax / 127), laid out per 128 columns as the weight's nibbles
// unpack: bytes [0, 64) the low halves (columns 0..15) of its 4 chunks, [64, 128) the high halves.
// The integer dot of 0..15 weights and int8 activations is exact; then per chunk
// y += scale_w * scale_x * dot, and offset * sum(x) with the fp32 sum. Groups of 32 only.
struct Q8Rows {
    long blocks;               // of 128 columns, the last maybe partly padding (zeros)
    std::vector<int8_t> xq;    // (M, blocks, 128)
    std::vector<float> sx;     // (M, blocks * 4): each chunk's scale, 0 for padding
    std::vector<float> xsum;   // (M, K / 32): each chunk's fp32 sum
};

void quantize_rows(const float* x, long M, long K, Q8Rows& r) {
    long chunks = K / 32;
    r.blocks = (chunks + 3) / 4;
    r.xq.assign(M * r.blocks * 128, 0);
    r.sx.assign(M * r.blocks * 4, 0.0f);
    r.xsum.assign(M * chunks, 0.0f);
    for (long m = 0; m < M; ++m)
        for (long c = 0; c < chunks; ++c) {
            const float* v = x + m * K + c * 32;
            float amax = 0.0f, sum = 0.0f;
            for (int j = 0; j < 32; ++j) {
                amax = v[j] > amax ? v[j] : (-v[j] > amax ? -v[j] : amax);
                sum += v[j];
            }
            float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            r.sx[m * r.blocks * 4 + c] = d;
            r.xsum[m * chunks + c] = sum;
            int8_t* lo = r.xq.data() + (m * r.blocks + c / 4) * 128 + (c % 4) * 16;
            for (int j = 0; j < 16; ++j) {
                lo[j] = static_cast<int8_t>(__builtin_nearbyintf(v[j] * inv));
                lo[64 + j] = static_cast<int8_t>(__builtin_nearbyintf(v[16 + j] * inv));
            }
        }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
template <int MT>
void q8_row(const Q8Rows& r, long M0, long K, const uint8_t* q, const float* scale, float* acc_out) {
    long chunks = K / 32;
    __m512 acc[2][MT];
    for (int m = 0; m < MT; ++m) acc[0][m] = acc[1][m] = _mm512_setzero_ps();
    const __m512i mask = _mm512_set1_epi8(0x0F);
    // lane l of a 4-chunk block belongs to chunk l / 4
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (long blk = 0; blk < r.blocks; ++blk) {
        long n = chunks - blk * 4 < 4 ? chunks - blk * 4 : 4;
        __m512i b = _mm512_maskz_loadu_epi8(n == 4 ? ~0ULL : (1ULL << (16 * n)) - 1, q + blk * 64);
        __m512i lo = _mm512_and_si512(b, mask);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), mask);
        __m512 sw = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(
            _mm_maskz_loadu_ps(static_cast<__mmask8>((1 << n) - 1), scale + blk * 4)));
        for (int m = 0; m < MT; ++m) {
            const int8_t* xq = r.xq.data() + ((M0 + m) * r.blocks + blk) * 128;
            __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
            d = _mm512_dpbusd_epi32(d, hi, _mm512_loadu_si512(xq + 64));
            __m512 sx = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(
                _mm_loadu_ps(r.sx.data() + ((M0 + m) * r.blocks + blk) * 4)));
            acc[blk & 1][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sw, sx), acc[blk & 1][m]);
        }
    }
    for (int m = 0; m < MT; ++m) acc_out[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][m], acc[1][m]));
}
#else
template <int MT>
void q8_row(const Q8Rows& r, long M0, long K, const uint8_t* q, const float* scale, float* acc_out) {
    long chunks = K / 32;
    for (int m = 0; m < MT; ++m) {
        float acc = 0.0f;
        for (long c = 0; c < chunks; ++c) {
            const int8_t* xq = r.xq.data() + ((M0 + m) * r.blocks + c / 4) * 128 + (c % 4) * 16;
            int32_t dot = 0;
            for (int j = 0; j < 16; ++j)
                dot += (q[c * 16 + j] & 0x0F) * xq[j] + (q[c * 16 + j] >> 4) * xq[64 + j];
            acc += static_cast<float>(dot) * (scale[c] * r.sx[(M0 + m) * r.blocks * 4 + c]);
        }
        acc_out[m] = acc;
    }
}
#endif

template <int MT>
void q8_tile(const Q8Rows& r, long M0, long K, long N, const uint8_t* q, const float* scale,
             const float* offset, const float* bias, float* y, long o) {
    float acc[MT];
    long chunks = K / 32;
    q8_row<MT>(r, M0, K, q + o * (K / 2), scale + o * chunks, acc);
    for (int m = 0; m < MT; ++m)
        y[(M0 + m) * N + o] = acc[m] + dot(offset + o * chunks, r.xsum.data() + (M0 + m) * chunks, chunks)
                              + (bias ? bias[o] : 0.0f);
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
#ifdef __AVX512F__
    if (M == 1) {
#pragma omp parallel for schedule(static)
        for (long p = 0; p < N / 2; ++p) {
            long o = 2 * p;
            float acc[2];
            int4_pair(x, K, q + o * (K / 2), q + (o + 1) * (K / 2), scale + o * groups,
                      scale + (o + 1) * groups, G, acc);
            for (int j = 0; j < 2; ++j)
                y[o + j] = acc[j] + dot(offset + (o + j) * groups, xs, groups) + (bias ? bias[o + j] : 0.0f);
        }
        if (N % 2) int4_tile<1>(x, 0, K, N, G, q, scale, offset, xs, bias, y, N - 1);
        return;
    }
#endif
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

// 1 when the int8-activation tier runs on VNNI dot products, 0 for its portable loops.
int gemv_q8_vectorized() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
    return 1;
#else
    return 0;
#endif
}

// As int4_linear for groups of 32, with x's rows rounded to int8 per chunk of 32 (see Q8Rows).
void int4_linear_q8(const float* x, long M, long K, const uint8_t* q, const float* scale,
                    const float* offset, long N, const float* bias, float* y) {
    Q8Rows r;
    quantize_rows(x, M, K, r);
#pragma omp parallel for schedule(static)
    for (long o = 0; o < N; ++o) {
        long m = 0;
        for (; m + ROW_TILE <= M; m += ROW_TILE) q8_tile<ROW_TILE>(r, m, K, N, q, scale, offset, bias, y, o);
        switch (M - m) {
            case 3: q8_tile<3>(r, m, K, N, q, scale, offset, bias, y, o); break;
            case 2: q8_tile<2>(r, m, K, N, q, scale, offset, bias, y, o); break;
            case 1: q8_tile<1>(r, m, K, N, q, scale, offset, bias, y, o); break;
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
