/* dptrain against PyTorch 1.13 (issue items A10 and 10 F4).
 *
 * torch_ref_{mlp,cnn,resnet}: the same weights and the same batch (B = 8,
 * 1x28x28) go through dptrain and through tests/torch/ref.py; the loss, the
 * logits, every parameter gradient, and (resnet) the BatchNorm running
 * statistics after the training-mode forward must agree.  The weights travel
 * through dp_safetensors_save, so this is also the dptrain -> PyTorch export
 * check (ref.py loads them with a strict load_state_dict).  Before the
 * training pass, eval-mode logits are compared too (BN with running stats).
 * torch_ref_gpt does the same for the transformer of issue 10 F4 (B = 3
 * sequences of T = 8 token ids; loss and logits over every position).
 *
 * torch_ref_gpt_adamw_curve: 200 AdamW steps from torch's initial weights on
 * the same windows; the per-step losses agree within 1% (comment there).
 *
 * torch_ref_init_{mlp,cnn,resnet,gpt}: the reverse direction.  ref.py writes a
 * freshly initialised torch model's state_dict (torch.manual_seed(0)) as
 * safetensors; dp_safetensors_load (what --init-from uses) must accept it,
 * and dptrain's eval-mode logits with those weights must equal torch's.
 *
 * torch_ref_safetensors_mismatch: dp_safetensors_load rejects a wrong shape,
 * a missing tensor, an extra tensor and a wrong dtype with DP_EMISMATCH and a
 * message naming the tensor (no torch needed).
 *
 * Every dptrain GEMM backend built in (ref, blas, dnnl) is compared in turn.
 *
 * Tolerances (float32 on both sides; the only difference is the order of
 * float32 summations inside GEMMs, convolutions, BN statistics and softmax):
 *   loss      |d - t| <= 1e-5 * |t|
 *   logits    |d - t| <= 1e-4 + 1e-4 * |t|              (each element)
 *   gradients per tensor, max|d - t| <= GRAD_TOL * max(1, max|t|) and
 *             max|d - t| <= GRAD_REL * max|t| + GRAD_ABS (the second one
 *             keeps the check meaningful for tensors whose gradients are
 *             all much smaller than 1)
 *   BN stats  |d - t| <= BUF_ABS + BUF_REL * |t|; num_batches_tracked exact
 * Measured (x86-64, AVX-512, all backends): loss <= 5e-8 relative, logits
 * <= 1.3e-6, gradients <= 2.5e-6 of max|t|, BN running stats <= 7e-8: the
 * tolerances leave a margin of 40x or more.  Checked by fault injection
 * (DP_TORCH_REF pointing at a modified ref.py): BN eps 1e-4 instead of 1e-5
 * fails on the logits, and one BN weight gradient scaled by 1.0002 fails on
 * the gradient (the GRAD_TOL rule alone would let it pass).  The measured
 * errors are printed to stderr ("worst rel").
 *
 * Environment: DP_TORCH_PYTHON (default /usr/bin/python3, the Debian python
 * with python3-torch), DP_TORCH_REF (default tests/torch/ref.py of the
 * source tree the binary was built in), DP_SKIP_TORCH=1 (skip instead of
 * failing when that python cannot import torch; CI=true makes the skip fail). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dp/nn.h"
#include "dp/optim.h"
#include "dp/train.h"
#include "test.h"

#define REF_B 8
#define REF_SEED 20240611u
/* gpt: the batch (sequences) and the largest context the setup holds. */
#define GPT_B 3
#define GPT_TMAX 64
/* Tolerances, see the header comment.  A conv weight gradient sums
 * B*H*W = 6272 products; float32 sums in a different order (blocked GEMM vs.
 * torch's mkldnn convolution) differ by ~sqrt(n) * 2^-24 ~ 5e-6 of the
 * magnitudes summed in the worst case, typically much less. */
#define GRAD_TOL 1e-4
#define GRAD_REL 1e-4
#define GRAD_ABS 1e-7
/* BN running statistics: one mean/variance over B*H*W >= 392 values, then a
 * momentum blend; measured relative errors ~1e-7. */
#define BUF_ABS 1e-5
#define BUF_REL 1e-5

/* ---- a small safetensors writer and reader ----------------------------------- */

struct st_tensor {
    const char *name;
    const char *dtype; /* "F32" or "I32" */
    int ndim;
    int64_t shape[4];
    const void *data; /* numel * 4 bytes */
};

