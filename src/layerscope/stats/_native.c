/* The partials of a float32 or bfloat16 tensor on the CPU, in one pass over its memory.
 *
 * layerscope builds this file with the system's C compiler the first time it needs it and
 * loads it with ctypes (see _native.py). It computes exactly what _partials.py computes with
 * torch ops, the row of Field values and the log2 histogram, but reads memory once: the data
 * is cut into blocks that stay in L1 cache, and each block is read by a vectorised pass of
 * counts and extremes (a second, masked one only where a block holds a NaN or an infinity),
 * a float64 pass of sums, and a pass of histogram counts (vectorised
 * with AVX2 or AVX-512 where the block spans few exponents, the usual case).
 * Threads (OpenMP, the runtime torch itself uses) take contiguous runs of blocks, and their
 * results are merged in thread order, so a result never depends on timing.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) || (defined(__AVX512F__) && defined(__AVX512BW__))
#include <immintrin.h>
#endif

/* The layout of a row: must match layerscope.stats.Field. */
enum { NUMEL, COUNT, MEAN, M2, MIN, MAX, ZEROS, NANS, INFS, NEG, POS, WIDTH };
enum { DTYPE_FLOAT32 = 0, DTYPE_BFLOAT16 = 1 };
enum { SLOTS = 256 };  /* one per float32 exponent */
#define ABI (100 * WIDTH + 2)

#define BLOCK 1024           /* values per block: 4 KB of float32, in L1 */
#define CHUNK (64 * BLOCK)   /* values between two flushes of 32-bit histogram counts */
#define PARALLEL_MIN (1 << 16)
#define MAX_THREADS 64
#define TABLES 8             /* histogram tables per thread */

typedef struct {
    double sum, squares;  /* of finite values minus the shift */
    float lo, hi;         /* finite extremes */
    int64_t zeros, nans, nonfinite, pos;
    int64_t hist[SLOTS];
} partials_t;

static void partials_init(partials_t* p) {
    memset(p, 0, sizeof *p);
    p->lo = INFINITY;
    p->hi = -INFINITY;
}

/* Counts and extremes of one block; sums of the finite values' distance from the shift. */
static void block_moments(const float* x, int64_t n, double shift, partials_t* p) {
    const uint32_t* bits = (const uint32_t*)x;
    float lo = INFINITY, hi = -INFINITY;
    int32_t zeros = 0, nans = 0, nonfinite = 0, pos = 0;
    uint32_t top = 0; /* the largest magnitude's bits: 0x7f800000 or more if one is not finite */
    /* The usual block, all finite, needs no masking: half the work of the loop below. */
#pragma omp simd reduction(+ : zeros, pos) reduction(min : lo) reduction(max : hi, top)
    for (int64_t i = 0; i < n; i++) {
        uint32_t magnitude = bits[i] & 0x7fffffffu;
        top = magnitude > top ? magnitude : top;
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        zeros += magnitude == 0;
        pos += bits[i] - 1u < 0x7f800000u; /* sign clear, not zero, at most +inf */
    }
    if (top >= 0x7f800000u) { /* a NaN or an infinity: count again, leaving them out */
        lo = INFINITY, hi = -INFINITY;
        zeros = pos = 0;
#pragma omp simd reduction(+ : zeros, nans, nonfinite, pos) reduction(min : lo) reduction(max : hi)
        for (int64_t i = 0; i < n; i++) {
            uint32_t magnitude = bits[i] & 0x7fffffffu;
            int32_t finite = magnitude < 0x7f800000u;
            float low = finite ? x[i] : INFINITY, high = finite ? x[i] : -INFINITY;
            lo = low < lo ? low : lo;
            hi = high > hi ? high : hi;
            zeros += magnitude == 0;
            nans += magnitude > 0x7f800000u;
            nonfinite += 1 - finite;
            pos += bits[i] - 1u < 0x7f800000u;
        }
    }
    double sum = 0.0, squares = 0.0;
    if (nonfinite == 0) {
#pragma omp simd reduction(+ : sum, squares)
        for (int64_t i = 0; i < n; i++) {
            double d = (double)x[i] - shift;
            sum += d;
            squares += d * d;
        }
    } else {
#pragma omp simd reduction(+ : sum, squares)
        for (int64_t i = 0; i < n; i++) {
            double d = (bits[i] & 0x7fffffffu) < 0x7f800000u ? (double)x[i] - shift : 0.0;
            sum += d;
            squares += d * d;
        }
    }
    p->sum += sum;
    p->squares += squares;
    p->lo = lo < p->lo ? lo : p->lo;
    p->hi = hi > p->hi ? hi : p->hi;
    p->zeros += zeros;
    p->nans += nans;
    p->nonfinite += nonfinite;
    p->pos += pos;
}

