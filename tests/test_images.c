/* Image folders (src/data/images.c): PNGs of every colour type and depth
 * and JPEGs (grey, RGB, CMYK), made here with libpng's and libjpeg's own
 * encoders, decoded exactly (PNG) or within a tolerance (JPEG); channel
 * conversion; resize + centre crop against hand-computed values; a folder
 * of classes into the cache (order, labels, reuse, rebuild on a touched,
 * added or removed image); thread-count independence; every refusal;
 * skip_bad. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
/* after stdio.h */
#include <jpeglib.h>
#include <png.h>
#include <zlib.h>

#include "dp/data.h"
#include "test.h"

/* ---- helpers ------------------------------------------------------------------ */

static const char *scratch(void) {
    static char d[512];
    snprintf(d, sizeof d, "%s/img.XXXXXX", dp_test_tmpdir());
    ASSERT_TRUE(mkdtemp(d) != NULL);
    return d;
}

static const char *join(char *out, size_t cap, const char *a, const char *b) {
    snprintf(out, cap, "%s/%s", a, b);
    return out;
}

static void mkdir_in(const char *dir, const char *name) {
    char p[1024];
    ASSERT_EQ(mkdir(join(p, sizeof p, dir, name), 0700), 0);
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    if (n) ASSERT_EQ(fwrite(b, 1, n, f), (long long)n);
    ASSERT_EQ(fclose(f), 0);
}

