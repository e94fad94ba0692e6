/*
 * dp/data.h — datasets (IDX files, NumPy arrays, CSV, image folders),
 * normalisation, the sampler, prefetch, augmentation, and text (token
 * files, the validation split, windows).
 *
 * IDX is the MNIST / Fashion-MNIST layout: a big-endian header (two zero
 * bytes, a type byte 0x08 = uint8, the number of dimensions, then each
 * dimension as uint32) followed by the data.  Files may be gzip-compressed
 * (read through zlib) or plain.
 *
 *     struct dp_dataset train;
 *     if (dp_dataset_load_idx(&train, "train-images-idx3-ubyte.gz",
 *                             "train-labels-idx1-ubyte.gz")) { ... dp_errmsg() ... }
 *     dp_dataset_normalize(&train, mean, std);
 */
#ifndef DP_DATA_H
#define DP_DATA_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A dataset: samples of C x H x W floats, read with dp_dataset_read, and
 * their labels.  The features are either held in memory as normalised floats
 * (x: IDX files) or read from a memory-mapped array as samples are asked for
 * (src: .npy, CSV; src/data/arrays.c).  Labels are classes (y) or, for a
 * regression, num_classes float targets per sample (target). */
struct dp_dataset_src;
struct dp_dataset {
    int64_t n;            /* samples */
    int64_t C, H, W;      /* per-sample shape (C = 1 for IDX images) */
    float *x;             /* (n, C, H, W) in memory, or NULL: read from src */
    int32_t *y;           /* (n) class labels, or NULL for a regression */
    float *target;        /* regression: (n, num_classes) targets, else NULL */
    int64_t num_classes;  /* max label + 1; a regression: targets per sample */
    struct dp_dataset_src *src; /* a mapped source, or NULL */
};
#define DP_DATASET_MAX_CLASSES 65536

/* Sample i (0 <= i < n) as C*H*W floats in (C, H, W) order, normalised, into
 * dst.  Thread-safe: reads only. */
void dp_dataset_read(const struct dp_dataset *ds, int64_t i, float *dst);

/* ---- datasets from arrays (src/data/arrays.c) ----------------------------------
 * Features: (N, D), (N, H, W), (N, C, H, W), or (N, H, W, C) with nhwc; any
 * dtype dp_npy reads, converted to float as read (a uint8 pixel becomes
 * 0..255: normalise).  Labels: (N) or (N, 1) integers 0 .. 65535 (bool
 * too), or with regression (N) or (N, K) numbers of any dtype.  The features
 * stay mapped (dp_npy_open): a file larger than memory trains. */
struct dp_data_opts {
    int nhwc;         /* the features are (N, H, W, C) */
    int regression;   /* the labels are float targets */
};
int dp_dataset_open_npy(struct dp_dataset *ds, const char *xpath, const char *ypath,
                        const struct dp_data_opts *o);
/* Moves a fixed fraction of ds into val: the first floor(n * frac) entries of
 * the permutation keyed by (seed, DP_RNG_VALSPLIT), each part kept in the
 * source's order.  Before normalising.  DP_EINVAL when a part would be empty. */
int dp_dataset_split(struct dp_dataset *ds, struct dp_dataset *val, double frac, uint64_t seed);
/* Keeps the first n samples (n <= 0 or >= ds->n: all). */
int dp_dataset_limit(struct dp_dataset *ds, int64_t n);
/* The normalisation's groups: the C channels of an image sample, or the W
 * features of a table's (C = H = 1); each a contiguous run of a sample. */
int64_t dp_dataset_norm_groups(const struct dp_dataset *ds);
/* Each group's mean and std (population) of ds's samples as read, in one
 * pass in sample order; a constant group gets std 1.  mean, std: (groups). */
int dp_dataset_channel_stats(const struct dp_dataset *ds, double *mean, double *std);
/* x = (x - mean[g]) / std[g] per group: in place for samples in memory, as
 * read for a mapped source (replacing any earlier normalisation). */
int dp_dataset_normalize_channels(struct dp_dataset *ds, const float *mean, const float *std);

