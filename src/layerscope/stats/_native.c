/* The partials of a float32, bfloat16, float16 or 8-bit float tensor on the CPU, in one pass.
 *
 * setup.py builds this file into libnative.so when layerscope is installed (or, opted into with
 * LAYERSCOPE_BUILD_NATIVE=1, _native.py builds it at first use), and _native.py loads it with
 * ctypes. It computes exactly what _partials.py computes with torch ops, the row of Field values
 * and the log2 (split by sign where asked) or linear histogram, but reads memory once: the data
 * is cut into blocks that stay in L1 cache, and each block is read by a vectorised pass of
 * counts and extremes (a second, masked one only where a block holds a NaN or an infinity), a
 * float64 pass of sums, and a pass of histogram counts (vectorised with AVX2 or AVX-512 where
 * the block spans few exponents, the usual case). The low-precision formats' counts take a
 * short pass of compares only in the blocks whose extremes pass a format's limit, or none: with
 * the log2 histogram, three formats' underflow is a sum of its slots.
 *
 * One library serves every CPU of an architecture. The kernel is compiled once per instruction
 * set, each copy's functions carrying that set's target attribute (x86-64: the baseline, AVX2
 * and AVX-512; elsewhere plain C that the compiler vectorises, with NEON on arm64), and
 * layerscope_select picks the best one the CPU runs. To compile one body several times the file
 * includes itself, as Highway's foreach_target.h does: the first reading holds what the copies
 * share and the dispatch; each later reading, with LAYERSCOPE_ISA defined, one copy.
 *
 * No OpenMP runtime is linked: `#pragma omp simd` needs only -fopenmp-simd (without it the
 * pragmas are ignored and the loops are slower, not wrong). Threads are torch's own: _native.py
 * hands over its OpenMP runtime's GOMP_parallel, and threads take contiguous runs of blocks
 * whose results are merged in thread order, so a result never depends on timing. Built with
 * -ffp-contract=off, the copies round alike but for the sums of squares, fused where they can be
 * (SQUARE_ADD): counts, extremes and histograms do not depend on the instruction set.
 */

#ifndef LAYERSCOPE_ISA /* ======== first reading: the shared parts and the dispatch ======== */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__ /* gcc takes -ffp-contract=off only */
#pragma STDC FP_CONTRACT OFF
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define X86_VARIANTS
#include <immintrin.h>
#endif

#ifdef _WIN32
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define ALWAYS_INLINE __forceinline
#else
#define ALWAYS_INLINE inline
#endif

/* The sha256 of this file, which _native.py compares with the file beside the library. */
#ifndef LAYERSCOPE_SOURCE_ID
#define LAYERSCOPE_SOURCE_ID ""
#endif

/* The layout of a row, in order: stats/_layout.py's Field, which _native.py compares with
 * layerscope_fields() name by name at load. NAN and INF are math.h's: here NANS and INFS. */
#define LAYERSCOPE_FIELDS(X) \
    X(NUMEL) X(COUNT) X(MEAN) X(M2) X(MIN) X(MAX) X(ZEROS) X(NANS) X(INFS) X(NEG) X(POS) \
    X(E4M3_OVER) X(E4M3_UNDER) X(E5M2_OVER) X(E5M2_UNDER) X(FP16_OVER) X(FP16_UNDER) \
    X(BF16_OVER) X(BF16_UNDER)
#define FIELD_ENUM(name) name,
#define FIELD_WORD(name) " " #name
enum { LAYERSCOPE_FIELDS(FIELD_ENUM) WIDTH };
/* How values are stored: must match _native.DTYPES. DTYPE_BYTE reads one byte a value, decoded
 * to float32 bits by a table of 256 (the 8-bit floats). */
enum { DTYPE_FLOAT32 = 0, DTYPE_BFLOAT16 = 1, DTYPE_FLOAT16 = 2, DTYPE_BYTE = 3 };
/* One per float32 exponent. The signed log2 histogram has two halves of them: slot
 * sign * 256 + exponent, the top 9 bits of a float32, so +0.0 is in slot 0 and -0.0 in 256. */
enum { LOG2_SLOTS = 256 };
#define ABI (100 * WIDTH + 4)

#define BLOCK 1024           /* values per block: 4 KB of float32, in L1 */
#define CHUNK (64 * BLOCK)   /* values between two flushes of 32-bit histogram counts */
#define PARALLEL_MIN (1 << 16)
#define MAX_THREADS 64
#define TABLES 8             /* log2 histogram tables per thread, or half as many signed ones */
#define TABLES_OF(slots) (TABLES * LOG2_SLOTS / (slots)) /* in the same 8 KB */
#define MAX_LINEAR_BINS (1 << 30)

/* The low-precision formats of stats/_formats.py, in its order (e4m3, e5m2, fp16, bf16): the
 * float32 bits of each one's largest finite value and of its smallest subnormal. A value
 * overflows a format where its magnitude bits lie in (MAX, INF_BITS), flushes to zero in
 * (0, SMALLEST). The ranges nest: a format's limits lie beyond the one's before it. */
enum { FORMATS = 4 };
#define INF_BITS 0x7f800000u
static const uint32_t FORMAT_MAX[FORMATS] = {0x43e00000u, 0x47600000u, 0x477fe000u, 0x7f7f0000u};
static const uint32_t FORMAT_SMALLEST[FORMATS] = {0x3b000000u, 0x37800000u, 0x33800000u, 0x00010000u};
/* The first three formats' smallest subnormals are normal powers of two: a log2 histogram
 * slot's lower edge. Where the log2 histogram is counted, their underflow is the count of the
 * slots below, less the zeros (slot 0 holds both), and the blocks count bf16's alone. */
