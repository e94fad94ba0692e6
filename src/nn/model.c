/* Models: the layer sequence, the parameter layout, replicas and one
 * forward/backward pass.
 *
 * The pass, for a sequence of layers f_0 .. f_{L-1}:
 *     a_0 = x,  a_{i+1} = f_i(a_i),  logits = a_L
 *     loss = sum_r xent(logits_r, t_r)            (reported as a sum)
 *     g_L  = loss_scale * dloss/dlogits           (loss_scale = 1/R: a mean)
 *     g_i  = f_i.backward(g_{i+1})                (accumulates dW into grads)
 * After layer i's backward its parameter range is final and is reported to
 * grad_ready, in reverse layer order; this is the hook the data-parallel
 * reducer starts its bucket all-reduces from. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/nn.h"
#include "layers_impl.h"

int64_t dp_shape_numel(const struct dp_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}

/* Appends a formatted statement and a newline to m->desc (the model's canonical text). */
static int desc_add(struct dp_model *m, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    size_t len = m->desc ? strlen(m->desc) : 0;
    char *d = n < 0 ? NULL : dp_malloc(len + (size_t)n + 2);
    if (!d) return dp_seterr(DP_ENOMEM, "model: out of memory");
    if (len) memcpy(d, m->desc, len);
    vsnprintf(d + len, (size_t)n + 1, fmt, ap);
    d[len + (size_t)n] = '\n', d[len + (size_t)n + 1] = 0;
    dp_free(m->desc);
    m->desc = d;
    return DP_OK;
}

static int desc_addf(struct dp_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int desc_addf(struct dp_model *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = desc_add(m, fmt, ap);
    va_end(ap);
    return rc;
}

int dp_model_init(struct dp_model **out, const char *spec, const struct dp_shape *in) {
    *out = NULL;
    if (!in || in->ndim < 1 || in->ndim > DP_MAX_DIMS)
        return dp_seterr(DP_EINVAL, "model: input shape needs 1..%d dims", DP_MAX_DIMS);
    for (int i = 0; i < in->ndim; i++)
        if (in->d[i] <= 0) return dp_seterr(DP_EINVAL, "model: input dim %d is %lld", i, (long long)in->d[i]);
    struct dp_model *m = dp_calloc(1, sizeof *m);
    if (!m) return dp_seterr(DP_ENOMEM, "model: out of memory");
    snprintf(m->spec, sizeof m->spec, "%s", spec ? spec : "custom");
    m->in_shape = *in;
    /* the canonical text's first statement (a model file's input line) */
    int rc = in->ndim == 1 ? desc_addf(m, "input tokens %lld", (long long)in->d[0])
             : in->ndim == 3 ? desc_addf(m, "input %lld %lld %lld", (long long)in->d[0], (long long)in->d[1],
                                         (long long)in->d[2])
                             : DP_OK; /* (no model file declares another shape: no text) */
    if (rc) {
        dp_model_free(m);
        return rc;
    }
    *out = m;
    return DP_OK;
}

void dp_layer_free(struct dp_layer *l) {
    if (!l) return;
    if (l->ops && l->ops->free) l->ops->free(l);
    dp_free(l);
}

void dp_model_free(struct dp_model *m) {
    if (!m) return;
    for (int i = 0; i < m->nlayers; i++) dp_layer_free(m->layers[i]);
    dp_free(m->layers);
    dp_free(m->params);
    dp_free(m->desc);
    dp_free(m);
}

struct dp_shape dp_model_cur_shape(const struct dp_model *m) {
    return m->nlayers ? m->layers[m->nlayers - 1]->out_shape : m->in_shape;
}

int dp_layer_make(struct dp_model *m, struct dp_layer **out, const struct dp_layer_ops *ops,
                  const char *name, const struct dp_shape *in) {
    *out = NULL;
    if (m->finalized) return dp_seterr(DP_EINVAL, "model: cannot add layer '%s' after finalize", name);
    struct dp_layer *l = dp_calloc(1, sizeof *l);
    if (!l) return dp_seterr(DP_ENOMEM, "layer %s: out of memory", name);
    l->ops = ops;
    snprintf(l->name, sizeof l->name, "%s", name);
    l->id = m->nids++;
    l->in_shape = *in;
    l->out_shape = *in;
    l->param_off = m->num_params;
    l->buffer_off = m->num_buffers;
    *out = l;
    return DP_OK;
}

/* 1 when a statement reads back as written: its names (the layer's, and pos= or tied=) are
 * a model file's (letters, digits, '_' and '.', at most 63, not starting with a digit or
 * '.'), and it fits a line.  A layer a C program named otherwise ("conv-1") leaves the model
 * without a text: a checkpoint then needs the program to rebuild it, never a text that
 * would not parse. */
static int describable(const char *st) {
    if (strlen(st) > 1000) return 0;
    const char *name = strchr(st, ' ');
    for (int k = 0; name; k++) {
        const char *v = name + 1, *e = strchr(v, ' ');
        size_t n = e ? (size_t)(e - v) : strlen(v);
        const char *eq = k ? memchr(v, '=', n) : NULL; /* (the layer's name: no '=' in it) */
        if (k && !eq) return 0; /* (after the name, only KEY=VALUE) */
        if (eq) n -= (size_t)(eq + 1 - v), v = eq + 1;
        int is_name = k == 0 || !strncmp(eq - 4, " pos", 4) || !strncmp(eq - 5, " tied", 5);
        if (is_name ? !dp__model_name_ok(v, n) : n == 0) return 0;
        for (size_t i = 0; !is_name && i < n; i++) /* numbers: digits, '.', '-', '+', 'e' */
            if (!isalnum((unsigned char)v[i]) && v[i] != '.' && v[i] != '-' && v[i] != '+') return 0;
        name = e;
    }
    return 1;
}

int dp__model_name_ok(const char *s, size_t n) {
    if (n == 0 || n > 63 || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '.') return 0;
    return 1;
}

int dp__layer_record(struct dp_model *m, struct dp_layer *l, int rc, const struct dp__model_mark *mk,
                     const char *fmt, ...) {
    if ((rc = dp__layer_append(m, l, rc, mk))) return rc;
    char st[1100];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(st, sizeof st, fmt, ap);
    va_end(ap);
    /* (no text: ndesc falls behind, and dp_model_finalize drops the text; a model whose input
     * no model file can declare has none from the start) */
    if (!m->desc || n < 0 || (size_t)n >= sizeof st || !describable(st)) return DP_OK;
    if (!(rc = desc_addf(m, "%s", st))) m->ndesc++;
    return rc;
}

const char *dp__float_str(char buf[32], float x) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, 32, "%.*g", prec, (double)x);
        if (strtof(buf, NULL) == x) break;
    }
    return buf;
}