/* ---- CSV (src/data/csv.c) ---------------------------------------------------------
 * A CSV file of numbers becomes two arrays in the cache folder, read as any
 * other arrays (dp_dataset_open_npy):
 *
 *     x  (rows, features)  float32   every column but the label's, in order
 *     y  (rows)            int64     classes 0..65535, or
 *                          float32   targets (regression)
 *
 *     struct dp_csv_opts o = dp_csv_default_opts();
 *     o.label_column = "price";
 *     struct dp_csv_info info;
 *     if (dp_csv_prepare("houses.csv", &o, &info)) { ... dp_errmsg() ... }
 *     dp_dataset_open_npy(&ds, info.x_path, info.y_path, &(struct dp_data_opts){.regression = 1});
 *
 * The file: fields separated by ',', each quoted or not ("a ""b"", c": RFC
 * 4180, tokenised by libcsv in strict mode), rows ended by '\n', "\r\n" or
 * the end of the file.  Blank lines (and lines of spaces only) are skipped,
 * a UTF-8 byte order mark at the start is ignored, spaces and tabs around a
 * value are trimmed.  A quoted field may span lines; positions in messages
 * count '\n' bytes, so a file that ends its lines with a lone '\r' is all
 * line 1 in them.  Every data row holds the same number of fields (at most
 * DP_CSV_MAX_COLUMNS), each a number that strtod parses whole (decimal,
 * exponent, hex float), finite, and finite as a float32; a class label is
 * an integer value 0..65535 ("3" or "3.0", not "3.5").
 *
 * Header: with header = -1 the first row is a header when one of its fields
 * is neither empty nor a number ("x1,x2,label"; ",a,b" too), and data
 * otherwise ("1,,3" is then a row with a missing value, and a header of
 * numbers only, "0,1,2", needs header = 1).  A header may be empty or
 * repeat names; only the label's name must be found once.
 *
 * Label column: label_column is a header name (exact match, after
 * trimming), else a decimal 0-based index; NULL is the last column.  A CSV
 * needs at least 2 columns (a label and a feature).
 *
 * Errors, each one line naming the place as PATH:LINE:COL (LINE 1-based,
 * the line where the field or row starts; COL the 1-based field of the
 * row):
 *   DP_EFORMAT  "PATH:7:3: a missing value (an empty field)"
 *               "PATH:9:2: 'abc' is not a number"
 *               "PATH:9:2: 'inf' is not a finite number"
 *               "PATH:9:2: '1e40' is out of float32's range"
 *               "PATH:12: 5 fields, the header has 6"     (or "the first row has 6")
 *               "PATH:4:6: label '3.5' is not a class (an integer 0..65535); for a regression use --loss mse"
 *               "PATH:3:2: a stray quote (a quote inside an unquoted field, or text after a
 *                closing quote): quote the whole field and double each quote inside it"
 *               "PATH:3:2: a quoted field is not closed before the end of the file"
 *               "PATH:1: more than 1048576 fields in a row"
 *               "PATH: empty: no rows", "PATH: a header row and no data rows",
 *               "PATH:1: one column only: a CSV needs a label column and at least one
 *                feature column (are the fields separated by ','?)"
 *   DP_EINVAL   a label column not in the header (its names listed, cut to
 *               about 200 characters), a name given when there is no
 *               header, an index out of range ("the CSV has 5 columns"), a
 *               name found twice, a bad option
 *   DP_ENOMEM   the arrays do not fit in memory
 *   DP_ENOENT, DP_EIO  the file (dp_csv_prepare) */
#define DP_CSV_MAX_COLUMNS (1 << 20)
struct dp_csv_opts {
    int header;                /* -1: detect (default), 0: no header row, 1: the first row is a header */
    const char *label_column;  /* a header name, or a 0-based index; NULL: the last column */
    int regression;            /* 1: the labels are float targets (float32), 0: integer classes 0..65535 (int64) */
    const char *cache_dir;     /* where the arrays go; NULL: dp_text_cache_dir's folder */
};
/* header = -1, everything else 0 / NULL (a zeroed struct means header = 0). */
struct dp_csv_opts dp_csv_default_opts(void);
struct dp_csv_info {
    int built;                 /* 1: parsed now; 0: the cached arrays were reused */
    int64_t rows, features;    /* data rows, feature columns */
    char x_path[4096], y_path[4096]; /* the arrays to read (dp_dataset_open_npy) */
    char label_name[256];      /* the label column's header name, or "column K" (K 0-based) */
    char why[512];             /* built: why (no cached arrays yet, the CSV changed, ...) */
};
/* Parses csv once into the two arrays in the cache folder and reuses them
 * while the CSV is unchanged.  o NULL: dp_csv_default_opts().  The arrays
 * are
 *
 *     CACHE/NAME-P-K.x.npy, CACHE/NAME-P-K.y.npy
 *
 * NAME the CSV's base name, P a hash of its absolute path (symlinks
 * resolved), K one of its size, its mtime (nanoseconds) and the options
 * that change the arrays (header, label_column, regression); CACHE is
 * o->cache_dir, else dp_text_cache_dir's folder, made as mkdir -p would.
 * They are reused when both exist, are valid .npy files of the expected
 * dtypes and shapes, and are strictly newer than the CSV; otherwise the CSV
 * is read whole and parsed (one pass, dp_csv_parse), the arrays written
 * (dp_npy_write, atomically) and the CSV's other arrays in the cache (the
 * same NAME-P-, another K) removed.  info (required) says which, and why.
 * Errors: those of dp_csv_parse; DP_ENOENT / DP_EIO for the CSV; DP_ENOENT
 * when there is no cache folder (no cache_dir, HOME nor XDG_CACHE_HOME);
 * DP_EIO naming the cache folder when it cannot be made or written. */