static uint8_t *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    ASSERT_TRUE(b != NULL);
    ASSERT_EQ(fread(b, 1, (size_t)len, f), len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* A PNG of w x h, colour type ct, `depth` bits; rows of packed samples as
 * PNG stores them (16 bits: big-endian), rowbytes each. */
struct png_spec {
    int w, h, ct, depth, interlace;
    const uint8_t *rows;
    const png_color *pal;
    int npal;
    const uint8_t *trns;
    int ntrns;
};

static void put_png(const char *path, const struct png_spec *s) {
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = p ? png_create_info_struct(p) : NULL;
    ASSERT_TRUE(info != NULL);
    if (setjmp(png_jmpbuf(p))) dp_test_fail(__FILE__, __LINE__, "libpng failed writing %s", path);
    png_init_io(p, f);
    png_set_IHDR(p, info, (png_uint_32)s->w, (png_uint_32)s->h, s->depth, s->ct,
                 s->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (s->pal) png_set_PLTE(p, info, s->pal, s->npal);
    if (s->trns) png_set_tRNS(p, info, s->trns, s->ntrns, NULL);
    png_write_info(p, info);
    size_t rb = png_get_rowbytes(p, info);
    png_bytep rows[64];
    ASSERT_TRUE(s->h <= 64);
    for (int y = 0; y < s->h; y++) rows[y] = (png_bytep)s->rows + (size_t)y * rb;
    png_write_image(p, rows);
    png_write_end(p, NULL);
    png_destroy_write_struct(&p, &info);
    ASSERT_EQ(fclose(f), 0);
}

/* An 8-bit grey or RGB PNG from (h, w, comps) pixels. */
static void put_png8(const char *path, int w, int h, int comps, const uint8_t *px) {
    struct png_spec s = {w, h, comps == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, 8, 0, px, NULL, 0, NULL, 0};
    put_png(path, &s);
}

/* A JPEG of (h, w, comps) pixels: comps 1 grey, 3 RGB, 4 CMYK (stored as given); no chroma
 * subsampling. */
static void put_jpeg(const char *path, int w, int h, int comps, const uint8_t *px, int quality) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h, c.input_components = comps;
    c.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    for (int i = 0; i < c.num_components; i++) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = (JSAMPROW)px + (size_t)c.next_scanline * (size_t)(w * comps);
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    ASSERT_EQ(fclose(f), 0);
}

/* dp_image_decode of the file at path. */
static int decode_file(const char *path, int channels, int64_t H, int64_t W, uint8_t **px, int64_t *c, int64_t *h,
                       int64_t *w) {
    size_t n;
    uint8_t *b = read_bytes(path, &n);
    int rc = dp_image_decode(b, n, path, channels, H, W, px, c, h, w);
    free(b);
    return rc;
}

/* The file's CHW pixels decoded with `channels` at the own size: expected exactly. */
static void expect_pixels(const char *path, int channels, int64_t C, int64_t H, int64_t W, const uint8_t *want) {
    uint8_t *px;
    int64_t c, h, w;
    ASSERT_OK(decode_file(path, channels, 0, 0, &px, &c, &h, &w));
    ASSERT_EQ(c, C);
    ASSERT_EQ(h, H);
    ASSERT_EQ(w, W);
    for (int64_t i = 0; i < C * H * W; i++)
        if (px[i] != want[i])
            dp_test_fail(__FILE__, __LINE__, "%s: byte %lld is %d, expected %d", path, (long long)i, px[i], want[i]);
    dp_free(px);
}

static int luma(int r, int g, int b) { return (299 * r + 587 * g + 114 * b + 500) / 1000; }

static void set_mtime(const char *path, time_t sec, long nsec) {
    struct timespec ts[2] = {{sec, nsec}, {sec, nsec}};
    ASSERT_EQ(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static struct dp_images_opts opts_in(const char *cache) {
    struct dp_images_opts o = dp_images_default_opts();
    o.cache_dir = cache;
    o.threads = 2;
    return o;
}

/* ---- decoding ----------------------------------------------------------------- */

TEST(image_decode_png_kinds) {
    const char *d = scratch();
    char p[600];
    /* grey 8-bit 2x3: as is; as RGB replicated */
    const uint8_t g[6] = {0, 1, 127, 128, 254, 255};
    put_png8(join(p, sizeof p, d, "g.png"), 3, 2, 1, g);
    expect_pixels(p, 0, 1, 2, 3, g);
    uint8_t g3[18];
    for (int c = 0; c < 3; c++) memcpy(g3 + 6 * c, g, 6);
    expect_pixels(p, 3, 3, 2, 3, g3);

    /* RGB 2x2: planar C x H x W; grey by the BT.601 luma, rounded half up */
    const uint8_t rgb[12] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
    put_png8(join(p, sizeof p, d, "rgb.png"), 2, 2, 3, rgb);
    uint8_t chw[12], y[4];
    for (int i = 0; i < 4; i++) {
        for (int c = 0; c < 3; c++) chw[c * 4 + i] = rgb[3 * i + c];
        y[i] = (uint8_t)luma(rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2]);
    }
    expect_pixels(p, 0, 3, 2, 2, chw);
    expect_pixels(p, 1, 1, 2, 2, y);
    ASSERT_EQ(y[0], 76);  /* 0.299 * 255 = 76.245 */
    ASSERT_EQ(y[1], 150); /* 149.685 */
    ASSERT_EQ(y[2], 29);  /* 29.07 */
    ASSERT_EQ(y[3], 18);  /* 2.99 + 11.74 + 3.42 = 18.15 */

    /* RGBA: alpha dropped, the colours as stored */
    const uint8_t rgba[8] = {200, 100, 50, 0, 1, 2, 3, 255};
    struct png_spec s = {2, 1, PNG_COLOR_TYPE_RGBA, 8, 0, rgba, NULL, 0, NULL, 0};
    put_png(join(p, sizeof p, d, "rgba.png"), &s);
    const uint8_t rgba_want[6] = {200, 1, 100, 2, 50, 3};
    expect_pixels(p, 0, 3, 1, 2, rgba_want);
    /* grey + alpha */
    const uint8_t ga[4] = {9, 0, 250, 128};
    s = (struct png_spec){2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, 0, ga, NULL, 0, NULL, 0};
    put_png(join(p, sizeof p, d, "ga.png"), &s);
    expect_pixels(p, 0, 1, 1, 2, (const uint8_t[]){9, 250});

    /* palette, colour: expanded to RGB, tRNS ignored; 4-bit indices packed */
    const png_color pal[3] = {{10, 20, 30}, {40, 50, 60}, {255, 255, 255}};
    const uint8_t idx[2] = {0x12, 0x00}; /* a 3x1 row at 4 bits: 1, 2, 0 */
    const uint8_t trns[1] = {0};
    s = (struct png_spec){3, 1, PNG_COLOR_TYPE_PALETTE, 4, 0, idx, pal, 3, trns, 1};
    put_png(join(p, sizeof p, d, "pal.png"), &s);
    expect_pixels(p, 0, 3, 1, 3, (const uint8_t[]){40, 255, 10, 50, 255, 20, 60, 255, 30});
    /* palette of greys only: no colour, one channel */
    const png_color gpal[2] = {{7, 7, 7}, {200, 200, 200}};
    const uint8_t gidx[2] = {1, 0};
    s = (struct png_spec){2, 1, PNG_COLOR_TYPE_PALETTE, 8, 0, gidx, gpal, 2, NULL, 0};
    put_png(join(p, sizeof p, d, "gpal.png"), &s);
    expect_pixels(p, 0, 1, 1, 2, (const uint8_t[]){200, 7});

    /* 16-bit grey and RGB: v * 255 / 65535 rounded */
    const uint16_t v16[4] = {0, 257 * 100 + 128, 65535, 32767};
    uint8_t be[8];
    for (int i = 0; i < 4; i++) be[2 * i] = (uint8_t)(v16[i] >> 8), be[2 * i + 1] = (uint8_t)v16[i];
    s = (struct png_spec){4, 1, PNG_COLOR_TYPE_GRAY, 16, 0, be, NULL, 0, NULL, 0};
    put_png(join(p, sizeof p, d, "g16.png"), &s);
    uint8_t w16[4];
    for (int i = 0; i < 4; i++) w16[i] = (uint8_t)floor(v16[i] * 255.0 / 65535.0 + 0.5);
    ASSERT_EQ(w16[1], 100); /* 25828 / 257 = 100.498 */
    expect_pixels(p, 0, 1, 1, 4, w16);
    uint8_t be6[12];
    for (int i = 0; i < 6; i++) be6[2 * i] = (uint8_t)(v16[i % 4] >> 8), be6[2 * i + 1] = (uint8_t)v16[i % 4];
    s = (struct png_spec){2, 1, PNG_COLOR_TYPE_RGB, 16, 0, be6, NULL, 0, NULL, 0};
    put_png(join(p, sizeof p, d, "rgb16.png"), &s);
    expect_pixels(p, 0, 3, 1, 2, (const uint8_t[]){w16[0], w16[3], w16[1], w16[0], w16[2], w16[1]});

    /* 1-bit grey (0 -> 0, 1 -> 255) and an interlaced image */
    const uint8_t bits[1] = {0xa0}; /* 1, 0, 1 */
    s = (struct png_spec){3, 1, PNG_COLOR_TYPE_GRAY, 1, 0, bits, NULL, 0, NULL, 0};
    put_png(join(p, sizeof p, d, "g1.png"), &s);
    expect_pixels(p, 0, 1, 1, 3, (const uint8_t[]){255, 0, 255});
    uint8_t big[9 * 9];
    for (int i = 0; i < 81; i++) big[i] = (uint8_t)(i * 3);
    s = (struct png_spec){9, 9, PNG_COLOR_TYPE_GRAY, 8, 1, big, NULL, 0, NULL, 0};
    put_png(join(p, sizeof p, d, "adam7.png"), &s);
    expect_pixels(p, 0, 1, 9, 9, big);
}

TEST(image_decode_jpeg) {
    const char *d = scratch();
    char p[600];
    enum { W = 16, H = 8 };
    uint8_t rgb[H * W * 3], grey[H * W];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint8_t *q = rgb + 3 * (y * W + x);
            q[0] = (uint8_t)(16 * x), q[1] = (uint8_t)(30 * y), q[2] = (uint8_t)(200 - 8 * x);
            grey[y * W + x] = (uint8_t)(10 * x + 5 * y);
        }
    uint8_t *px;
    int64_t c, h, w;
    /* RGB at quality 100, no subsampling: within a few levels */
    put_jpeg(join(p, sizeof p, d, "rgb.jpg"), W, H, 3, rgb, 100);
    ASSERT_OK(decode_file(p, 0, 0, 0, &px, &c, &h, &w));
    ASSERT_TRUE(c == 3 && h == H && w == W);
    for (int i = 0; i < H * W; i++)
        for (int k = 0; k < 3; k++) ASSERT_NEAR(px[k * H * W + i], rgb[3 * i + k], 4);
    dp_free(px);
    /* as grey: the luma of the decoded RGB */
    ASSERT_OK(decode_file(p, 1, 0, 0, &px, &c, &h, &w));
    ASSERT_EQ(c, 1);
    for (int i = 0; i < H * W; i++) ASSERT_NEAR(px[i], luma(rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2]), 4);
    dp_free(px);
    /* grey JPEG: one channel, replicated into three */
    put_jpeg(join(p, sizeof p, d, "grey.jpeg"), W, H, 1, grey, 100);
    ASSERT_OK(decode_file(p, 0, 0, 0, &px, &c, &h, &w));
    ASSERT_EQ(c, 1);
    for (int i = 0; i < H * W; i++) ASSERT_NEAR(px[i], grey[i], 2);
    dp_free(px);
    ASSERT_OK(decode_file(p, 3, 0, 0, &px, &c, &h, &w));
    ASSERT_EQ(c, 3);
    for (int i = 0; i < H * W; i++) ASSERT_TRUE(px[i] == px[H * W + i] && px[i] == px[2 * H * W + i]);
    dp_free(px);
    /* CMYK (Adobe's inverted inks): (255, 0, 0, 255) is red, (255, 255, 255, 128) mid grey */
    uint8_t cmyk[8 * 8 * 4];
    for (int i = 0; i < 64; i++) {
        const uint8_t *v = i < 32 ? (const uint8_t[]){255, 0, 0, 255} : (const uint8_t[]){255, 255, 255, 128};
        memcpy(cmyk + 4 * i, v, 4);
    }
    put_jpeg(join(p, sizeof p, d, "cmyk.jpg"), 8, 8, 4, cmyk, 100);
    ASSERT_OK(decode_file(p, 0, 0, 0, &px, &c, &h, &w));
    ASSERT_EQ(c, 3);
    ASSERT_NEAR(px[0], 255, 3);
    ASSERT_NEAR(px[64], 0, 3);
    ASSERT_NEAR(px[128], 0, 3);
    for (int k = 0; k < 3; k++) ASSERT_NEAR(px[k * 64 + 63], 128, 3);
    dp_free(px);
}

