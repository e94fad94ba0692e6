/* One image, PNG or JPEG, decoded to C x H x W uint8 (dp/data.h, "image
 * folders", has the conversions and the messages): dp_image_decode, and the
 * two steps images.c runs over a folder (data_impl.h).
 *
 * Decoding is libpng's and libjpeg(-turbo)'s.  Both report errors through a
 * callback that must not return: here it keeps the library's message and
 * longjmps back to the reader, which frees what it held and returns.  Their
 * warnings are dropped (library code never prints), except libjpeg's
 * "premature end of JPEG file", after which it would hand back the image
 * with its missing part grey: that one fails the image as truncated.
 *
 *     bytes --sniff--> read_png / read_jpeg --> struct img: h x w x nc bytes (nc 1..4, interleaved)
 *           --to_chw--> C x H x W: channels converted, then resized and cropped (or copied)
 *
 * The size is checked against DP_IMAGE_MAX_PIXELS from the header, before
 * anything the size of the image is allocated. */
#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* after stdio.h: jpeglib.h uses FILE and size_t */
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "data/data_impl.h"
#include "dp/core.h"
#include "dp/data.h"

/* One image as a library decoded it. */
struct img {
    int64_t h, w;
    int nc;               /* bytes per pixel in px: 1 grey, 2 grey + alpha, 3 RGB, 4 RGBA */
    int colour;           /* from the header: a colour type (PNG: a palette with a non-grey entry) */
    uint8_t *px;          /* (h, w, nc) dp_malloc'd, the caller frees it; NULL after a header read */
    uint8_t **rows;       /* libpng's row pointers while reading */
    int fail;             /* why the library was stopped: 0 its own error, 1 out of memory, 2 too large */
    jmp_buf jb;           /* libjpeg's way back */
    char msg[JMSG_LENGTH_MAX + 64]; /* the library's message */
};

/* Stops the image at the size check: more than DP_IMAGE_MAX_PIXELS. */
static int too_large(struct img *im) {
    if (im->w * im->h <= DP_IMAGE_MAX_PIXELS) return 0;
    im->fail = 2;
    snprintf(im->msg, sizeof im->msg, "%lldx%lld (HxW) is too large (more than %lld pixels)",
             (long long)im->h, (long long)im->w, (long long)DP_IMAGE_MAX_PIXELS);
    return 1;
}

static void png_fail(png_structp p, png_const_charp m) {
    struct img *im = png_get_error_ptr(p);
    if (!im->fail) snprintf(im->msg, sizeof im->msg, "%s", m);
    png_longjmp(p, 1);
}

static void png_quiet(png_structp p, png_const_charp m) { (void)p, (void)m; }

/* The PNG in f (its 8-byte signature already read).  Transforms: palette to
 * RGB, grey below 8 bits to 8 bits, tRNS to an alpha channel (png_set_expand),
 * 16 bits to 8 (png_set_scale_16: rounded, v * 255 / 65535); the alpha
 * channel stays in px and to_chw drops it. */