enum { UNDER_FROM_HISTOGRAM = 3 };

typedef struct {
    const void* data;
    int dtype;
    const uint32_t* decode; /* DTYPE_BYTE's table of float32 bits */
} values_t;

/* Which histogram: none, the log2 one, the log2 one split by sign (LOG2_SLOTS for values whose
 * sign bit is clear, then LOG2_SLOTS for those whose sign bit is set), or `bins` linear ones
 * over [lo, hi) with an underflow and an overflow slot. scale and width are bins / (hi - lo)
 * and (hi - lo) / bins, computed by the caller as _torch_kernels.linear_bin_index computes
 * them. */
enum { HIST_NONE, HIST_LOG2, HIST_SIGNED_LOG2, HIST_LINEAR };
typedef struct {
    int kind;
    int64_t bins;
    double lo, hi, scale, width;
} histogram_t;

typedef struct {
    double sum, squares;  /* of finite values minus the shift */
    float lo, hi;         /* finite extremes */
    int64_t zeros, nans, nonfinite, pos;
    int64_t over[FORMATS], under[FORMATS]; /* per format: values it cannot hold */
    int64_t* counts;      /* the histogram's slots; a linear one's last slot takes NaN */
} partials_t;

static void partials_init(partials_t* p, int64_t* counts, int64_t slots) {
    memset(p, 0, sizeof *p);
    p->lo = INFINITY;
    p->hi = -INFINITY;
    p->counts = counts;
    if (counts != NULL) memset(counts, 0, sizeof(int64_t) * (size_t)slots);
}

/* float16 bits as float32 bits, exactly. Integer steps and one subtraction of normal floats,
 * so a flush-to-zero mode (torch.set_flush_denormal) cannot change it. */
static inline uint32_t half_to_float_bits(uint16_t half) {
    uint32_t shifted = (uint32_t)(half & 0x7fffu) << 13; /* exponent and mantissa in place */
    uint32_t exponent = shifted & 0x0f800000u;
    uint32_t bits = shifted + ((127u - 15u) << 23);
    if (exponent == 0x0f800000u) { /* Inf and NaN: exponent 255 */
        bits += (128u - 16u) << 23;
    } else if (exponent == 0) { /* zero and subnormal: 2**-14 * 1.m, less 2**-14 */
        float value;
        bits += 1u << 23;
        memcpy(&value, &bits, sizeof value);
        value -= 0x1p-14f;
        memcpy(&bits, &value, sizeof bits);
    }
    return bits | (uint32_t)(half & 0x8000u) << 16;
}

/* The float32 bits of value i. */
static inline uint32_t value_bits(const values_t* v, int64_t i) {
    uint32_t bits;
    switch (v->dtype) {
    case DTYPE_BFLOAT16: return (uint32_t)((const uint16_t*)v->data)[i] << 16;
    case DTYPE_FLOAT16: return half_to_float_bits(((const uint16_t*)v->data)[i]);
    case DTYPE_BYTE: return v->decode[((const uint8_t*)v->data)[i]];
    default: memcpy(&bits, (const float*)v->data + i, sizeof bits); return bits;
    }
}

/* Floats as int32 in the same order: the bits, with a negative float's magnitude bits flipped.
 * With clang the extremes are taken over these: clang (14, Apple's) vectorises no float minimum
 * that must keep NaN's semantics, and integer ones vectorise everywhere. gcc vectorises the
 * float one, which costs it 4% less. -0 orders before +0, which no statistic tells apart. */
static inline int32_t order_key(uint32_t bits) {
    return (int32_t)(bits ^ ((uint32_t)((int32_t)bits >> 31) >> 1));
}

