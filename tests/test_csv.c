/* CSV files (src/data/csv.c): the header detected or not, the label column
 * by name, index or default, classes and regression targets, quoting, CRLF
 * and blank lines, every refusal with its exact LINE:COL, the arrays in the
 * cache (written, reused, rebuilt when the CSV or the options change), and
 * dp_npy_write read back by dp_npy_open. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dp/data.h"
#include "test.h"

/* ---- helpers ------------------------------------------------------------------ */

/* A fresh folder for the test (never the user's cache). */
static const char *scratch(void) {
    static char d[512];
    snprintf(d, sizeof d, "%s/csv.XXXXXX", dp_test_tmpdir());
    ASSERT_TRUE(mkdtemp(d) != NULL);
    return d;
}

static void write_text(const char *path, const char *text) { dp_test_write_file(path, text, strlen(text)); }

static void set_mtime(const char *path, time_t sec) {
    struct timespec ts[2] = {{sec, 0}, {sec, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static int parse(const char *text, const struct dp_csv_opts *o, struct dp_csv_data *d) {
    return dp_csv_parse((const uint8_t *)text, strlen(text), "data.csv", o, d);
}

static struct dp_csv_opts opts(int header, const char *label, int regression) {
    struct dp_csv_opts o = dp_csv_default_opts();
    o.header = header, o.label_column = label, o.regression = regression;
    return o;
}

/* text under o fails with code and exactly the message msg; nothing is left allocated. */
#define CLASS_HINT "is not a class (an integer 0..65535); for a regression use --loss mse"
#define ASSERT_CSV_FAILS(text, o, code, msg)                                                    \
    do {                                                                                        \
        struct dp_csv_opts o_ = (o);                                                            \
        struct dp_csv_data d_;                                                                  \
        const char *m_ = (msg);                                                                 \
        ASSERT_ERR(parse(text, &o_, &d_), code, m_);                                            \
        if (strcmp(dp_errmsg(), m_))                                                            \
            dp_test_fail(__FILE__, __LINE__, "message '%s', expected '%s'", dp_errmsg(), m_);   \
        ASSERT_TRUE(d_.x == NULL && d_.y == NULL && d_.rows == 0);                              \
    } while (0)

static int64_t cls(const struct dp_csv_data *d, int64_t i) { return ((const int64_t *)d->y)[i]; }
static float tgt(const struct dp_csv_data *d, int64_t i) { return ((const float *)d->y)[i]; }

/* ---- parsing ------------------------------------------------------------------ */

TEST(csv_header_detected_label_last) {
    struct dp_csv_data d;
    struct dp_csv_opts o = dp_csv_default_opts();
    ASSERT_OK(parse("x1,x2,label\n1,2,0\n3.5,-4e1,7\n0x10,+.5,65535\n", &o, &d));
    ASSERT_EQ(d.header, 1);
    ASSERT_EQ(d.rows, 3);
    ASSERT_EQ(d.features, 2);
    ASSERT_EQ(d.label, 2);
    ASSERT_TRUE(strcmp(d.label_name, "label") == 0);
    const float want[6] = {1, 2, 3.5f, -40, 16, 0.5f};
    for (int i = 0; i < 6; i++) ASSERT_FEQ(d.x[i], want[i]);
    ASSERT_EQ(cls(&d, 0), 0);
    ASSERT_EQ(cls(&d, 1), 7);
    ASSERT_EQ(cls(&d, 2), 65535);
    dp_csv_data_free(&d);
    ASSERT_TRUE(d.x == NULL && d.y == NULL);

    /* NULL options: the same defaults; ",a,b" (an empty name, pandas' index column) is a header */
    ASSERT_OK(dp_csv_parse((const uint8_t *)",a,b\n0,1,2\n", 11, "data.csv", NULL, &d));
    ASSERT_EQ(d.header, 1);
    ASSERT_EQ(d.rows, 1);
    ASSERT_TRUE(strcmp(d.label_name, "b") == 0);
    dp_csv_data_free(&d);
}

TEST(csv_no_header_detected_or_forced) {
    struct dp_csv_data d;
    struct dp_csv_opts o = dp_csv_default_opts();
    /* all numbers: data, and the label is "column K" (0-based) */
    ASSERT_OK(parse("1,2,0\n3,4,1\n", &o, &d));
    ASSERT_EQ(d.header, 0);
    ASSERT_EQ(d.rows, 2);
    ASSERT_EQ(d.features, 2);
    ASSERT_TRUE(strcmp(d.label_name, "column 2") == 0);
    ASSERT_FEQ(d.x[0], 1);
    ASSERT_FEQ(d.x[3], 4);
    ASSERT_EQ(cls(&d, 1), 1);
    dp_csv_data_free(&d);
    /* header = 1: a header of numbers */
    o = opts(1, NULL, 0);
    ASSERT_OK(parse("0,1,2\n3,4,1\n", &o, &d));
    ASSERT_EQ(d.header, 1);
    ASSERT_EQ(d.rows, 1);
    ASSERT_TRUE(strcmp(d.label_name, "2") == 0);
    dp_csv_data_free(&d);
    /* header = 0: a first row of names is data, and fails as such */
    ASSERT_CSV_FAILS("a,b\n1,2\n", opts(0, NULL, 0), DP_EFORMAT, "data.csv:1:1: 'a' is not a number");
    /* "1,,3" is a row with a missing value, not a header */
    ASSERT_CSV_FAILS("1,,3\n1,2,3\n", opts(-1, NULL, 0), DP_EFORMAT,
                     "data.csv:1:2: a missing value (an empty field)");
}

TEST(csv_label_by_name_index_and_regression) {
    struct dp_csv_data d;
    const char *text = "a,price,c\n1,2.5,3\n4,-5.25,6\n";
    struct dp_csv_opts o = opts(-1, "price", 1);
    ASSERT_OK(parse(text, &o, &d));
    ASSERT_EQ(d.label, 1);
    ASSERT_TRUE(strcmp(d.label_name, "price") == 0);
    ASSERT_FEQ(tgt(&d, 0), 2.5);
    ASSERT_FEQ(tgt(&d, 1), -5.25);
    const float want[4] = {1, 3, 4, 6}; /* the other columns, in order */
    for (int i = 0; i < 4; i++) ASSERT_FEQ(d.x[i], want[i]);
    dp_csv_data_free(&d);
    /* by 0-based index, with a header: its name */
    o = opts(-1, "0", 0);
    ASSERT_OK(parse(text, &o, &d));
    ASSERT_EQ(d.label, 0);
    ASSERT_TRUE(strcmp(d.label_name, "a") == 0);
    ASSERT_EQ(cls(&d, 1), 4);
    ASSERT_FEQ(d.x[2], -5.25);
    dp_csv_data_free(&d);
    /* by index, no header */
    o = opts(-1, "1", 1);
    ASSERT_OK(parse("1,2,3\n", &o, &d));
    ASSERT_TRUE(strcmp(d.label_name, "column 1") == 0);
    ASSERT_FEQ(tgt(&d, 0), 2);
    dp_csv_data_free(&d);
    /* a header name that looks like an index is a name first */
    o = opts(1, "0", 0);
    ASSERT_OK(parse("1,0\n5,9\n", &o, &d));
    ASSERT_EQ(d.label, 1);
    ASSERT_EQ(cls(&d, 0), 9);
    dp_csv_data_free(&d);
    /* a class label written as an integral float is that class */
    o = opts(-1, NULL, 0);
    ASSERT_OK(parse("1,3.0\n2,1e1\n", &o, &d));
    ASSERT_EQ(cls(&d, 0), 3);
    ASSERT_EQ(cls(&d, 1), 10);
    dp_csv_data_free(&d);
}

TEST(csv_quotes_crlf_blank_lines) {
    struct dp_csv_data d;
    struct dp_csv_opts o = opts(-1, "y, the label", 0);
    /* a byte order mark, quoted names with commas and doubled quotes, CRLF, blank lines and
     * lines of spaces, spaces around values (quoted or not), no final line end */
    const char *text = "\xef\xbb\xbf\"x \"\"one\"\"\",\"y, the label\",z\r\n"
                       "\r\n"
                       " 1 , 2 ,\t3\r\n"
                       "   \r\n"
                       "\n"
                       "\"4\",\" 5 \",\"6e0\"";
    ASSERT_OK(parse(text, &o, &d));
    ASSERT_EQ(d.header, 1);
    ASSERT_EQ(d.rows, 2);
    ASSERT_EQ(d.label, 1);
    ASSERT_TRUE(strcmp(d.label_name, "y, the label") == 0);
    const float want[4] = {1, 3, 4, 6};
    for (int i = 0; i < 4; i++) ASSERT_FEQ(d.x[i], want[i]);
    ASSERT_EQ(cls(&d, 0), 2);
    ASSERT_EQ(cls(&d, 1), 5);
    dp_csv_data_free(&d);
    /* a name with a line break: the lines after it are counted right */
    ASSERT_CSV_FAILS("\"two\nlines\",b\n1,2\n\nx,3\n", opts(-1, NULL, 0), DP_EFORMAT,
                     "data.csv:5:1: 'x' is not a number");
    /* and with CRLF */
    ASSERT_CSV_FAILS("a,b\r\n1,2\r\n3,\r\n", opts(-1, NULL, 0), DP_EFORMAT,
                     "data.csv:3:2: a missing value (an empty field)");
}

TEST(csv_errors_name_line_and_column) {
    struct dp_csv_opts def = dp_csv_default_opts();
    ASSERT_CSV_FAILS("a,b,c\n1,2,3\n\n4,,6\n", def, DP_EFORMAT,
                     "data.csv:4:2: a missing value (an empty field)");
    ASSERT_CSV_FAILS("a,b,c\n1,2,3\n4,\"\",6\n", def, DP_EFORMAT,
                     "data.csv:3:2: a missing value (an empty field)");
    ASSERT_CSV_FAILS("a,b,c\n1,2,3\n4,5,6\n7,8,9\n1,2,3\n5,6,7\n8,9,0\n1,2,3\n1,abc,0\n", def, DP_EFORMAT,
                     "data.csv:9:2: 'abc' is not a number");
    ASSERT_CSV_FAILS("a,b\n1 2,0\n", def, DP_EFORMAT, "data.csv:2:1: '1 2' is not a number");
    ASSERT_CSV_FAILS("a,b\n1,2\nnan,1\n", def, DP_EFORMAT, "data.csv:3:1: 'nan' is not a finite number");
    ASSERT_CSV_FAILS("a,b\n-inf,1\n", def, DP_EFORMAT, "data.csv:2:1: '-inf' is not a finite number");
    ASSERT_CSV_FAILS("a,b\n1e40,1\n", def, DP_EFORMAT, "data.csv:2:1: '1e40' is out of float32's range");
    ASSERT_CSV_FAILS("a,b,c,d,e,f\n1,2,3,4,5,6\n1,2,3,4,5\n", def, DP_EFORMAT,
                     "data.csv:3: 5 fields, the header has 6");
    ASSERT_CSV_FAILS("1,2,3\n1,2,3,4\n", def, DP_EFORMAT, "data.csv:2: 4 fields, the first row has 3");
    ASSERT_CSV_FAILS("a,b,c\n1\n", def, DP_EFORMAT, "data.csv:2: 1 field, the header has 3");
    /* class labels */
    ASSERT_CSV_FAILS("a,b,c,d,e,f\n1,2,3,4,5,1\n1,2,3,4,5,0\n1,2,3,4,5,3.5\n", def, DP_EFORMAT,
                     "data.csv:4:6: label '3.5' " CLASS_HINT);
    ASSERT_CSV_FAILS("a,b\n1,65536\n", def, DP_EFORMAT,
                     "data.csv:2:2: label '65536' " CLASS_HINT);
    ASSERT_CSV_FAILS("a,b\n1,-1\n", def, DP_EFORMAT,
                     "data.csv:2:2: label '-1' " CLASS_HINT);
    ASSERT_CSV_FAILS("a,b\n1,cat\n", def, DP_EFORMAT,
                     "data.csv:2:2: label 'cat' " CLASS_HINT);
    ASSERT_CSV_FAILS("a,b\n1,cat\n", opts(-1, NULL, 1), DP_EFORMAT, "data.csv:2:2: 'cat' is not a number");
    /* the file as a whole */
    ASSERT_CSV_FAILS("", def, DP_EFORMAT, "data.csv: empty: no rows");
    ASSERT_CSV_FAILS("\n \r\n\t\n", def, DP_EFORMAT, "data.csv: empty: no rows");
    ASSERT_CSV_FAILS("a,b\n\n", def, DP_EFORMAT, "data.csv: a header row and no data rows");
    ASSERT_CSV_FAILS("\nlabel\n1\n", def, DP_EFORMAT,
                     "data.csv:2: one column only: a CSV needs a label column and at least one "
                     "feature column (are the fields separated by ','?)");
    /* quotes: libcsv's strict mode */
    ASSERT_CSV_FAILS("a,b\n1,2\"3\n", def, DP_EFORMAT,
                     "data.csv:2:2: a stray quote (a quote inside an unquoted field, or text after a closing "
                     "quote): quote the whole field and double each quote inside it");
    ASSERT_CSV_FAILS("a,b\n1,2\n\"1\"x,2\n", def, DP_EFORMAT,
                     "data.csv:3:1: a stray quote (a quote inside an unquoted field, or text after a closing "
                     "quote): quote the whole field and double each quote inside it");
    ASSERT_CSV_FAILS("a,b\n1,\"2\n3\n4\n", def, DP_EFORMAT,
                     "data.csv:2:2: a quoted field is not closed before the end of the file");
    ASSERT_CSV_FAILS("a,b\n1,\"2", def, DP_EFORMAT,
                     "data.csv:2:2: a quoted field is not closed before the end of the file");
    /* a value shown in a message stays one line, and short */
    ASSERT_CSV_FAILS("a,b\n\"x\ny\",1\n", def, DP_EFORMAT, "data.csv:2:1: 'x\\x0ay' is not a number");
    char longer[200] = "a,b\n1,", want[200] = "data.csv:2:2: '";
    memset(longer + 6, 'a', 80), memset(want + 15, 'a', 57); /* 57 of 80 shown */
    strcat(longer, "\n"), strcat(want, "...' is not a number");
    ASSERT_CSV_FAILS(longer, opts(-1, NULL, 1), DP_EFORMAT, want);
}

TEST(csv_label_column_refusals) {
    const char *text = "a,b,c\n1,2,3\n";
    ASSERT_CSV_FAILS(text, opts(-1, "zz", 0), DP_EINVAL,
                     "data.csv: no column named 'zz' in the header (a, b, c); give a name or a "
                     "0-based index");
    ASSERT_CSV_FAILS(text, opts(-1, "3", 0), DP_EINVAL,
                     "data.csv: label column 3 is out of range: the CSV has 3 columns (0-based "
                     "indices 0..2)");
    ASSERT_CSV_FAILS("1,2,3\n", opts(-1, "price", 0), DP_EINVAL,
                     "data.csv: label column 'price' is not a 0-based index, and the CSV has no "
                     "header row (its first row is all numbers)");
    ASSERT_CSV_FAILS("a,b,a\n1,2,3\n", opts(-1, "a", 0), DP_EINVAL,
                     "data.csv: the header names two columns 'a' (0 and 2, 0-based): give the "
                     "label column by its index");
    ASSERT_CSV_FAILS(text, opts(-1, "", 0), DP_EINVAL, "data.csv: empty label column");
    ASSERT_CSV_FAILS(text, opts(2, NULL, 0), DP_EINVAL,
                     "data.csv: header must be -1 (detect), 0 or 1, not 2");
    /* a long header: its names cut to about 200 characters */
    char big[4096] = "";
    for (int i = 0; i < 100; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "%scolumn_%d", i ? "," : "", i);
    strcat(big, "\n");
    for (int i = 0; i < 100; i++) strcat(big, i ? ",1" : "1");
    struct dp_csv_opts o = opts(-1, "nope", 0);
    struct dp_csv_data d;
    ASSERT_ERR(parse(big, &o, &d), DP_EINVAL, "no column named 'nope' in the header (column_0, column_1, ");
    ASSERT_TRUE(strstr(dp_errmsg(), " ...); give a name or a 0-based index") != NULL);
    ASSERT_TRUE(strlen(dp_errmsg()) < 300);
}

TEST(csv_column_limit) {
    /* 2^20 + 1 fields in one row: refused; 2^20 exactly is fine */
    size_t n = ((size_t)DP_CSV_MAX_COLUMNS + 1) * 2;
    char *t = malloc(n + 1);
    ASSERT_TRUE(t != NULL);
    for (size_t i = 0; i < n; i += 2) t[i] = '1', t[i + 1] = ',';
    t[n - 1] = '\n';
    t[n] = 0;
    struct dp_csv_opts o = dp_csv_default_opts();
    struct dp_csv_data d;
    ASSERT_ERR(parse(t, &o, &d), DP_EFORMAT, "data.csv:1: more than 1048576 fields in a row");
    t[n - 3] = '\n', t[n - 2] = 0; /* one field fewer */
    ASSERT_OK(parse(t, &o, &d));
    ASSERT_EQ(d.rows, 1);
    ASSERT_EQ(d.features, DP_CSV_MAX_COLUMNS - 1);
    dp_csv_data_free(&d);
    free(t);
}

/* ---- the arrays in the cache -------------------------------------------------------- */

TEST(csv_npy_write_round_trip) {
    const char *dir = scratch();
    char p[600];
    snprintf(p, sizeof p, "%s/a.npy", dir);
    float f[6] = {1.5f, -2, 3, 4, 5, 6.25f};
    int64_t shape[2] = {2, 3};
    ASSERT_OK(dp_npy_write(p, DP_NPY_F32, 2, shape, f));
    struct dp_npy a;
    ASSERT_OK(dp_npy_open(p, &a));
    ASSERT_TRUE(a.dtype == DP_NPY_F32 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3);
    ASSERT_EQ((size_t)((const uint8_t *)a.data - (const uint8_t *)a.map) % 64, 0); /* numpy's alignment */
    for (int i = 0; i < 6; i++) ASSERT_FEQ(dp_npy_get(&a, i), f[i]);
    dp_npy_close(&a);
    int64_t l[3] = {-5, 0, (int64_t)1 << 40}, n3 = 3;
    ASSERT_OK(dp_npy_write(p, DP_NPY_I64, 1, &n3, l)); /* over the old one */
    ASSERT_OK(dp_npy_open(p, &a));
    ASSERT_TRUE(a.dtype == DP_NPY_I64 && a.ndim == 1 && a.shape[0] == 3);
    ASSERT_FEQ(dp_npy_get(&a, 2), 1099511627776.0);
    dp_npy_close(&a);
    int64_t z[2] = {0, 4};
    ASSERT_OK(dp_npy_write(p, DP_NPY_F32, 2, z, NULL)); /* empty */
    ASSERT_OK(dp_npy_open(p, &a));
    ASSERT_TRUE(a.count == 0 && a.shape[1] == 4);
    dp_npy_close(&a);
    ASSERT_ERR(dp_npy_write(p, DP_NPY_I16, 1, &n3, l), DP_EINVAL, "int16");
    char q[600];
    snprintf(q, sizeof q, "%s/no/such/a.npy", dir);
    const char *qn = q;
    ASSERT_ERR(dp_npy_write(q, DP_NPY_F32, 2, shape, f), DP_EIO, qn);
    ASSERT_EQ(dp_test_files_in(dir), 1); /* no temporary left */
}

TEST(csv_prepare_cache_reused_and_rebuilt) {
    const char *dir = scratch();
    char csv[600], cache[600], first_x[4096], first_y[4096];
    snprintf(csv, sizeof csv, "%s/train data.csv", dir);
    snprintf(cache, sizeof cache, "%s/cache/a/b", dir); /* made as mkdir -p would */
    time_t now = time(NULL);
    write_text(csv, "f1,f2,class\n1,2,0\n3,4,1\n5,6,2\n");
    set_mtime(csv, now - 100);
    struct dp_csv_opts o = dp_csv_default_opts();
    o.cache_dir = cache;
    struct dp_csv_info info;
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "no cached arrays of") != NULL);
    ASSERT_EQ(info.rows, 3);
    ASSERT_EQ(info.features, 2);
    ASSERT_TRUE(strcmp(info.label_name, "class") == 0);
    /* CACHE/NAME-P-K.x.npy, NAME with the space made '_' */
    char want[700];
    snprintf(want, sizeof want, "%s/train_data.csv-", cache);
    ASSERT_TRUE(strncmp(info.x_path, want, strlen(want)) == 0);
    ASSERT_EQ(strlen(info.x_path), strlen(want) + 16 + 1 + 16 + strlen(".x.npy"));
    ASSERT_TRUE(strcmp(info.x_path + strlen(info.x_path) - 6, ".x.npy") == 0);
    ASSERT_TRUE(strncmp(info.x_path, info.y_path, strlen(info.x_path) - 5) == 0);
    ASSERT_EQ(dp_test_files_in(cache), 2);
    struct dp_npy x, y;
    ASSERT_OK(dp_npy_open(info.x_path, &x));
    ASSERT_OK(dp_npy_open(info.y_path, &y));
    ASSERT_TRUE(x.dtype == DP_NPY_F32 && x.ndim == 2 && x.shape[0] == 3 && x.shape[1] == 2);
    ASSERT_TRUE(y.dtype == DP_NPY_I64 && y.ndim == 1 && y.shape[0] == 3);
    for (int i = 0; i < 6; i++) ASSERT_FEQ(dp_npy_get(&x, i), i + 1);
    for (int i = 0; i < 3; i++) ASSERT_FEQ(dp_npy_get(&y, i), i);
    dp_npy_close(&x);
    dp_npy_close(&y);
    /* the arrays train as any others */
    struct dp_dataset ds;
    ASSERT_OK(dp_dataset_open_npy(&ds, info.x_path, info.y_path, &(struct dp_data_opts){0}));
    ASSERT_EQ(ds.n, 3);
    ASSERT_EQ(ds.num_classes, 3);
    dp_dataset_free(&ds);

    /* reused: nothing written, the same paths and label */
    snprintf(first_x, sizeof first_x, "%s", info.x_path);
    snprintf(first_y, sizeof first_y, "%s", info.y_path);
    struct stat st0;
    ASSERT_EQ(stat(first_x, &st0), 0);
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    ASSERT_EQ(info.built, 0);
    ASSERT_EQ(info.rows, 3);
    ASSERT_EQ(info.features, 2);
    ASSERT_TRUE(strcmp(info.label_name, "class") == 0);
    ASSERT_TRUE(strcmp(info.x_path, first_x) == 0 && strcmp(info.y_path, first_y) == 0);
    struct stat st1;
    ASSERT_EQ(stat(first_x, &st1), 0);
    ASSERT_TRUE(st1.st_mtim.tv_sec == st0.st_mtim.tv_sec && st1.st_mtim.tv_nsec == st0.st_mtim.tv_nsec);

    /* the CSV changed (other content, a later mtime): rebuilt under a new name, the old arrays removed */
    write_text(csv, "f1,f2,class\n7,8,1\n9,10,0\n");
    set_mtime(csv, now - 50);
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "or the options changed since its arrays were cached") != NULL);
    ASSERT_EQ(info.rows, 2);
    ASSERT_TRUE(strcmp(info.x_path, first_x) != 0);
    ASSERT_TRUE(access(first_x, F_OK) != 0 && access(first_y, F_OK) != 0);
    ASSERT_EQ(dp_test_files_in(cache), 2);
    ASSERT_OK(dp_npy_open(info.x_path, &x));
    ASSERT_FEQ(dp_npy_get(&x, 0), 7);
    ASSERT_FEQ(dp_npy_get(&x, 3), 10);
    dp_npy_close(&x);

    /* other options: other arrays (float targets), the old ones removed */
    snprintf(first_x, sizeof first_x, "%s", info.x_path);
    o.regression = 1;
    o.label_column = "f1";
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "or the options changed since its arrays were cached") != NULL);
    ASSERT_TRUE(strcmp(info.label_name, "f1") == 0);
    ASSERT_TRUE(access(first_x, F_OK) != 0);
    ASSERT_EQ(dp_test_files_in(cache), 2);
    ASSERT_OK(dp_npy_open(info.y_path, &y));
    ASSERT_TRUE(y.dtype == DP_NPY_F32);
    ASSERT_FEQ(dp_npy_get(&y, 1), 9);
    dp_npy_close(&y);
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    ASSERT_EQ(info.built, 0);

    /* arrays older than the CSV, or broken: rebuilt */
    set_mtime(info.x_path, now - 70);
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "is newer than its cached arrays") != NULL);
    write_text(info.y_path, "not an array");
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "the cached array is unreadable") != NULL);
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    ASSERT_EQ(info.built, 0);
    ASSERT_EQ(dp_test_files_in(cache), 2);
}