/* Histogram counts of one block, spread over eight tables: runs of values with the same
 * exponent, the usual case, would otherwise wait on each other's increments. */
static void block_histogram_scalar(const float* x, int64_t n, uint32_t (*tables)[SLOTS]) {
    const uint32_t* bits = (const uint32_t*)x;
    int64_t i = 0;
    for (; i + TABLES <= n; i += TABLES)
        for (int t = 0; t < TABLES; t++) tables[t][(bits[i + t] >> 23) & 0xff]++;
    for (; i < n; i++) tables[0][(bits[i] >> 23) & 0xff]++;
}

/* A block's values span few exponents: in the models measured, 12 to 16 of the 254 normal
 * ones, at most 34. Counting each exponent present with byte compares, 32 or 64 values a
 * compare, then beats a table increment per value, which is bound by stores. Blocks spanning
 * more than VECTOR_SPAN exponents go scalar. Each instruction set gives three pieces: a
 * vector of exponent bytes, extraction of a block's exponents, and a count of one of them. */
#define VECTOR_SPAN 32

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define VECTOR_HISTOGRAM
#define LANES 64
typedef __m512i bytes_t;
#define BYTES_ALL(v) _mm512_set1_epi8((char)(v))
#define BYTES_MIN _mm512_min_epu8
#define BYTES_MAX _mm512_max_epu8
#define BYTES_ADD _mm512_add_epi8
#define BYTES_SUB _mm512_sub_epi8

