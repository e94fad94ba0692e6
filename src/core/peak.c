/* The fp32 peak of one core, measured: the denominator of the CLI's MFU.
 *
 * A hard-coded peak is wrong on every CPU but the one it was read on (220
 * GFLOP/s was this project's first machine; an Intel Xeon of family 6 model
 * 207 measures 170-175 with AVX-512, AMD Zen 5 about 218).  So the peak is
 * measured once per process: a loop of independent FMAs on the widest vector
 * ISA the CPU and the OS support, timed, best of many short repetitions.
 *
 * Why the loop reaches the peak.  An FMA has a latency of 4-5 cycles and the
 * cores here issue two per cycle, so 8-10 independent chains keep both units
 * busy; the loop runs 12 accumulators (chains), each acc = acc * x + y, which
 * converges to y / (1 - x) and so never reaches an infinity or a denormal (a
 * denormal would cost a microcode assist on some cores).  Each iteration is
 * 12 FMAs of W lanes: 24 W FLOP; W = 16 (zmm) or 8 (ymm).
 *
 * Why the best of many.  The first repetitions run while the core ramps its
 * clock (turbo, and on Intel the AVX-512 licence); a repetition that the
 * scheduler interrupts is slow.  Neither makes a repetition faster than the
 * core can go, so the fastest one is the peak.  Repetitions of 32k iterations
 * (~60 us at 200 GFLOP/s) run until ~8 ms have passed: well within the 20 ms
 * the CLI can spend at start-up, and a hundred chances at an undisturbed one.
 *
 * The figure is single-threaded; with all cores busy a CPU may clock lower,
 * so peak x threads slightly overstates the machine and MFU errs low.
 *
 * The functions are compiled for their ISA with target attributes, so the
 * build does not depend on -march; __builtin_cpu_supports checks both the CPU
 * and that the OS saves the wider registers. */
#include <math.h>
#include <pthread.h>

#include "dp/core.h"

#define PEAK_CHAINS 12
#define PEAK_ITERS 32768     /* per repetition */
#define PEAK_BUDGET_S 0.008  /* stop starting repetitions after this long */
#define PEAK_MIN_REPS 5

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PEAK_X86 1

/* 12 chains of FMAs on zmm; returns the sum of the accumulators, so the
 * compiler cannot drop the loop. */
__attribute__((target("avx512f"))) static float fma_loop_avx512(int64_t iters) {
    const __m512 x = _mm512_set1_ps(0.9999f), y = _mm512_set1_ps(1e-4f);
    __m512 a[PEAK_CHAINS];
    for (int c = 0; c < PEAK_CHAINS; c++) a[c] = _mm512_set1_ps(0.01f * (float)c);
    for (int64_t i = 0; i < iters; i++) {
        a[0] = _mm512_fmadd_ps(a[0], x, y);
        a[1] = _mm512_fmadd_ps(a[1], x, y);
        a[2] = _mm512_fmadd_ps(a[2], x, y);
        a[3] = _mm512_fmadd_ps(a[3], x, y);
        a[4] = _mm512_fmadd_ps(a[4], x, y);
        a[5] = _mm512_fmadd_ps(a[5], x, y);
        a[6] = _mm512_fmadd_ps(a[6], x, y);
        a[7] = _mm512_fmadd_ps(a[7], x, y);
        a[8] = _mm512_fmadd_ps(a[8], x, y);
        a[9] = _mm512_fmadd_ps(a[9], x, y);
        a[10] = _mm512_fmadd_ps(a[10], x, y);
        a[11] = _mm512_fmadd_ps(a[11], x, y);
    }
    __m512 s = a[0];
    for (int c = 1; c < PEAK_CHAINS; c++) s = _mm512_add_ps(s, a[c]);
    return _mm512_reduce_add_ps(s);
}

/* The same on ymm with AVX2's FMA3. */
__attribute__((target("avx2,fma"))) static float fma_loop_avx2(int64_t iters) {
    const __m256 x = _mm256_set1_ps(0.9999f), y = _mm256_set1_ps(1e-4f);
    __m256 a[PEAK_CHAINS];
    for (int c = 0; c < PEAK_CHAINS; c++) a[c] = _mm256_set1_ps(0.01f * (float)c);
    for (int64_t i = 0; i < iters; i++) {
        a[0] = _mm256_fmadd_ps(a[0], x, y);
        a[1] = _mm256_fmadd_ps(a[1], x, y);
        a[2] = _mm256_fmadd_ps(a[2], x, y);
        a[3] = _mm256_fmadd_ps(a[3], x, y);
        a[4] = _mm256_fmadd_ps(a[4], x, y);
        a[5] = _mm256_fmadd_ps(a[5], x, y);
        a[6] = _mm256_fmadd_ps(a[6], x, y);
        a[7] = _mm256_fmadd_ps(a[7], x, y);
        a[8] = _mm256_fmadd_ps(a[8], x, y);
        a[9] = _mm256_fmadd_ps(a[9], x, y);
        a[10] = _mm256_fmadd_ps(a[10], x, y);
        a[11] = _mm256_fmadd_ps(a[11], x, y);
    }
    __m256 s = a[0];
    for (int c = 1; c < PEAK_CHAINS; c++) s = _mm256_add_ps(s, a[c]);
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}
#endif

static pthread_once_t peak_once = PTHREAD_ONCE_INIT;
static double peak_flops;    /* written once under peak_once, read after it */
static const char *peak_isa; /* NULL when not measured */

static void measure_peak(void) {
#ifdef PEAK_X86
    float (*loop)(int64_t);
    int lanes;
    const char *isa;
    if (__builtin_cpu_supports("avx512f")) loop = fma_loop_avx512, lanes = 16, isa = "avx512f";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        loop = fma_loop_avx2, lanes = 8, isa = "avx2+fma";
    else return;
    double best = INFINITY, start = dp_time();
    float check = 0;
    for (int rep = 0; rep < PEAK_MIN_REPS || dp_time() - start < PEAK_BUDGET_S; rep++) {
        double t0 = dp_time();
        check += loop(PEAK_ITERS);
        double dt = dp_time() - t0;
        if (dt < best) best = dt;
    }
    double flops = 2.0 * lanes * PEAK_CHAINS * (double)PEAK_ITERS / best;
    /* Each chain converges to y / (1 - x) = 1: the sum of lanes x 12 chains is
     * near lanes x 12 per repetition.  Anything else, or a rate outside what
     * a core can do, means the loop did not run as written: no figure. */
    if (!isfinite(check) || check <= 0 || !(best > 0) || !isfinite(flops) || flops < 1e8 ||
        flops > 1e13)
        return;
    peak_flops = flops;
    peak_isa = isa;
#endif
}

double dp_cpu_peak_flops(void) {
    pthread_once(&peak_once, measure_peak);
    return peak_flops;
}

const char *dp_cpu_peak_isa(void) {
    pthread_once(&peak_once, measure_peak);
    return peak_isa;
}
