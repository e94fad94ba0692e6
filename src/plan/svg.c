/* A small SVG plot writer (dp/plan.h): lines, stacked areas, bars and
 * timeline spans, with "nice" ticks (1, 2 or 5 x 10^k apart).
 *
 * Layout, in pixels (W x H):
 *
 *     +--------------------------- title -----------------------------+
 *     | y ticks |  plot area [L, W-R] x [T, H-B]          legend (top right)
 *     | ylabel  |                                                       |
 *     +-------- x ticks, xlabel --------------------------------------+
 *
 * A data point (x, y) maps to (L + (x - x0)/(x1 - x0) pw, T + ph - (y - y0)/(y1 - y0) ph).
 * Every number is printed with a fixed format, so a plot is a pure function
 * of its input (tests/fixtures/plot_small.svg is a golden file). */
#include <math.h>
#include <string.h>

#include "dp/plan.h"

enum { ML = 72, MR = 24, MT = 36, MB = 52 };

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

struct frame {
    double x0, x1, y0, y1;
    double L, T, pw, ph;
};
static double px(const struct frame *f, double x) { return f->L + (x - f->x0) / (f->x1 - f->x0) * f->pw; }
static double py(const struct frame *f, double y) { return f->T + f->ph - (y - f->y0) / (f->y1 - f->y0) * f->ph; }

/* XML text: & < > " escaped. */
static void text(FILE *o, const char *s) {
    for (; s && *s; s++) {
        if (*s == '&') fputs("&amp;", o);
        else if (*s == '<') fputs("&lt;", o);
        else if (*s == '>') fputs("&gt;", o);
        else if (*s == '"') fputs("&quot;", o);
        else if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, o);
    }
}