/* The resize + crop on gradients whose bilinear samples are exact. */
TEST(image_resize_crop_exact) {
    const char *d = scratch();
    char p[600];
    uint8_t *px;
    int64_t c, h, w;
    /* 2x2 -> 4x4: source coordinates (Y + 0.5) / 2 - 0.5 = -0.25 (clamped to 0), 0.25, 0.75, 1.25
     * (y1 clamped), so the weights of the second row / column are 0, .25, .75, 1 */
    put_png8(join(p, sizeof p, d, "sq.png"), 2, 2, 1, (const uint8_t[]){0, 100, 200, 240});
    ASSERT_OK(decode_file(p, 0, 4, 4, &px, &c, &h, &w));
    ASSERT_TRUE(c == 1 && h == 4 && w == 4);
    /* rows 0 and 3 are the source's rows interpolated along x; row 1 = .75 row 0 + .25 row 3,
     * row 2 = .25 row 0 + .75 row 3: (1, 1) = .75 * 25 + .25 * 210 = 71.25, (2, 2) = .25 * 75 +
     * .75 * 230 = 191.25, (1, 2) = .75 * 75 + .25 * 230 = 113.75 */
    const uint8_t sq[16] = {0, 25, 75, 100, 50, 71, 114, 135, 150, 164, 191, 205, 200, 210, 230, 240};
    for (int i = 0; i < 16; i++) ASSERT_EQ(px[i], sq[i]);
    dp_free(px);

    /* 2x4 (rows = [0 40 80 120], [100 140 180 220]) -> 2x2: scale 1 covers it, so no resampling,
     * and the crop keeps columns 1..2 */
    const uint8_t wide[8] = {0, 40, 80, 120, 100, 140, 180, 220};
    put_png8(join(p, sizeof p, d, "wide.png"), 4, 2, 1, wide);
    ASSERT_OK(decode_file(p, 0, 2, 2, &px, &c, &h, &w));
    ASSERT_TRUE(px[0] == 40 && px[1] == 80 && px[2] == 140 && px[3] == 180);
    dp_free(px);
    /* 2x4 -> 4x4: scale 2 (the shorter side, 2, becomes 4), resized to 4x8, columns 2..5 kept:
     * source columns X / 2 - 0.25 = 0.75, 1.25, 1.75, 2.25, rows 0, .25, .75, 1; the image is
     * 100 row + 40 column, so each value is 100 fy + 40 sx */
    ASSERT_OK(decode_file(p, 0, 4, 4, &px, &c, &h, &w));
    const uint8_t grad[16] = {30, 50, 70, 90, 55, 75, 95, 115, 105, 125, 145, 165, 130, 150, 170, 190};
    for (int i = 0; i < 16; i++) ASSERT_EQ(px[i], grad[i]);
    dp_free(px);
    /* the same image as 3 channels, and a tall target: 4 rows of 1 column from 2x4: scale
     * max(4 / 2, 1 / 4) = 2, 4x8, column (8 - 1) / 2 = 3: sx = 1.25 -> 50 + 100 fy */
    ASSERT_OK(decode_file(p, 3, 4, 1, &px, &c, &h, &w));
    ASSERT_TRUE(c == 3 && h == 4 && w == 1);
    const uint8_t tall[4] = {50, 75, 125, 150};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++) ASSERT_EQ(px[k * 4 + i], tall[i]);
    dp_free(px);
    /* shrinking 4x8 (40 row + 10 column) -> 2x2: scale 1/2, resized to 2x4, columns 1..2 kept:
     * source columns (X + .5) 2 - .5 = 2.5, 4.5, rows 0.5, 2.5 (no antialiasing) */
    uint8_t g48[32];
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 8; x++) g48[y * 8 + x] = (uint8_t)(40 * y + 10 * x);
    put_png8(join(p, sizeof p, d, "g48.png"), 8, 4, 1, g48);
    ASSERT_OK(decode_file(p, 0, 2, 2, &px, &c, &h, &w));
    const uint8_t shrunk[4] = {20 + 25, 20 + 45, 100 + 25, 100 + 45};
    for (int i = 0; i < 4; i++) ASSERT_EQ(px[i], shrunk[i]);
    dp_free(px);
}