static inline __m128i bytes_fold(bytes_t v, __m128i (*fold)(__m128i, __m128i)) {
    __m256i a = _mm512_castsi512_si256(v), b = _mm512_extracti64x4_epi64(v, 1);
    __m128i c = fold(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    return fold(c, fold(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}

/* The exponent bytes of values x[0..64), in order; the shift leaves the sign in bit 8, which
 * the narrowing drops. */
static inline bytes_t exponent_bytes(const float* x) {
    __m128i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = _mm512_cvtepi32_epi8(_mm512_srli_epi32(_mm512_loadu_si512(x + 16 * k), 23));
    __m512i e = _mm512_inserti32x4(_mm512_castsi128_si512(q[0]), q[1], 1);
    return _mm512_inserti32x4(_mm512_inserti32x4(e, q[2], 2), q[3], 3);
}

/* How many of the first `full` bytes of ex equal e: each lane counts at most BLOCK / 64. */
static inline uint32_t count_byte(const uint8_t* ex, int64_t full, int e) {
    const __m512i key = BYTES_ALL(e), one = BYTES_ALL(1);
    __m512i counts = _mm512_setzero_si512();
    for (int64_t j = 0; j < full; j += LANES) {
        __mmask64 equal = _mm512_cmpeq_epi8_mask(_mm512_loadu_si512(ex + j), key);
        counts = _mm512_mask_add_epi8(counts, equal, counts, one);
    }
    return (uint32_t)_mm512_reduce_add_epi64(_mm512_sad_epu8(counts, _mm512_setzero_si512()));
}
#define BYTES_STORE(p, v) _mm512_storeu_si512((p), (v))

#elif defined(__AVX2__)
#define VECTOR_HISTOGRAM
#define LANES 32
typedef __m256i bytes_t;
#define BYTES_ALL(v) _mm256_set1_epi8((char)(v))
#define BYTES_MIN _mm256_min_epu8
#define BYTES_MAX _mm256_max_epu8
#define BYTES_ADD _mm256_add_epi8
#define BYTES_SUB _mm256_sub_epi8

static inline __m128i bytes_fold(bytes_t v, __m128i (*fold)(__m128i, __m128i)) {
    return fold(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

/* The exponent bytes of values x[0..32), in some order: the packs interleave 128-bit lanes,
 * which a count does not mind. */
static inline bytes_t exponent_bytes(const float* x) {
    const __m256i low_byte = _mm256_set1_epi32(0xff);
    __m256i e[4];
    for (int k = 0; k < 4; k++)
        e[k] = _mm256_and_si256(_mm256_srli_epi32(_mm256_loadu_si256((const __m256i*)(x + 8 * k)), 23), low_byte);
    return _mm256_packus_epi16(_mm256_packus_epi32(e[0], e[1]), _mm256_packus_epi32(e[2], e[3]));
}

/* How many of the first `full` bytes of ex equal e: each lane counts at most BLOCK / 32. */
static inline uint32_t count_byte(const uint8_t* ex, int64_t full, int e) {
    const __m256i key = BYTES_ALL(e);
    __m256i counts = _mm256_setzero_si256();
    for (int64_t j = 0; j < full; j += LANES)  /* a match is -1: subtracting it counts one */
        counts = _mm256_sub_epi8(counts, _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i*)(ex + j)), key));
    __m256i sums = _mm256_sad_epu8(counts, _mm256_setzero_si256());
    __m128i half = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
    return (uint32_t)(_mm_cvtsi128_si64(half) + _mm_extract_epi64(half, 1));
}
#define BYTES_STORE(p, v) _mm256_storeu_si256((__m256i*)(p), (v))
#endif

#ifdef VECTOR_HISTOGRAM
static __m128i min_epu8(__m128i a, __m128i b) { return _mm_min_epu8(a, b); }
static __m128i max_epu8(__m128i a, __m128i b) { return _mm_max_epu8(a, b); }

/* The smallest byte of 16. */
static inline int min_of(__m128i b) {
    __m128i c = _mm_min_epu16(_mm_cvtepu8_epi16(b), _mm_cvtepu8_epi16(_mm_srli_si128(b, 8)));
    return _mm_extract_epi16(_mm_minpos_epu16(c), 0);
}

static inline int min_byte(bytes_t v) { return min_of(bytes_fold(v, min_epu8)); }
static inline int max_byte(bytes_t v) {
    return 255 - min_of(_mm_xor_si128(bytes_fold(v, max_epu8), _mm_set1_epi8(-1)));
}

/* Histogram counts of one block into table by exponent compares; 0 if its span is too wide
 * (nothing is counted then), else 1. */
static int block_histogram_vector(const float* x, int64_t n, uint32_t* table) {
    uint8_t ex[BLOCK];
    int64_t full = n & ~(int64_t)(LANES - 1);
    if (full == 0) return 0;
    const bytes_t one = BYTES_ALL(1);
    bytes_t low = BYTES_ALL(255), high = BYTES_ALL(0);
    bytes_t normal_low = low, normal_high = high;
    for (int64_t i = 0; i < full; i += LANES) {
        bytes_t e = exponent_bytes(x + i);
        BYTES_STORE(ex + i, e);
        low = BYTES_MIN(low, e);
        high = BYTES_MAX(high, e);
        /* minus and plus one wrap 0 and 255 past the normal exponents, 1 to 254 */
        normal_low = BYTES_MIN(normal_low, BYTES_SUB(e, one));
        normal_high = BYTES_MAX(normal_high, BYTES_ADD(e, one));
    }
    int first = min_byte(normal_low) + 1, last = max_byte(normal_high) - 1;
    int zero = min_byte(low) == 0, special = max_byte(high) == 255;
    int span = (first <= last ? last - first + 1 : 0) + zero + special;
    if (span > VECTOR_SPAN) return 0;
    if (zero) table[0] += count_byte(ex, full, 0);
    if (special) table[255] += count_byte(ex, full, 255);
    for (int e = first; e <= last; e++) table[e] += count_byte(ex, full, e);
    const uint32_t* bits = (const uint32_t*)x;
    for (int64_t i = full; i < n; i++) table[(bits[i] >> 23) & 0xff]++;
    return 1;
}
#endif

/* Histogram counts of one block into the chunk's tables. */
static void block_histogram(const float* x, int64_t n, uint32_t (*tables)[SLOTS]) {
#ifdef VECTOR_HISTOGRAM
    if (block_histogram_vector(x, n, tables[0])) return;
#endif
    block_histogram_scalar(x, n, tables);
}

/* The n values from start as float32: in place, or widened from bfloat16 into widened. */
static inline const float* block_floats(const void* data, int dtype, int64_t start, int64_t n,
                                        float* widened) {
    if (dtype != DTYPE_BFLOAT16) return (const float*)data + start;
    const uint16_t* half = (const uint16_t*)data + start; /* float32's upper half */
    uint32_t* wide = (uint32_t*)widened;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) wide[i] = (uint32_t)half[i] << 16;
    return widened;
}

/* Partials of values [begin, end) into p. */
static void range_partials(const void* data, int dtype, int64_t begin, int64_t end, double shift,
                           int with_histogram, partials_t* p) {
    float widened[BLOCK];
    uint32_t tables[TABLES][SLOTS];
    for (int64_t chunk = begin; chunk < end; chunk += CHUNK) {
        int64_t chunk_end = chunk + CHUNK < end ? chunk + CHUNK : end;
        if (with_histogram) memset(tables, 0, sizeof tables);
        for (int64_t start = chunk; start < chunk_end; start += BLOCK) {
            int64_t n = chunk_end - start < BLOCK ? chunk_end - start : BLOCK;
            const float* x = block_floats(data, dtype, start, n, widened);
            block_moments(x, n, shift, p);
            if (with_histogram) block_histogram(x, n, tables);
        }
        if (with_histogram)
            for (int t = 0; t < TABLES; t++)
                for (int slot = 0; slot < SLOTS; slot++) p->hist[slot] += tables[t][slot];
    }
}

/* The first finite value, or 0 if there is none: the shift of the sums. */
static double first_finite(const void* data, int dtype, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        if (dtype == DTYPE_BFLOAT16)  /* bfloat16 is float32's upper half */
            bits = (uint32_t)((const uint16_t*)data)[i] << 16;
        else
            memcpy(&bits, (const float*)data + i, sizeof bits);
        if ((bits & 0x7fffffffu) < 0x7f800000u) {
            float value;
            memcpy(&value, &bits, sizeof value);
            return (double)value;
        }
    }
    return 0.0;
}

