/* src/core internals shared with the layers above (data, train): atomic file
 * replacement, used by the checkpoint, safetensors and token-file writers
 * (implemented in file.c).  It lives in core, the lowest layer, so that
 * src/data can write token files without depending on src/train. */
#ifndef DP_CORE_IMPL_H
#define DP_CORE_IMPL_H

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