static int64_t st_numel(const struct st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

static void st_write(const char *path, const struct st_tensor *t, int n) {
    static char hdr[65536];
    size_t len = 0;
    uint64_t off = 0;
    len += (size_t)snprintf(hdr + len, 65536 - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        uint64_t bytes = 4u * (uint64_t)st_numel(&t[i]);
        len += (size_t)snprintf(hdr + len, 65536 - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name,
                                t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            len += (size_t)snprintf(hdr + len, 65536 - len, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        len += (size_t)snprintf(hdr + len, 65536 - len, "],\"data_offsets\":[%llu,%llu]}",
                                (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
        ASSERT_TRUE(len < 65000);
    }
    hdr[len++] = '}';
    while (len % 8) hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) dp_test_fail(__FILE__, __LINE__, "cannot create %s", path);
    uint64_t hl = len;
    ASSERT_TRUE(fwrite(&hl, 8, 1, f) == 1);
    ASSERT_TRUE(fwrite(hdr, 1, len, f) == len);
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)st_numel(&t[i]);
        ASSERT_TRUE(fwrite(t[i].data, 4, cnt, f) == cnt);
    }
    ASSERT_TRUE(fclose(f) == 0);
}

struct st_entry {
    char name[160];
    char dtype[8];
    int ndim;
    int64_t shape[8];
    uint64_t begin, end;
};
struct st_file {
    char path[512];
    unsigned char *buf;
    size_t len, data_off;
    struct st_entry *e;
    int n;
};

struct st_parser {
    const char *s, *end, *path;
};
static void sp_ws(struct st_parser *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\n' || *p->s == '\r' || *p->s == '\t')) p->s++;
}
static void sp_expect(struct st_parser *p, char c) {
    sp_ws(p);
    if (p->s >= p->end || *p->s != c)
        dp_test_fail(__FILE__, __LINE__, "%s: bad safetensors header, %ld bytes before its end (expected '%c')",
                     p->path, (long)(p->end - p->s), c);
    p->s++;
}
static int sp_peek(struct st_parser *p, char c) {
    sp_ws(p);
    return p->s < p->end && *p->s == c;
}
static void sp_string(struct st_parser *p, char *out, size_t cap) {
    sp_expect(p, '"');
    size_t n = 0;
    while (p->s < p->end && *p->s != '"') {
        if (*p->s == '\\') {           /* keep escapes verbatim: names here have none */
            if (n + 1 < cap) out[n++] = *p->s;
            p->s++;
        }
        if (p->s < p->end && n + 1 < cap) out[n++] = *p->s;
        p->s++;
    }
    out[n] = 0;
    sp_expect(p, '"');
}
static uint64_t sp_u64(struct st_parser *p) {
    sp_ws(p);
    if (p->s >= p->end || *p->s < '0' || *p->s > '9')
        dp_test_fail(__FILE__, __LINE__, "%s: expected a number in the header", p->path);
    uint64_t v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') v = v * 10 + (uint64_t)(*p->s++ - '0');
    return v;
}
static int sp_u64_array(struct st_parser *p, int64_t *v, int cap) {
    int n = 0;
    sp_expect(p, '[');
    while (!sp_peek(p, ']')) {
        if (n) sp_expect(p, ',');
        uint64_t x = sp_u64(p);
        if (n >= cap) dp_test_fail(__FILE__, __LINE__, "%s: array too long in header", p->path);
        v[n++] = (int64_t)x;
    }
    sp_expect(p, ']');
    return n;
}

static void st_read(struct st_file *sf, const char *path) {
    memset(sf, 0, sizeof *sf);
    snprintf(sf->path, sizeof sf->path, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) dp_test_fail(__FILE__, __LINE__, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    ASSERT_TRUE(sz >= 8);
    sf->buf = malloc((size_t)sz + 1);
    ASSERT_TRUE(sf->buf != NULL);
    ASSERT_TRUE(fread(sf->buf, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    sf->len = (size_t)sz;
    uint64_t hl;
    memcpy(&hl, sf->buf, 8);
    ASSERT_TRUE(hl <= sf->len - 8);
    sf->data_off = 8 + (size_t)hl;
    struct st_parser p = {(const char *)sf->buf + 8, (const char *)sf->buf + 8 + hl, sf->path};
    int cap = 64;
    sf->e = calloc((size_t)cap, sizeof *sf->e);
    ASSERT_TRUE(sf->e != NULL);
    sp_expect(&p, '{');
    for (int first = 1; !sp_peek(&p, '}'); first = 0) {
        if (!first) sp_expect(&p, ',');
        char name[160];
        sp_string(&p, name, sizeof name);
        sp_expect(&p, ':');
        sp_expect(&p, '{');
        if (strcmp(name, "__metadata__") == 0) {
            for (int f2 = 1; !sp_peek(&p, '}'); f2 = 0) {
                char k[256], v[256];
                if (!f2) sp_expect(&p, ',');
                sp_string(&p, k, sizeof k);
                sp_expect(&p, ':');
                sp_string(&p, v, sizeof v);
            }
            sp_expect(&p, '}');
            continue;
        }
        if (sf->n == cap) {
            cap *= 2;
            sf->e = realloc(sf->e, sizeof *sf->e * (size_t)cap);
            ASSERT_TRUE(sf->e != NULL);
        }
        struct st_entry *e = &sf->e[sf->n++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", name);
        e->ndim = -1;
        int noff = 0;
        int64_t offs[2] = {0, 0};
        for (int f2 = 1; !sp_peek(&p, '}'); f2 = 0) {
            char k[32];
            if (!f2) sp_expect(&p, ',');
            sp_string(&p, k, sizeof k);
            sp_expect(&p, ':');
            if (strcmp(k, "dtype") == 0) sp_string(&p, e->dtype, sizeof e->dtype);
            else if (strcmp(k, "shape") == 0) e->ndim = sp_u64_array(&p, e->shape, 8);
            else if (strcmp(k, "data_offsets") == 0) noff = sp_u64_array(&p, offs, 2);
            else dp_test_fail(__FILE__, __LINE__, "%s: unknown key %s", path, k);
        }
        sp_expect(&p, '}');
        if (e->ndim < 0 || noff != 2 || offs[1] < offs[0] || (uint64_t)offs[1] > sf->len - sf->data_off)
            dp_test_fail(__FILE__, __LINE__, "%s: tensor %s: bad header entry", path, name);
        e->begin = (uint64_t)offs[0];
        e->end = (uint64_t)offs[1];
    }
}

static void st_free(struct st_file *sf) {
    free(sf->buf);
    free(sf->e);
    memset(sf, 0, sizeof *sf);
}

static const struct st_entry *st_find(const struct st_file *sf, const char *name) {
    for (int i = 0; i < sf->n; i++)
        if (strcmp(sf->e[i].name, name) == 0) return &sf->e[i];
    return NULL;
}

/* The F32 tensor `name` with the given shape, copied into a new array (the
 * file's data need not be aligned).  ndim < 0: any shape, *count set. */
static float *st_get_f32(const struct st_file *sf, const char *name, int ndim, const int64_t *shape,
                         int64_t *count) {
    const struct st_entry *e = st_find(sf, name);
    if (!e) dp_test_fail(__FILE__, __LINE__, "%s: no tensor '%s'", sf->path, name);
    if (strcmp(e->dtype, "F32") != 0)
        dp_test_fail(__FILE__, __LINE__, "%s: tensor '%s' is %s, expected F32", sf->path, name, e->dtype);
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    if (ndim >= 0) {
        int ok = e->ndim == ndim;
        for (int d = 0; ok && d < ndim; d++) ok = e->shape[d] == shape[d];
        if (!ok) {
            char a[128] = "", b[128] = "";
            for (int d = 0; d < e->ndim; d++) snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", d ? "," : "", (long long)e->shape[d]);
            for (int d = 0; d < ndim; d++) snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", d ? "," : "", (long long)shape[d]);
            dp_test_fail(__FILE__, __LINE__, "%s: tensor '%s' has shape [%s], dptrain has [%s]", sf->path, name, a, b);
        }
    }
    if (e->end - e->begin != 4u * (uint64_t)n)
        dp_test_fail(__FILE__, __LINE__, "%s: tensor '%s': byte size does not match the shape", sf->path, name);
    float *out = malloc(sizeof(float) * (size_t)(n ? n : 1));
    ASSERT_TRUE(out != NULL);
    memcpy(out, sf->buf + sf->data_off + e->begin, 4u * (size_t)n);
    if (count) *count = n;
    return out;
}

/* ---- running the reference ------------------------------------------------------ */

static const char *torch_python(void) {
    const char *p = getenv("DP_TORCH_PYTHON");
    return p && *p ? p : "/usr/bin/python3";
}
static const char *torch_ref_script(void) {
    static char def[4096];
    const char *p = getenv("DP_TORCH_REF");
    if (p && *p) return p;
    /* the source tree's copy, wherever the tests are run from */
    const char *src = dp_test_source_dir();
    snprintf(def, sizeof def, "%s/tests/torch/ref.py", src ? src : "(source tree not found)");
    return def;
}
static int torch_skip_allowed(void) {
    const char *s = getenv("DP_SKIP_TORCH");
    return s && strcmp(s, "1") == 0;
}
static int torch_importable(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' >/dev/null 2>&1", torch_python());
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Runs `python ref.py ARGS`; skips the test when torch is missing and
 * DP_SKIP_TORCH=1; fails it otherwise. */
static void run_ref_args(const char *args) {
    if (torch_skip_allowed() && !torch_importable())
        SKIP("%s cannot import torch, and DP_SKIP_TORCH=1", torch_python());
    if (access(torch_ref_script(), R_OK) != 0)
        dp_test_fail(__FILE__, __LINE__, "%s not found (set DP_TORCH_REF)",
                     torch_ref_script());
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' '%s' %s", torch_python(), torch_ref_script(), args);
    fflush(stdout);
    fflush(stderr);
    int st = system(cmd);
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) return;
    if (!torch_importable())
        dp_test_fail(__FILE__, __LINE__,
                     "%s cannot import torch: install python3-torch (Debian), or set DP_SKIP_TORCH=1 to skip the "
                     "PyTorch comparison", torch_python());
    dp_test_fail(__FILE__, __LINE__, "the PyTorch reference failed (status %d): %s", st, cmd);
}

/* Runs ref.py on one batch, which writes OUT (and INIT if not NULL). */
static void run_ref(const char *model, const char *in, const char *inputs, const char *out,
                   const char *init) {
    char args[4096];
    snprintf(args, sizeof args, "'%s' '%s' '%s' --inputs '%s'%s%s%s", model, in, out, inputs,
             init ? " --export-init '" : "", init ? init : "", init ? "'" : "");
    run_ref_args(args);
}

/* ---- the model, its weights and the batch ------------------------------------------ */

struct ref_setup {
    struct dp_model *m;
    struct dp_replica r;
    int64_t B, T;  /* samples; positions per sample (token models), else 0 */
    float x[REF_B * 28 * 28];
    int32_t y[REF_B];
    int32_t tok[GPT_B * GPT_TMAX], tgt[GPT_B * GPT_TMAX]; /* token models: ids, next ids */
    char dir[512];
    char weights[600], inputs[600], out[600], init[600];
};

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int is_gpt(const char *spec) { return strncmp(spec, "gpt:", 4) == 0; }

/* Builds the model with dptrain's initialisation, then perturbs what that
 * leaves constant (BN/LN weight 1 / bias 0, Linear biases 0, running stats
 * 0 / 1 / 0 batches), so that a layer that ignored gamma, beta, a bias or the
 * old running statistics would show up.  gpt: the N(0, 0.02) weights are
 * scaled to N(0, 0.2), so that attention is far from uniform (with 0.02 the
 * scores q.k/sqrt(dh) are ~1e-3 and a wrong scale or a swapped k/v would
 * hardly move the softmax). */
static void setup(struct ref_setup *s, const char *spec) {
    memset(s, 0, sizeof *s);
    ASSERT_OK(dp_model_from_spec(&s->m, spec, 1, 28, 28));
    s->B = is_gpt(spec) ? GPT_B : REF_B;
    s->T = is_gpt(spec) ? s->m->in_shape.d[0] : 0;
    ASSERT_TRUE(s->T <= GPT_TMAX);
    ASSERT_OK(dp_replica_init(&s->r, s->m, s->B));
    dp_model_init_params(s->m, &s->r, REF_SEED);
    for (int i = 0; i < s->m->nparams; i++) {
        const struct dp_param_info *p = &s->m->params[i];
        float *v = (p->is_buffer ? s->r.buffers : s->r.params) + p->offset;
        for (int64_t j = 0; j < p->count; j++) {
            float u = dp_rng_uniform(REF_SEED, DP_RNG_USER, 1000 + (uint64_t)i, (uint64_t)j);
            if (p->is_buffer) {
                if (ends_with(p->name, "running_mean")) v[j] = u - 0.5f;
                else if (ends_with(p->name, "running_var")) v[j] = 0.5f + 1.5f * u;
                else if (ends_with(p->name, "num_batches_tracked")) v[j] = 3.0f;
            } else if (p->init == DP_INIT_CONST || p->init == DP_INIT_ZERO) {
                v[j] += 0.5f * (u - 0.5f); /* gamma in [0.75, 1.25), beta in [-0.25, 0.25) */
            } else if (s->T && p->init == DP_INIT_NORMAL) {
                v[j] *= 10.0f;
            }
        }
    }
    for (int i = 0; i < REF_B * 28 * 28; i++) s->x[i] = dp_rng_normal(REF_SEED, DP_RNG_USER, 1, (uint64_t)i);
    for (int b = 0; b < REF_B; b++) s->y[b] = (int32_t)(dp_rng_u32(REF_SEED, DP_RNG_USER, 2, (uint64_t)b) % 10);
    const uint32_t V = (uint32_t)dp_model_num_classes(s->m);
    for (int64_t i = 0; i < s->B * s->T; i++) {
        s->tok[i] = (int32_t)(dp_rng_u32(REF_SEED, DP_RNG_USER, 3, (uint64_t)i) % V);
        s->tgt[i] = (int32_t)(dp_rng_u32(REF_SEED, DP_RNG_USER, 4, (uint64_t)i) % V);
    }
    snprintf(s->dir, sizeof s->dir, "%s", dp_test_tmpdir());
    snprintf(s->weights, sizeof s->weights, "%s/weights.safetensors", s->dir);
    snprintf(s->inputs, sizeof s->inputs, "%s/inputs.safetensors", s->dir);
    snprintf(s->out, sizeof s->out, "%s/out.safetensors", s->dir);
    snprintf(s->init, sizeof s->init, "%s/init.safetensors", s->dir);
    ASSERT_OK(dp_safetensors_save(s->weights, s->m, &s->r));
    struct st_tensor in[2] = {
        {"input.x", "F32", 4, {REF_B, 1, 28, 28}, s->x},
        {"input.y", "I32", 1, {REF_B, 0, 0, 0}, s->y},
    };
    struct st_tensor tin[2] = {
        {"input.tokens", "I32", 2, {s->B, s->T, 0, 0}, s->tok},
        {"input.targets", "I32", 2, {s->B, s->T, 0, 0}, s->tgt},
    };
    st_write(s->inputs, s->T ? tin : in, 2);
}

static void teardown(struct ref_setup *s) {
    dp_replica_free(&s->r);
    dp_model_free(s->m);
}

static struct dp_batch batch_of(struct ref_setup *s) {
    static int64_t idx[REF_B];
    for (int b = 0; b < REF_B; b++) idx[b] = b;
    struct dp_batch b = {.B = REF_B, .x = s->x, .targets = s->y, .sample_idx = idx, .epoch = 0};
    if (s->T) b = (struct dp_batch){.B = s->B, .tokens = s->tok, .targets = s->tgt, .sample_idx = idx};
    return b;
}

/* The logits' shape: (B, V) or, for a token model, (B, T, V). */
static int logits_shape(const struct ref_setup *s, int64_t *shape) {
    int64_t V = dp_model_num_classes(s->m);
    shape[0] = s->B;
    shape[1] = s->T ? s->T : V;
    shape[2] = V;
    return s->T ? 3 : 2;
}

/* Elementwise |d - t| <= abs + rel * |t|; returns the worst |d - t| / (abs +
 * rel |t|) ratio (<= 1 passes) and the worst relative error max|d-t|/max|t|. */
static double cmp_elementwise(const char *what, const float *d, const float *t, int64_t n, double abs_tol,
                              double rel_tol, double *worst_rel) {
    double worst = 0, maxdiff = 0, maxt = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double diff = fabs((double)d[i] - (double)t[i]);
        if (!(diff == diff) || isinf(d[i])) diff = INFINITY;
        double ratio = diff / (abs_tol + rel_tol * fabs((double)t[i]));
        if (!(ratio <= worst)) worst = ratio, at = i;
        if (diff > maxdiff) maxdiff = diff;
        if (fabs((double)t[i]) > maxt) maxt = fabs((double)t[i]);
    }
    double rel = maxdiff / (maxt > 0 ? maxt : 1);
    if (worst_rel && rel > *worst_rel) *worst_rel = rel;
    if (!(worst <= 1.0))
        dp_test_fail(__FILE__, __LINE__, "%s: element %lld: dptrain %.9g, torch %.9g (tolerance %.1e + %.1e*|t|)",
                     what, (long long)at, d[at], t[at], abs_tol, rel_tol);
    return rel;
}

/* ---- the forward/backward comparison ------------------------------------------------- */

/* One comparison of dptrain (with the current GEMM backend) against OUT. */
static void compare_once(struct ref_setup *s, const struct st_file *o, const char *gemm) {
    const struct dp_model *m = s->m;
    int64_t lshape[3];
    const int lnd = logits_shape(s, lshape);
    const int64_t R = s->B * (s->T ? s->T : 1), nlogits = R * dp_model_num_classes(m); /* loss rows */
    struct dp_batch b = batch_of(s);
    double worst_logit = 0, worst_grad = 0, worst_buf = 0, worst_eval = 0;
    char worst_grad_name[128] = "";

    /* Eval mode first, with the (perturbed) running statistics. */
    struct dp_pass pe = {.training = 0, .seed = REF_SEED};
    ASSERT_OK(dp_model_run(m, &s->r, &b, &pe));
    float *t_eval = st_get_f32(o, "logits_eval", lnd, lshape, NULL);
    cmp_elementwise("eval-mode logits", s->r.acts[m->nlayers], t_eval, nlogits, 1e-4, 1e-4, &worst_eval);
    free(t_eval);

    /* Training mode forward + backward. */
    memset(s->r.grads, 0, sizeof(float) * (size_t)m->num_params);
    struct dp_pass p = {.training = 1, .backward = 1, .seed = REF_SEED};
    ASSERT_OK(dp_model_run(m, &s->r, &b, &p));

    int64_t one = 1;
    float *t_loss = st_get_f32(o, "loss", 1, &one, NULL);
    double loss = p.loss_sum / (double)R; /* the mean over every row, as F.cross_entropy */
    double loss_rel = fabs(loss - t_loss[0]) / fabs((double)t_loss[0]);
    if (!(loss_rel <= 1e-5))
        dp_test_fail(__FILE__, __LINE__, "loss: dptrain %.9g, torch %.9g (relative error %.2e > 1e-5)", loss,
                     (double)t_loss[0], loss_rel);
    free(t_loss);

    float *t_logits = st_get_f32(o, "logits", lnd, lshape, NULL);
    cmp_elementwise("logits", s->r.acts[m->nlayers], t_logits, nlogits, 1e-4, 1e-4, &worst_logit);
    free(t_logits);

    int ngrad = 0, nbuf = 0;
    for (int i = 0; i < m->nparams; i++) {
        const struct dp_param_info *pi = &m->params[i];
        char name[160];
        snprintf(name, sizeof name, "%s.%s", pi->is_buffer ? "buffer" : "grad", pi->name);
        /* num_batches_tracked is a 0-d tensor in torch; only its value is
         * compared here (the shape is the loader's business: torch_ref_init). */
        int scalar = pi->is_buffer && ends_with(pi->name, "num_batches_tracked");
        int64_t tn = 0;
        float *t = st_get_f32(o, name, scalar ? -1 : pi->shape.ndim, pi->shape.d, &tn);
        if (scalar) ASSERT_EQ(tn, pi->count);
        if (pi->is_buffer) {
            const float *d = s->r.buffers + pi->offset;
            nbuf++;
            if (scalar) {
                for (int64_t j = 0; j < pi->count; j++)
                    if (d[j] != t[j])
                        dp_test_fail(__FILE__, __LINE__, "%s: dptrain %g, torch %g", pi->name, d[j], t[j]);
            } else {
                cmp_elementwise(pi->name, d, t, pi->count, BUF_ABS, BUF_REL, &worst_buf);
            }
        } else {
            const float *d = s->r.grads + pi->offset;
            ngrad++;
            double maxdiff = 0, maxt = 0;
            int64_t at = 0;
            for (int64_t j = 0; j < pi->count; j++) {
                double diff = fabs((double)d[j] - (double)t[j]);
                if (!(diff == diff)) diff = INFINITY;
                if (!(diff <= maxdiff)) maxdiff = diff, at = j;
                if (fabs((double)t[j]) > maxt) maxt = fabs((double)t[j]);
            }
            double rel = maxdiff / (maxt > 0 ? maxt : 1);
            if (rel > worst_grad) {
                worst_grad = rel;
                snprintf(worst_grad_name, sizeof worst_grad_name, "%s", pi->name);
            }
            double tol = GRAD_TOL * (maxt > 1 ? maxt : 1);
            double tol_rel = GRAD_REL * maxt + GRAD_ABS;
            if (!(maxdiff <= tol) || !(maxdiff <= tol_rel))
                dp_test_fail(__FILE__, __LINE__,
                             "gradient of %s: max |diff| %.3g at element %lld (dptrain %.9g, torch %.9g), "
                             "max |g_torch| %.3g, tolerance %.3g",
                             pi->name, maxdiff, (long long)at, d[at], t[at], maxt, tol < tol_rel ? tol : tol_rel);
        }
        free(t);
    }
    /* Every gradient and buffer torch reported was compared. */
    int tgrad = 0, tbuf = 0;
    for (int i = 0; i < o->n; i++) {
        tgrad += strncmp(o->e[i].name, "grad.", 5) == 0;
        tbuf += strncmp(o->e[i].name, "buffer.", 7) == 0;
    }
    ASSERT_EQ(tgrad, ngrad);
    ASSERT_EQ(tbuf, nbuf);
    fprintf(stderr,
            "    torch_ref %s (gemm %s): loss %.6f rel err %.2e | logits worst rel %.2e (eval %.2e) | %d gradients worst rel "
            "%.2e (%s) | %d buffers worst rel %.2e\n",
            m->spec, gemm, loss, loss_rel, worst_logit, worst_eval, ngrad, worst_grad, worst_grad_name, nbuf, worst_buf);
}

static void torch_ref_compare(const char *spec) {
    struct ref_setup *s = calloc(1, sizeof *s);
    ASSERT_TRUE(s != NULL);
    setup(s, spec);
    run_ref(spec, s->weights, s->inputs, s->out, NULL);
    struct st_file o;
    st_read(&o, s->out);
    const struct dp_model *m = s->m;
    /* The starting state, restored before each GEMM backend's run. */
    size_t pbytes = sizeof(float) * (size_t)m->num_params, bbytes = sizeof(float) * (size_t)m->num_buffers;
    float *p0 = malloc(pbytes + 4), *b0 = malloc(bbytes + 4);
    ASSERT_TRUE(p0 && b0);
    memcpy(p0, s->r.params, pbytes);
    memcpy(b0, s->r.buffers, bbytes);
    enum dp_gemm_backend saved = dp_gemm_get_backend();
    for (int be = 0; be < DP_GEMM_BACKEND_COUNT; be++) {
        if (!dp_gemm_backend_available((enum dp_gemm_backend)be)) continue;
        ASSERT_OK(dp_gemm_set_backend((enum dp_gemm_backend)be));
        memcpy(s->r.params, p0, pbytes);
        memcpy(s->r.buffers, b0, bbytes);
        compare_once(s, &o, dp_gemm_backend_name((enum dp_gemm_backend)be));
    }
    ASSERT_OK(dp_gemm_set_backend(saved));
    free(p0);
    free(b0);
    st_free(&o);
    teardown(s);
    free(s);
}

TEST_T(torch_ref_mlp, 300) { torch_ref_compare("mlp"); }
TEST_T(torch_ref_cnn, 300) { torch_ref_compare("cnn"); }
TEST_T(torch_ref_resnet, 300) { torch_ref_compare("resnet"); }
/* Issue 10 F4: the transformer (embeddings, causal attention, GELU MLP,
 * pre-LN blocks, tied head, cross-entropy at every position). */
#define GPT_REF_SPEC "gpt:layers=2,heads=2,dim=16,ctx=8,vocab=32"
TEST_T(torch_ref_gpt, 300) { torch_ref_compare(GPT_REF_SPEC); }

/* ---- PyTorch -> dptrain: a torch-initialised state_dict loads with --init-from ---- */

static void torch_ref_init(const char *spec) {
    struct ref_setup *s = calloc(1, sizeof *s);
    ASSERT_TRUE(s != NULL);
    setup(s, spec);
    run_ref(spec, s->weights, s->inputs, s->out, s->init);
    const struct dp_model *m = s->m;
    struct dp_replica r2;
    ASSERT_OK(dp_replica_init(&r2, m, s->B));
    ASSERT_OK(dp_safetensors_load(s->init, m, &r2));
    /* The loaded values are the file's, bit for bit. */
    struct st_file fi;
    st_read(&fi, s->init);
    ASSERT_EQ(fi.n, m->nparams);
    for (int i = 0; i < m->nparams; i++) {
        const struct dp_param_info *pi = &m->params[i];
        float *t = st_get_f32(&fi, pi->name, pi->shape.ndim, pi->shape.d, NULL);
        const float *d = (pi->is_buffer ? r2.buffers : r2.params) + pi->offset;
        if (memcmp(d, t, sizeof(float) * (size_t)pi->count) != 0)
            dp_test_fail(__FILE__, __LINE__, "%s: loaded values differ from the file", pi->name);
        free(t);
    }
    st_free(&fi);

    struct st_file o;
    st_read(&o, s->out);
    int64_t lshape[3];
    const int lnd = logits_shape(s, lshape);
    struct dp_batch b = batch_of(s);
    struct dp_pass pe = {.training = 0, .seed = REF_SEED};
    ASSERT_OK(dp_model_run(m, &r2, &b, &pe));
    float *t = st_get_f32(&o, "logits_init", lnd, lshape, NULL);
    double worst = 0;
    cmp_elementwise("logits with torch's initial weights", r2.acts[m->nlayers], t,
                    s->B * (s->T ? s->T : 1) * dp_model_num_classes(m), 1e-4, 1e-4, &worst);
    fprintf(stderr, "    torch_ref_init %s: torch state_dict loaded, eval logits worst rel %.2e\n", spec, worst);
    free(t);
    st_free(&o);
    dp_replica_free(&r2);
    teardown(s);
    free(s);
}

TEST_T(torch_ref_init_mlp, 300) { torch_ref_init("mlp"); }
TEST_T(torch_ref_init_cnn, 300) { torch_ref_init("cnn"); }
TEST_T(torch_ref_init_resnet, 300) { torch_ref_init("resnet"); }
TEST_T(torch_ref_init_gpt, 300) { torch_ref_init(GPT_REF_SPEC); }

/* ---- 200 AdamW steps from torch's initial weights: the two loss curves ------------- */

/* Issue 10 F4: from the same initial weights (a fresh torch model exported by
 * ref.py, loaded with dp_safetensors_load as --init-from does) and the same
 * windows, dptrain (dp_model_run + dp_optim_step, what the trainer does each
 * step) and torch.optim.AdamW (foreach=False, the same betas, eps and
 * decoupled weight decay on every parameter, the same per-step learning rate
 * from dp_sched_lr: warmup to 1e-2, cosine down to 1e-3) produce loss curves
 * that agree within CURVE_REL (the 1%) at every step.  Differences
 * come only from float32 summation order and compound over the steps;
 * measured worst 2.3e-7 (printed), every backend.  The 1% is coarse next to
 * that: it is torch_ref_gpt that pins the model to ~1e-6.  What this adds is
 * the training loop: torch's initial weights loaded, the loss over B T
 * positions, AdamW with its schedule, 200 steps.  Checked by fault injection
 * (each breaks this test; the first two break torch_ref_gpt too):
 * attention without the 1/sqrt(dh) scale (1.1% at step 34), k and v swapped
 * (3.4% at step 20), AdamW without weight decay (1.3% at step 37), AdamW
 * without the bias correction of v (1.3% at step 1).  The learning rate is
 * high for this reason: at 3e-3 the weights stay small, the attention scores
 * near 0, and the missing scale moved the curve by only 0.8%.
 *
 * The windows follow a noisy rule, so that the model has something to learn,
 * and one that needs attention (the previous token, not only the current one):
 * w[i+1] = (w[i] + 1 + 2 (w[i-1] mod 2)) mod V with probability 3/4, else a
 * uniform token.  The curve must fall (the mean of the last 20 losses below
 * CURVE_DROP x the first; measured 3.50 -> 1.75): a flat curve would compare
 * little beyond the initial loss. */
#define CURVE_SPEC "gpt:layers=2,heads=2,dim=32,ctx=16,vocab=32"
#define CURVE_STEPS 200
#define CURVE_B 4
#define CURVE_REL 1e-2
#define CURVE_DROP 0.7

static void curve_windows(int32_t *tok, int32_t *tgt, int64_t nwin, int64_t T, uint32_t V) {
    for (int64_t w = 0; w < nwin; w++) {
        int32_t prev = 0, cur = (int32_t)(dp_rng_u32(REF_SEED, DP_RNG_USER, 10, (uint64_t)w) % V);
        for (int64_t i = 0; i < T; i++) {
            const uint64_t k = (uint64_t)(w * T + i);
            int32_t next = (int32_t)(((uint32_t)cur + 1u + 2u * ((uint32_t)prev & 1u)) % V);
            if (dp_rng_u32(REF_SEED, DP_RNG_USER, 11, k) % 4 == 0)
                next = (int32_t)(dp_rng_u32(REF_SEED, DP_RNG_USER, 12, k) % V);
            tok[w * T + i] = cur;
            tgt[w * T + i] = next;
            prev = cur, cur = next;
        }
    }
}

TEST_T(torch_ref_gpt_adamw_curve, 300) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, CURVE_SPEC, 0, 0, 0));
    const int64_t S = CURVE_STEPS, B = CURVE_B, T = m->in_shape.d[0], n = m->num_params;
    const uint32_t V = (uint32_t)dp_model_num_classes(m);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(S * B * T));
    int32_t *tgt = malloc(sizeof(int32_t) * (size_t)(S * B * T));
    float *lr = malloc(sizeof(float) * (size_t)S);
    ASSERT_TRUE(tok && tgt && lr);
    curve_windows(tok, tgt, S * B, T, V);
    const struct dp_sched sched = {.kind = DP_SCHED_COSINE, .base_lr = 1e-2f, .total_steps = S,
                                   .warmup_steps = 20, .min_lr = 1e-3f};
    ASSERT_OK(dp_sched_check(&sched));
    for (int64_t t = 0; t < S; t++) lr[t] = dp_sched_lr(&sched, t);
    struct dp_optim_params hp = dp_optim_default_params();
    hp.kind = DP_OPTIM_ADAMW, hp.beta1 = 0.9f, hp.beta2 = 0.95f, hp.eps = 1e-8f, hp.weight_decay = 0.1f;
    const float hpv[4] = {hp.beta1, hp.beta2, hp.eps, hp.weight_decay};

    char dir[512], train[600], out[600], init[600], args[2048];
    snprintf(dir, sizeof dir, "%s", dp_test_tmpdir());
    snprintf(train, sizeof train, "%s/train.safetensors", dir);
    snprintf(out, sizeof out, "%s/curve.safetensors", dir);
    snprintf(init, sizeof init, "%s/init.safetensors", dir);
    const struct st_tensor tin[4] = {
        {"train.tokens", "I32", 3, {S, B, T, 0}, tok},
        {"train.targets", "I32", 3, {S, B, T, 0}, tgt},
        {"train.lr", "F32", 1, {S, 0, 0, 0}, lr},
        {"train.hparams", "F32", 1, {4, 0, 0, 0}, hpv},
    };
    st_write(train, tin, 4);
    snprintf(args, sizeof args, "'%s' --adamw '%s' '%s' --export-init '%s'", CURVE_SPEC, train, out, init);
    run_ref_args(args);

    struct st_file o;
    st_read(&o, out);
    float *t_loss = st_get_f32(&o, "losses", 1, &S, NULL);
    double tail = 0; /* the mean of the last 20 steps (one batch's loss is noisy) */
    for (int64_t t = S - 20; t < S; t++) tail += t_loss[t] / 20.0;
    if (!(tail < CURVE_DROP * t_loss[0]))
        dp_test_fail(__FILE__, __LINE__, "torch's loss goes from %.4f to %.4f (last 20 steps) in %lld steps: too "
                     "flat a curve", (double)t_loss[0], tail, (long long)S);

    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, B));
    ASSERT_OK(dp_safetensors_load(init, m, &r));
    float *p0 = malloc(sizeof(float) * (size_t)n);
    ASSERT_TRUE(p0 != NULL);
    memcpy(p0, r.params, sizeof(float) * (size_t)n);
    int64_t idx[CURVE_B];
    for (int64_t b = 0; b < B; b++) idx[b] = b;

    enum dp_gemm_backend saved = dp_gemm_get_backend();
    for (int be = 0; be < DP_GEMM_BACKEND_COUNT; be++) {
        if (!dp_gemm_backend_available((enum dp_gemm_backend)be)) continue;
        ASSERT_OK(dp_gemm_set_backend((enum dp_gemm_backend)be));
        memcpy(r.params, p0, sizeof(float) * (size_t)n);
        struct dp_optim opt;
        ASSERT_OK(dp_optim_init(&opt, &hp, n));
        double worst = 0, first = 0, last = 0;
        int64_t worst_at = 0;
        for (int64_t t = 0; t < S; t++) {
            struct dp_batch b = {.B = B, .tokens = tok + t * B * T, .targets = tgt + t * B * T,
                                 .sample_idx = idx, .epoch = 0};
            memset(r.grads, 0, sizeof(float) * (size_t)n);
            struct dp_pass p = {.training = 1, .backward = 1, .seed = REF_SEED};
            ASSERT_OK(dp_model_run(m, &r, &b, &p));
            const double loss = p.loss_sum / (double)(B * T); /* mean over every position */
            const double rel = fabs(loss - t_loss[t]) / fabs((double)t_loss[t]);
            if (!(rel <= CURVE_REL))
                dp_test_fail(__FILE__, __LINE__,
                             "gemm %s, step %lld: loss dptrain %.7g, torch %.7g (relative difference %.2e > %.0e)",
                             dp_gemm_backend_name((enum dp_gemm_backend)be), (long long)t, loss,
                             (double)t_loss[t], rel, CURVE_REL);
            if (rel > worst) worst = rel, worst_at = t;
            if (t == 0) first = loss;
            last = loss;
            ASSERT_OK(dp_optim_step(&opt, r.params, r.grads, n, lr[t]));
        }
        fprintf(stderr,
                "    torch_ref adamw %s (gemm %s): %lld steps, loss %.4f -> %.4f (torch %.4f -> %.4f, last 20 "
                "mean %.4f), worst rel %.2e at step %lld\n",
                CURVE_SPEC, dp_gemm_backend_name((enum dp_gemm_backend)be), (long long)S, first, last, (double)t_loss[0], (double)t_loss[S - 1], tail, worst, (long long)worst_at);
        dp_optim_free(&opt);
    }
    ASSERT_OK(dp_gemm_set_backend(saved));
    free(p0);
    free(t_loss);
    st_free(&o);
    dp_replica_free(&r);
    dp_model_free(m);
    free(tok);
    free(tgt);
    free(lr);
}