static int read_png(FILE *f, int header_only, struct img *im) {
    png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, im, png_fail, png_quiet);
    png_infop info = p ? png_create_info_struct(p) : NULL;
    if (!info) {
        png_destroy_read_struct(&p, NULL, NULL);
        return DP_ENOMEM;
    }
    if (setjmp(png_jmpbuf(p))) {
        png_destroy_read_struct(&p, &info, NULL);
        dp_free(im->rows), im->rows = NULL;
        return im->fail == 1 ? DP_ENOMEM : DP_EFORMAT;
    }
    png_init_io(p, f);
    png_set_sig_bytes(p, 8);
    png_read_info(p, info);
    im->w = png_get_image_width(p, info), im->h = png_get_image_height(p, info);
    int ct = png_get_color_type(p, info), npal = 0;
    png_colorp pal;
    im->colour = (ct & PNG_COLOR_MASK_COLOR) && ct != PNG_COLOR_TYPE_PALETTE;
    if (ct == PNG_COLOR_TYPE_PALETTE && png_get_PLTE(p, info, &pal, &npal))
        for (int i = 0; i < npal; i++)
            im->colour |= pal[i].red != pal[i].green || pal[i].green != pal[i].blue;
    if (too_large(im)) png_error(p, "");
    if (!header_only) {
        png_set_expand(p);
        png_set_scale_16(p);
        png_set_interlace_handling(p);
        png_read_update_info(p, info);
        im->nc = png_get_channels(p, info);
        if (png_get_rowbytes(p, info) != (size_t)im->w * (size_t)im->nc) png_error(p, "unexpected row size");
        im->px = dp_malloc((size_t)(im->h * im->w * im->nc));
        im->rows = dp_malloc(sizeof *im->rows * (size_t)im->h);
        if (!im->px || !im->rows) im->fail = 1, png_error(p, "");
        for (int64_t y = 0; y < im->h; y++) im->rows[y] = im->px + y * im->w * im->nc;
        png_read_image(p, im->rows);
    }
    png_destroy_read_struct(&p, &info, NULL);
    dp_free(im->rows), im->rows = NULL;
    return DP_OK;
}

struct jerr {
    struct jpeg_error_mgr pub;
    struct img *im;
};

static void jpeg_fail(j_common_ptr ci) {
    struct img *im = ((struct jerr *)ci->err)->im;
    if (!im->fail) ci->err->format_message(ci, im->msg);
    longjmp(im->jb, 1);
}

/* Warnings (level -1) are dropped, but for the end of the data before the
 * end of the image: the rest would be filled with grey. */
