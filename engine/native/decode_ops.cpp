// The non-linear ops of a CPU decode step, each one call for what several torch ops did:
// RMSNorm with the residual add, RoPE on q and k plus the K/V write into the paged pool, attention
// straight over the pool through the block table, SiLU-and-mul. float32 throughout; every pointer is
// to contiguous rows (the Python side checks). Built by engine/native/build.py; called through
// engine/native/decode_ops.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// exp for x <= ~88, branch-free so that loops of it vectorize (libm's expf is a call per element).
// Cephes' polynomial: within 2 ulp of expf over the range softmax and SiLU use.
inline float fast_exp(float x) {
    // Ternaries, not fminf/fmaxf: those do not vectorize without -ffinite-math-only.
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    // Round to nearest by adding and removing 1.5 * 2^23 (floorf would not vectorize without
    // -fno-trapping-math).
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * (r * r) + r + 1.0f;
    int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    return y * __builtin_bit_cast(float, bits);
}

inline float dot(const float* a, const float* b, long n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (long i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

// Tokens per unit of attention work: a sequence's context is split into chunks of this many,
// attended separately and merged by their maxima and sums. Fixed (not derived from the thread
// count or the batch), so a sequence's result has the same bits alone or in any batch.
constexpr long CHUNK = 128;

void silu_row(const float* __restrict gate, const float* __restrict up, float* __restrict out, long n) {
#pragma omp simd
    for (long i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + fast_exp(-gate[i])) * up[i];
}

// The body of decode_attention (below), for a head_dim fixed at compile time (HD) or not (0).
template <long HD>
void attend(const float* q, long q_stride, const float* k_cache, const float* v_cache,
                      const int64_t* block_tables, long table_width, const int64_t* context_lens,
                      long seqs, long heads, long kv_heads, long runtime_head_dim, long block_size,
                      float scale, float* out) {
    // A compile-time head_dim (64, 128) unrolls the dot products and keeps them in registers.
    const long head_dim = HD ? HD : runtime_head_dim;
    const long group = heads / kv_heads, token_stride = kv_heads * head_dim;
    std::vector<long> first_chunk(seqs + 1, 0);
    for (long s = 0; s < seqs; ++s)
        first_chunk[s + 1] = first_chunk[s] + (context_lens[s] + CHUNK - 1) / CHUNK;
    const long items = first_chunk[seqs];
    // Per item and query head: the maximum score, the sum of exp(score - max), the weighted values.
    std::vector<float> part_max(items * heads), part_sum(items * heads);
    std::vector<float> part_acc(items * heads * head_dim);
    long work = 0;
    for (long s = 0; s < seqs; ++s) work += context_lens[s];
    work *= heads * head_dim;

#pragma omp parallel if (work > 32768 && items > 1)
    {
        std::vector<float> scores(heads * CHUNK);
        std::vector<long> rows(CHUNK);
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < items; ++item) {
            long s = 0;
            while (first_chunk[s + 1] <= item) ++s;
            const long lo = (item - first_chunk[s]) * CHUNK;
            const long hi = std::min(lo + CHUNK, static_cast<long>(context_lens[s]));
            const long n = hi - lo;
            const int64_t* table = block_tables + s * table_width;
            const float* qs = q + s * q_stride;
            float* sc = scores.data();
            // Each token's row offset in the pool, walked block by block (no division per token).
            long* row = rows.data();
            for (long t = lo, block = lo / block_size, offset = lo % block_size; t < hi; ++t) {
                row[t - lo] = (table[block] * block_size + offset) * token_stride;
                if (++offset == block_size) offset = 0, ++block;
            }
            for (long t = lo; t < hi; ++t) {
                const float* k = k_cache + row[t - lo];
                for (long h = 0; h < heads; ++h)
                    sc[h * CHUNK + (t - lo)] = dot(qs + h * head_dim, k + (h / group) * head_dim, head_dim) * scale;
            }
            float* mx = part_max.data() + item * heads;
            float* sm = part_sum.data() + item * heads;
            float* acc = part_acc.data() + item * heads * head_dim;
            for (long h = 0; h < heads; ++h) {
                float* __restrict p = sc + h * CHUNK;
                float m = p[0];
                for (long i = 1; i < n; ++i) m = p[i] > m ? p[i] : m;
                float total = 0.0f;
#pragma omp simd reduction(+ : total)
                for (long i = 0; i < n; ++i) {
                    p[i] = fast_exp(p[i] - m);
                    total += p[i];
                }
                mx[h] = m;
                sm[h] = total;
            }
            std::memset(acc, 0, heads * head_dim * sizeof(float));
            for (long t = lo; t < hi; ++t) {
                const float* v = v_cache + row[t - lo];
                for (long h = 0; h < heads; ++h) {
                    const float w = sc[h * CHUNK + (t - lo)];
                    const float* vh = v + (h / group) * head_dim;
                    float* a = acc + h * head_dim;
#pragma omp simd
                    for (long d = 0; d < head_dim; ++d) a[d] += w * vh[d];
                }
            }
        }
    }

    // Merge each (sequence, query head)'s chunks in order: softmax over the whole context.
    for (long s = 0; s < seqs; ++s) {
        for (long h = 0; h < heads; ++h) {
            float* o = out + (s * heads + h) * head_dim;
            float m = -INFINITY;
            for (long c = first_chunk[s]; c < first_chunk[s + 1]; ++c)
                m = std::fmax(m, part_max[c * heads + h]);
            float total = 0.0f;
            std::memset(o, 0, head_dim * sizeof(float));
            for (long c = first_chunk[s]; c < first_chunk[s + 1]; ++c) {
                const long at = c * heads + h;
                const float w = std::exp(part_max[at] - m);
                total += w * part_sum[at];
                const float* a = part_acc.data() + at * head_dim;
#pragma omp simd
                for (long d = 0; d < head_dim; ++d) o[d] += w * a[d];
            }
            const float inv = 1.0f / total;
#pragma omp simd
            for (long d = 0; d < head_dim; ++d) o[d] *= inv;
        }
    }
}

}  // namespace

