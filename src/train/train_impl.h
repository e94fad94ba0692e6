/* src/train internals.  Atomic file replacement, shared by the checkpoint
 * and safetensors writers (implemented in ckpt.c). */
#ifndef DP_TRAIN_IMPL_H
#define DP_TRAIN_IMPL_H

#include <stddef.h>

/* One piece of the file, written in order. */
struct dp__wpart {
    const void *data;
    size_t len;
};

/* Writes the parts to a new, uniquely named file beside path
 * ("<path>.tmp.<pid>.<n>", created with O_EXCL), fsyncs it, renames it over
 * path and fsyncs the folder.  On any error the temporary file is removed and
 * path keeps its old contents.  `what` prefixes the error message. */
int dp__write_file_atomic(const char *path, const struct dp__wpart *parts, int nparts, const char *what);

#endif
