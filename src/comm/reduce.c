/*
 * Reduction kernels of the communicator: dst += src, and "sum P sources, store
 * to D destinations" (the direct algorithm's fused reduce-and-distribute).
 *
 * The loops are written with GCC/Clang vector extensions, 64 bytes (16 fp32,
 * 8 fp64, 16 bf16 widened to fp32) per vector, so that they vectorise at -O2
 * whatever the compiler's cost model says (GCC 12's -O2 model refuses loops
 * that need a scalar epilogue).  Loads and stores go through memcpy, so no
 * alignment is assumed, but the fp32 and fp64 loops first run scalar up to
 * the next 64-byte boundary of their first output (line_head): a block that
 * starts mid-line (a split of a count that is not a multiple of 16) would
 * otherwise make every vector load and store touch two cache lines.  At
 * mlp's 2.68 MB gradient, 2 ranks, direct (3 of its 5 chunks start mid-line):
 * 1.5x the time of an aligned 2.5 MiB before, 1.1x after (docs/results.md).  Every element is
 * summed in the same order by the head, the vector body and the scalar tail,
 * so results do not depend on alignment or on where a block boundary falls.
 *
 * bf16: inputs are widened to fp32 (exact), summed in fp32 in source order,
 * and the sum is rounded to bf16 once (round to nearest even; NaN stays a
 * quiet NaN), exactly as dp_bf16_from_f32().
 */
#include <string.h>

#include "comm_impl.h"

/* These vectors are passed and returned only between static inline functions of
 * this file, so the compiler's note that a 64-byte vector's calling convention differs
 * without AVX-512 (-Wpsabi) concerns no interface: on a CPU without AVX-512,
 * -march=native would turn it into a build error. */
#pragma GCC diagnostic ignored "-Wpsabi" /* (gcc and clang) */
typedef float v16f __attribute__((vector_size(64)));
typedef double v8d __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