int dp_csv_prepare(const char *csv, const struct dp_csv_opts *o, struct dp_csv_info *info);

/* The parse itself, on bytes in memory (dp_csv_prepare's, and the fuzzer's
 * entry point); `what` names the input in messages.  On success d holds
 * the arrays (dp_malloc'd; free with dp_csv_data_free); on failure d is
 * zeroed.  Memory: the arrays are allocated for the most rows len bytes
 * could hold, (len + 1) / (2 * columns), and only the pages the rows fill
 * are ever touched. */
struct dp_csv_data {
    float *x;                  /* (rows, features) */
    void *y;                   /* (rows): int64_t classes, or float targets with regression */
    int64_t rows, features;
    int64_t label;             /* the label's column, 0-based */
    int header;                /* 1: the first row was a header */
    char label_name[256];      /* as dp_csv_info's */
};
int dp_csv_parse(const uint8_t *buf, size_t len, const char *what, const struct dp_csv_opts *o,
                 struct dp_csv_data *d);
void dp_csv_data_free(struct dp_csv_data *d);

/* ---- image folders (src/data/images.c; one image: src/data/image.c) -------------------
 * A folder of images, one subfolder per class, becomes two arrays (and the
 * class names) in the cache folder, read as any other arrays
 * (dp_dataset_open_npy; the pixels are 0..255: normalise):
 *
 *     x  (N, C, H, W)  uint8   the images, class by class, each class's in name order
 *     y  (N)           int64   their classes 0..K-1
 *
 *     struct dp_images_opts o = dp_images_default_opts();
 *     o.height = o.width = 64;
 *     struct dp_images_info info;
 *     if (dp_images_prepare("photos", &o, &info)) { ... dp_errmsg() ... }
 *     dp_dataset_open_npy(&ds, info.x_path, info.y_path, &(struct dp_data_opts){0});
 *
 * The folder: DIR/<class>/<file>.png|.jpg|.jpeg (the extension in any
 * case).  The classes are DIR's subfolders in strcmp order, numbered
 * 0..K-1 (at most DP_DATASET_MAX_CLASSES); the images of a class are in
 * strcmp order of their names.  Symlinks are followed; names starting with
 * '.', other files and folders inside a class folder are left out.  A class
 * folder with no image is an error (keeping it would shift the numbers of
 * the classes after it without a word).  An image is read by its first
 * bytes, whatever its extension says.
 *
 * Pixels: C = 1 (grey) or 3 (RGB), o->channels, or with 0 from the images: 3
 * when any image has colour by its header (a colour type; a PNG palette
 * with an entry that is not grey; a JPEG that is not greyscale), else 1.
 * Grey is replicated into RGB; RGB becomes grey by the ITU-R BT.601 luma,
 * (299 R + 587 G + 114 B + 500) / 1000 in integers (rounded half up); an
 * alpha channel (PNG tRNS included) is dropped, leaving the colours as
 * stored (as PIL's convert("RGB")); 16-bit PNG samples are scaled to 8
 * bits rounded (v * 255 / 65535), palettes and grey below 8 bits expanded,
 * interlaced PNGs read; a CMYK JPEG is taken as Adobe's inverted CMYK.
 * Size: with height = width = 0 every image must have the size of the
 * first; else each is resized bilinearly (half-pixel centres, no
 * antialiasing) by the least scale that covers H x W, then centre-cropped
 * to H x W (src/data/image.c, to_chw, has the formulas).  An image larger
 * than DP_IMAGE_MAX_PIXELS pixels is refused as bad.
 *
 * Errors, each one line:
 *   DP_ENOENT   "DIR: no such folder"; a file gone since the listing
 *   DP_EINVAL   "DIR: not a folder (expected DIR/<class>/<image>.png|.jpg|.jpeg)";
 *               "DIR: no images: expected DIR/<class>/<image>.png|.jpg|.jpeg (a subfolder per class)";
 *               "DIR/CLASS: a class folder with no images (*.png, *.jpg, *.jpeg): remove it or
 *                add images (an empty class would shift the class numbers)";
 *               "DIR: more than 65536 classes (subfolders)"; a class name with a line break;
 *               a bad option
 *   DP_EFORMAT  "PATH: not a PNG/JPEG image", "PATH: corrupt or truncated PNG: <libpng's message>",
 *               "PATH: corrupt or truncated JPEG: <libjpeg's message>",
 *               "PATH: 20000x30000 (HxW) is too large (more than 67108864 pixels)";
 *               with skip_bad these images are skipped and counted instead, and when
 *               none is left:
 *               "DIR: no image could be read: all N were skipped (the first: ...)"
 *   DP_EMISMATCH "DIR/b/2.png is 4x6 (HxW) but DIR/a/1.png is 4x4: the images differ in size;
 *               give --image-size H,W to resize and centre-crop them all to H x W"
 *   DP_ENOMEM, DP_EIO  memory, reading, the cache folder (as dp_csv_prepare's) */