static void jpeg_emit(j_common_ptr ci, int level) {
    if (level == -1 && ci->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(ci);
}

static void jpeg_quiet(j_common_ptr ci) { (void)ci; }

/* The JPEG in f (from its start), as grey, RGB, or CMYK made RGB: Adobe's
 * CMYK JPEGs (the ones in use) store inverted inks, 255 - ink, so
 * R = C' K' / 255 (G from M', B from Y'). */
static int read_jpeg(FILE *f, int header_only, struct img *im) {
    struct jpeg_decompress_struct ci;
    struct jerr e;
    memset(&ci, 0, sizeof ci);
    ci.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = jpeg_fail, e.pub.emit_message = jpeg_emit, e.pub.output_message = jpeg_quiet;
    e.im = im;
    if (setjmp(im->jb)) {
        jpeg_destroy_decompress(&ci);
        return im->fail == 1 ? DP_ENOMEM : DP_EFORMAT;
    }
    jpeg_create_decompress(&ci);
    jpeg_stdio_src(&ci, f);
    jpeg_read_header(&ci, TRUE);
    im->w = ci.image_width, im->h = ci.image_height;
    im->colour = ci.jpeg_color_space != JCS_GRAYSCALE;
    if (too_large(im)) jpeg_fail((j_common_ptr)&ci);
    if (!header_only) {
        int cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
        ci.out_color_space = !im->colour ? JCS_GRAYSCALE : cmyk ? JCS_CMYK : JCS_RGB;
        jpeg_start_decompress(&ci);
        im->nc = ci.output_components;
        im->px = dp_malloc((size_t)(im->h * im->w * im->nc));
        if (!im->px) im->fail = 1, jpeg_fail((j_common_ptr)&ci);
        while (ci.output_scanline < ci.output_height) {
            JSAMPROW row = im->px + (int64_t)ci.output_scanline * im->w * im->nc;
            jpeg_read_scanlines(&ci, &row, 1);
        }
        if (cmyk) {
            for (int64_t i = 0; i < im->h * im->w; i++) {
                const uint8_t *s = im->px + 4 * i;
                uint8_t *d = im->px + 3 * i;
                int k = s[3];
                for (int c = 0; c < 3; c++) d[c] = (uint8_t)((s[c] * k + 127) / 255);
            }
            im->nc = 3;
        }
    }
    jpeg_destroy_decompress(&ci);
    return DP_OK;
}

/* The image in f by its first bytes; `what` names it in messages.  On
 * failure im->px may hold pixels: the caller frees it either way. */
static int read_image(FILE *f, const char *what, int header_only, struct img *im) {
    uint8_t sig[8];
    size_t n = fread(sig, 1, sizeof sig, f);
    const char *kind = "PNG";
    int rc;
    if (n == 8 && !png_sig_cmp(sig, 0, 8)) {
        rc = read_png(f, header_only, im);
    } else if (n >= 3 && sig[0] == 0xff && sig[1] == 0xd8 && sig[2] == 0xff && fseek(f, 0, SEEK_SET) == 0) {
        rc = read_jpeg(f, header_only, im), kind = "JPEG";
    } else {
        return dp_seterr(DP_EFORMAT, "%s: not a PNG/JPEG image", what);
    }
    if (rc == DP_ENOMEM) return dp_seterr(DP_ENOMEM, "%s: out of memory decoding it", what);
    if (rc && im->fail == 2) return dp_seterr(DP_EFORMAT, "%s: %s", what, im->msg);
    if (rc) return dp_seterr(DP_EFORMAT, "%s: corrupt or truncated %s: %s", what, kind, im->msg);
    return DP_OK;
}

/* Pixel i of im as channel c of C: grey replicated for RGB, RGB made grey by
 * the ITU-R BT.601 luma Y = 0.299 R + 0.587 G + 0.114 B rounded half up,
 * alpha dropped (the colours as stored, as PIL's convert("RGB") does). */
static inline int chan(const struct img *im, int64_t i, int C, int c) {
    const uint8_t *p = im->px + i * im->nc;
    if (im->nc <= 2) return p[0];
    if (C == 3) return p[c];
    return (299 * p[0] + 587 * p[1] + 114 * p[2] + 500) / 1000;
}

/* im as C x H x W into dst: copied when it has that size, else resized and
 * centre-cropped.  The resize scales by s = max(H / ih, W / iw), the least
 * that covers H x W (for a square target: the shorter side becomes H, as
 * torchvision's Resize(H) then CenterCrop(H)), to rh x rw, truncated:
 *     H iw >= W ih:  rh = H, rw = floor(iw H / ih) (>= W);  else rw = W, rh = floor(ih W / iw)
 * and the crop keeps rows top .. top + H - 1, top = floor((rh - H) / 2)
 * (columns likewise).  Output (y, x) is resized pixel (Y, X) = (top + y,
 * left + x), sampled bilinearly with half-pixel centres (align_corners =
 * false):
 *     sy = max(0, (Y + 0.5) ih / rh - 0.5), y0 = floor(sy), y1 = min(y0 + 1, ih - 1), fy = sy - y0
 *     (sx, x0, x1, fx likewise)
 *     v = (1 - fy) ((1 - fx) p[y0][x0] + fx p[y0][x1]) + fy ((1 - fx) p[y1][x0] + fx p[y1][x1])
 * rounded half up.  No antialiasing when shrinking (torch's interpolate with
 * antialias=False): PIL's Resize averages the whole footprint, so a large
 * reduction differs from it. */
static void to_chw(const struct img *im, int C, int64_t H, int64_t W, uint8_t *dst) {
    const int64_t ih = im->h, iw = im->w;
    if (ih == H && iw == W) {
        for (int c = 0; c < C; c++)
            for (int64_t i = 0; i < H * W; i++) dst[c * H * W + i] = (uint8_t)chan(im, i, C, c);
        return;
    }
    int64_t rh = H, rw = W;
    if (H * iw >= W * ih) rw = iw * H / ih;
    else rh = ih * W / iw;
    const int64_t top = (rh - H) / 2, left = (rw - W) / 2;
    for (int64_t y = 0; y < H; y++) {
        double sy = ((double)(top + y) + 0.5) * (double)ih / (double)rh - 0.5;
        if (sy < 0) sy = 0;
        int64_t y0 = (int64_t)sy, y1 = y0 + 1 < ih ? y0 + 1 : ih - 1;
        double fy = sy - (double)y0;
        for (int64_t x = 0; x < W; x++) {
            double sx = ((double)(left + x) + 0.5) * (double)iw / (double)rw - 0.5;
            if (sx < 0) sx = 0;
            int64_t x0 = (int64_t)sx, x1 = x0 + 1 < iw ? x0 + 1 : iw - 1;
            double fx = sx - (double)x0;
            for (int c = 0; c < C; c++) {
                double a = chan(im, y0 * iw + x0, C, c), b = chan(im, y0 * iw + x1, C, c);
                double d = chan(im, y1 * iw + x0, C, c), e = chan(im, y1 * iw + x1, C, c);
                double v = (1 - fy) * ((1 - fx) * a + fx * b) + fy * ((1 - fx) * d + fx * e);
                dst[(c * H + y) * W + x] = (uint8_t)(v + 0.5);
            }
        }
    }
}

int dp__image_check_size(const char *what, int64_t height, int64_t width) {
    if (height < 0 || width < 0 || (height == 0) != (width == 0) || height > 65535 || width > 65535 ||
        height * width > DP_IMAGE_MAX_PIXELS)
        return dp_seterr(DP_EINVAL,
                         "%s: image size %lldx%lld: give both 0 or both 1..65535 (at most %lld pixels)", what,
                         (long long)height, (long long)width, (long long)DP_IMAGE_MAX_PIXELS);
    return DP_OK;
}

int dp_image_decode(const uint8_t *buf, size_t len, const char *what, int channels, int64_t height,
                    int64_t width, uint8_t **pixels, int64_t *c, int64_t *h, int64_t *w) {
    if (!what) what = "image";
    if (!pixels || !c || !h || !w || (!buf && len)) return dp_seterr(DP_EINVAL, "%s: NULL argument", what);
    *pixels = NULL, *c = *h = *w = 0;
    if (channels != 0 && channels != 1 && channels != 3)
        return dp_seterr(DP_EINVAL, "%s: channels must be 0, 1 or 3, not %d", what, channels);
    int rc = dp__image_check_size(what, height, width);
    if (rc) return rc;
    if (len == 0) return dp_seterr(DP_EFORMAT, "%s: not a PNG/JPEG image", what);
    FILE *f = fmemopen((void *)buf, len, "rb");
    if (!f) return dp_seterr(DP_ENOMEM, "%s: fmemopen: %s", what, strerror(errno));
    struct img im = {0};
    if (!(rc = read_image(f, what, 0, &im))) {
        int C = channels ? channels : im.colour ? 3 : 1;
        int64_t H = height ? height : im.h, W = height ? width : im.w;
        if (!(*pixels = dp_malloc((size_t)(C * H * W)))) {
            rc = dp_seterr(DP_ENOMEM, "%s: out of memory", what);
        } else {
            to_chw(&im, C, H, W, *pixels);
            *c = C, *h = H, *w = W;
        }
    }
    dp_free(im.px);
    fclose(f);
    return rc;
}

int dp__image_header(FILE *f, const char *what, int64_t *h, int64_t *w, int *colour) {
    struct img im = {0};
    int rc = read_image(f, what, 1, &im);
    *h = im.h, *w = im.w, *colour = im.colour;
    return rc;
}

int dp__image_decode_file(FILE *f, const char *what, int C, int64_t H, int64_t W, uint8_t *dst) {
    struct img im = {0};
    int rc = read_image(f, what, 0, &im);
    if (!rc) to_chw(&im, C, H, W, dst);
    dp_free(im.px);
    return rc;
}
