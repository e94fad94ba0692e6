/* Gradient compression's names and specs (--compress), and the pure encoders its schemes
 * use: fp16 conversion, the 3-bytes-per-word wire packing (compress.c's comment says why),
 * top-k selection, sign bits and Gram-Schmidt for PowerSGD. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/compress_impl.h"

/* ---- names and specs ---- */

static const char *const kind_names[DP_COMPRESS_COUNT] = {"none", "bf16", "fp16", "powersgd", "topk", "sign"};

const char *dp_compress_name(enum dp_compress k) {
    return (unsigned)k < DP_COMPRESS_COUNT ? kind_names[k] : "unknown";
}

int dp_compress_parse(const char *spec, struct dp_compress_params *p) {
    if (!spec || !spec[0])
        return dp_seterr(DP_EINVAL, "--compress: empty spec (expected none, bf16, fp16, powersgd:RANK, "
                         "topk:FRACTION or sign)");
    const char *colon = strchr(spec, ':');
    size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
    int kind = -1;
    for (int k = 0; k < DP_COMPRESS_COUNT; k++)
        if (strlen(kind_names[k]) == nlen && !strncmp(spec, kind_names[k], nlen)) kind = k;
    if (kind < 0)
        return dp_seterr(DP_EINVAL, "--compress: unknown scheme '%.*s' (expected none, bf16, fp16, "
                         "powersgd:RANK, topk:FRACTION or sign)", (int)nlen, spec);
    int needs = kind == DP_COMPRESS_POWERSGD || kind == DP_COMPRESS_TOPK;
    if (needs && !colon)
        return dp_seterr(DP_EINVAL, "--compress %s needs a value: %s", spec,
                         kind == DP_COMPRESS_TOPK ? "topk:FRACTION, 0 < FRACTION <= 1 (e.g. topk:0.01)"
                                                  : "powersgd:RANK, RANK >= 1 (e.g. powersgd:4)");
    if (!needs && colon) return dp_seterr(DP_EINVAL, "--compress %s takes no value (got '%s')", kind_names[kind], spec);
    if (kind == DP_COMPRESS_TOPK) {
        char *end;
        double f = strtod(colon + 1, &end);
        if (end == colon + 1 || *end || !(f > 0 && f <= 1))
            return dp_seterr(DP_EINVAL, "--compress topk:FRACTION needs 0 < FRACTION <= 1 (got '%s')", colon + 1);
        p->fraction = f;
    } else if (kind == DP_COMPRESS_POWERSGD) {
        char *end;
        long r = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || r < 1 || r > 1024)
            return dp_seterr(DP_EINVAL, "--compress powersgd:RANK needs an integer RANK in 1..1024 (got '%s')",
                             colon + 1);
        p->rank = (int)r;
    }
    p->kind = (enum dp_compress)kind;
    return DP_OK;
}

void dp_compress_format(const struct dp_compress_params *p, char *buf, size_t len) {
    if (p->kind == DP_COMPRESS_TOPK) snprintf(buf, len, "topk:%g", p->fraction);
    else if (p->kind == DP_COMPRESS_POWERSGD) snprintf(buf, len, "powersgd:%d", p->rank);
    else snprintf(buf, len, "%s", dp_compress_name(p->kind));
}

/* ---- pure helpers ---- */

uint16_t dp__f16_from_f32(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;   /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;  /* >= 65520 rounds to infinity */
    if (a < 0x38800000u) {                        /* below 2^-14: subnormal (units of 2^-24) */
        float v;
        memcpy(&v, &a, 4);
        return sign | (uint16_t)lrintf(v * 16777216.0f); /* exact scaling, rint = nearest even */
    }
    uint32_t r = a - (112u << 23); /* exponent bias 127 -> 15 */
    uint32_t h = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry into the exponent is right */
    return sign | (uint16_t)h;
}

float dp__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

size_t dp__wire_words(size_t bytes) { return (bytes + 2) / 3; }