/* 8192 x 8192: a corrupt file may declare any size, and a JPEG of 725 bytes that declared
 * 2037 x 62195 took 3.4 s and 745 MB to decode at the former bound of 2^27 */
#define DP_IMAGE_MAX_PIXELS ((int64_t)1 << 26)
struct dp_images_opts {
    int channels;              /* 0: from the images (3 if any has colour), 1 or 3 */
    int64_t height, width;     /* 0, 0: the images' own size (all equal); else 1..65535 each:
                                * resized (covering) and centre-cropped to height x width */
    int skip_bad;              /* 1: skip and count images that cannot be decoded instead of failing */
    int threads;               /* decoding threads; 0: the CPUs available (dp_cpus_allowed) */
    const char *cache_dir;     /* where the arrays go; NULL: dp_text_cache_dir's folder */
};
/* Everything 0 / NULL. */
struct dp_images_opts dp_images_default_opts(void);
struct dp_images_info {
    int built;                 /* 1: decoded now; 0: the cached arrays were reused */
    int64_t images;            /* N: the images in the arrays */
    int64_t classes, channels, height, width;
    int64_t skipped;           /* images skipped (skip_bad); reused: the listing's images - N */
    char first_bad[4096];      /* built: the first image skipped (DIR/CLASS/FILE), "" if none */
    char first_bad_error[512]; /* built: why it was skipped (its error message) */
    char x_path[4096], y_path[4096], classes_path[4096];
    char why[512];             /* built: why (no cached arrays yet, an image or the options changed, ...) */
};
/* Decodes the images of dir once into three files in the cache folder and
 * reuses them while the folder's images are unchanged.  o NULL:
 * dp_images_default_opts().  The files are
 *
 *     CACHE/NAME-P-K.x.npy, CACHE/NAME-P-K.y.npy, CACHE/NAME-P-K.classes.txt
 *
 * NAME the folder's base name, P a hash of its absolute path (symlinks
 * resolved), K one of every image's path under dir, size and mtime
 * (nanoseconds), and the options that change the arrays (channels, height,
 * width, skip_bad); classes.txt holds the class names, one a line, in class
 * order.  They are reused when all three exist, the arrays are valid .npy
 * files of the expected dtypes and shapes, and the folder lists to the
 * same K (so a changed, added or removed image means a rebuild).
 * Otherwise the images are decoded on up to o->threads threads (the result
 * is the same for any count), each image written into x's temporary file
 * at its place as soon as it is decoded (a set larger than memory builds),
 * the files renamed into place, and the folder's other files in the cache (the same
 * NAME-P-, another K) removed.  info (required) says which, and why. */
int dp_images_prepare(const char *dir, const struct dp_images_opts *o, struct dp_images_info *info);
/* The class names of a prepared folder (info->classes_path), each followed
 * by '\n', as one NUL-terminated string in *names (dp_free it). */
int dp_images_class_names(const struct dp_images_info *info, char **names);
/* One image in memory (PNG or JPEG) decoded to C x H x W uint8 in *pixels
 * (dp_malloc'd; dp_free it), converted, resized and cropped as
 * dp_images_prepare does: channels 0 is the image's own (3 if it has
 * colour), height = width = 0 its own size.  `what` names it in messages
 * (the errors above).  The fuzzer's entry point. */
int dp_image_decode(const uint8_t *buf, size_t len, const char *what, int channels, int64_t height, int64_t width,
                    uint8_t **pixels, int64_t *c, int64_t *h, int64_t *w);

/* ---- NumPy .npy arrays (src/data/npy.c) --------------------------------------
 * Version 1.0, 2.0 and 3.0 files, C order, little-endian, of the dtypes below.
 * Fortran order, big-endian, object and structured dtypes are refused with a
 * message saying so: nothing is ever unpickled. */
enum dp_npy_dtype { DP_NPY_F32, DP_NPY_F64, DP_NPY_U8, DP_NPY_I8, DP_NPY_I16, DP_NPY_I32, DP_NPY_I64, DP_NPY_BOOL };
#define DP_NPY_MAX_DIMS 8
struct dp_npy {
    enum dp_npy_dtype dtype;
    size_t item;                       /* bytes per element */
    int ndim;
    int64_t shape[DP_NPY_MAX_DIMS];
    int64_t count;                     /* prod(shape) */
    const void *data;                  /* the elements, C order (inside the mapping) */
    void *map;                         /* dp_npy_open's mapping of the whole file */
    size_t map_len;
};
/* Maps the file (read-only; pages come in as they are read, so a file larger
 * than memory is no problem) and checks its header and size.  Errors:
 * DP_ENOENT, DP_EIO, DP_EFORMAT (not a .npy, a bad header, a size that does
 * not match the shape), DP_ENOTSUP (a layout or dtype not read, named). */