int layerscope_abi(void) { return ABI; }

/* Partials of n > 0 values into row[WIDTH] and, unless it is NULL, hist[SLOTS] (float64 counts).
 *
 * Sums run in float64 on the values minus the first finite one, which bounds the cancellation
 * of squares - sum**2 / count, as _float32_partials explains. Returns 0, or -1 for an unknown
 * dtype. */
int layerscope_partials(const void* data, int64_t n, int dtype, double* row, double* hist,
                        int threads) {
    if (dtype != DTYPE_FLOAT32 && dtype != DTYPE_BFLOAT16) return -1;
    double shift = first_finite(data, dtype, n);
    int with_histogram = hist != NULL;
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads < 1 || n < PARALLEL_MIN) threads = 1;
    if (threads > blocks) threads = (int)blocks;

    partials_t single;
    partials_t* parts = &single;
    /* one per thread, on the heap: they hold 2 KB of counts each */
    if (threads > 1 && !(parts = malloc(sizeof(partials_t) * (size_t)threads))) {
        parts = &single;
        threads = 1;
    }
    partials_t* total = &parts[0];
    if (threads == 1) {
        partials_init(total);
        range_partials(data, dtype, 0, n, shift, with_histogram, total);
    } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
        {
            int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
            /* contiguous runs of whole blocks, the same for the same thread count */
            int64_t begin = blocks * t / count * BLOCK, end = blocks * (t + 1) / count * BLOCK;
            partials_init(&parts[t]);
            range_partials(data, dtype, begin, end < n ? end : n, shift, with_histogram, &parts[t]);
#pragma omp single
            threads = (int)count;
        }