int dp_model_append(struct dp_model *m, struct dp_layer *l) {
    if (m->nlayers == m->cap_layers) {
        int cap = m->cap_layers ? 2 * m->cap_layers : 16;
        struct dp_layer **nl = dp_malloc(sizeof *nl * (size_t)cap);
        if (!nl) return dp_seterr(DP_ENOMEM, "model: out of memory");
        if (m->nlayers) memcpy(nl, m->layers, sizeof *nl * (size_t)m->nlayers);
        dp_free(m->layers);
        m->layers = nl;
        m->cap_layers = cap;
    }
    m->layers[m->nlayers++] = l;
    m->flops_fwd += l->flops_fwd;
    return DP_OK;
}

int64_t dp_model_add_param(struct dp_model *m, struct dp_layer *l, const char *name,
                           const struct dp_shape *shape, enum dp_init_kind init, float a,
                           int is_buffer) {
    if (m->finalized) return dp_seterr(DP_EINVAL, "model: cannot add parameter after finalize");
    int64_t *total = is_buffer ? &m->num_buffers : &m->num_params;
    int64_t *loff = is_buffer ? &l->buffer_off : &l->param_off;
    int64_t *lcnt = is_buffer ? &l->buffer_count : &l->param_count;
    /* A layer's range must stay contiguous: nothing may have been added by
     * another layer since this layer's last parameter. */
    if (*loff + *lcnt != *total)
        return dp_seterr(DP_EINTERNAL, "layer %s: parameters not contiguous", l->name);
    if (m->nparams == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 32;
        struct dp_param_info *np = dp_malloc(sizeof *np * (size_t)cap);
        if (!np) return dp_seterr(DP_ENOMEM, "model: out of memory");
        if (m->nparams) memcpy(np, m->params, sizeof *np * (size_t)m->nparams);
        dp_free(m->params);
        m->params = np;
        m->cap_params = cap;
    }
    struct dp_param_info *p = &m->params[m->nparams++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s.%s", l->name, name);
    p->shape = *shape;
    p->count = dp_shape_numel(shape);
    p->offset = *total;
    p->init = init;
    p->init_a = a;
    p->is_buffer = is_buffer;
    *total += p->count;
    *lcnt += p->count;
    return p->offset;
}

int dp_model_finalize(struct dp_model *m) {
    if (m->nlayers == 0) return dp_seterr(DP_EINVAL, "model %s: no layers", m->spec);
    struct dp_shape out = dp_model_cur_shape(m);
    if (out.ndim < 1 || out.ndim > 2)
        return dp_seterr(DP_EINVAL, "model %s: output must be (V) or (T, V) logits, got %d dims",
                         m->spec, out.ndim);
    for (int i = 0; i + 1 < m->nlayers; i++) {
        struct dp_shape a = m->layers[i]->out_shape, b = m->layers[i + 1]->in_shape;
        if (dp_shape_numel(&a) != dp_shape_numel(&b))
            return dp_seterr(DP_EINTERNAL, "model %s: layer %s output does not feed %s", m->spec,
                             m->layers[i]->name, m->layers[i + 1]->name);
    }
    /* The canonical text holds a statement for every layer, or the model cannot be
     * written down (a layer of the caller's own, appended with dp_model_append): no text. */
    if (m->loss == DP_LOSS_MSE && out.ndim != 1)
        return dp_seterr(DP_EINVAL, "model %s: loss mse needs (K) outputs per sample, got %d dims", m->spec,
                         out.ndim);
    if (m->desc && m->ndesc == m->nlayers) {
        int rc = desc_addf(m, "loss %s", m->loss == DP_LOSS_MSE ? "mse" : "cross_entropy");
        if (rc) return rc;
    } else {
        dp_free(m->desc);
        m->desc = NULL;
    }
    /* Fusion: a ReLU after a layer that applies it in its own epilogue is skipped by the pass
     * (the ReLU layer stays in the sequence: names, text and checkpoints are unchanged), and a
     * composite makes its own inner fusions (fuse_inner).  The same bits: max(v, 0) of the
     * same v, dy [y > 0] of the same dy and y. */
    for (int i = 0; i < m->nlayers && !m->no_fusion; i++) {
        struct dp_layer *l = m->layers[i], *prev = i > 0 ? m->layers[i - 1] : NULL;
        if (l->fuse_inner) l->fuse_inner(l);
        if (prev && !strcmp(l->ops->type, "relu") && !prev->fused && prev->fuse_relu && prev->fuse_relu(prev))
            l->fused = 1;
    }
    m->finalized = 1;
    return DP_OK;
}

int dp_model_set_fusion(struct dp_model *m, int on) {
    if (m->finalized) return dp_seterr(DP_EINVAL, "model %s: fusion is chosen before finalize", m->spec);
    m->no_fusion = !on;
    return DP_OK;
}

int dp_model_set_loss(struct dp_model *m, int loss) {
    if (loss != DP_LOSS_XENT && loss != DP_LOSS_MSE) return dp_seterr(DP_EINVAL, "model: loss %d", loss);
    if (!m->finalized || m->loss == loss) {
        m->loss = loss;
        return DP_OK;
    }
    struct dp_shape out = dp_model_cur_shape(m);
    if (loss == DP_LOSS_MSE && out.ndim != 1)
        return dp_seterr(DP_EINVAL, "model %s: loss mse needs (K) outputs per sample, got %d dims", m->spec,
                         out.ndim);
    m->loss = loss;
    if (m->desc) { /* the text ends with its loss statement (finalize): write the new one */
        size_t len = strlen(m->desc), at = len >= 2 ? len - 2 : 0;
        while (at > 0 && m->desc[at - 1] != '\n') at--;
        if (!strncmp(m->desc + at, "loss ", 5)) m->desc[at] = 0;
        return desc_addf(m, "loss %s", loss == DP_LOSS_MSE ? "mse" : "cross_entropy");
    }
    return DP_OK;
}

int64_t dp_model_num_classes(const struct dp_model *m) {
    struct dp_shape s = dp_model_cur_shape(m);
    return s.d[s.ndim - 1];
}

const struct dp_param_info *dp_model_find_param(const struct dp_model *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

int dp_model_span(const struct dp_model *m, int l0, int l1, struct dp_span *s) {
    if (l0 < 0 || l1 > m->nlayers || l0 >= l1)
        return dp_seterr(DP_EINVAL, "model %s: layers [%d, %d) of %d", m->spec, l0, l1, m->nlayers);
    int64_t off = m->layers[l0]->param_off, end = off;
    for (int i = l0; i < l1; i++) /* (registration order: each layer's range starts where the last ended) */
        end = m->layers[i]->param_off + m->layers[i]->param_count;
    *s = (struct dp_span){.layer0 = l0, .layer1 = l1, .param_off = off, .param_count = end - off};
    return DP_OK;
}

/* ---- replicas ----------------------------------------------------------------- */

int dp_replica_init(struct dp_replica *r, const struct dp_model *m, int64_t max_batch) {
    return dp_replica_init_lazy(r, m, max_batch, 0);
}

int dp_replica_init_lazy(struct dp_replica *r, const struct dp_model *m, int64_t max_batch, int lazy) {
    memset(r, 0, sizeof *r);
    if (!m->finalized) return dp_seterr(DP_EINVAL, "replica: model not finalized");
    r->model = m;
    r->max_batch = max_batch;
    r->lazy = lazy;
    size_t np = (size_t)(m->num_params ? m->num_params : 1) * sizeof(float);
    size_t nb = (size_t)(m->num_buffers ? m->num_buffers : 1) * sizeof(float);
    r->params = lazy & DP_REPLICA_LAZY_PARAMS ? dp_slab_map(np) : dp_malloc_big(np);
    r->grads = lazy & DP_REPLICA_LAZY_GRADS ? dp_slab_map(np) : dp_malloc_big(np);
    r->buffers = dp_malloc_big(nb);
    r->saved = dp_calloc((size_t)m->nids + 1, sizeof(void *));
    r->acts = dp_calloc((size_t)m->nlayers + 1, sizeof(float *));
    /* Estimate one step's activations (outputs of every layer plus two
     * gradient buffers) so the arena rarely has to grow. */
    size_t est = 0;
    for (int i = 0; i < m->nlayers; i++)
        est += (size_t)dp_shape_numel(&m->layers[i]->out_shape) * sizeof(float) * 3;
    est = lazy & DP_REPLICA_LAZY_ARENA ? 0 : est * (size_t)(max_batch > 0 ? max_batch : 1);
    if (!r->params || !r->grads || !r->buffers || !r->saved || !r->acts ||
        dp_arena_init(&r->arena, est) != DP_OK) {
        dp_replica_free(r);
        return dp_seterr(DP_ENOMEM, "replica: cannot allocate %zu bytes of parameters and activations",
                         2 * np + nb + est);
    }
    if (!(lazy & DP_REPLICA_LAZY_PARAMS)) memset(r->params, 0, np); /* (a mapped slab reads as zeros) */
    if (!(lazy & DP_REPLICA_LAZY_GRADS)) memset(r->grads, 0, np);
    memset(r->buffers, 0, nb);
    return DP_OK;
}

int dp_replica_init_view(struct dp_replica *v, const struct dp_replica *r, int l0, int l1, int64_t max_batch) {
    memset(v, 0, sizeof *v);
    const struct dp_model *m = r->model;
    if (l0 < 0 || l1 > m->nlayers || l0 >= l1)
        return dp_seterr(DP_EINVAL, "replica view: layers [%d, %d) of %d", l0, l1, m->nlayers);
    *v = (struct dp_replica){.model = m, .params = r->params, .grads = r->grads, .buffers = r->buffers,
                             .max_batch = max_batch, .view = 1};
    size_t est = 0;
    for (int i = l0; i < l1; i++) est += (size_t)dp_shape_numel(&m->layers[i]->out_shape) * sizeof(float) * 3;
    est *= (size_t)(max_batch > 0 ? max_batch : 1);
    v->saved = dp_calloc((size_t)m->nids + 1, sizeof(void *));
    v->acts = dp_calloc((size_t)m->nlayers + 1, sizeof(float *));
    if (!v->saved || !v->acts || dp_arena_init(&v->arena, est) != DP_OK) {
        dp_replica_free(v);
        return dp_seterr(DP_ENOMEM, "replica view: cannot allocate %zu bytes of activations", est);
    }
    return DP_OK;
}

void dp_replica_free(struct dp_replica *r) {
    if (!r) return;
    if (r->view) { /* (the slabs are the owner's) */
        dp_free(r->saved);
        dp_free(r->acts);
        if (r->arena.head) dp_arena_free(&r->arena);
        memset(r, 0, sizeof *r);
        return;
    }
    size_t np = r->model ? (size_t)(r->model->num_params ? r->model->num_params : 1) * sizeof(float) : 0;
    if (r->lazy & DP_REPLICA_LAZY_PARAMS) dp_slab_unmap(r->params, np);
    else dp_free(r->params);
    if (r->lazy & DP_REPLICA_LAZY_GRADS) dp_slab_unmap(r->grads, np);
    else dp_free(r->grads);
    dp_free(r->buffers);
    dp_free(r->saved);
    dp_free(r->acts);
    if (r->arena.head) dp_arena_free(&r->arena);
    memset(r, 0, sizeof *r);
}

void dp_model_init_params(const struct dp_model *m, struct dp_replica *r, uint64_t seed) {
    dp_model_init_slice(m, 0, r->params, 0, m->num_params, seed);
    dp_model_init_slice(m, 1, r->buffers, 0, m->num_buffers, seed);
}

/* Each tensor's overlap [j0, j1) with the slice, element j of tensor i drawn
 * by the counter (seed, i, j): the same value whoever draws it. */
void dp_model_init_slice(const struct dp_model *m, int buffers, float *dst, int64_t off, int64_t len, uint64_t seed) {
    for (int i = 0; i < m->nparams; i++) {
        const struct dp_param_info *p = &m->params[i];
        if (!p->is_buffer != !buffers) continue;
        int64_t j0 = off > p->offset ? off - p->offset : 0;
        int64_t j1 = off + len < p->offset + p->count ? off + len - p->offset : p->count;
        for (int64_t j = j0; j < j1; j++) {
            float *o = &dst[p->offset - off + j];
            switch (p->init) {
            case DP_INIT_CONST: *o = p->init_a; break;
            case DP_INIT_UNIFORM:
                *o = p->init_a * (2.0f * dp_rng_uniform(seed, DP_RNG_INIT, (uint64_t)i, (uint64_t)j) - 1.0f);
                break;
            case DP_INIT_NORMAL: *o = p->init_a * dp_rng_normal(seed, DP_RNG_INIT, (uint64_t)i, (uint64_t)j); break;
            default: *o = 0.0f; break;
            }
        }
    }
}

uint64_t dp_replica_hash(const struct dp_replica *r) {
    uint64_t h = dp_fnv1a64(r->params, (size_t)r->model->num_params * sizeof(float), DP_FNV1A64_INIT);
    return dp_fnv1a64(r->buffers, (size_t)r->model->num_buffers * sizeof(float), h);
}

/* ---- slices (dp_model_set_unit) ---------------------------------------------------- */

/* As few slices as the unit allows, of equal rows (the last the remainder): n = ceil(rows / s)
 * slices of ceil(rows / n) rows, s the rows that fit the unit. */
int64_t dp_unit_slice_rows(int64_t rows, int64_t row_len, size_t bytes) {
    if (!bytes || rows <= 1 || row_len <= 0 || (size_t)(rows * row_len) * sizeof(float) <= bytes) return 0;
    int64_t s = (int64_t)(bytes / (sizeof(float) * (size_t)row_len));
    if (s < 1) s = 1;
    const int64_t n = (rows + s - 1) / s;
    return (rows + n - 1) / n;
}

/* l and what is under it cut for the unit (or not: bytes 0, or no larger than it); 1 if cut. */
static int cut(struct dp_layer *l, size_t bytes) {
    l->slice_rows = 0, l->parts = 0;
    const int over = bytes && (size_t)l->param_count * sizeof(float) > bytes;
    if (l->rows > 0) l->slice_rows = dp_unit_slice_rows(l->rows, l->row_len, bytes);
    else if (l->nkids) l->parts = over;
    for (int k = 0; k < l->nkids; k++) cut(l->kids[k], l->parts ? bytes : 0);
    return l->slice_rows > 0 || l->parts;
}

int dp_model_set_unit(struct dp_model *m, size_t bytes) {
    int n = 0;
    for (int i = 0; i < m->nlayers; i++) n += cut(m->layers[i], bytes);
    return n;
}

static int add_range(int64_t *off, int64_t *count, int max, int n, int64_t o, int64_t c) {
    if (n < max && count) {
        if (off) off[n] = o;
        count[n] = c;
    }
    return n + 1;
}

int dp_layer_ranges(const struct dp_layer *l, int64_t *off, int64_t *count, int max) {
    int n = 0;
    if (l->slice_rows > 0) {
        const int64_t body = l->rows * l->row_len, ns = (l->rows + l->slice_rows - 1) / l->slice_rows;
        if (l->param_count > body) n = add_range(off, count, max, n, l->param_off + body, l->param_count - body);
        for (int64_t j = ns - 1; j >= 0; j--) {
            int64_t r0 = j * l->slice_rows, nr = l->rows - r0 < l->slice_rows ? l->rows - r0 : l->slice_rows;
            n = add_range(off, count, max, n, l->param_off + r0 * l->row_len, nr * l->row_len);
        }
    } else if (l->parts) {
        for (int k = l->nkids - 1; k >= 0; k--)
            if (l->kids[k]->param_count > 0)
                n += dp_layer_ranges(l->kids[k], off ? off + n : NULL, count ? count + n : NULL, max > n ? max - n : 0);
    } else if (l->param_count > 0)
        n = add_range(off, count, max, n, l->param_off, l->param_count);
    return n;
}

int dp__kid_begin(struct dp_ctx *ctx, const struct dp_layer *parent, struct dp_layer *kid, int phase) {
    if (parent->parts && ctx->layer_begin && kid->param_count > 0) {
        int rc = ctx->layer_begin(ctx->layer_begin_arg, phase, -1, kid);
        if (rc) return dp_adderr(rc, "%s", kid->name);
    }
    return DP_OK;
}

void dp__kid_backward_done(struct dp_ctx *ctx, const struct dp_layer *parent, struct dp_layer *kid) {
    /* (a kid cut in turn reported its own ranges as it wrote them) */
    if (parent->parts && kid->param_count > 0 && ctx->grad_ready && !kid->slice_rows && !kid->parts)
        ctx->grad_ready(ctx->grad_ready_arg, kid->param_off, kid->param_count);
}

int dp__kid_forward(struct dp_ctx *ctx, const struct dp_layer *parent, struct dp_layer *kid, float *y, const float *x,
                    int64_t B) {
    int rc = dp__kid_begin(ctx, parent, kid, DP_PHASE_FORWARD);
    return rc ? rc : kid->ops->forward(kid, ctx, y, x, B);
}

int dp__kid_backward(struct dp_ctx *ctx, const struct dp_layer *parent, struct dp_layer *kid, float *dx,
                     const float *dy, const float *x, const float *y, int64_t B) {
    int rc = dp__kid_begin(ctx, parent, kid, DP_PHASE_BACKWARD);
    if (!rc) rc = kid->ops->backward(kid, ctx, dx, dy, x, y, B);
    if (!rc) dp__kid_backward_done(ctx, parent, kid);
    return rc;
}

int dp__layer_slice_begin(const struct dp_ctx *ctx, const struct dp_layer *l, int phase, int64_t r0, int64_t nr,
                          int bias) {
    if (!ctx->layer_begin) return DP_OK;
    struct dp_layer v = *l; /* the slice's view: its rows, the parameters after them (bias) as its tied range */
    const int64_t tail = l->param_count - l->rows * l->row_len;
    v.param_off = l->param_off + r0 * l->row_len, v.param_count = r0 == l->rows ? tail : nr * l->row_len;
    v.tied_off = bias && tail ? l->param_off + l->rows * l->row_len : 0, v.tied_count = bias ? tail : 0;
    v.slice_rows = 0;
    int rc = ctx->layer_begin(ctx->layer_begin_arg, phase, -1, &v);
    if (!rc) return DP_OK;
    return r0 == l->rows ? dp_adderr(rc, "its bias") : dp_adderr(rc, "rows %lld..%lld", (long long)r0, (long long)(r0 + nr - 1));
}

/* ---- one pass ------------------------------------------------------------------ */

/* The pass's context on replica r (its slabs, arena and saved state). */
static struct dp_ctx pass_ctx(struct dp_replica *r, const struct dp_batch *b, const struct dp_pass *p) {
    return (struct dp_ctx){
        .params = r->params, .grads = r->grads, .buffers = r->buffers, .arena = &r->arena,
        .saved = r->saved, .batch = b, .training = p->training, .seed = p->seed,
        .grad_ready = p->grad_ready, .grad_ready_arg = p->grad_ready_arg,
        .stat_sync = p->stat_sync, .stat_sync_arg = p->stat_sync_arg, .stat_acc = p->stat_acc,
        .tp = p->tp && p->tp->size > 1 ? p->tp : NULL,
        .layer_begin = p->layer_begin, .layer_begin_arg = p->layer_begin_arg,
    };
}

/* Rows of the loss (R) and classes (V) of a batch of B samples, and the loss scale. */
static float pass_scale(const struct dp_model *m, int64_t B, const struct dp_pass *p, int64_t *R, int64_t *V) {
    struct dp_shape out = dp_model_cur_shape(m);
    *V = out.d[out.ndim - 1];
    *R = B * (dp_shape_numel(&out) / *V);
    return p->loss_scale != 0.0f ? p->loss_scale : *R > 0 ? 1.0f / (float)*R : 0.0f;
}

int dp_model_forward_range(const struct dp_model *m, struct dp_replica *r, const struct dp_batch *b, int l0, int l1,
                           const float *x, struct dp_pass *p) {
    int64_t B = b->B;
    /* B = 0 is allowed: a data-parallel worker whose share of a small last
     * batch is empty still runs the pass, so that it takes part in the
     * collectives inside it (SyncBatchNorm) and contributes zero gradients. */
    if (B < 0 || B > r->max_batch)
        return dp_seterr(DP_EINVAL, "model: batch of %lld samples (replica holds up to %lld)",
                         (long long)B, (long long)r->max_batch);
    if (l0 < 0 || l1 > m->nlayers || l0 >= l1)
        return dp_seterr(DP_EINVAL, "model: layers [%d, %d) of %d", l0, l1, m->nlayers);
    if (p->backward && !p->training) return dp_seterr(DP_EINVAL, "model: backward needs training mode");
    dp_arena_reset(&r->arena);
    memset(r->saved, 0, sizeof(void *) * (size_t)(m->nids + 1));
    r->dlogits = NULL;
    struct dp_ctx ctx = pass_ctx(r, b, p);
    int64_t R, V;
    ctx.loss_scale = pass_scale(m, B, p, &R, &V);
    double t0 = dp_time();
    r->acts[l0] = (float *)(l0 == 0 ? b->x : x);
    for (int i = l0; i < l1; i++) {
        struct dp_layer *l = m->layers[i];
        int rc = p->layer_begin ? p->layer_begin(p->layer_begin_arg, DP_PHASE_FORWARD, i, l) : 0;
        if (rc) return dp_adderr(rc, "forward %s", l->name);
        if (l->fused) { /* done by the layer before it */
            r->acts[i + 1] = r->acts[i];
            continue;
        }
        float *y = dp_arena_alloc(&r->arena, sizeof(float) * (size_t)(B * dp_shape_numel(&l->out_shape)));
        if (!y) return dp_adderr(DP_ENOMEM, "forward %s", l->name);
        /* a pass without backward (evaluation) keeps the layers' outputs only: what a layer keeps
         * for its backward is given back as soon as it is done */
        const struct dp_arena_mark mk = dp_arena_mark(&r->arena);
        rc = l->ops->forward(l, &ctx, y, r->acts[i], B);
        if (rc) return dp_adderr(rc, "forward %s", l->name);
        if (!p->training) dp_arena_release(&r->arena, mk);
        r->acts[i + 1] = y;
    }
    p->abs_sum = 0, p->correct = 0, p->loss_sum = 0;
    if (l1 == m->nlayers) { /* the loss, and its gradient for backward */
        const float *logits = r->acts[m->nlayers];
        if (p->backward && !(r->dlogits = dp_arena_alloc(&r->arena, sizeof(float) * (size_t)(R * V))))
            return dp_adderr(DP_ENOMEM, "loss");
        int64_t v0, Vl; /* (under a tensor group, the head's vocabulary slice) */
        const int split = ctx.tp && m->layers[m->nlayers - 1]->tp_out_split && m->loss != DP_LOSS_MSE;
        if (split) dp_tp_slice(V, ctx.tp->size, ctx.tp->rank, &v0, &Vl);
        int rc = m->loss == DP_LOSS_MSE
                     ? dp_mse(r->dlogits, &p->loss_sum, &p->abs_sum, logits, b->target, R, V, ctx.loss_scale)
                 : split ? dp_softmax_xent_split(r->dlogits, &p->loss_sum, &p->correct, logits, b->targets, R, V, v0,
                                                 Vl, ctx.loss_scale, ctx.tp)
                         : dp_softmax_xent(r->dlogits, &p->loss_sum, &p->correct, logits, b->targets, R, V,
                                           ctx.loss_scale);
        if (rc) return dp_adderr(rc, "loss");
    }
    p->t_forward = dp_time() - t0;
    p->t_backward = 0;
    return DP_OK;
}

int dp_model_backward_range(const struct dp_model *m, struct dp_replica *r, const struct dp_batch *b, int l0, int l1,
                            const float *dy, const float **dx_out, struct dp_pass *p) {
    if (dx_out) *dx_out = NULL;
    if (l0 < 0 || l1 > m->nlayers || l0 >= l1)
        return dp_seterr(DP_EINVAL, "model: layers [%d, %d) of %d", l0, l1, m->nlayers);
    if (l1 == m->nlayers) dy = r->dlogits;
    if (!p->backward || !dy) return dp_seterr(DP_EINVAL, "model: backward without its forward or output gradient");
    int64_t B = b->B;
    struct dp_ctx ctx = pass_ctx(r, b, p);
    int64_t R, V;
    ctx.loss_scale = pass_scale(m, B, p, &R, &V);
    double t1 = dp_time();
    /* two ping-pong buffers for the activation gradients */
    int64_t maxn = 0;
    for (int i = l0 > 0 ? l0 : 1; i < l1; i++) {
        int64_t n = dp_shape_numel(&m->layers[i]->in_shape);
        if (n > maxn) maxn = n;
    }
    float *buf[2] = {NULL, NULL};
    if (maxn > 0) {
        buf[0] = dp_arena_alloc(&r->arena, sizeof(float) * (size_t)(B * maxn));
        buf[1] = dp_arena_alloc(&r->arena, sizeof(float) * (size_t)(B * maxn));
        if (!buf[0] || !buf[1]) return dp_adderr(DP_ENOMEM, "backward");
    }
    int rc;
    for (int i = l1 - 1; i >= l0; i--) {
        struct dp_layer *l = m->layers[i];
        float *dx = i > 0 ? (dy == buf[0] ? buf[1] : buf[0]) : NULL; /* (not the buffer dy is in) */
        /* a layer's backward scratch is dead once it returns (its results
         * are dx and the gradients): give it back, so that the step's peak is
         * the forward's saved activations plus one layer's scratch, not the
         * sum over all layers */
        if (p->layer_begin &&
            (rc = p->layer_begin(p->layer_begin_arg, DP_PHASE_BACKWARD, i, l)))
            return dp_adderr(rc, "backward %s", l->name);
        if (l->fused) continue; /* its dx is its dy: the layer before it masks dy itself */
        struct dp_arena_mark mk = dp_arena_mark(&r->arena);
        rc = l->ops->backward(l, &ctx, dx, dy, r->acts[i], r->acts[i + 1], B);
        dp_arena_release(&r->arena, mk);
        if (rc) return dp_adderr(rc, "backward %s", l->name);
        /* (a layer in slices or parts reported each range itself, as it was written) */
        if (l->param_count > 0 && p->grad_ready && l->slice_rows <= 0 && !l->parts)
            p->grad_ready(p->grad_ready_arg, l->param_off, l->param_count);
        dy = dx;
    }
    if (dx_out) *dx_out = dy;
    p->t_backward = dp_time() - t1;
    return DP_OK;
}

int dp_model_run(const struct dp_model *m, struct dp_replica *r, const struct dp_batch *b,
                 struct dp_pass *p) {
    int rc = dp_model_forward_range(m, r, b, 0, m->nlayers, NULL, p);
    if (rc || !p->backward) return rc;
    double t_forward = p->t_forward;
    rc = dp_model_backward_range(m, r, b, 0, m->nlayers, NULL, NULL, p);
    p->t_forward = t_forward;
    return rc;
}

static int no_sum(void *arg, float *buf, int64_t n) {
    (void)arg, (void)buf, (void)n;
    return DP_OK;
}

int dp_model_layer_bytes(const struct dp_model *m, double *out, double *saved, double *scratch) {
    return dp_model_layer_bytes_tp(m, 1, out, saved, scratch);
}

int dp_model_layer_bytes_tp(const struct dp_model *m, int size, double *out, double *saved, double *scratch) {
    const struct dp_tp tp = {.rank = 0, .size = size, .allreduce = no_sum};
    struct dp_replica r, v;
    memset(&v, 0, sizeof v);
    int rc = dp_replica_init(&r, m, 1);
    if (rc) return rc;
    const int64_t n = dp_shape_numel(&m->in_shape), T = dp_model_reads_tokens(m) ? n : 0;
    const struct dp_shape os = dp_model_cur_shape(m);
    const int64_t pos = dp_shape_numel(&os) / os.d[os.ndim - 1];
    int64_t most = 1, idx = 0;
    for (int i = 0; i < m->nlayers; i++)
        if (dp_shape_numel(&m->layers[i]->out_shape) > most) most = dp_shape_numel(&m->layers[i]->out_shape);
    float *x = dp_calloc((size_t)n, sizeof(float)), *dy = dp_calloc((size_t)most, sizeof(float));
    int32_t *tok = dp_calloc((size_t)(T ? T : 1), sizeof(int32_t)), *tgt = dp_calloc((size_t)pos, sizeof(int32_t));
    float *target = dp_calloc((size_t)os.d[os.ndim - 1], sizeof(float));
    if (!x || !dy || !tok || !tgt || !target) rc = dp_seterr(DP_ENOMEM, "model: out of memory");
    const struct dp_batch b = {.B = 1, .x = T ? NULL : x, .tokens = T ? tok : NULL,
                               .targets = m->loss == DP_LOSS_MSE ? NULL : tgt,
                               .target = m->loss == DP_LOSS_MSE ? target : NULL, .sample_idx = &idx};
    struct dp_pass pass = {.training = 1, .backward = 1, .tp = &tp};
    if (!rc) rc = dp_model_forward_range(m, &r, &b, 0, m->nlayers, NULL, &pass);
    for (int i = 0; i < m->nlayers && !rc; i++) { /* layer i alone, on a view, from its input */
        struct dp_pass q = {.training = 1, .backward = 1, .tp = &tp};
        if ((rc = dp_replica_init_view(&v, &r, i, i + 1, 1)) ||
            (rc = dp_model_forward_range(m, &v, &b, i, i + 1, r.acts[i], &q)))
            break;
        out[i] = (double)dp_shape_numel(&m->layers[i]->out_shape);
        saved[i] = (double)v.arena.used_total;
        if ((rc = dp_model_backward_range(m, &v, &b, i, i + 1, dy, NULL, &q))) break;
        scratch[i] = (double)v.arena.high_water - saved[i];
        dp_replica_free(&v);
    }
    dp_replica_free(&v);
    dp_free(x), dp_free(dy), dp_free(tok), dp_free(tgt), dp_free(target);
    dp_replica_free(&r);
    return rc ? dp_adderr(rc, "model %s: measuring its layers", m->spec) : DP_OK;
}

void dp_model_apply_stats(const struct dp_model *m, float *buffers, const double *acc) {
    for (int i = 0; i < m->nlayers; i++) dp__layer_apply_stats(m->layers[i], buffers, acc);
}
