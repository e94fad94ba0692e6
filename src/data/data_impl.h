/* src/data internals shared by its files: the cache folder (cache.c), where
 * text.c keeps the token file of a folder of text (`--data DIR`) and csv.c
 * the arrays of a CSV file.
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
#include <string.h>
#include <time.h>

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

#endif