int dp_npy_open(const char *path, struct dp_npy *a);
void dp_npy_close(struct dp_npy *a);
/* The same checks on bytes in memory (a->data points into buf; nothing to
 * close).  `what` names the array in messages.  Used by the fuzzer. */
int dp_npy_parse(const uint8_t *buf, size_t len, const char *what, struct dp_npy *a);
/* Element i (flat, C order) as a double (int64 beyond 2^53 rounds). */
double dp_npy_get(const struct dp_npy *a, int64_t i);
const char *dp_npy_dtype_name(enum dp_npy_dtype t);
/* Writes data as a version 1.0 .npy of `dtype` with shape[0..ndim) (C order,
 * little-endian; ndim 0..DP_NPY_MAX_DIMS, shape may be NULL for ndim 0),
 * atomically: a temporary beside path, fsync'ed and renamed over it, so a
 * crash leaves the old file or the whole new one.  dp_npy_open reads it back
 * (and numpy.load).  DP_EINVAL for a dtype other than DP_NPY_F32,
 * DP_NPY_I64 and DP_NPY_U8, a negative dimension or a size that overflows;
 * DP_EIO naming the (temporary) path when it cannot be written, the folder
 * missing included. */
int dp_npy_write(const char *path, enum dp_npy_dtype dtype, int ndim, const int64_t *shape, const void *data);

/* An array in the caller's memory, described as an .npy header describes one: C order, this
 * machine's byte order, `dtype` an enum dp_npy_dtype, shape[0..ndim).  The Python package hands
 * numpy arrays through it (python/dptrain, docs/python.md). */
struct dp_array {
    const void *data;
    int dtype;                         /* enum dp_npy_dtype */
    int ndim;                          /* 1 .. DP_NPY_MAX_DIMS */
    int64_t shape[DP_NPY_MAX_DIMS];
};
/* dp_dataset_open_npy over arrays in memory (src/data/arrays.c): the same shapes, dtypes, checks
 * and messages (each array named by xname, yname, e.g. "X" and "y").  The features are borrowed:
 * ds reads them as samples are asked for, so they must stay alive and unchanged while ds is used;
 * the labels are read once.  y NULL (or its data NULL): every label 0 (a prediction's inputs). */
int dp_dataset_open_arrays(struct dp_dataset *ds, const struct dp_array *x, const struct dp_array *y,
                           const char *xname, const char *yname, const struct dp_data_opts *o);

/* Reads one IDX file (plain or .gz).  On success *data holds the raw bytes
 * (caller frees with dp_free), dims[0..*ndim) the dimensions.  Validates the
 * magic, the type (uint8 only), ndim (1..4), that the dimensions are
 * positive and that the payload holds exactly prod(dims) bytes. */
int dp_idx_read(const char *path, uint8_t **data, int *ndim, int64_t dims[4]);
/* Same, but *data holds only the first min(first, dims[0]) records when
 * first > 0 (dims[] are still the file's): the header is validated, the rest
 * of the file is not read (nor checked for truncation or trailing bytes).
 * first <= 0 is dp_idx_read. */
int dp_idx_read_first(const char *path, int64_t first, uint8_t **data, int *ndim, int64_t dims[4]);
/* Same, from a memory buffer (already decompressed).  Used by the fuzzer. */
int dp_idx_parse(const uint8_t *buf, size_t len, uint8_t **data, int *ndim, int64_t dims[4]);

/* Loads images (n, H, W) and labels (n) and checks they agree; pixels are
 * scaled to [0, 1]. */
int dp_dataset_load_idx(struct dp_dataset *ds, const char *images_path, const char *labels_path);
/* Finds train/test files in dir ("train-images-idx3-ubyte[.gz]" etc.).
 * DP_ENOENT "dataset: DIR: no such file or folder" for a missing dir,
 * DP_EINVAL for a dir that is not a folder (the message says what the
 * folder must hold), DP_ENOENT naming each missing file. */
int dp_dataset_load_dir(struct dp_dataset *train, struct dp_dataset *test, const char *dir);
/* Same, keeping only the first max_train training and max_test test samples
 * (0: all), and reading no image past them: what --train-limit and
 * --test-limit use, so that a short run does not decompress the whole set.
 * The labels are read whole (they are small), so the count check and
 * num_classes are those of the full files. */
int dp_dataset_load_dir_first(struct dp_dataset *train, struct dp_dataset *test, const char *dir,
                              int64_t max_train, int64_t max_test);
/* x = (x - mean) / std */
void dp_dataset_normalize(struct dp_dataset *ds, float mean, float std);
void dp_dataset_free(struct dp_dataset *ds);

/* ---- NumPy .npz archives (src/data/npz.c, through Debian's libzip) --------------
 * An .npz is a zip of KEY.npy members (numpy.savez, savez_compressed).  A member
 * is extracted once into the cache folder (dp_text_cache_dir's) as the .npy it
 * is, then mapped like any .npy (dp_dataset_open_npy). */