TEST(image_decode_refusals) {
    uint8_t *px = (uint8_t *)1;
    int64_t c, h, w;
    ASSERT_ERR(dp_image_decode((const uint8_t *)"", 0, "e.png", 0, 0, 0, &px, &c, &h, &w), DP_EFORMAT,
               "e.png: not a PNG/JPEG image");
    ASSERT_TRUE(px == NULL);
    ASSERT_ERR(dp_image_decode((const uint8_t *)"GIF89a....", 10, "x.gif", 0, 0, 0, &px, &c, &h, &w), DP_EFORMAT,
               "x.gif: not a PNG/JPEG image");
    const uint8_t b[1] = {0};
    ASSERT_ERR(dp_image_decode(b, 1, "b", 2, 0, 0, &px, &c, &h, &w), DP_EINVAL, "channels must be 0, 1 or 3");
    ASSERT_ERR(dp_image_decode(b, 1, "b", 0, 4, 0, &px, &c, &h, &w), DP_EINVAL, "give both 0 or both");
    ASSERT_ERR(dp_image_decode(b, 1, "b", 0, 70000, 70000, &px, &c, &h, &w), DP_EINVAL, "image size");
    /* a PNG whose header claims 20000 x 30000 pixels: refused before anything is allocated */
    const char *d = scratch();
    char p[600];
    uint8_t one[1] = {0};
    put_png8(join(p, sizeof p, d, "one.png"), 1, 1, 1, one);
    size_t n;
    uint8_t *f = read_bytes(p, &n);
    /* IHDR's width and height at bytes 16..23; its CRC (bytes 29..32) is then wrong: libpng
     * checks it while reading the header, so fix it */
    /* width 30000 (0x7530), height 20000 (0x4e20), big-endian */
    const uint8_t wh[8] = {0, 0, 0x75, 0x30, 0, 0, 0x4e, 0x20};
    memcpy(f + 16, wh, 8);
    uint32_t crc = (uint32_t)crc32(0, f + 12, 17);
    f[29] = (uint8_t)(crc >> 24), f[30] = (uint8_t)(crc >> 16), f[31] = (uint8_t)(crc >> 8), f[32] = (uint8_t)crc;
    ASSERT_ERR(dp_image_decode(f, n, "huge.png", 0, 0, 0, &px, &c, &h, &w), DP_EFORMAT,
               "huge.png: 20000x30000 (HxW) is too large (more than 67108864 pixels)");
    /* truncated: in its data, and in its header */
    put_png8(p, 1, 1, 1, one);
    free(f);
    f = read_bytes(p, &n);
    ASSERT_ERR(dp_image_decode(f, n - 20, "cut.png", 0, 0, 0, &px, &c, &h, &w), DP_EFORMAT,
               "cut.png: corrupt or truncated PNG: ");
    ASSERT_ERR(dp_image_decode(f, 20, "cut.png", 0, 0, 0, &px, &c, &h, &w), DP_EFORMAT,
               "cut.png: corrupt or truncated PNG: ");
    f[42] ^= 0xff; /* in IDAT's data: a CRC error */
    ASSERT_ERR(dp_image_decode(f, n, "crc.png", 0, 0, 0, &px, &c, &h, &w), DP_EFORMAT,
               "crc.png: corrupt or truncated PNG: ");
    free(f);
    uint8_t px8[64];
    memset(px8, 99, sizeof px8);
    put_jpeg(p, 8, 8, 1, px8, 90);
    f = read_bytes(p, &n);
    ASSERT_ERR(dp_image_decode(f, n - 30, "cut.jpg", 0, 0, 0, &px, &c, &h, &w), DP_EFORMAT,
               "cut.jpg: corrupt or truncated JPEG: Premature end of JPEG file");
    ASSERT_ERR(dp_image_decode(f, 40, "cut.jpg", 0, 0, 0, &px, &c, &h, &w), DP_EFORMAT,
               "cut.jpg: corrupt or truncated JPEG: ");
    free(f);
    ASSERT_ERR(dp_image_decode((const uint8_t *)"\xff\xd8\xff\xe0junk", 8, "j.jpg", 0, 0, 0, &px, &c, &h, &w),
               DP_EFORMAT, "j.jpg: corrupt or truncated JPEG: ");
}

