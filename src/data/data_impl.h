/* src/data internals shared by its files: the cache folder (cache.c), where
 * text.c keeps the token file of a folder of text (`--data DIR`), csv.c
 * the arrays of a CSV file and images.c those of a folder of images; the
 * .npy header (npy.c); one image decoded (image.c).
 *
 * Every file in the cache is named after the path it was made from:
 *
 *     CACHE/NAME-P-K<suffix>     NAME the source's base name (for a person
 *                                listing the cache), P a 64-bit FNV-1a hash
 *                                of its absolute path (symlinks resolved),
 *                                K a hash of what the contents depend on
 *
 * "NAME-P-" (dp__cache_prefix) is then the same for every version of one
 * source, and a writer removes the other versions (another K) once it has
 * written its own (dp__cache_remove_others): the cache holds one file (or
 * set of files) per source. */
#ifndef DP_DATA_IMPL_H
#define DP_DATA_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dp/data.h"

/* Whether mtime a is strictly after b. */
static inline int dp__ts_after(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec != b->tv_sec ? a->tv_sec > b->tv_sec : a->tv_nsec > b->tv_nsec;
}

static inline int dp__ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* "NAME-P-" of the file or folder at path into prefix[0..cap): NAME its base
 * name with anything but letters, digits, '-', '_' and an inner '.' made '_'
 * (at most 48 characters; "root" for /), P the hash of its realpath as 16
 * hex digits.  DP_EIO "WHAT: PATH: ..." when realpath fails, DP_EINVAL when
 * cap is too small (66 bytes always do). */
int dp__cache_prefix(const char *what, const char *path, char *prefix, size_t cap);
/* The newest (by mtime) of the files in cache named prefix*suffix, other
 * than the one named own (a base name), into path[0..cap): 1 when there is
 * one, 0 when there is none (or cache cannot be listed). */
int dp__cache_newest_other(const char *cache, const char *prefix, const char *suffix, const char *own,
                           char *path, size_t cap);
/* Removes the files in cache named prefix*suffix other than own (best
 * effort: one that cannot be removed stays). */
void dp__cache_remove_others(const char *cache, const char *prefix, const char *suffix, const char *own);

/* The .npy header (version 1.0) of an array of dtype (float32, int64 or
 * uint8) and shape[0..ndim) into pre[0..cap): the dict padded with spaces
 * and a '\n' to the next multiple of 64 bytes, or to min_total bytes
 * (rounded up to 64) when that is more, so that a writer can reserve the
 * room of a larger shape and write a smaller one over it later (images.c).
 * Returns its length, or 0 with the message set (DP_EINVAL: another dtype,
 * a bad shape, cap too small; DP__NPY_HEADER_MAX bytes always do). */
#define DP__NPY_HEADER_MAX 640
size_t dp__npy_header(const char *path, enum dp_npy_dtype dtype, int ndim, const int64_t *shape,
                      size_t min_total, uint8_t *pre, size_t cap);

/* One image in f, PNG or JPEG by its first bytes (image.c), for the
 * folders of images.c; `what` names it in messages (dp_image_decode's).
 * dp__image_header reads the header only: its size and whether it has
 * colour (dp/data.h's rule for C).  dp__image_decode_file decodes it into
 * dst as C x H x W, converted, resized and cropped as dp_image_decode
 * does (H x W its own size: copied).  dp__image_check_size checks a
 * height, width option (both 0, or both 1..65535 and at most
 * DP_IMAGE_MAX_PIXELS pixels). */
int dp__image_header(FILE *f, const char *what, int64_t *h, int64_t *w, int *colour);
int dp__image_decode_file(FILE *f, const char *what, int C, int64_t H, int64_t W, uint8_t *dst);
int dp__image_check_size(const char *what, int64_t height, int64_t width);

#endif