/* The path of member KEY's .npy in the cache (cache_dir NULL: the default
 * cache folder) into path[0..cap), extracted now (*built = 1) unless a copy
 * newer than the archive is there.  DP_ENOENT for a missing archive, or for a
 * missing member (the message lists the archive's arrays); DP_EFORMAT for a
 * file that is not a zip or a corrupt member; DP_EIO for the cache folder. */
int dp_npz_extract(const char *npz, const char *key, const char *cache_dir, char *path, size_t cap, int *built);
/* The names of the archive's .npy members, without ".npy", as "a, b, c". */
int dp_npz_keys(const char *npz, char *names, size_t cap);
/* Member KEY.npy of an archive in memory, inflated into *npy (dp_free it):
 * the fuzzer's entry point (members over 64 MiB are refused). */
int dp_npz_parse(const uint8_t *buf, size_t len, const char *key, uint8_t **npy, size_t *npy_len);

/* ---- augmentation ------------------------------------------------------------ */

struct dp_augment {
    int crop_pad;   /* random crop with this zero padding (0 = off) */
    int hflip;      /* random horizontal flip with p = 0.5 */
};
/* Writes the augmented sample `src` (C, H, W) into dst.  Random choices are a
 * function of (seed, global sample index, epoch) only. */
void dp_augment_sample(float *dst, const float *src, int64_t C, int64_t H, int64_t W,
                       const struct dp_augment *a, uint64_t seed, int64_t sample_idx,
                       int64_t epoch);

/* ---- loader: sampler + batch assembly + prefetch thread -------------------- */

/* The loader produces the batches of an epoch in the order given by a
 * permutation of the dataset (a pure function of seed and epoch when
 * shuffling), assembling each batch (gather + augmentation) on a background
 * thread one or more batches ahead of the consumer. */
struct dp_loader_params {
    int64_t batch;          /* global batch size */
    int shuffle;
    uint64_t seed;
    int drop_last;          /* 0: the last batch of an epoch may be smaller */
    struct dp_augment aug;
    int prefetch;           /* batches prepared ahead (0 = synchronous) */
    /* Data parallelism: this loader yields the part of each global batch that
     * belongs to `rank` of `world` (contiguous split, remainder to the first
     * ranks).  world = 1 for one worker. */
    int rank, world;
    /* Split unit: with align > 1 each rank's part is a run of whole chunks of
     * `align` samples (the last chunk of a batch may be short); deterministic
     * mode uses it so that chunk boundaries do not depend on world.  0 or 1:
     * split by samples. */
    int64_t align;
    /* 1: the split may be changed later by dp_loader_set_shares (--balance),
     * so every batch buffer holds a whole global batch instead of
     * ceil(batch / world) samples. */
    int uneven;
};
struct dp_loader_params dp_loader_default_params(void);

struct dp_loader_batch {
    int64_t B;              /* samples in this part of the batch (0 when global_B < world) */
    int64_t global_B;       /* samples in the whole global batch */
    float *x;               /* (B, C, H, W); NULL for a text loader */
    int32_t *tokens;        /* text loader: (B, ctx) input token ids; else NULL */
    int32_t *y;             /* (B) labels, or (B, ctx) next tokens for a text loader */
    float *target;          /* a regression's (B, K) targets, else NULL */
    int64_t *idx;           /* (B) dataset indices (keys the RNG); text: window indices */
    int64_t epoch, step_in_epoch;
};

struct dp_loader;
int dp_loader_init(struct dp_loader **l, const struct dp_dataset *ds,
                   const struct dp_loader_params *p);
struct dp_tokens;
struct dp_text_split;
/* A text loader: an epoch is `windows` training windows of ctx + 1 tokens
 * (docs/text.md), window i of epoch e being dp_text_window_start(seed, e, i,
 * ctx, train_n): global batch `step` holds windows [step * batch, ...), and
 * each rank fills its own part of that range (split as for images, align
 * included), so the split does not change which windows form a batch.
 * p->shuffle and p->aug are unused (the windows are already random).  t and
 * s are borrowed and must outlive the loader.  DP_EINVAL when windows < 1 or
 * the training part is shorter than ctx + 1 tokens. */
int dp_loader_init_text(struct dp_loader **l, const struct dp_tokens *t, const struct dp_text_split *s,
                        int64_t ctx, int64_t windows, const struct dp_loader_params *p);
/* Batches per epoch. */
int64_t dp_loader_steps_per_epoch(const struct dp_loader *l);
/* Per-rank shares of the global batch (--balance): shares[r] units of align
 * samples for rank r, summing to ceil(batch / align); NULL = the equal split.
 * Applies from the next batch returned (src/data/loader.c). */
int dp_loader_set_shares(struct dp_loader *l, const int64_t *shares);
/* The split itself: rank's part [*off, *off + *B) of a global batch of G <=
 * batch samples under shares (NULL: equal), as every loader computes it. */
