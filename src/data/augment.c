/* Data augmentation: random crop with zero padding and random horizontal
 * flip, keyed by (seed, global sample index, epoch).
 *
 * Every random choice comes from the counter-based RNG addressed as
 *
 *     dp_rng_u32(seed, DP_RNG_AUGMENT, sample_idx, epoch << 8 | what)
 *
 * with one `what` per decision, so the augmented version of sample i in epoch
 * e is the same whichever worker, batch position or prefetch thread produces
 * it.  That is what lets P workers reproduce one worker's run exactly.
 */
#include <string.h>

#include "dp/core.h"
#include "dp/data.h"

/* The decisions drawn per sample (the low 8 bits of the RNG counter b). */
enum {
    AUG_CROP_Y = 0, /* vertical crop offset */
    AUG_CROP_X = 1, /* horizontal crop offset */
    AUG_FLIP = 2,   /* flip or not */
};

static uint32_t draw(uint64_t seed, int64_t sample_idx, int64_t epoch, unsigned what) {
    return dp_rng_u32(seed, DP_RNG_AUGMENT, (uint64_t)sample_idx,
                      (uint64_t)epoch << 8 | (uint64_t)what);
}

/* An offset uniform in [-pad, pad].  The modulo bias is below 2^-20 for any
 * padding an image could use, which does not matter for augmentation. */
static int64_t draw_offset(uint64_t seed, int64_t sample_idx, int64_t epoch, unsigned what,
                           int pad) {
    uint32_t span = 2u * (uint32_t)pad + 1u;
    return (int64_t)(draw(seed, sample_idx, epoch, what) % span) - pad;
}

/* Writes the augmented sample src (C, H, W) to dst (C, H, W); the two must
 * not overlap.  With a == NULL or both options off, dst is a copy of src.
 *
 * Crop: conceptually pad src by crop_pad zeros on every side and cut an H x W
 * window at offset (pad + dy, pad + dx), dy and dx uniform in [-pad, pad]:
 * dst[c][i][j] = src[c][i + dy][j + dx], or 0 outside the image.  Flip: with
 * probability 1/2 the result is mirrored left-right.  Both choices are the
 * same for every channel of a sample. */
void dp_augment_sample(float *dst, const float *src, int64_t C, int64_t H, int64_t W,
                       const struct dp_augment *a, uint64_t seed, int64_t sample_idx,
                       int64_t epoch) {
    int pad = a && a->crop_pad > 0 ? a->crop_pad : 0;
    int flip_on = a && a->hflip;
    size_t plane = (size_t)(H * W);
    if (!pad && !flip_on) {
        memcpy(dst, src, (size_t)C * plane * sizeof(float));
        return;
    }
    int64_t dy = 0, dx = 0;
    if (pad) {
        dy = draw_offset(seed, sample_idx, epoch, AUG_CROP_Y, pad);
        dx = draw_offset(seed, sample_idx, epoch, AUG_CROP_X, pad);
    }
    int flip = flip_on && (draw(seed, sample_idx, epoch, AUG_FLIP) >> 31);

    /* Columns j of the output read source column j + dx; the valid range of
     * j is where that lies in [0, W).  Rows likewise with dy. */
    int64_t j0 = dx < 0 ? -dx : 0, j1 = dx > 0 ? W - dx : W;
    if (j0 > W) j0 = W;   /* offset beyond the image: the row is all zeros */
    if (j1 < j0) j1 = j0;
    for (int64_t c = 0; c < C; c++) {
        const float *s = src + (size_t)c * plane;
        float *d = dst + (size_t)c * plane;
        for (int64_t i = 0; i < H; i++) {
            float *drow = d + i * W;
            int64_t si = i + dy;
            if (si < 0 || si >= H) {
                memset(drow, 0, (size_t)W * sizeof(float));
                continue;
            }
            const float *srow = s + si * W;
            if (!flip) {
                for (int64_t j = 0; j < j0; j++) drow[j] = 0.0f;
                if (j1 > j0) memcpy(drow + j0, srow + j0 + dx, (size_t)(j1 - j0) * sizeof(float));
                for (int64_t j = j1; j < W; j++) drow[j] = 0.0f;
            } else {
                /* Mirrored: output column W-1-j holds what column j would. */
                for (int64_t j = 0; j < W; j++) {
                    int64_t sj = j + dx;
                    drow[W - 1 - j] = (sj >= 0 && sj < W) ? srow[sj] : 0.0f;
                }
            }
        }
    }
}
