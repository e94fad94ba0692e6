/* The run folder (dp_train_params.io.out_dir): what may be written into it, and
 * its metrics.jsonl.
 *
 *   a folder that holds a run        refused, unless this run resumes the
 *   (checkpoint.bin, or a non-empty  folder's own checkpoint, or overwrite
 *   metrics.jsonl)                   is set (then its checkpoint is removed
 *                                    first, and checkpoint.prev.bin: the
 *                                    folder never pairs an old checkpoint
 *                                    with new metrics)
 *   a missing folder                 made, with its missing parents
 *
 * metrics.jsonl holds one JSON record per line.  Each record reaches the
 * file in one write(2): the stream is fully buffered with a buffer larger
 * than any record, and flushed at the end of each record, so a kill leaves
 * whole records and at most one cut short (a write interrupted by the kill
 * itself, or by a full disk).  A checkpoint stores the file's length when
 * it was written (section DPMETRIC, dp_trainer_save); resuming the folder's
 * checkpoint cuts the file back to that length.  That drops a record cut
 * short and the records of the steps after the checkpoint, which the
 * resumed run computes and records again: every step appears once.  A
 * checkpoint without the section (written before it existed) gets only the
 * partial last line cut. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core_impl.h"
#include "dp/train.h"
#include "run_folder.h"

/* 1 if a and b name the same folder */
static int same_dir(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Lines (newlines) in the first `len` bytes of f, and the offset just past the last newline. */
static int64_t count_lines(FILE *f, int64_t len, int64_t *whole) {
    char buf[65536];
    int64_t n = 0, at = 0;
    *whole = 0;
    rewind(f);
    while (at < len) {
        size_t want = (size_t)(len - at < (int64_t)sizeof buf ? len - at : (int64_t)sizeof buf);
        size_t got = fread(buf, 1, want, f);
        if (got == 0) break;
        for (size_t i = 0; i < got; i++)
            if (buf[i] == '\n') n++, *whole = at + (int64_t)i + 1;
        at += (int64_t)got;
    }
    return n;
}

/* The refusal: what the folder holds, and both ways out. */
static int refuse(const char *dir, const char *ckpt, int has_ckpt, int64_t records) {
    char what[512];
    struct dp_ckpt_header h;
    if (has_ckpt && dp_ckpt_read_header(ckpt, &h) == 0)
        snprintf(what, sizeof what, "a run of model %s at step %lld (checkpoint.bin, %lld records in metrics.jsonl)",
                 h.model_spec, (long long)h.step, (long long)records);
    else if (has_ckpt)
        snprintf(what, sizeof what, "a checkpoint.bin that cannot be read (%s)", dp_errmsg());
    else
        snprintf(what, sizeof what, "a run's metrics.jsonl (%lld records, no checkpoint)", (long long)records);
    if (has_ckpt)
        return dp_seterr(DP_EEXIST, "output folder %s holds %s: pass --resume %s to continue it, or --overwrite to "
                         "replace it (or choose another --out)", dir, what, ckpt);
    return dp_seterr(DP_EEXIST, "output folder %s holds %s: pass --overwrite to replace it, or choose another --out",
                     dir, what);
}

/* Cuts the folder's metrics.jsonl back to what it held when `resume` was written. */
static int cut_metrics(const char *path, const char *resume, char *note, size_t note_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? DP_OK : dp_seterr(DP_EIO, "cannot read %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return dp_seterr(DP_EIO, "cannot read %s: %s", path, strerror(errno));
    }
    int64_t size = st.st_size, whole;
    int64_t lines = count_lines(f, size, &whole);
    void *data = NULL;
    uint64_t n = 0;
    int rc = dp_ckpt_read_section(resume, DP_CKPT_METRICS_TAG, &data, &n);
    if (rc) {
        fclose(f);
        return rc;
    }
    int64_t keep = whole; /* without the section: only a partial last line goes */
    struct dp_ckpt_metrics mb;
    if (data && n == sizeof mb) {
        memcpy(&mb, data, sizeof mb);
        if (mb.bytes >= 0 && mb.bytes <= whole) keep = mb.bytes;
    }
    dp_free(data);
    int64_t kept_whole, kept = count_lines(f, keep, &kept_whole);
    fclose(f);
    if (keep == size) return DP_OK;
    if (truncate(path, (off_t)keep) != 0) return dp_seterr(DP_EIO, "cannot cut %s: %s", path, strerror(errno));
    size_t len = strlen(note);
    snprintf(note + len, note_len - len, "%s%s: %s%lld record%s past the checkpoint removed (the resumed run records "
             "those steps again)", len ? "; " : "", path, whole < size ? "a record cut short, and " : "",
             (long long)(lines - kept), lines - kept == 1 ? "" : "s");
    return DP_OK;
}

/* The refusal alone (no side effects); *own: resume is the folder's own checkpoint. */
static int check(const char *dir, const char *resume, int overwrite, char *ckpt, size_t ckpt_len, char *path,
                 size_t path_len, int *own, int *has_ckpt) {

    if (snprintf(ckpt, ckpt_len, "%s/checkpoint.bin", dir) >= (int)ckpt_len ||
        snprintf(path, path_len, "%s/metrics.jsonl", dir) >= (int)path_len)
        return dp_seterr(DP_EINVAL, "output folder path too long: %s", dir);
    /* does this run resume the folder's own checkpoint? */
    char rdir[4096];
    snprintf(rdir, sizeof rdir, "%s", resume ? resume : "");
    *own = resume && same_dir(dirname(rdir), dir);
    struct stat st;
    *has_ckpt = stat(ckpt, &st) == 0 && S_ISREG(st.st_mode); /* (anything else is no run's) */
    int64_t records = 0, whole;
    FILE *f = stat(path, &st) == 0 && st.st_size > 0 ? fopen(path, "rb") : NULL;
    if (f) { /* (a partial last line counts as a record) */
        records = count_lines(f, st.st_size, &whole);
        records += whole < st.st_size;
        fclose(f);
    }
    if ((*has_ckpt || records) && !*own && !overwrite) return refuse(dir, ckpt, *has_ckpt, records);
    return DP_OK;
}

int dp__run_folder_check(const char *dir, const char *resume, int overwrite) {
    char ckpt[4096], path[4096];
    int own, has_ckpt;
    return check(dir, resume, overwrite, ckpt, sizeof ckpt, path, sizeof path, &own, &has_ckpt);
}

int dp__run_folder_open(const char *dir, const char *resume, int overwrite, FILE **metrics, char *path,
                        size_t path_len, char *note, size_t note_len) {
    *metrics = NULL;
    char ckpt[4096];
    int own, has_ckpt;
    int rc = check(dir, resume, overwrite, ckpt, sizeof ckpt, path, path_len, &own, &has_ckpt);
    if (rc) return rc;
    if (overwrite && !own && has_ckpt && unlink(ckpt) != 0)
        return dp_seterr(DP_EIO, "--overwrite: cannot remove %s: %s", ckpt, strerror(errno));
    /* and the one before it (checkpointing.c keeps the latest two) */
    char prev[4200];
    snprintf(prev, sizeof prev, "%s/checkpoint.prev.bin", dir);
    if (overwrite && !own && unlink(prev) != 0 && errno != ENOENT)
        return dp_seterr(DP_EIO, "--overwrite: cannot remove %s: %s", prev, strerror(errno));
    if (dp__mkdir_p(dir, 0755) != 0)
        return dp_seterr(DP_EIO, "cannot create output folder %s: %s", dir, strerror(errno));
    if (own && (rc = cut_metrics(path, resume, note, note_len))) return rc;
    /* Appending keeps the history of a resumed run in one file. */
    if (!(*metrics = fopen(path, own ? "a" : "w"))) return dp_seterr(DP_EIO, "cannot write %s: %s", path, strerror(errno));
    /* one write per record: see the top of this file */
    setvbuf(*metrics, NULL, _IOFBF, DP_METRICS_RECORD_MAX);
    return DP_OK;
}

/* ---- the failure record ------------------------------------------------------------------- */

int dp__run_folder_failure(const char *dir, int process, int64_t steps_done, const char *error, const int *lost,
                           int nlost) {
    char host[256] = "", hostj[600], err[2200], rec[4096 + 600], path[4096];
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    (void)dp__json_escape(hostj, sizeof hostj, host); /* (a cut message is still one record) */
    (void)dp__json_escape(err, sizeof err, error ? error : "");
    int k = snprintf(rec, sizeof rec,
                     "{\"kind\": \"failure\", \"process\": %d, \"host\": \"%s\", \"steps_done\": %lld, "
                     "\"lost_processes\": [", process, hostj, (long long)steps_done);
    for (int i = 0; i < nlost && k > 0 && (size_t)k < sizeof rec - 32; i++)
        k += snprintf(rec + k, sizeof rec - (size_t)k, "%s%d", i ? ", " : "", lost[i]);
    if (k > 0 && (size_t)k < sizeof rec) k += snprintf(rec + k, sizeof rec - (size_t)k, "], \"error\": \"%s\"}\n", err);
    if (k <= 0 || (size_t)k >= sizeof rec) return dp_seterr(DP_EINVAL, "failure record: too long");
    if (snprintf(path, sizeof path, "%s/failure.p%d.json", dir, process) >= (int)sizeof path)
        return dp_seterr(DP_EINVAL, "failure record: path too long: %s", dir);
    struct dp__wpart part = {rec, (size_t)k};
    return dp__write_file_atomic(path, &part, 1, "failure record");
}