static inline float key_float(int32_t key) {
    uint32_t bits = (uint32_t)order_key((uint32_t)key); /* the flip undoes itself */
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

#ifdef __clang__
typedef int32_t extreme_t;
#define EXTREME(bits, value) order_key(bits)
#define EXTREME_FLOAT(e) key_float(e)
#define EXTREME_INF 0x7f800000           /* order_key of +inf */
#define EXTREME_MINUS_INF (-0x7f800001)  /* order_key of -inf */
#else
typedef float extreme_t;
#define EXTREME(bits, value) (value)
#define EXTREME_FLOAT(e) (e)
#define EXTREME_INF INFINITY
#define EXTREME_MINUS_INF (-INFINITY)
#endif

/* The copies of the kernel: the functions each instruction set has. */
typedef void range_partials_t(const values_t* v, int64_t begin, int64_t end, double shift,
                              const histogram_t* h, partials_t* p);
typedef int range_extremes_t(const values_t* v, int64_t begin, int64_t end, float* lo, float* hi);

#define NAME(f) NAME_(f, LAYERSCOPE_ISA)
#define NAME_(f, isa) NAME__(f, isa)
#define NAME__(f, isa) f##_##isa

#define LAYERSCOPE_ISA portable
#define ISA_LEVEL 0
#define ISA_TARGET
#include "_native.c"

#ifdef X86_VARIANTS
#define LAYERSCOPE_ISA avx2
#define ISA_LEVEL 1
#define ISA_TARGET __attribute__((target("avx2,fma")))
#include "_native.c"

/* 512-bit vectors for the loops the compiler vectorises: about 10% faster than the 256 that
 * gcc prefers for some CPUs that have them. */
#define LAYERSCOPE_ISA avx512
#define ISA_LEVEL 2
#if defined(__clang__)
#define ISA_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"), min_vector_width(512)))
#elif __GNUC__ >= 8
#define ISA_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,prefer-vector-width=512")))
#else
#define ISA_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#endif
#include "_native.c"
#endif

typedef struct {
    const char* name;
    range_partials_t* range_partials;
    range_extremes_t* range_extremes;
} kernel_t;

static const kernel_t KERNELS[] = {
    {"portable", range_partials_portable, range_extremes_portable},
#ifdef X86_VARIANTS
    {"avx2", range_partials_avx2, range_extremes_avx2},
    {"avx512", range_partials_avx512, range_extremes_avx512},
#endif
};

/* The most capable copy this CPU runs (the checks include the system's support for the wider
 * registers). */
static int supported_level(void) {
#ifdef X86_VARIANTS
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return 2;
    if (avx2) return 1;
#endif
    return 0;
}

static const kernel_t* kernel = &KERNELS[0];

/* Use the copy of `level` (0 portable, 1 AVX2, 2 AVX-512), or the best one for a level < 0 or
 * beyond what the CPU runs. Returns the level in use. */
EXPORT int layerscope_select(int level) {
    int best = supported_level();
    if (level < 0 || level > best) level = best;
    kernel = &KERNELS[level];
    return level;
}

EXPORT const char* layerscope_isa(void) { return kernel->name; }
EXPORT int layerscope_abi(void) { return ABI; }
EXPORT const char* layerscope_fields(void) { return LAYERSCOPE_FIELDS(FIELD_WORD) + 1; }
EXPORT const char* layerscope_source_id(void) { return LAYERSCOPE_SOURCE_ID; }

/* Torch's OpenMP runtime, as _native.py finds it; NULL: one thread. */
typedef void parallel_t(void (*)(void*), void*, unsigned, unsigned);
static parallel_t* run_parallel;
static int (*thread_number)(void);
static int (*team_size)(void);

EXPORT void layerscope_use_threads(void* parallel, void* number, void* size) {
    run_parallel = (parallel_t*)parallel;
    thread_number = (int (*)(void))number;
    team_size = (int (*)(void))size;
}

/* How many threads for n values, given torch's thread count. */
static int thread_count(int64_t n, int threads) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
    if (run_parallel == NULL || threads < 1 || n < PARALLEL_MIN) return 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    return threads > blocks ? (int)blocks : threads;
}

/* Thread t of count takes this run of whole blocks, the same for the same count. */
static void thread_range(int64_t n, int64_t t, int64_t count, int64_t* begin, int64_t* end) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
    *begin = blocks * t / count * BLOCK;
    *end = blocks * (t + 1) / count * BLOCK;
    if (*end > n) *end = n;
}

/* The first finite value, or 0 if there is none: the shift of the sums. */
static double first_finite(const values_t* v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = value_bits(v, i);
        if ((bits & 0x7fffffffu) < 0x7f800000u) {
            float value;
            memcpy(&value, &bits, sizeof value);
            return (double)value;
        }
    }
    return 0.0;
}

typedef struct {
    const values_t* values;
    int64_t n;
    double shift;
    const histogram_t* histogram;
    partials_t* parts;
    int64_t* counts; /* slots per thread, one run after another */
    int64_t slots;
    int threads, team;
} partials_job_t;

static void partials_part(void* arg) {
    partials_job_t* job = arg;
    int t = thread_number(), count = team_size();
    if (t == 0) job->team = count;
    if (count > job->threads) return; /* cannot happen: GOMP_parallel gives at most threads */
    int64_t begin, end;
    thread_range(job->n, t, count, &begin, &end);
    partials_t* p = &job->parts[t];
    partials_init(p, job->counts ? job->counts + t * job->slots : NULL, job->slots);
    kernel->range_partials(job->values, begin, end, job->shift, job->histogram, p);
}

/* Partials of n > 0 values into row[WIDTH] and, unless it is NULL, the histogram into hist
 * (float64 counts: LOG2_SLOTS, twice that split by sign, or a linear one's bins + 2). Returns
 * 0, or -1 for bad arguments, -2 where memory ran out. */