/* ---- folders ------------------------------------------------------------------ */

/* DIR/cat (2 images), DIR/ant (1), DIR/bee (2, one a JPEG), made out of order, and what is
 * left out: hidden files and folders, other files, a nested folder. */
static void make_zoo(const char *dir) {
    char p[1024];
    mkdir_in(dir, "cat");
    mkdir_in(dir, "ant");
    mkdir_in(dir, "bee");
    mkdir_in(dir, ".git");
    mkdir_in(dir, "cat/sub");
    put_png8(join(p, sizeof p, dir, "cat/b.PNG"), 2, 2, 1, (const uint8_t[]){1, 2, 3, 4});
    const uint8_t rgb[12] = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120};
    put_png8(join(p, sizeof p, dir, "cat/a.png"), 2, 2, 3, rgb);
    put_png8(join(p, sizeof p, dir, "ant/z.png"), 2, 2, 1, (const uint8_t[]){200, 201, 202, 203});
    put_png8(join(p, sizeof p, dir, "bee/1.png"), 2, 2, 1, (const uint8_t[]){5, 6, 7, 8});
    uint8_t flat[4] = {77, 77, 77, 77};
    put_jpeg(join(p, sizeof p, dir, "bee/2.jpeg"), 2, 2, 1, flat, 100);
    put_png8(join(p, sizeof p, dir, "cat/.hidden.png"), 1, 1, 1, flat);
    put_png8(join(p, sizeof p, dir, "cat/sub/x.png"), 1, 1, 1, flat);
    put_png8(join(p, sizeof p, dir, ".git/x.png"), 1, 1, 1, flat);
    write_bytes(join(p, sizeof p, dir, "cat/notes.txt"), "not an image", 12);
    write_bytes(join(p, sizeof p, dir, "README"), "top-level file", 14);
}

TEST(images_prepare_folder) {
    const char *d = scratch();
    char dir[600], cache[600];
    join(dir, sizeof dir, d, "zoo set");
    join(cache, sizeof cache, d, "cache/x/y");
    ASSERT_EQ(mkdir(dir, 0700), 0);
    make_zoo(dir);
    struct dp_images_opts o = opts_in(cache);
    struct dp_images_info info;
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "no cached arrays of") != NULL);
    ASSERT_EQ(info.images, 5);
    ASSERT_EQ(info.classes, 3);
    ASSERT_EQ(info.channels, 3); /* cat/a.png has colour */
    ASSERT_TRUE(info.height == 2 && info.width == 2 && info.skipped == 0 && info.first_bad[0] == 0);
    char want[700];
    snprintf(want, sizeof want, "%s/zoo_set-", cache);
    ASSERT_TRUE(strncmp(info.x_path, want, strlen(want)) == 0);
    ASSERT_EQ(strlen(info.x_path), strlen(want) + 16 + 1 + 16 + strlen(".x.npy"));
    ASSERT_TRUE(strncmp(info.x_path, info.y_path, strlen(info.x_path) - 5) == 0);
    ASSERT_TRUE(strncmp(info.x_path, info.classes_path, strlen(info.x_path) - 5) == 0);
    ASSERT_TRUE(strcmp(info.classes_path + strlen(info.classes_path) - 12, ".classes.txt") == 0);
    ASSERT_EQ(dp_test_files_in(cache), 3);
    char *names;
    ASSERT_OK(dp_images_class_names(&info, &names));
    ASSERT_TRUE(strcmp(names, "ant\nbee\ncat\n") == 0);
    dp_free(names);
    /* order: ant/z, bee/1, bee/2.jpeg, cat/a, cat/b.PNG ('a' < 'b') */
    struct dp_npy x, y;
    ASSERT_OK(dp_npy_open(info.x_path, &x));
    ASSERT_OK(dp_npy_open(info.y_path, &y));
    ASSERT_TRUE(x.dtype == DP_NPY_U8 && x.ndim == 4 && x.shape[0] == 5 && x.shape[1] == 3 && x.shape[2] == 2 &&
                x.shape[3] == 2);
    ASSERT_EQ((size_t)((const uint8_t *)x.data - (const uint8_t *)x.map) % 64, 0);
    ASSERT_TRUE(y.dtype == DP_NPY_I64 && y.ndim == 1 && y.shape[0] == 5);
    const int64_t labels[5] = {0, 1, 1, 2, 2};
    for (int i = 0; i < 5; i++) ASSERT_FEQ(dp_npy_get(&y, i), labels[i]);
    const uint8_t *px = x.data;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 4; i++) {
            ASSERT_EQ(px[0 * 12 + k * 4 + i], 200 + i);        /* ant/z, grey replicated */
            ASSERT_EQ(px[1 * 12 + k * 4 + i], 5 + i);          /* bee/1 */
            ASSERT_NEAR(px[2 * 12 + k * 4 + i], 77, 1);         /* bee/2.jpeg */
            ASSERT_EQ(px[3 * 12 + k * 4 + i], 10 + 30 * i + 10 * k); /* cat/a: RGB, planar */
            ASSERT_EQ(px[4 * 12 + k * 4 + i], 1 + i);          /* cat/b.PNG */
        }
    }
    dp_npy_close(&x);
    dp_npy_close(&y);
    /* the arrays train as any others */
    struct dp_dataset ds;
    ASSERT_OK(dp_dataset_open_npy(&ds, info.x_path, info.y_path, &(struct dp_data_opts){0}));
    ASSERT_TRUE(ds.n == 5 && ds.C == 3 && ds.H == 2 && ds.W == 2 && ds.num_classes == 3);
    float s[12];
    dp_dataset_read(&ds, 3, s);
    ASSERT_FEQ(s[1], 40);
    dp_dataset_free(&ds);

    /* grey forced, and a size given: other arrays, the old ones removed; a trailing '/' is the
     * same folder */
    char slash[700];
    snprintf(slash, sizeof slash, "%s/", dir);
    o.channels = 1, o.height = 1, o.width = 1;
    ASSERT_OK(dp_images_prepare(slash, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "or the options changed since its arrays were cached") != NULL);
    ASSERT_TRUE(info.channels == 1 && info.height == 1 && info.width == 1 && info.images == 5);
    ASSERT_EQ(dp_test_files_in(cache), 3);
    ASSERT_OK(dp_npy_open(info.x_path, &x));
    /* cat/a (2x2 -> 1x1): the centre of 4 pixels, each weighted 1/4, of the luma */
    int l[4], sum = 0;
    for (int i = 0; i < 4; i++) l[i] = luma(10 + 30 * i, 20 + 30 * i, 30 + 30 * i), sum += l[i];
    ASSERT_EQ(((const uint8_t *)x.data)[3], (int)floor(sum / 4.0 + 0.5));
    dp_npy_close(&x);
}