TEST(csv_prepare_refusals) {
    const char *dir = scratch();
    char csv[512], cache[512], p[1024], xdg[512];
    const char *pn = p;
    snprintf(csv, sizeof csv, "%s/d.csv", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    struct dp_csv_opts o = dp_csv_default_opts();
    o.cache_dir = cache;
    struct dp_csv_info info;
    ASSERT_ERR(dp_csv_prepare(csv, &o, &info), DP_ENOENT, "d.csv: no such file");
    ASSERT_ERR(dp_csv_prepare(dir, &o, &info), DP_EIO, "not a regular file");
    /* a parse error names the CSV's path, and nothing is written */
    write_text(csv, "a,b\nx,1\n");
    snprintf(p, sizeof p, "%s:2:1: 'x' is not a number", csv);
    ASSERT_ERR(dp_csv_prepare(csv, &o, &info), DP_EFORMAT, pn);
    ASSERT_TRUE(access(cache, F_OK) != 0);
    /* a cache folder that cannot be made (under a file) */
    write_text(csv, "a,b\n1,2\n");
    snprintf(p, sizeof p, "%s/d.csv/cache", dir);
    o.cache_dir = p;
    ASSERT_ERR(dp_csv_prepare(csv, &o, &info), DP_EIO, "cannot create the cache folder");
    ASSERT_TRUE(strstr(dp_errmsg(), p) != NULL);
    /* arrays that cannot be written: a non-empty folder where x's file goes (root cannot
     * rename a file over it either) */
    o.cache_dir = cache;
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    char xp[4096], inner[4200];
    snprintf(xp, sizeof xp, "%s", info.x_path);
    ASSERT_EQ(unlink(xp), 0);
    ASSERT_EQ(mkdir(xp, 0700), 0);
    snprintf(inner, sizeof inner, "%s/keep", xp);
    write_text(inner, "x");
    ASSERT_ERR(dp_csv_prepare(csv, &o, &info), DP_EIO, "cannot write the arrays of");
    ASSERT_TRUE(strstr(dp_errmsg(), cache) != NULL);
    ASSERT_EQ(unlink(inner), 0);
    ASSERT_EQ(rmdir(xp), 0);
    ASSERT_OK(dp_csv_prepare(csv, &o, &info));
    ASSERT_EQ(info.rows, 1);
    /* the default cache folder, from XDG_CACHE_HOME: never the user's real one */
    snprintf(xdg, sizeof xdg, "%s/xdg", dir);
    ASSERT_EQ(setenv("XDG_CACHE_HOME", xdg, 1), 0);
    ASSERT_OK(dp_csv_prepare(csv, NULL, &info));
    snprintf(p, sizeof p, "%s/dptrain/d.csv-", xdg);
    ASSERT_TRUE(strncmp(info.x_path, p, strlen(p)) == 0);
    ASSERT_EQ(unsetenv("XDG_CACHE_HOME"), 0);
    ASSERT_EQ(unsetenv("HOME"), 0);
    ASSERT_ERR(dp_csv_prepare(csv, NULL, &info), DP_ENOENT, "d.csv: no cache folder for its arrays");
}