/* ---- dp_safetensors_load rejects files that do not match the model ------------------ */

TEST(torch_ref_safetensors_mismatch) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_spec(&m, "mlp:784,16,10", 1, 28, 28));
    struct dp_replica r;
    ASSERT_OK(dp_replica_init(&r, m, 4));
    dp_model_init_params(m, &r, 7);
    ASSERT_EQ(m->nparams, 4); /* fc1.weight, fc1.bias, fc2.weight, fc2.bias */
    struct st_tensor t[5];
    for (int i = 0; i < 4; i++) {
        const struct dp_param_info *p = &m->params[i];
        t[i] = (struct st_tensor){p->name, "F32", p->shape.ndim, {0, 0, 0, 0}, r.params + p->offset};
        for (int d = 0; d < p->shape.ndim; d++) t[i].shape[d] = p->shape.d[d];
    }
    ASSERT_TRUE(strcmp(t[0].name, "fc1.weight") == 0 && t[0].shape[0] == 16 && t[0].shape[1] == 784);
    char path[600];
    snprintf(path, sizeof path, "%s/x.safetensors", dp_test_tmpdir());

    /* The writer above produces a file the loader accepts, and a round trip
     * keeps every value. */
    struct dp_replica r2;
    ASSERT_OK(dp_replica_init(&r2, m, 4));
    st_write(path, t, 4);
    ASSERT_OK(dp_safetensors_load(path, m, &r2));
    ASSERT_TRUE(memcmp(r.params, r2.params, sizeof(float) * (size_t)m->num_params) == 0);

    /* Wrong shape: fc1.weight stored transposed (784, 16). */
    struct st_tensor bad[5];
    memcpy(bad, t, sizeof t);
    bad[0].shape[0] = 784, bad[0].shape[1] = 16;
    st_write(path, bad, 4);
    ASSERT_ERR(dp_safetensors_load(path, m, &r2), DP_EMISMATCH, "fc1.weight");

    /* Wrong rank: fc2.bias as (10, 1). */
    memcpy(bad, t, sizeof t);
    bad[3].ndim = 2, bad[3].shape[1] = 1;
    st_write(path, bad, 4);
    ASSERT_ERR(dp_safetensors_load(path, m, &r2), DP_EMISMATCH, "fc2.bias");

    /* Missing tensor: no fc2.bias. */
    st_write(path, t, 3);
    ASSERT_ERR(dp_safetensors_load(path, m, &r2), DP_EMISMATCH, "fc2.bias");

    /* Missing tensor, not the last one: no fc1.bias. */
    memcpy(bad, t, sizeof t);
    bad[1] = t[3];
    st_write(path, bad, 3);
    ASSERT_ERR(dp_safetensors_load(path, m, &r2), DP_EMISMATCH, "fc1.bias");

    /* Extra tensor: fc3.weight does not exist in the model. */
    memcpy(bad, t, sizeof t);
    bad[4] = (struct st_tensor){"fc3.weight", "F32", 2, {10, 10, 0, 0}, r.params};
    st_write(path, bad, 5);
    ASSERT_ERR(dp_safetensors_load(path, m, &r2), DP_EMISMATCH, "fc3.weight");

    /* Wrong dtype: fc1.bias as I32 (same byte size). */
    memcpy(bad, t, sizeof t);
    bad[1].dtype = "I32";
    st_write(path, bad, 4);
    ASSERT_ERR(dp_safetensors_load(path, m, &r2), DP_EMISMATCH, "fc1.bias");

    dp_replica_free(&r2);
    dp_replica_free(&r);
    dp_model_free(m);
}