TEST(images_cache_reused_and_rebuilt) {
    const char *d = scratch();
    char dir[600], cache[600], p[1024], first[4096];
    join(dir, sizeof dir, d, "set");
    join(cache, sizeof cache, d, "cache");
    ASSERT_EQ(mkdir(dir, 0700), 0);
    make_zoo(dir);
    struct dp_images_opts o = opts_in(cache);
    struct dp_images_info info;
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_EQ(info.built, 1);
    snprintf(first, sizeof first, "%s", info.x_path);
    struct stat st0, st1;
    ASSERT_EQ(stat(first, &st0), 0);
    /* reused: nothing written */
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_EQ(info.built, 0);
    ASSERT_TRUE(info.images == 5 && info.classes == 3 && info.channels == 3 && info.height == 2 && info.skipped == 0);
    ASSERT_TRUE(strcmp(info.x_path, first) == 0);
    ASSERT_EQ(stat(first, &st1), 0);
    ASSERT_TRUE(st1.st_mtim.tv_sec == st0.st_mtim.tv_sec && st1.st_mtim.tv_nsec == st0.st_mtim.tv_nsec);
    /* threads do not change the arrays' name */
    o.threads = 1;
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_EQ(info.built, 0);

    /* an image touched (its mtime only): rebuilt under another K, the old files removed */
    set_mtime(join(p, sizeof p, dir, "bee/1.png"), 1000000000, 5);
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "set's images or the options changed since its arrays were cached") != NULL);
    ASSERT_TRUE(strcmp(info.x_path, first) != 0 && access(first, F_OK) != 0);
    ASSERT_EQ(dp_test_files_in(cache), 3);
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_EQ(info.built, 0);
    /* added, then removed */
    put_png8(join(p, sizeof p, dir, "ant/zz.png"), 2, 2, 1, (const uint8_t[]){9, 9, 9, 9});
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_TRUE(info.built == 1 && info.images == 6);
    struct dp_npy y;
    ASSERT_OK(dp_npy_open(info.y_path, &y));
    ASSERT_FEQ(dp_npy_get(&y, 1), 0);
    dp_npy_close(&y);
    ASSERT_EQ(unlink(p), 0);
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_TRUE(info.built == 1 && info.images == 5);
    ASSERT_EQ(dp_test_files_in(cache), 3);
    /* a new class */
    mkdir_in(dir, "dog");
    put_png8(join(p, sizeof p, dir, "dog/d.png"), 2, 2, 1, (const uint8_t[]){1, 1, 1, 1});
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_TRUE(info.built == 1 && info.images == 6 && info.classes == 4);
    /* broken arrays, a missing classes file: rebuilt */
    write_bytes(info.x_path, "not an array", 12);
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_TRUE(strstr(info.why, "the cached arrays are unreadable") != NULL);
    ASSERT_EQ(unlink(info.classes_path), 0);
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_EQ(info.built, 1);
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_EQ(info.built, 0);
    ASSERT_EQ(dp_test_files_in(cache), 3);
}