static int partials(const values_t* v, int64_t n, double* row, double* hist,
                    const histogram_t* h, int threads) {
    if (v->dtype < DTYPE_FLOAT32 || v->dtype > DTYPE_BYTE || (v->dtype == DTYPE_BYTE && !v->decode))
        return -1;
    if (h->kind == HIST_LINEAR && (h->bins < 1 || h->bins > MAX_LINEAR_BINS)) return -1;
    int64_t slots = h->kind == HIST_LOG2          ? LOG2_SLOTS
                    : h->kind == HIST_SIGNED_LOG2 ? 2 * LOG2_SLOTS
                    : h->kind == HIST_LINEAR      ? h->bins + 3
                                                  : 0;
    threads = thread_count(n, threads);

    partials_t single;
    int64_t single_counts[2 * LOG2_SLOTS];
    partials_job_t job = {v, n, first_finite(v, n), h, &single, NULL, slots, threads, 1};
    if (slots > 0) job.counts = single_counts;
    if (threads > 1 || slots > 2 * LOG2_SLOTS) {
        job.parts = malloc(sizeof(partials_t) * (size_t)threads);
        job.counts = slots ? malloc(sizeof(int64_t) * (size_t)(slots * threads)) : NULL;
        if (job.parts == NULL || (slots && job.counts == NULL)) {
            free(job.parts);
            free(job.counts);
            return -2;
        }
    }
    if (threads > 1) {
        run_parallel(partials_part, &job, (unsigned)threads, 0);
    } else {
        partials_init(job.parts, job.counts, slots);
        kernel->range_partials(v, 0, n, job.shift, h, job.parts);
    }

    partials_t* total = &job.parts[0];
    for (int t = 1; t < job.team; t++) { /* in thread order: the same sums every time */
        partials_t* p = &job.parts[t];
        total->sum += p->sum;
        total->squares += p->squares;
        total->lo = p->lo < total->lo ? p->lo : total->lo;
        total->hi = p->hi > total->hi ? p->hi : total->hi;
        total->zeros += p->zeros;
        total->nans += p->nans;
        total->nonfinite += p->nonfinite;
        total->pos += p->pos;
        for (int f = 0; f < FORMATS; f++) {
            total->over[f] += p->over[f];
            total->under[f] += p->under[f];
        }
        for (int64_t slot = 0; slot < slots; slot++) total->counts[slot] += p->counts[slot];
    }

    if (h->kind == HIST_LOG2 || h->kind == HIST_SIGNED_LOG2)
        for (int f = 0; f < UNDER_FROM_HISTOGRAM; f++) {
            int64_t below = 0;
            for (uint32_t slot = 0; slot < FORMAT_SMALLEST[f] >> 23; slot++) {
                below += total->counts[slot];
                if (h->kind == HIST_SIGNED_LOG2) below += total->counts[LOG2_SLOTS + slot];
            }
            total->under[f] = below - total->zeros;
        }

    int64_t count = n - total->nonfinite;
    double count_f = count > 0 ? (double)count : 1.0;
    double m2 = total->squares - total->sum * total->sum / count_f;
    row[NUMEL] = (double)n;
    row[COUNT] = (double)count;
    row[MEAN] = job.shift + total->sum / count_f;
    row[M2] = m2 > 0.0 ? m2 : 0.0;
    row[MIN] = total->lo;
    row[MAX] = total->hi;
    row[ZEROS] = (double)total->zeros;
    row[NANS] = (double)total->nans;
    row[INFS] = (double)(total->nonfinite - total->nans);
    row[NEG] = (double)(n - total->zeros - total->nans - total->pos); /* NaN is neither */
    row[POS] = (double)total->pos;
    for (int f = 0; f < FORMATS; f++) { /* each format's over, then under, from E4M3_OVER */
        row[E4M3_OVER + 2 * f] = (double)total->over[f];
        row[E4M3_UNDER + 2 * f] = (double)total->under[f];
    }
    if (hist != NULL && slots > 0) { /* a linear histogram's NaN slot is left out */
        int64_t written = h->kind == HIST_LINEAR ? slots - 1 : slots;
        for (int64_t slot = 0; slot < written; slot++) hist[slot] = (double)total->counts[slot];
    }
    if (job.parts != &single) {
        free(job.parts);
        free(job.counts);
    }
    return 0;
}

/* Partials and, unless hist is NULL, the log2 histogram, split by sign where split_signs is
 * nonzero: see partials(). */
EXPORT int layerscope_partials(const void* data, int64_t n, int dtype, const uint32_t* decode,
                               double* row, double* hist, int split_signs, int threads) {
    values_t v = {data, dtype, decode};
    int kind = hist == NULL ? HIST_NONE : split_signs ? HIST_SIGNED_LOG2 : HIST_LOG2;
    histogram_t h = {kind, 0, 0.0, 0.0, 0.0, 0.0};
    return partials(&v, n, row, hist, &h, threads);
}

/* Partials and the linear histogram of `bins` bins over [lo, hi): see partials(). */
EXPORT int layerscope_partials_linear(const void* data, int64_t n, int dtype,
                                      const uint32_t* decode, double* row, double* hist,
                                      double lo, double hi, double scale, double width,
                                      int64_t bins, int threads) {
    values_t v = {data, dtype, decode};
    histogram_t h = {HIST_LINEAR, bins, lo, hi, scale, width};
    return partials(&v, n, row, hist, &h, threads);
}

typedef struct {
    const values_t* values;
    int64_t n;
    float lo[MAX_THREADS], hi[MAX_THREADS];
    int nan[MAX_THREADS];
    int team;
} extremes_job_t;

static void extremes_part(void* arg) {
    extremes_job_t* job = arg;
    int t = thread_number(), count = team_size();
    if (t == 0) job->team = count;
    if (count > MAX_THREADS) return;
    int64_t begin, end;
    thread_range(job->n, t, count, &begin, &end);
    job->lo[t] = INFINITY;
    job->hi[t] = -INFINITY;
    job->nan[t] = begin < end && kernel->range_extremes(job->values, begin, end, &job->lo[t], &job->hi[t]);
}

/* The sentinel's reading of n > 0 values: out[0] = minimum, out[1] = maximum, both NaN if one
 * value is, as torch.aminmax gives them. Returns 0, or -1 for an unknown dtype. */
EXPORT int layerscope_extremes(const void* data, int64_t n, int dtype, const uint32_t* decode,
                               double* out, int threads) {
    if (dtype < DTYPE_FLOAT32 || dtype > DTYPE_BYTE || (dtype == DTYPE_BYTE && !decode)) return -1;
    values_t v = {data, dtype, decode};
    extremes_job_t job;
    job.values = &v;
    job.n = n;
    job.team = 1;
    threads = thread_count(n, threads);
    if (threads > 1) {
        run_parallel(extremes_part, &job, (unsigned)threads, 0);
    } else {
        job.nan[0] = kernel->range_extremes(&v, 0, n, &job.lo[0], &job.hi[0]);
    }
    float lo = job.lo[0], hi = job.hi[0];
    int nan = job.nan[0];
    for (int t = 1; t < job.team; t++) {
        lo = job.lo[t] < lo ? job.lo[t] : lo;
        hi = job.hi[t] > hi ? job.hi[t] : hi;
        nan |= job.nan[t];
    }
    out[0] = nan ? NAN : (double)lo;
    out[1] = nan ? NAN : (double)hi;
    return 0;
}

#else /* ======== a later reading: one copy of the kernel, for LAYERSCOPE_ISA ======== */