void dp__wire_pack(const uint8_t *src, size_t bytes, float *words) {
    size_t full = bytes / 3, j;
    for (j = 0; j < full; j++)
        words[j] = (float)((uint32_t)src[3 * j] | (uint32_t)src[3 * j + 1] << 8 | (uint32_t)src[3 * j + 2] << 16);
    if (bytes % 3) {
        uint32_t u = 0;
        for (size_t k = 0; 3 * j + k < bytes; k++) u |= (uint32_t)src[3 * j + k] << (8 * k);
        words[j] = (float)u;
    }
}

void dp__wire_unpack(const float *words, size_t bytes, uint8_t *dst) {
    for (size_t j = 0; 3 * j < bytes; j++) {
        uint32_t u = (uint32_t)words[j];
        for (size_t k = 0; k < 3 && 3 * j + k < bytes; k++) dst[3 * j + k] = (uint8_t)(u >> (8 * k));
    }
}

static inline float topk_key(float v) { return isnan(v) ? INFINITY : fabsf(v); }

void dp__topk_select(const float *v, uint32_t *idx, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n;
    if (k <= 0 || k >= n) return;
    /* Invariant: idx[0..lo) hold keys >= every key in [lo, hi), and
     * idx[hi..n) keys <= them; the k-th boundary lies in [lo, hi]. */
    while (hi - lo > 1) {
        float a = topk_key(v[idx[lo]]), b = topk_key(v[idx[lo + (hi - lo) / 2]]), c = topk_key(v[idx[hi - 1]]);
        float pv = a < b ? (b < c ? b : a < c ? c : a) : (a < c ? a : b < c ? c : b); /* median of 3 */
        /* three-way partition of [lo, hi): > pv | == pv | < pv */
        int64_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            float x = topk_key(v[idx[i]]);
            uint32_t t;
            if (x > pv) t = idx[lt], idx[lt++] = idx[i], idx[i++] = t;
            else if (x < pv) t = idx[--gt], idx[gt] = idx[i], idx[i] = t;
            else i++;
        }
        if (k <= lt) hi = lt;
        else if (k >= gt) lo = gt;
        else return; /* the boundary falls among keys equal to pv */
    }
}

float dp__sign_scale(const float *p, int64_t n) {
    double l2 = 0;
    for (int64_t i = 0; i < n; i++) l2 += (double)p[i] * p[i];
    return n > 0 ? (float)sqrt(l2 / (double)n) : 0.0f;
}

void dp__sign_pack(const float *p, int64_t n, uint8_t *bits) {
    memset(bits, 0, (size_t)((n + 7) / 8));
    for (int64_t i = 0; i < n; i++) bits[i >> 3] |= (uint8_t)((p[i] < 0) << (i & 7));
}

void dp__gram_schmidt(float *P, int64_t n, int64_t r) {
    /* Modified Gram-Schmidt on the columns p_0..p_{r-1} (stride r):
     *     for j: for i < j: p_j -= (p_i . p_j) p_i;  p_j /= |p_j|
     * in double accumulation.  Every rank runs it on the same all-reduced P,
     * so every rank gets the same bits.  A column whose norm falls below
     * 1e-30 (P rank-deficient, e.g. a zero gradient) is zeroed: its
     * direction then contributes nothing to P Q^T. */
    for (int64_t j = 0; j < r; j++) {
        for (int pass = 0; pass < 2; pass++) /* twice: orthogonal to rounding even when P is ill-conditioned */
            for (int64_t i = 0; i < j; i++) {
                double d = 0;
                for (int64_t k = 0; k < n; k++) d += (double)P[k * r + i] * P[k * r + j];
                for (int64_t k = 0; k < n; k++) P[k * r + j] -= (float)(d * P[k * r + i]);
            }
        double s = 0;
        for (int64_t k = 0; k < n; k++) s += (double)P[k * r + j] * P[k * r + j];
        double inv = s > 1e-60 ? 1.0 / sqrt(s) : 0.0;
        for (int64_t k = 0; k < n; k++) P[k * r + j] = (float)(P[k * r + j] * inv);
    }
}