/* 1, 3 and 7 threads write the same bytes (with a resize and a skipped image). */
TEST(images_threads_identical) {
    const char *d = scratch();
    char dir[600], p[1024];
    join(dir, sizeof dir, d, "many");
    ASSERT_EQ(mkdir(dir, 0700), 0);
    uint8_t px[7 * 9 * 3];
    for (int k = 0; k < 3; k++) {
        char cls[8];
        snprintf(cls, sizeof cls, "c%d", k);
        mkdir_in(dir, cls);
        for (int i = 0; i < 13; i++) {
            for (int j = 0; j < (int)sizeof px; j++) px[j] = (uint8_t)(j * 7 + i * 31 + k * 5);
            char name[64];
            snprintf(name, sizeof name, "%s/%02d.%s", cls, i, i % 3 ? "png" : "jpg");
            join(p, sizeof p, dir, name);
            if (i % 3) put_png8(p, 9, 7, 3, px);
            else put_jpeg(p, 9, 7, 3, px, 80);
        }
    }
    write_bytes(join(p, sizeof p, dir, "c1/05.png"), "broken", 6); /* skipped */
    uint8_t *first = NULL;
    size_t first_n = 0;
    const int threads[3] = {1, 3, 7};
    for (int t = 0; t < 3; t++) {
        char cache[700];
        snprintf(cache, sizeof cache, "%s/cache%d", d, t);
        struct dp_images_opts o = opts_in(cache);
        o.threads = threads[t], o.skip_bad = 1, o.height = 5, o.width = 4;
        struct dp_images_info info;
        ASSERT_OK(dp_images_prepare(dir, &o, &info));
        ASSERT_TRUE(info.built == 1 && info.images == 38 && info.skipped == 1);
        size_t n;
        uint8_t *b = read_bytes(info.x_path, &n);
        if (!first) {
            first = b, first_n = n;
            continue;
        }
        ASSERT_EQ(n, first_n);
        ASSERT_TRUE(memcmp(b, first, n) == 0);
        free(b);
    }
    free(first);
}

TEST(images_refusals) {
    const char *d = scratch();
    char dir[600], cache[600], p[1024], m[2000];
    const char *mp = m;
    join(cache, sizeof cache, d, "cache");
    struct dp_images_opts o = opts_in(cache);
    struct dp_images_info info;
    join(dir, sizeof dir, d, "none");
    snprintf(m, sizeof m, "%s: no such folder", dir);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_ENOENT, mp);
    write_bytes(dir, "x", 1);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, "not a folder");
    /* no class folders; class folders without images */
    join(dir, sizeof dir, d, "empty");
    ASSERT_EQ(mkdir(dir, 0700), 0);
    snprintf(m, sizeof m, "%s: no images: expected %s/<class>/<image>.png|.jpg|.jpeg (a subfolder per class)", dir,
             dir);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, mp);
    put_png8(join(p, sizeof p, dir, "top.png"), 1, 1, 1, (const uint8_t[]){0});
    mkdir_in(dir, "a");
    write_bytes(join(p, sizeof p, dir, "a/x.gif"), "GIF", 3);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, mp);
    /* one empty class among others: named */
    mkdir_in(dir, "b");
    put_png8(join(p, sizeof p, dir, "b/1.png"), 1, 1, 1, (const uint8_t[]){0});
    snprintf(m, sizeof m, "%s/a: a class folder with no images (*.png, *.jpg, *.jpeg)", dir);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, mp);
    ASSERT_TRUE(access(cache, F_OK) != 0);
    /* not an image, corrupt, truncated: named, nothing written */
    ASSERT_EQ(rename(p, join(m, sizeof m, dir, "a/1.png")), 0);
    write_bytes(join(p, sizeof p, dir, "b/0.jpg"), "GIF89a", 6);
    snprintf(m, sizeof m, "%s/b/0.jpg: not a PNG/JPEG image", dir);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EFORMAT, mp);
    uint8_t g[64];
    memset(g, 50, sizeof g);
    put_jpeg(p, 8, 8, 1, g, 90);
    size_t n;
    uint8_t *b = read_bytes(p, &n);
    write_bytes(p, b, n - 40);
    free(b);
    snprintf(m, sizeof m, "%s/b/0.jpg: corrupt or truncated JPEG: Premature end of JPEG file", dir);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EFORMAT, mp);
    ASSERT_TRUE(access(cache, F_OK) != 0);
    /* sizes that differ, without a size: both named */
    put_jpeg(p, 8, 8, 1, g, 90);
    snprintf(m, sizeof m,
             "%s/b/0.jpg is 8x8 (HxW) but %s/a/1.png is 1x1: the images differ in size; give --image-size H,W to "
             "resize and centre-crop them all to H x W",
             dir, dir);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EMISMATCH, mp);
    o.height = o.width = 3;
    ASSERT_OK(dp_images_prepare(dir, &o, &info));
    ASSERT_TRUE(info.images == 2 && info.height == 3 && info.channels == 1);
    /* options */
    o.channels = 2;
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, "channels must be 0 (from the images), 1 or 3");
    o.channels = 0, o.height = 0;
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, "give both 0 or both 1..65535");
    o.height = 3, o.threads = -1;
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, "threads must be");
    o.threads = 0, o.skip_bad = 2;
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, "skip_bad must be 0 or 1");
    ASSERT_ERR(dp_images_prepare(NULL, &o, &info), DP_EINVAL, "NULL argument");
    /* a cache folder that cannot be made */
    o.skip_bad = 0;
    o.cache_dir = join(p, sizeof p, dir, "a/1.png/cache"); /* under a file */
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EIO, "cannot create the cache folder");
}