/* s + d * d, fused where the instruction set has it: 4 to 7% faster with gcc. Contraction is
 * off, so it is fused here only; the copies' sums of squares may then differ in the last bit.
 * Not with clang, which vectorises no reduction through fma(). */
#if (ISA_LEVEL >= 1 || defined(__FP_FAST_FMA)) && !defined(__clang__)
#define SQUARE_ADD(d, s) fma((d), (d), (s))
#else
#define SQUARE_ADD(d, s) ((s) + (d) * (d))
#endif

/* How many of the n values' magnitude bits lie in [low, high): one unsigned compare each. */
static inline ISA_TARGET int32_t NAME(count_range)(const uint32_t* bits, int64_t n, uint32_t low,
                                                   uint32_t high) {
    const uint32_t span = high - low;
    int32_t count = 0;
#pragma omp simd reduction(+ : count)
    for (int64_t i = 0; i < n; i++) count += (int32_t)((bits[i] & 0x7fffffffu) - low < span);
    return count;
}

/* Counts and extremes of one block; sums of the finite values' distance from the shift. The
 * underflow of the formats from `first_under` on (0, or UNDER_FROM_HISTOGRAM with a log2
 * histogram). */
static inline ISA_TARGET void NAME(block_moments)(const float* x, int64_t n, double shift,
                                                  int first_under, partials_t* p) {
    const uint32_t* bits = (const uint32_t*)x;
    extreme_t lo = EXTREME_INF, hi = EXTREME_MINUS_INF;
    int32_t zeros = 0, nans = 0, nonfinite = 0, pos = 0;
    uint32_t top = 0; /* the largest magnitude's bits: 0x7f800000 or more if one is not finite */
    uint32_t bottom = 0xffffffffu; /* the smallest nonzero magnitude's bits, less one */
    /* The usual block, all finite, needs no masking: half the work of the loop below. */
#pragma omp simd reduction(+ : zeros, pos) reduction(min : lo, bottom) reduction(max : hi, top)
    for (int64_t i = 0; i < n; i++) {
        uint32_t magnitude = bits[i] & 0x7fffffffu;
        extreme_t key = EXTREME(bits[i], x[i]);
        top = magnitude > top ? magnitude : top;
        bottom = magnitude - 1u < bottom ? magnitude - 1u : bottom; /* zero wraps to the top */
        lo = key < lo ? key : lo;
        hi = key > hi ? key : hi;
        zeros += magnitude == 0;
        pos += bits[i] - 1u < 0x7f800000u; /* sign clear, not zero, at most +inf */
    }
    if (top >= 0x7f800000u) { /* a NaN or an infinity: count again, leaving them out */
        lo = EXTREME_INF, hi = EXTREME_MINUS_INF;
        zeros = pos = 0;
#pragma omp simd reduction(+ : zeros, nans, nonfinite, pos) reduction(min : lo) reduction(max : hi)
        for (int64_t i = 0; i < n; i++) {
            uint32_t magnitude = bits[i] & 0x7fffffffu;
            int32_t finite = magnitude < 0x7f800000u;
            extreme_t key = EXTREME(bits[i], x[i]);
            extreme_t low = finite ? key : EXTREME_INF, high = finite ? key : EXTREME_MINUS_INF;
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
            squares = SQUARE_ADD(d, squares);
        }
    } else {
#pragma omp simd reduction(+ : sum, squares)
        for (int64_t i = 0; i < n; i++) {
            double d = (bits[i] & 0x7fffffffu) < 0x7f800000u ? (double)x[i] - shift : 0.0;
            sum += d;
            squares = SQUARE_ADD(d, squares);
        }
    }
    p->sum += sum;
    p->squares += squares;
    float low = EXTREME_FLOAT(lo), high = EXTREME_FLOAT(hi);
    p->lo = low < p->lo ? low : p->lo;
    p->hi = high > p->hi ? high : p->hi;
    p->zeros += zeros;
    p->nans += nans;
    p->nonfinite += nonfinite;
    p->pos += pos;
    /* The formats' ranges nest, so the block's extremes say which formats lose a value in it:
     * only those are counted. Most blocks of weights and gradients fit e4m3's top, few
     * activations' pass fp16's; a gradient's smallest values pass e4m3's and e5m2's bottom. */
    for (int f = 0; f < FORMATS && top > FORMAT_MAX[f]; f++)
        p->over[f] += NAME(count_range)(bits, n, FORMAT_MAX[f] + 1u, INF_BITS);
    for (int f = first_under; f < FORMATS && bottom < FORMAT_SMALLEST[f] - 1u; f++)
        p->under[f] += NAME(count_range)(bits, n, 1u, FORMAT_SMALLEST[f]);
}

/* Log2 histogram counts of one block, spread over tables (TABLES_OF(slots)): runs of values
 * with the same exponent, the usual case, would otherwise wait on each other's increments.
 * mask 0xff counts exponents, 0x1ff sign and exponent (the signed histogram); the callers pass
 * it as a constant, so each inlined copy indexes as one with a fixed mask would. */
static inline ISA_TARGET void NAME(block_log2_scalar)(const float* x, int64_t n, uint32_t* tables,
                                                      uint32_t mask) {
    const uint32_t* bits = (const uint32_t*)x;
    const int slots = (int)mask + 1, spread = TABLES_OF(slots);
    int64_t i = 0;
    for (; i + TABLES <= n; i += TABLES)
        for (int t = 0; t < TABLES; t++)
            tables[t % spread * slots + ((bits[i + t] >> 23) & mask)]++;
    for (; i < n; i++) tables[(bits[i] >> 23) & mask]++;
}