static inline v16f ld_f32(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void st_f32(float *p, v16f v) { memcpy(p, &v, sizeof v); }
static inline v8d ld_f64(const double *p) {
    v8d v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void st_f64(double *p, v8d v) { memcpy(p, &v, sizeof v); }

/* 16 bf16 -> 16 fp32 (exact). */
static inline v16f ld_bf16(const uint16_t *p) {
    v16h h;
    memcpy(&h, p, sizeof h);
    v16u u = __builtin_convertvector(h, v16u) << 16;
    return (v16f)u;
}
/* 16 fp32 -> 16 bf16, round to nearest even, NaN -> quiet NaN. */
static inline void st_bf16(uint16_t *p, v16f f) {
    v16u u = (v16u)f;
    v16u rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    v16u quiet = (u >> 16) | 0x40u;
    v16u nan = (v16u)((v16i)((u & 0x7fffffffu) > 0x7f800000u));
    v16u r = (rounded & ~nan) | (quiet & nan);
    v16h h = __builtin_convertvector(r, v16h);
    memcpy(p, &h, sizeof h);
}

/* Elements of size esize from p to the next 64-byte boundary, at most n (0
 * when p is not aligned to its element: no boundary is reachable). */
static inline int64_t line_head(const void *p, size_t esize, int64_t n) {
    size_t mis = (size_t)((uintptr_t)p % 64);
    if (mis % esize) return 0;
    int64_t k = (int64_t)((64 - mis) % 64 / esize);
    return k < n ? k : n;
}

/* ---- dst += src ----------------------------------------------------------------- */

static void add_f32(float *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (int64_t h = line_head(dst, sizeof *dst, n); i < h; i++) dst[i] = dst[i] + src[i];
    for (; i + 32 <= n; i += 32) {
        v16f a0 = ld_f32(dst + i) + ld_f32(src + i);
        v16f a1 = ld_f32(dst + i + 16) + ld_f32(src + i + 16);
        st_f32(dst + i, a0);
        st_f32(dst + i + 16, a1);
    }
    for (; i < n; i++) dst[i] = dst[i] + src[i];
}

static void add_f64(double *dst, const double *src, int64_t n) {
    int64_t i = 0;
    for (int64_t h = line_head(dst, sizeof *dst, n); i < h; i++) dst[i] = dst[i] + src[i];
    for (; i + 16 <= n; i += 16) {
        v8d a0 = ld_f64(dst + i) + ld_f64(src + i);
        v8d a1 = ld_f64(dst + i + 8) + ld_f64(src + i + 8);
        st_f64(dst + i, a0);
        st_f64(dst + i + 8, a1);
    }
    for (; i < n; i++) dst[i] = dst[i] + src[i];
}

static void add_bf16(uint16_t *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) st_bf16(dst + i, ld_bf16(dst + i) + ld_bf16(src + i));
    for (; i < n; i++) dst[i] = dp_bf16_from_f32(dp_bf16_to_f32(dst[i]) + dp_bf16_to_f32(src[i]));
}

void dp__reduce_add(void *dst, const void *src, int64_t n, enum dp_dtype t) {
    switch (t) {
    case DP_DTYPE_F32: add_f32(dst, src, n); break;
    case DP_DTYPE_F64: add_f64(dst, src, n); break;
    case DP_DTYPE_BF16: add_bf16(dst, src, n); break;
    default: DP_ASSERT(!"unknown dtype");
    }
}

/* ---- s = sum of srcs, stored to every dst ------------------------------------------ */

#define MAXP 1024

static void sum_to_f32(char *const *dp, int nd, char *const *sp, int ns, size_t off, int64_t n) {
    float *dst[MAXP];
    const float *src[MAXP];
    for (int j = 0; j < nd; j++) dst[j] = (float *)(dp[j] + off);
    for (int j = 0; j < ns; j++) src[j] = (const float *)(sp[j] + off);
    int64_t i = 0;
    for (int64_t h = line_head(nd ? (const void *)dst[0] : (const void *)src[0], sizeof(float), n); i < h; i++) {
        float s = src[0][i];
        for (int j = 1; j < ns; j++) s += src[j][i];
        for (int j = 0; j < nd; j++) dst[j][i] = s;
    }
    if (ns == 2 && nd == 2) { /* P = 2 all-reduce: the hot case, one pass, no inner loops */
        const float *a = src[0], *b = src[1];
        float *x = dst[0], *y = dst[1];
        for (; i + 32 <= n; i += 32) {
            v16f s0 = ld_f32(a + i) + ld_f32(b + i);
            v16f s1 = ld_f32(a + i + 16) + ld_f32(b + i + 16);
            st_f32(x + i, s0), st_f32(x + i + 16, s1);
            st_f32(y + i, s0), st_f32(y + i + 16, s1);
        }
    }
    for (; i + 16 <= n; i += 16) {
        v16f s = ld_f32(src[0] + i);
        for (int j = 1; j < ns; j++) s += ld_f32(src[j] + i);
        for (int j = 0; j < nd; j++) st_f32(dst[j] + i, s);
    }
    for (; i < n; i++) {
        float s = src[0][i];
        for (int j = 1; j < ns; j++) s += src[j][i];
        for (int j = 0; j < nd; j++) dst[j][i] = s;
    }
}

static void sum_to_f64(char *const *dp, int nd, char *const *sp, int ns, size_t off, int64_t n) {
    double *dst[MAXP];
    const double *src[MAXP];
    for (int j = 0; j < nd; j++) dst[j] = (double *)(dp[j] + off);
    for (int j = 0; j < ns; j++) src[j] = (const double *)(sp[j] + off);
    int64_t i = 0;
    for (int64_t h = line_head(nd ? (const void *)dst[0] : (const void *)src[0], sizeof(double), n); i < h; i++) {
        double s = src[0][i];
        for (int j = 1; j < ns; j++) s += src[j][i];
        for (int j = 0; j < nd; j++) dst[j][i] = s;
    }
    for (; i + 8 <= n; i += 8) {
        v8d s = ld_f64(src[0] + i);
        for (int j = 1; j < ns; j++) s += ld_f64(src[j] + i);
        for (int j = 0; j < nd; j++) st_f64(dst[j] + i, s);
    }
    for (; i < n; i++) {
        double s = src[0][i];
        for (int j = 1; j < ns; j++) s += src[j][i];
        for (int j = 0; j < nd; j++) dst[j][i] = s;
    }
}

static void sum_to_bf16(char *const *dp, int nd, char *const *sp, int ns, size_t off, int64_t n) {
    uint16_t *dst[MAXP];
    const uint16_t *src[MAXP];
    for (int j = 0; j < nd; j++) dst[j] = (uint16_t *)(dp[j] + off);
    for (int j = 0; j < ns; j++) src[j] = (const uint16_t *)(sp[j] + off);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v16f s = ld_bf16(src[0] + i);
        for (int j = 1; j < ns; j++) s += ld_bf16(src[j] + i);
        for (int j = 0; j < nd; j++) st_bf16(dst[j] + i, s);
    }
    for (; i < n; i++) {
        float s = dp_bf16_to_f32(src[0][i]);
        for (int j = 1; j < ns; j++) s += dp_bf16_to_f32(src[j][i]);
        uint16_t h = dp_bf16_from_f32(s);
        for (int j = 0; j < nd; j++) dst[j][i] = h;
    }
}

void dp__reduce_sum_to(char *const *dst, int ndst, char *const *src, int nsrc, size_t off,
                       int64_t n, enum dp_dtype t) {
    DP_ASSERT(nsrc >= 1 && nsrc <= MAXP && ndst >= 0 && ndst <= MAXP);
    switch (t) {
    case DP_DTYPE_F32: sum_to_f32(dst, ndst, src, nsrc, off, n); break;
    case DP_DTYPE_F64: sum_to_f64(dst, ndst, src, nsrc, off, n); break;
    case DP_DTYPE_BF16: sum_to_bf16(dst, ndst, src, nsrc, off, n); break;
    default: DP_ASSERT(!"unknown dtype");
    }
}