/* 65537 subfolders: symlinks to one folder (followed, and cheaper to make than folders). */
TEST(images_too_many_classes) {
    const char *d = scratch();
    char dir[600], p[1024], cache[600], one[600];
    join(dir, sizeof dir, d, "classes");
    join(cache, sizeof cache, d, "cache");
    join(one, sizeof one, d, "one");
    ASSERT_EQ(mkdir(dir, 0700), 0);
    ASSERT_EQ(mkdir(one, 0700), 0);
    for (int i = 0; i <= DP_DATASET_MAX_CLASSES; i++) {
        snprintf(p, sizeof p, "%s/%05d", dir, i);
        ASSERT_EQ(symlink(one, p), 0);
    }
    struct dp_images_opts o = opts_in(cache);
    struct dp_images_info info;
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, "more than 65536 classes (subfolders)");
    /* 65536 are fine as far as the count goes (the shared folder has no images) */
    ASSERT_EQ(unlink(p), 0);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EINVAL, "no images");
}

TEST(images_skip_bad) {
    const char *d = scratch();
    char dir[600], cache[600], p[1024];
    join(dir, sizeof dir, d, "bad");
    join(cache, sizeof cache, d, "cache");
    ASSERT_EQ(mkdir(dir, 0700), 0);
    mkdir_in(dir, "a");
    mkdir_in(dir, "b");
    put_png8(join(p, sizeof p, dir, "a/1.png"), 2, 1, 1, (const uint8_t[]){1, 2});
    /* a/2.png: its header reads, its data is cut short (found by the second pass) */
    uint8_t big[64 * 64];
    for (int i = 0; i < 64 * 64; i++) big[i] = (uint8_t)(i * 131 + (i >> 6) * 17);
    put_png8(join(p, sizeof p, dir, "a/2.png"), 64, 64, 1, big);
    size_t n;
    uint8_t *b = read_bytes(p, &n);
    write_bytes(p, b, n / 2);
    free(b);
    put_png8(join(p, sizeof p, dir, "a/3.png"), 2, 1, 1, (const uint8_t[]){3, 4});
    write_bytes(join(p, sizeof p, dir, "b/0.jpg"), "not a jpeg", 10); /* found by the first */
    put_png8(join(p, sizeof p, dir, "b/1.png"), 2, 1, 1, (const uint8_t[]){5, 6});
    struct dp_images_opts o = opts_in(cache);
    struct dp_images_info info;
    char m[2000];
    const char *mp = m;
    /* without skip_bad: b/0.jpg, found by the first pass, before a/2.png and before the sizes are compared */
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EFORMAT, "b/0.jpg: not a PNG/JPEG image");
    o.height = 1, o.width = 2; /* a/2.png is 64x64 */
    o.skip_bad = 1;
    for (int t = 1; t <= 4; t++) {
        o.threads = t;
        ASSERT_OK(dp_images_prepare(dir, &o, &info));
        ASSERT_EQ(info.images, 3);
        ASSERT_EQ(info.skipped, 2);
        snprintf(m, sizeof m, "%s/a/2.png", dir);
        ASSERT_TRUE(strcmp(info.first_bad, m) == 0); /* the first in image order, though found last */
        snprintf(m, sizeof m, "%s/a/2.png: corrupt or truncated PNG: ", dir);
        ASSERT_TRUE(strstr(info.first_bad_error, mp) == info.first_bad_error);
        struct dp_npy x, y;
        ASSERT_OK(dp_npy_open(info.x_path, &x));
        ASSERT_OK(dp_npy_open(info.y_path, &y));
        ASSERT_TRUE(x.shape[0] == 3 && x.shape[1] == 1 && y.shape[0] == 3);
        ASSERT_EQ(x.map_len, (size_t)((const uint8_t *)x.data - (const uint8_t *)x.map) + 6);
        const uint8_t want[6] = {1, 2, 3, 4, 5, 6};
        for (int i = 0; i < 6; i++) ASSERT_EQ(((const uint8_t *)x.data)[i], want[i]);
        ASSERT_TRUE(dp_npy_get(&y, 0) == 0 && dp_npy_get(&y, 1) == 0 && dp_npy_get(&y, 2) == 1);
        dp_npy_close(&x);
        dp_npy_close(&y);
        /* reused: the count of skipped images from the listing */
        ASSERT_OK(dp_images_prepare(dir, &o, &info));
        ASSERT_TRUE(info.built == 0 && info.images == 3 && info.skipped == 2);
        ASSERT_EQ(unlink(info.x_path), 0);
    }
    /* every image bad */
    write_bytes(join(p, sizeof p, dir, "a/1.png"), "x", 1);
    write_bytes(join(p, sizeof p, dir, "a/3.png"), "x", 1);
    write_bytes(join(p, sizeof p, dir, "b/1.png"), "x", 1);
    snprintf(m, sizeof m,
             "%s: no image could be read: all 5 were skipped (the first: %s/a/1.png: not a PNG/JPEG image)", dir,
             dir);
    ASSERT_ERR(dp_images_prepare(dir, &o, &info), DP_EFORMAT, mp);
}

TEST(images_npy_write_u8) {
    const char *d = scratch();
    char p[600];
    const uint8_t v[6] = {0, 1, 2, 253, 254, 255};
    int64_t shape[3] = {1, 2, 3};
    ASSERT_OK(dp_npy_write(join(p, sizeof p, d, "u8.npy"), DP_NPY_U8, 3, shape, v));
    struct dp_npy a;
    ASSERT_OK(dp_npy_open(p, &a));
    ASSERT_TRUE(a.dtype == DP_NPY_U8 && a.ndim == 3 && a.count == 6);
    for (int i = 0; i < 6; i++) ASSERT_FEQ(dp_npy_get(&a, i), v[i]);
    dp_npy_close(&a);
}