/* A block's values span few exponents: in the models measured, 12 to 16 of the 254 normal
 * ones, at most 34. Counting each exponent present with byte compares, 32 or 64 values a
 * compare, then beats a table increment per value, which is bound by stores. Blocks spanning
 * more than VECTOR_SPAN exponents go scalar. Each instruction set gives three pieces: a
 * vector of exponent bytes, extraction of a block's exponents, and a count of one of them. */
#define VECTOR_SPAN 32

#if ISA_LEVEL == 2
#define VECTOR_LOG2
#define LANES 64
typedef __m512i NAME(bytes_t);
#define bytes_t NAME(bytes_t)
#define BYTES_ALL(v) _mm512_set1_epi8((char)(v))
#define BYTES_MIN _mm512_min_epu8
#define BYTES_MAX _mm512_max_epu8
#define BYTES_ADD _mm512_add_epi8
#define BYTES_SUB _mm512_sub_epi8
#define BYTES_STORE(p, v) _mm512_storeu_si512((p), (v))

static inline ISA_TARGET __m128i NAME(bytes_fold)(bytes_t v, __m128i (*fold)(__m128i, __m128i)) {
    __m256i a = _mm512_castsi512_si256(v), b = _mm512_extracti64x4_epi64(v, 1);
    __m128i c = fold(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    return fold(c, fold(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}

/* The exponent bytes of values x[0..64), in order; the shift leaves the sign in bit 8, which
 * the narrowing drops. */
static inline ISA_TARGET bytes_t NAME(exponent_bytes)(const float* x) {
    __m128i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = _mm512_cvtepi32_epi8(_mm512_srli_epi32(_mm512_loadu_si512(x + 16 * k), 23));
    __m512i e = _mm512_inserti32x4(_mm512_castsi128_si512(q[0]), q[1], 1);
    return _mm512_inserti32x4(_mm512_inserti32x4(e, q[2], 2), q[3], 3);
}

/* How many of the first `full` bytes of ex equal e: each lane counts at most BLOCK / 64. */
static inline ISA_TARGET uint32_t NAME(count_byte)(const uint8_t* ex, int64_t full, int e) {
    const __m512i key = BYTES_ALL(e), one = BYTES_ALL(1);
    __m512i counts = _mm512_setzero_si512();
    for (int64_t j = 0; j < full; j += LANES) {
        __mmask64 equal = _mm512_cmpeq_epi8_mask(_mm512_loadu_si512(ex + j), key);
        counts = _mm512_mask_add_epi8(counts, equal, counts, one);
    }
    return (uint32_t)_mm512_reduce_add_epi64(_mm512_sad_epu8(counts, _mm512_setzero_si512()));
}

#elif ISA_LEVEL == 1
#define VECTOR_LOG2
#define LANES 32
typedef __m256i NAME(bytes_t);
#define bytes_t NAME(bytes_t)
#define BYTES_ALL(v) _mm256_set1_epi8((char)(v))
#define BYTES_MIN _mm256_min_epu8
#define BYTES_MAX _mm256_max_epu8
#define BYTES_ADD _mm256_add_epi8
#define BYTES_SUB _mm256_sub_epi8
#define BYTES_STORE(p, v) _mm256_storeu_si256((__m256i*)(p), (v))

static inline ISA_TARGET __m128i NAME(bytes_fold)(bytes_t v, __m128i (*fold)(__m128i, __m128i)) {
    return fold(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

/* The exponent bytes of values x[0..32), in some order: the packs interleave 128-bit lanes,
 * which a count does not mind. */
static inline ISA_TARGET bytes_t NAME(exponent_bytes)(const float* x) {
    const __m256i low_byte = _mm256_set1_epi32(0xff);
    __m256i e[4];
    for (int k = 0; k < 4; k++)
        e[k] = _mm256_and_si256(_mm256_srli_epi32(_mm256_loadu_si256((const __m256i*)(x + 8 * k)), 23), low_byte);
    return _mm256_packus_epi16(_mm256_packus_epi32(e[0], e[1]), _mm256_packus_epi32(e[2], e[3]));
}

/* How many of the first `full` bytes of ex equal e: each lane counts at most BLOCK / 32. */
static inline ISA_TARGET uint32_t NAME(count_byte)(const uint8_t* ex, int64_t full, int e) {
    const __m256i key = BYTES_ALL(e);
    __m256i counts = _mm256_setzero_si256();
    for (int64_t j = 0; j < full; j += LANES)  /* a match is -1: subtracting it counts one */
        counts = _mm256_sub_epi8(counts, _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i*)(ex + j)), key));
    __m256i sums = _mm256_sad_epu8(counts, _mm256_setzero_si256());
    __m128i half = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
    return (uint32_t)(_mm_cvtsi128_si64(half) + _mm_extract_epi64(half, 1));
}
#endif

#ifdef VECTOR_LOG2
static ISA_TARGET __m128i NAME(min_epu8)(__m128i a, __m128i b) { return _mm_min_epu8(a, b); }
static ISA_TARGET __m128i NAME(max_epu8)(__m128i a, __m128i b) { return _mm_max_epu8(a, b); }

/* The smallest byte of 16. */
static inline ISA_TARGET int NAME(min_of)(__m128i b) {
    __m128i c = _mm_min_epu16(_mm_cvtepu8_epi16(b), _mm_cvtepu8_epi16(_mm_srli_si128(b, 8)));
    return _mm_extract_epi16(_mm_minpos_epu16(c), 0);
}

static inline ISA_TARGET int NAME(min_byte)(bytes_t v) {
    return NAME(min_of)(NAME(bytes_fold)(v, NAME(min_epu8)));
}
static inline ISA_TARGET int NAME(max_byte)(bytes_t v) {
    return 255 - NAME(min_of)(_mm_xor_si128(NAME(bytes_fold)(v, NAME(max_epu8)), _mm_set1_epi8(-1)));
}

/* A byte that no exponent of a block takes, given what block_log2_vector found in it: zeros,
 * specials (Inf and NaN), and normal exponents from first to last (none if first > last).
 * A block it counts spans at most VECTOR_SPAN exponents, so one is free. */
static inline ISA_TARGET int NAME(absent_byte)(int zero, int special, int first, int last) {
    if (!zero) return 0;
    if (!special) return 255;
    if (first > last) return 1;
    return first > 1 ? first - 1 : last + 1;
}

/* Move the count of exponent e among the bytes of `negative` to the negative half. */
static inline ISA_TARGET void NAME(move_negative)(const uint8_t* negative, int64_t full, int e,
                                                  uint32_t* table) {
    uint32_t count = NAME(count_byte)(negative, full, e);
    table[e] -= count;
    table[LOG2_SLOTS + e] += count;
}

/* The signed histogram's negative half of the first `full` values of a block, which
 * block_log2_vector has counted in the positive half of table (table[e]): the count of each
 * exponent among the values whose sign bit is set moves to table[LOG2_SLOTS + e]. Those
 * values' exponent bytes, the others' replaced by a byte no exponent of the block takes, are
 * counted as all the block's are. A block with no sign bit set (a ReLU's) costs one pass of
 * ORs; it comes first, apart: in one loop with the bytes, both ran a third slower. */
static ISA_TARGET void NAME(split_signs)(const uint32_t* bits, int64_t full, uint32_t* table,
                                         int zero, int special, int first, int last) {
    uint8_t negative[BLOCK];
    const uint8_t absent = (uint8_t)NAME(absent_byte)(zero, special, first, last);
    uint32_t signs = 0;
#pragma omp simd reduction(| : signs)
    for (int64_t i = 0; i < full; i++) signs |= bits[i];
    if (!(signs >> 31)) return;
#pragma omp simd
    for (int64_t i = 0; i < full; i++) {
        uint32_t sign = bits[i] >> 31;
        negative[i] = sign ? (uint8_t)(bits[i] >> 23) : absent; /* the cast drops the sign */
    }
    if (zero) NAME(move_negative)(negative, full, 0, table);
    if (special) NAME(move_negative)(negative, full, 255, table);
    for (int e = first; e <= last; e++) NAME(move_negative)(negative, full, e, table);
}

/* Log2 histogram counts of one block into table by exponent compares, split by sign into
 * table[LOG2_SLOTS + e] where split; 0 if its span is too wide (nothing is counted then),
 * else 1. */
static ISA_TARGET int NAME(block_log2_vector)(const float* x, int64_t n, uint32_t* table,
                                              int split) {
    uint8_t ex[BLOCK];
    int64_t full = n & ~(int64_t)(LANES - 1);
    if (full == 0) return 0;
    const bytes_t one = BYTES_ALL(1);
    bytes_t low = BYTES_ALL(255), high = BYTES_ALL(0);
    bytes_t normal_low = low, normal_high = high;
    for (int64_t i = 0; i < full; i += LANES) {
        bytes_t e = NAME(exponent_bytes)(x + i);
        BYTES_STORE(ex + i, e);
        low = BYTES_MIN(low, e);
        high = BYTES_MAX(high, e);
        /* minus and plus one wrap 0 and 255 past the normal exponents, 1 to 254 */
        normal_low = BYTES_MIN(normal_low, BYTES_SUB(e, one));
        normal_high = BYTES_MAX(normal_high, BYTES_ADD(e, one));
    }
    int first = NAME(min_byte)(normal_low) + 1, last = NAME(max_byte)(normal_high) - 1;
    int zero = NAME(min_byte)(low) == 0, special = NAME(max_byte)(high) == 255;
    int span = (first <= last ? last - first + 1 : 0) + zero + special;
    if (span > VECTOR_SPAN) return 0;
    if (zero) table[0] += NAME(count_byte)(ex, full, 0);
    if (special) table[255] += NAME(count_byte)(ex, full, 255);
    for (int e = first; e <= last; e++) table[e] += NAME(count_byte)(ex, full, e);
    const uint32_t* bits = (const uint32_t*)x;
    const uint32_t mask = split ? 0x1ffu : 0xffu;
    for (int64_t i = full; i < n; i++) table[(bits[i] >> 23) & mask]++;
    if (split) NAME(split_signs)(bits, full, table, zero, special, first, last);
    return 1;
}
#endif

/* Log2 histogram counts of one block into the chunk's tables, split by sign where split (half
 * as many tables then, of 2 * LOG2_SLOTS slots each). */
static inline ISA_TARGET void NAME(block_log2)(const float* x, int64_t n, uint32_t* tables,
                                               int split) {
#ifdef VECTOR_LOG2
    if (NAME(block_log2_vector)(x, n, tables, split)) return;
#endif
    if (split)
        NAME(block_log2_scalar)(x, n, tables, 0x1ffu);
    else
        NAME(block_log2_scalar)(x, n, tables, 0xffu);
}

/* Linear histogram counts of one block: each value's slot as _torch_kernels.linear_bin_index
 * computes it, in float64 and checked against the edges, then one increment a value. The
 * slots loop is written without branches, and converts no NaN, so that it vectorises. */
static inline ISA_TARGET void NAME(block_linear)(const float* x, int64_t n, const histogram_t* h,
                                                 int64_t* counts) {
    int32_t slots[BLOCK];
    const double lo = h->lo, hi = h->hi, scale = h->scale, width = h->width;
    const double bins = (double)h->bins;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        double value = (double)x[i];
        double position = floor((value - lo) * scale);
        position = position < -1.0 ? -1.0 : position;
        position = position > bins ? bins : position;
        double edge = position >= bins ? hi : lo + (position > 0.0 ? position : 0.0) * width;
        position -= (double)((position >= 0.0) & (value < edge));
        double next = position + 1.0;
        edge = next >= bins ? hi : lo + (next > 0.0 ? next : 0.0) * width;
        position += (double)((position < bins) & (value >= edge));
        position = value == value ? position : bins + 1.0; /* NaN: the slot left out */
        slots[i] = (int32_t)position + 1;
    }
    for (int64_t i = 0; i < n; i++) counts[slots[i]]++;
}

/* The n values from start as float32: in place, or widened into `widened`. */
static inline ISA_TARGET const float* NAME(block_floats)(const values_t* v, int64_t start,
                                                         int64_t n, float* widened) {
    uint32_t* wide = (uint32_t*)widened;
    if (v->dtype == DTYPE_FLOAT32) return (const float*)v->data + start;
    if (v->dtype == DTYPE_BFLOAT16) { /* float32's upper half */
        const uint16_t* half = (const uint16_t*)v->data + start;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) wide[i] = (uint32_t)half[i] << 16;
    } else if (v->dtype == DTYPE_FLOAT16) {
        const uint16_t* half = (const uint16_t*)v->data + start;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) wide[i] = half_to_float_bits(half[i]);
    } else {
        const uint8_t* bytes = (const uint8_t*)v->data + start;
        const uint32_t* decode = v->decode;
        for (int64_t i = 0; i < n; i++) wide[i] = decode[bytes[i]];
    }
    return widened;
}