void dp_loader_split(int64_t G, int64_t batch, int64_t align, int world, int rank, const int64_t *shares,
                     int64_t *off, int64_t *B);
/* Positions the loader at (epoch, step within the epoch); used by resume. */
int dp_loader_seek(struct dp_loader *l, int64_t epoch, int64_t step);
/* Returns the next batch (valid until the next call).  Moves to the next
 * epoch after the last batch of the current one. */
int dp_loader_next(struct dp_loader *l, const struct dp_loader_batch **b);
/* Seconds the consumer spent waiting inside dp_loader_next so far. */
double dp_loader_wait_time(const struct dp_loader *l);
void dp_loader_free(struct dp_loader *l);

/* ---- text: token files, the validation split, windows ------------------------ */

/* A token file (docs/text.md), all integers little-endian:
 *
 *     offset  size     field
 *     0       8        magic "DPTOKENS"
 *     8       4        version (1)
 *     12      4        vocab: vocabulary size, 2..65536
 *     16      8        count: number of tokens, >= 1
 *     24      4        crc: CRC-32 (dp_crc32) of the 2*count token bytes
 *     28      4        reserved, 0
 *     32      2*count  tokens, uint16 each, every one < vocab
 *
 * and nothing after the tokens: the file is exactly 32 + 2*count bytes. */
#define DP_TOKENS_MAGIC "DPTOKENS"
#define DP_TOKENS_VERSION 1
#define DP_TOKENS_HEADER_BYTES 32
#define DP_TOKENS_VOCAB_MAX 65536
/* Byte-level vocabulary: token = byte value. */
#define DP_TOKENS_VOCAB_BYTES 256
/* The default corpus (Debian's fortunes + fortunes-min) and the default
 * validation fraction (the last 5% of the tokens). */
#define DP_TEXT_DEFAULT_CORPUS "/usr/share/games/fortunes"
#define DP_TEXT_VAL_FRAC 0.05

struct dp_tokens {
    uint16_t *tok;  /* (n) token ids, each < vocab; dp_malloc'd */
    int64_t n;
    int64_t vocab;
};

/* Writes tok[0..n) as a token file, atomically (a crash leaves the old file
 * or the whole new one).  Checks vocab (2..65536), n >= 1 and every token <
 * vocab before writing; DP_ENOENT when path's folder does not exist. */
int dp_tokens_write(const char *path, const uint16_t *tok, int64_t n, int64_t vocab);
/* Reads a token file, validating every header field (magic, version, vocab,
 * count against the file size, reserved, crc) and every token (< vocab).
 * DP_EFORMAT with a message naming the field (a file that does not start
 * with the magic: "PATH is not a token file (it starts with "...")", its
 * first bytes escaped); DP_ENOENT / DP_EIO for a missing or unreadable file.
 * On failure t is zeroed. */
int dp_tokens_read(const char *path, struct dp_tokens *t);
/* Whether path is a token file by its first bytes only (the magic), without
 * reading the rest: 0, DP_EFORMAT with "tokens: PATH is not a token file
 * (it starts with "...")" (or "(it is empty)"), or the open errors of
 * dp_tokens_read.  For a caller that must tell a token file from anything
 * else a user may pass in its place before it reads the file.  start (may
 * be NULL) gets the part in parentheses on DP_EFORMAT, "" otherwise. */
int dp_tokens_probe(const char *path, char *start, size_t cap);
/* Same from a memory image of the file (the fuzzer's entry point).  Never
 * allocates more than len bytes. */
int dp_tokens_parse(const uint8_t *buf, size_t len, struct dp_tokens *t);
/* Byte-level tokens of bytes[0..len): t->tok[i] = bytes[i], vocab 256. */
int dp_tokens_from_bytes(struct dp_tokens *t, const uint8_t *bytes, size_t len);
void dp_tokens_free(struct dp_tokens *t);

/* The text of a list of inputs, concatenated.  Each input is a file (a
 * symlink to one is followed) or a folder, meaning its regular files in name
 * order (strcmp order; symlinks and subfolders inside it are skipped).  With
 * no inputs (n == 0): the default corpus, DP_TEXT_DEFAULT_CORPUS without its
 * index files (*.dat) and UTF-8 aliases (*.u8).  DP_ENOENT for a missing
 * input, DP_EINVAL when the result is empty (no files, or 0 bytes). */
struct dp_text_corpus {
    uint8_t *bytes;  /* (len) dp_malloc'd */
    size_t len;
    int nfiles;
};
int dp_text_corpus_load(struct dp_text_corpus *c, const char *const *inputs, int n);
void dp_text_corpus_free(struct dp_text_corpus *c);