extern "C" {

// out = norm(x + residual) * weight, and residual = x + residual, per row of n. With residual
// null: out = norm(x) * weight. Statistics as the torch reference: mean of squares, + eps, rsqrt.
void add_rms_norm(const float* x, float* residual, const float* weight, float* out, long rows,
                  long n, float eps) {
    for (long row = 0; row < rows; ++row) {
        const float* xr = x + row * n;
        float* o = out + row * n;
        const float* h = xr;
        if (residual) {
            float* res = residual + row * n;
#pragma omp simd
            for (long i = 0; i < n; ++i) res[i] = xr[i] + res[i];
            h = res;
        }
        float ss = dot(h, h, n);
        float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
#pragma omp simd
        for (long i = 0; i < n; ++i) o[i] = (h[i] * inv) * weight[i];
    }
}

// qkv: [tokens, (heads + 2 * kv_heads) * head_dim], q then k then v heads. Rotates the q and k
// heads in place ("rotate half": (x1 c - x2 s, x2 c + x1 s), the torch reference's products and
// sums, so its bits) with the tables cos/sin [positions, head_dim / 2], then copies each token's
// k and v heads to its pool slot: caches [slots, kv_heads, head_dim].
// No fused multiply-adds here (g++ contracts by default in C++): the reference's separate
// products and sums, so its bits.
__attribute__((optimize("fp-contract=off")))
void rope_kv_write(float* qkv, long tokens, long heads, long kv_heads, long head_dim,
                   const int64_t* positions, const float* cos_table, const float* sin_table,
                   float* k_cache, float* v_cache, const int64_t* slots) {
    const long half = head_dim / 2, row = (heads + 2 * kv_heads) * head_dim;
    const long kv = kv_heads * head_dim;
    for (long t = 0; t < tokens; ++t) {
        float* x = qkv + t * row;
        const float* c = cos_table + positions[t] * half;
        const float* s = sin_table + positions[t] * half;
        for (long h = 0; h < heads + kv_heads; ++h) {
            float* x1 = x + h * head_dim;
            float* x2 = x1 + half;
#pragma omp simd
            for (long i = 0; i < half; ++i) {
                float a = x1[i], b = x2[i];
                x1[i] = a * c[i] + b * (-s[i]);
                x2[i] = b * c[i] + a * s[i];
            }
        }
        std::memcpy(k_cache + slots[t] * kv, x + heads * head_dim, kv * sizeof(float));
        std::memcpy(v_cache + slots[t] * kv, x + heads * head_dim + kv, kv * sizeof(float));
    }
}

// One query token per sequence: q rows [seqs] of stride q_stride (heads * head_dim floats used,
// head h at h * head_dim), caches [blocks, block_size, kv_heads, head_dim], block_tables [seqs,
// table_width], context_lens [seqs] (>= 1, the new token's K/V already written). out: [seqs,
// heads, head_dim]. Work items are (sequence, chunk of CHUNK tokens), spread over the threads; an
// item reads each token's K and V rows whole (all KV heads: one contiguous stretch of the pool per
// block, which the prefetcher streams), each KV head's row once for the `group` query heads that
// share it, and keeps per query head its scores' maximum, sum of exponentials and weighted values,
// merged afterwards.
void decode_attention(const float* q, long q_stride, const float* k_cache, const float* v_cache,
                      const int64_t* block_tables, long table_width, const int64_t* context_lens,
                      long seqs, long heads, long kv_heads, long head_dim, long block_size,
                      float scale, float* out) {
    auto run = head_dim == 64 ? attend<64> : head_dim == 128 ? attend<128> : attend<0>;
    run(q, q_stride, k_cache, v_cache, block_tables, table_width, context_lens, seqs, heads,
        kv_heads, head_dim, block_size, scale, out);
}

// A decode step's attention on the fused qkv output of its decode tokens (one per sequence):
// rope_kv_write, then decode_attention with q read out of qkv's rows. One call instead of two.
void rope_write_attend(float* qkv, long heads, long kv_heads, long head_dim,
                       const int64_t* positions, const float* cos_table, const float* sin_table,
                       float* k_cache, float* v_cache, const int64_t* slots,
                       const int64_t* block_tables, long table_width, const int64_t* context_lens,
                       long seqs, long block_size, float scale, float* out) {
    rope_kv_write(qkv, seqs, heads, kv_heads, head_dim, positions, cos_table, sin_table, k_cache,
                  v_cache, slots);
    decode_attention(qkv, (heads + 2 * kv_heads) * head_dim, k_cache, v_cache, block_tables,
                     table_width, context_lens, seqs, heads, kv_heads, head_dim, block_size, scale,
                     out);
}

// x: [rows, 2 * inter], gate then up; out: [rows, inter] = silu(gate) * up.
void silu_and_mul(const float* x, float* out, long rows, long inter) {
    for (long r = 0; r < rows; ++r) silu_row(x + r * 2 * inter, x + r * 2 * inter + inter, out + r * inter, inter);
}

}  // extern "C"