/* Partials of values [begin, end) into p, the log2 histogram split by sign where split: a
 * constant in each of range_partials' two copies, so that the one without the split compiles
 * as the kernel did before it had one (measured: a shared copy ran 5 to 20% slower). */
static ALWAYS_INLINE ISA_TARGET void NAME(range_partials_of)(const values_t* v, int64_t begin,
                                                             int64_t end, double shift,
                                                             const histogram_t* h,
                                                             partials_t* out, int split) {
    float widened[BLOCK];
    uint32_t tables[TABLES * LOG2_SLOTS]; /* TABLES_OF(slots) tables of `slots` each */
    int log2 = h->kind == HIST_LOG2 || split;
    const int slots = split ? 2 * LOG2_SLOTS : LOG2_SLOTS;
    partials_t local = *out, *p = &local; /* threads' partials share cache lines: add up here */
    for (int64_t chunk = begin; chunk < end; chunk += CHUNK) {
        int64_t chunk_end = chunk + CHUNK < end ? chunk + CHUNK : end;
        if (log2) memset(tables, 0, sizeof tables);
        for (int64_t start = chunk; start < chunk_end; start += BLOCK) {
            int64_t n = chunk_end - start < BLOCK ? chunk_end - start : BLOCK;
            const float* x = NAME(block_floats)(v, start, n, widened);
            NAME(block_moments)(x, n, shift, log2 ? UNDER_FROM_HISTOGRAM : 0, p);
            if (log2)
                NAME(block_log2)(x, n, tables, split);
            else if (h->kind == HIST_LINEAR)
                NAME(block_linear)(x, n, h, p->counts);
        }
        if (log2)
            for (int t = 0; t < TABLES_OF(slots); t++)
                for (int slot = 0; slot < slots; slot++)
                    p->counts[slot] += tables[t * slots + slot];
    }
    *out = local;
}