/* Preparing a token file.  dp_text_prepare loads the inputs as
 * dp_text_corpus_load does and writes their byte-level tokens to out
 * (atomically): `dptrain prepare-text`.
 *
 * dp_text_prepare_dir prepares a folder of text files for training on first
 * use (`--data DIR`): its token file is made from the folder's regular files
 * in name order, leaving out DP_TEXT_DIR_TOKENS (and temporaries of its
 * writer), *.dat and *.u8, and written (atomically) into the cache folder
 * (dp_text_cache_dir, made as mkdir -p would), not into DIR:
 *
 *     CACHE/NAME-P-C.tokens     NAME the folder's name, P a hash of its
 *                               absolute path, C one of its sources' names,
 *                               sizes and mtimes
 *
 * so a changed source means a new file (the folder's older ones are then
 * removed).  The path of the token file to read goes to path[0..cap).  A
 * token file is reused when it is valid (dp_tokens_read), byte-level,
 * holds as many tokens as the sources have bytes, and is strictly newer
 * than every source; otherwise it is rebuilt.  Where it is looked for, in
 * order:
 *   1. the cache file for these sources;
 *   2. DIR/DP_TEXT_DIR_TOKENS, which dptrain wrote before it had a cache:
 *      reused while valid, read only (a stale one is left alone);
 *   3. none valid: built into the cache, or, when the cache folder cannot
 *      be made or written (no HOME, a read-only home), into
 *      DIR/DP_TEXT_DIR_TOKENS, which step 2 then finds next time.  When
 *      both fail: DP_EIO with one message naming both places.
 * info (may be NULL) says which.  DP_ENOENT for a missing DIR, DP_EINVAL
 * for one that is not a folder or holds no text file.
 * dp_text_prepare_dir_in is the same with the cache folder given (NULL:
 * dp_text_cache_dir's). */
#define DP_TEXT_DIR_TOKENS "tokens.bin"
struct dp_text_prepared {
    int built;        /* 1: the token file was written; 0: an existing one reused */
    int nfiles;       /* source files */
    int64_t tokens;   /* tokens in the file (= source bytes) */
    int in_dir;       /* dp_text_prepare_dir: 1 when the token file is DIR/DP_TEXT_DIR_TOKENS */
    char why[512];    /* built by dp_text_prepare_dir: why ("no token file of DIR in the cache
                       * yet", "X is newer than the cached token file", ...) */
    char cache_error[512]; /* built into DIR: why not into the cache */
};
int dp_text_prepare(const char *const *inputs, int n, const char *out, struct dp_text_prepared *info);
int dp_text_prepare_dir(const char *dir, char *path, size_t cap, struct dp_text_prepared *info);
int dp_text_prepare_dir_in(const char *dir, const char *cache, char *path, size_t cap,
                           struct dp_text_prepared *info);
/* The cache folder of dp_text_prepare_dir into out[0..cap):
 * $XDG_CACHE_HOME/dptrain when XDG_CACHE_HOME is an absolute path (the XDG
 * base directory rule), else $HOME/.cache/dptrain.  It is not created here.
 * DP_ENOENT when neither variable is set. */
int dp_text_cache_dir(char *out, size_t cap);

/* A fixed split: training tokens [0, train_n), validation tokens
 * [train_n, train_n + val_n), val_n = floor(n * val_frac).  val_frac in
 * [0, 1). */
struct dp_text_split {
    int64_t train_n;
    int64_t val_n;
};
int dp_text_split_init(struct dp_text_split *s, int64_t n, double val_frac);

/* Training windows.  Window `index` (the global sample index within the
 * epoch: step * global batch + position in the batch) of `epoch` is the
 * ctx + 1 tokens starting at
 *     dp_text_window_start(seed, epoch, index, ctx, train_n)
 * a pure function of its arguments, uniform over [0, train_n - ctx - 1]:
 * the whole window lies in the training part.  Which worker fills which
 * index does not change the window.  Returns -1 when train_n < ctx + 1. */
int64_t dp_text_window_start(uint64_t seed, int64_t epoch, int64_t index, int64_t ctx, int64_t train_n);
/* Fills the windows first..first+count-1: x[i] = the window's first ctx
 * tokens, y[i] = its last ctx (the next token at each position).
 * x, y: (count, ctx). */
int dp_text_fill_train(const struct dp_tokens *t, const struct dp_text_split *s, int64_t ctx,
                       uint64_t seed, int64_t epoch, int64_t first, int64_t count, int32_t *x,
                       int32_t *y);
/* Validation windows: fixed and consecutive, window k's inputs are the val
 * tokens [k*ctx, (k+1)*ctx) and its targets the same range shifted by one, so
 * input blocks do not overlap and target blocks do not overlap: every
 * validation token but the first is a target exactly once (the tail that
 * does not fill a window is left out).  Count: (val_n - 1) / ctx. */
int64_t dp_text_val_windows(const struct dp_text_split *s, int64_t ctx);
int dp_text_fill_val(const struct dp_tokens *t, const struct dp_text_split *s, int64_t ctx,
                     int64_t first, int64_t count, int32_t *x, int32_t *y);

#ifdef __cplusplus
}
#endif
#endif