/* The tick spacing: 1, 2 or 5 x 10^k, about n ticks over the range. */
static double nice_step(double range, int n) {
    double raw = range / n, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* Widens [lo, hi] to whole ticks (an empty range gets a unit around it). */
static void nice_range(double *lo, double *hi) {
    if (!(*hi > *lo)) {
        double d = *lo != 0 ? fabs(*lo) * 0.5 : 1;
        *lo -= d, *hi += d;
    }
    double st = nice_step(*hi - *lo, 5);
    *lo = floor(*lo / st + 1e-9) * st, *hi = ceil(*hi / st - 1e-9) * st;
}

static int has_unit(const char *label) {
    const char *a = label ? strchr(label, '(') : NULL;
    return a && strchr(a, ')') && strchr(a, ')') > a + 1;
}

static void axes(FILE *o, const struct frame *f, const struct dp_svg_plot *p, int ylabels_rows, int64_t rows) {
    fprintf(o, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"#444\"/>\n", f->L,
            f->T, f->pw, f->ph);
    double st = nice_step(f->x1 - f->x0, 5);
    if (p->kind == DP_SVG_BARS && st < 1) st = 1; /* bars stand at whole x (ranks): no tick between */
    for (double v = ceil(f->x0 / st - 1e-9) * st; v <= f->x1 + st * 1e-9; v += st) {
        double x = px(f, v), vv = fabs(v) < st * 1e-9 ? 0 : v;
        fprintf(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#ddd\"/>\n", x, f->T, x, f->T + f->ph);
        fprintf(o, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%.6g</text>\n", x, f->T + f->ph + 16, vv);
    }
    if (ylabels_rows) { /* one label per row: its index */
        for (int64_t r = 0; r < rows; r++)
            fprintf(o, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%lld</text>\n", f->L - 6,
                    py(f, (double)r + 0.5) + 4, (long long)r);
    } else {
        st = nice_step(f->y1 - f->y0, 5);
        for (double v = ceil(f->y0 / st - 1e-9) * st; v <= f->y1 + st * 1e-9; v += st) {
            double y = py(f, v), vv = fabs(v) < st * 1e-9 ? 0 : v;
            fprintf(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#ddd\"/>\n", f->L, y,
                    f->L + f->pw, y);
            fprintf(o, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%.6g</text>\n", f->L - 6, y + 4, vv);
        }
    }
    fprintf(o, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">", f->L + f->pw / 2, f->T + f->ph + 40);
    text(o, p->xlabel);
    fprintf(o, "</text>\n<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" transform=\"rotate(-90 %.2f %.2f)\">",
            16.0, f->T + f->ph / 2, 16.0, f->T + f->ph / 2);
    text(o, p->ylabel);
    fprintf(o, "</text>\n<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-size=\"14\">", f->L + f->pw / 2, 22.0);
    text(o, p->title);
    fputs("</text>\n", o);
}

static void legend(FILE *o, const struct frame *f, const struct dp_svg_series *s, int ns) {
    for (int i = 0; i < ns; i++) {
        double x = f->L + f->pw - 150, y = f->T + 10 + 16 * i;
        fprintf(o, "<rect x=\"%.2f\" y=\"%.2f\" width=\"10\" height=\"10\" fill=\"%s\"/>\n", x, y, palette[i % 10]);
        fprintf(o, "<text x=\"%.2f\" y=\"%.2f\">", x + 14, y + 9);
        text(o, s[i].name ? s[i].name : "");
        fputs("</text>\n", o);
    }
}

int dp_svg_write(FILE *o, const struct dp_svg_plot *p, const struct dp_svg_series *s, int ns) {
    if ((unsigned)p->kind >= DP_SVG_KIND_COUNT) return dp_seterr(DP_EINVAL, "svg: unknown plot kind");
    if (!has_unit(p->xlabel)) return dp_seterr(DP_EINVAL, "svg: x label '%s' carries no unit (\"name (unit)\")",
                                               p->xlabel ? p->xlabel : "");
    if (p->kind != DP_SVG_SPANS && !has_unit(p->ylabel))
        return dp_seterr(DP_EINVAL, "svg: y label '%s' carries no unit (\"name (unit)\")", p->ylabel ? p->ylabel : "");
    if (ns < 1 || !s) return dp_seterr(DP_EINVAL, "svg: nothing to plot");
    /* data ranges */
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    int64_t rows = 0, finite = 0;
    for (int i = 0; i < ns; i++) {
        if (p->kind == DP_SVG_STACKED && s[i].n != s[0].n)
            return dp_seterr(DP_EINVAL, "svg: stacked series '%s' has %lld points, the first %lld", s[i].name,
                             (long long)s[i].n, (long long)s[0].n);
        if (!s[i].row && s[i].n > rows) rows = s[i].n;
        for (int64_t k = 0; s[i].row && k < s[i].n; k++)
            if (isfinite(s[i].row[k]) && s[i].row[k] >= 0 && s[i].row[k] + 1 > (double)rows) rows = (int64_t)s[i].row[k] + 1;
        for (int64_t k = 0; k < s[i].n; k++) {
            double x = p->kind == DP_SVG_STACKED ? s[0].x[k] : s[i].x[k], y = s[i].y[k];
            if (!isfinite(x) || (!isfinite(y) && p->kind != DP_SVG_STACKED)) continue; /* not drawn */
            finite++;
            x0 = fmin(x0, x), x1 = fmax(x1, x);
            if (p->kind == DP_SVG_SPANS) x0 = fmin(x0, y), x1 = fmax(x1, y);
            else if (p->kind != DP_SVG_STACKED) y0 = fmin(y0, y), y1 = fmax(y1, y);
        }
    }
    if (p->kind == DP_SVG_STACKED)
        for (int64_t k = 0; k < s[0].n; k++) {
            double sum = 0;
            for (int i = 0; i < ns; i++) sum += isfinite(s[i].y[k]) && s[i].y[k] > 0 ? s[i].y[k] : 0;
            y0 = 0, y1 = fmax(y1, sum);
        }
    if (!finite) return dp_seterr(DP_EINVAL, "svg: '%s': no finite data", p->title ? p->title : "");
    if (p->kind == DP_SVG_BARS) { /* bars start at 0 and stand half a spacing inside the frame */
        y0 = fmin(y0, 0), y1 = fmax(y1, 0);
        x0 -= 0.5, x1 += 0.5;
    }
    if (p->kind == DP_SVG_SPANS) y0 = 0, y1 = (double)rows;
    else if (!(y1 >= y0)) y0 = 0, y1 = 1;
    nice_range(&x0, &x1);
    if (p->kind != DP_SVG_SPANS) nice_range(&y0, &y1);
    if (!isfinite(x1 - x0) || !isfinite(y1 - y0) || x1 - x0 < 1e-300 || y1 - y0 < 1e-300)
        return dp_seterr(DP_EINVAL, "svg: '%s': the data's range cannot be drawn", p->title ? p->title : "");
    int W = p->width > 0 ? p->width : 640, H = p->height > 0 ? p->height : 400;
    struct frame f = {x0, x1, y0, y1, ML, MT, W - ML - MR, H - MT - MB};

    fprintf(o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
            W, H, W, H, W, H);
    axes(o, &f, p, p->kind == DP_SVG_SPANS, rows);
    if (p->kind == DP_SVG_LINES) {
        for (int i = 0; i < ns; i++) {
            int open = 0;
            for (int64_t k = 0; k < s[i].n; k++) {
                double x = s[i].x[k], y = s[i].y[k];
                if (!isfinite(x) || !isfinite(y)) {
                    if (open) fputs("\"/>\n", o), open = 0;
                    continue;
                }
                if (!open) fprintf(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", palette[i % 10]);
                fprintf(o, "%s%.2f,%.2f", open ? " " : "", px(&f, x), py(&f, y));
                open = 1;
            }
            if (open) fputs("\"/>\n", o);
            for (int64_t k = 0; p->markers && k < s[i].n; k++)
                if (isfinite(s[i].x[k]) && isfinite(s[i].y[k]))
                    fprintf(o, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n", px(&f, s[i].x[k]),
                            py(&f, s[i].y[k]), palette[i % 10]);
        }
    } else if (p->kind == DP_SVG_STACKED) {
        int64_t n = s[0].n;
        for (int i = 0; i < ns; i++) { /* band i: from the sum of 0..i-1 up to the sum of 0..i */
            fprintf(o, "<polygon fill=\"%s\" fill-opacity=\"0.8\" stroke=\"none\" points=\"", palette[i % 10]);
            int first = 1;
            for (int pass = 0; pass < 2; pass++)
                for (int64_t q = 0; q < n; q++) {
                    int64_t k = pass ? n - 1 - q : q; /* top edge forwards, bottom edge back */
                    if (!isfinite(s[0].x[k])) continue;
                    double sum = 0;
                    for (int j = 0; j < i + 1 - pass; j++) sum += isfinite(s[j].y[k]) && s[j].y[k] > 0 ? s[j].y[k] : 0;
                    fprintf(o, "%s%.2f,%.2f", first ? "" : " ", px(&f, s[0].x[k]), py(&f, sum));
                    first = 0;
                }
            fputs("\"/>\n", o);
        }
    } else if (p->kind == DP_SVG_BARS) {
        double slot = f.pw / (x1 - x0) * 0.8 / ns; /* a unit of x holds ns bars in 80% of it */
        for (int i = 0; i < ns; i++)
            for (int64_t k = 0; k < s[i].n; k++) {
                double x = s[i].x[k], y = s[i].y[k];
                if (!isfinite(x) || !isfinite(y)) continue;
                double xl = px(&f, x) - 0.4 * f.pw / (x1 - x0) + i * slot, ya = py(&f, fmax(y, 0)), yb = py(&f, fmin(y, 0));
                fprintf(o, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>\n", xl, ya, slot,
                        yb - ya, palette[i % 10]);
            }
    } else { /* SPANS */
        double h = f.ph / (double)rows * 0.8 / ns;
        for (int i = 0; i < ns; i++)
            for (int64_t k = 0; k < s[i].n; k++) {
                double a = s[i].x[k], b = s[i].y[k], r = s[i].row ? s[i].row[k] : (double)k;
                if (!isfinite(a) || !isfinite(b) || !(r >= 0)) continue;
                double y = py(&f, r + 1) + 0.1 * f.ph / (double)rows + i * h;
                fprintf(o, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>\n", px(&f, a), y,
                        fmax(px(&f, b) - px(&f, a), 0.5), h, palette[i % 10]);
            }
    }
    legend(o, &f, s, ns);
    fputs("</svg>\n", o);
    return ferror(o) ? dp_seterr(DP_EIO, "svg: write failed") : DP_OK;
}