/* Partials of values [begin, end) into p. */
static ISA_TARGET void NAME(range_partials)(const values_t* v, int64_t begin, int64_t end,
                                            double shift, const histogram_t* h, partials_t* out) {
    if (h->kind == HIST_SIGNED_LOG2)
        NAME(range_partials_of)(v, begin, end, shift, h, out, 1);
    else
        NAME(range_partials_of)(v, begin, end, shift, h, out, 0);
}

/* Minimum and maximum of values [begin, end) into lo and hi; returns whether one is NaN. */
static ISA_TARGET int NAME(range_extremes)(const values_t* v, int64_t begin, int64_t end,
                                           float* lo, float* hi) {
    float widened[BLOCK];
    extreme_t low = EXTREME_INF, high = EXTREME_MINUS_INF; /* NaN makes them moot */
    int any_nan = 0;
    for (int64_t start = begin; start < end; start += BLOCK) {
        int64_t n = end - start < BLOCK ? end - start : BLOCK;
        const float* x = NAME(block_floats)(v, start, n, widened);
        const uint32_t* bits = (const uint32_t*)x;
        int32_t nans = 0; /* per block: a count over the whole range could overflow */
#pragma omp simd reduction(min : low) reduction(max : high) reduction(+ : nans)
        for (int64_t i = 0; i < n; i++) {
            extreme_t key = EXTREME(bits[i], x[i]);
            low = key < low ? key : low;
            high = key > high ? key : high;
            nans += (bits[i] & 0x7fffffffu) > 0x7f800000u;
        }
        any_nan |= nans > 0;
    }
    *lo = EXTREME_FLOAT(low);
    *hi = EXTREME_FLOAT(high);
    return any_nan;
}

#undef SQUARE_ADD
#undef VECTOR_LOG2
#undef LANES
#undef bytes_t
#undef BYTES_ALL
#undef BYTES_MIN
#undef BYTES_MAX
#undef BYTES_ADD
#undef BYTES_SUB
#undef BYTES_STORE
#undef LAYERSCOPE_ISA
#undef ISA_LEVEL
#undef ISA_TARGET
#endif