#else
        partials_init(total);
        range_partials(data, dtype, 0, n, shift, with_histogram, total);
        threads = 1;
#endif
        for (int t = 1; t < threads; t++) {  /* in thread order: the same sums every time */
            partials_t* p = &parts[t];
            total->sum += p->sum;
            total->squares += p->squares;
            total->lo = p->lo < total->lo ? p->lo : total->lo;
            total->hi = p->hi > total->hi ? p->hi : total->hi;
            total->zeros += p->zeros;
            total->nans += p->nans;
            total->nonfinite += p->nonfinite;
            total->pos += p->pos;
            for (int slot = 0; slot < SLOTS; slot++) total->hist[slot] += p->hist[slot];
        }
    }

    int64_t count = n - total->nonfinite;
    double count_f = count > 0 ? (double)count : 1.0;
    double m2 = total->squares - total->sum * total->sum / count_f;
    row[NUMEL] = (double)n;
    row[COUNT] = (double)count;
    row[MEAN] = shift + total->sum / count_f;
    row[M2] = m2 > 0.0 ? m2 : 0.0;
    row[MIN] = total->lo;
    row[MAX] = total->hi;
    row[ZEROS] = (double)total->zeros;
    row[NANS] = (double)total->nans;
    row[INFS] = (double)(total->nonfinite - total->nans);
    row[NEG] = (double)(n - total->zeros - total->nans - total->pos); /* NaN is neither */
    row[POS] = (double)total->pos;
    if (with_histogram)
        for (int slot = 0; slot < SLOTS; slot++) hist[slot] = (double)total->hist[slot];
    if (parts != &single) free(parts);
    return 0;
}

/* Minimum and maximum of values [begin, end) into lo and hi; returns whether one is NaN. */
static int range_extremes(const void* data, int dtype, int64_t begin, int64_t end, float* lo,
                          float* hi) {
    float widened[BLOCK];
    float low = INFINITY, high = -INFINITY;
    int any_nan = 0;
    for (int64_t start = begin; start < end; start += BLOCK) {
        int64_t n = end - start < BLOCK ? end - start : BLOCK;
        const float* x = block_floats(data, dtype, start, n, widened);
        int32_t nans = 0; /* per block: a count over the whole range could overflow */
#pragma omp simd reduction(min : low) reduction(max : high) reduction(+ : nans)
        for (int64_t i = 0; i < n; i++) {
            low = x[i] < low ? x[i] : low; /* a NaN compares false: counted apart */
            high = x[i] > high ? x[i] : high;
            nans += x[i] != x[i];
        }
        any_nan |= nans > 0;
    }
    *lo = low;
    *hi = high;
    return any_nan;
}

/* The sentinel's reading of n > 0 values: out[0] = minimum, out[1] = maximum, both NaN if one
 * value is, as torch.aminmax gives them. Returns 0, or -1 for an unknown dtype. */
int layerscope_extremes(const void* data, int64_t n, int dtype, double* out, int threads) {
    if (dtype != DTYPE_FLOAT32 && dtype != DTYPE_BFLOAT16) return -1;
    float lo = INFINITY, hi = -INFINITY;
    int nan = 0;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads < 1 || n < PARALLEL_MIN) threads = 1;
    if (threads == 1) {
        nan = range_extremes(data, dtype, 0, n, &lo, &hi);
    } else {
        int64_t blocks = (n + BLOCK - 1) / BLOCK;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(min : lo) reduction(max : hi) reduction(| : nan)
        {
            int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
            int64_t begin = blocks * t / count * BLOCK, end = blocks * (t + 1) / count * BLOCK;
            float a = INFINITY, b = -INFINITY;
            if (begin < n) nan |= range_extremes(data, dtype, begin, end < n ? end : n, &a, &b);
            lo = a < lo ? a : lo;
            hi = b > hi ? b : hi;
        }
#else
        (void)blocks;
        nan = range_extremes(data, dtype, 0, n, &lo, &hi);
#endif
    }
    out[0] = nan ? NAN : (double)lo;
    out[1] = nan ? NAN : (double)hi;
    return 0;
}
