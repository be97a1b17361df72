/* The partials of a float32 or bfloat16 tensor on the CPU, in one pass over its memory.
 *
 * layerscope builds this file with the system's C compiler the first time it needs it and
 * loads it with ctypes (see _native.py). It computes exactly what _partials.py computes with
 * torch ops, the row of Field values and the log2 histogram, but reads each value once: the
 * data is cut into blocks that stay in L1 cache, and each block is read by a vectorised pass
 * of counts and extremes, a float64 pass of sums, and a scalar pass of histogram counts.
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

/* The layout of a row: must match layerscope.stats.Field. */
enum { NUMEL, COUNT, MEAN, M2, MIN, MAX, ZEROS, NANS, INFS, NEG, POS, WIDTH };
enum { DTYPE_FLOAT32 = 0, DTYPE_BFLOAT16 = 1 };
enum { SLOTS = 256 };  /* one per float32 exponent */
#define ABI (100 * WIDTH + 1)

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
        pos += bits[i] - 1u < 0x7f800000u; /* sign clear, not zero, at most +inf */
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
static void block_histogram(const float* x, int64_t n, uint32_t (*tables)[SLOTS]) {
    const uint32_t* bits = (const uint32_t*)x;
    int64_t i = 0;
    for (; i + TABLES <= n; i += TABLES)
        for (int t = 0; t < TABLES; t++) tables[t][(bits[i + t] >> 23) & 0xff]++;
    for (; i < n; i++) tables[0][(bits[i] >> 23) & 0xff]++;
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
            const float* x;
            if (dtype == DTYPE_BFLOAT16) {  /* bfloat16 is float32's upper half */
                const uint16_t* half = (const uint16_t*)data + start;
                uint32_t* wide = (uint32_t*)widened;
#pragma omp simd
                for (int64_t i = 0; i < n; i++) wide[i] = (uint32_t)half[i] << 16;
                x = widened;
            } else {
                x = (const float*)data + start;
            }
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
