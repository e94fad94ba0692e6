/* Named models: "mlp", "cnn", "resnet", "mlp:W0,W1,...[,dropout=P]",
 * "cnn:C1,C2[,F]", "resnet:DEPTH[,WIDTH]",
 * "gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V]". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/nn.h"

/* A comma-separated list of positive integers (at most max, each <= 2^24)
 * into v, stopping before a "key=" item (*rest points at it, or at the end);
 * the count, or a negative code with the model's error set. */
static int int_list(const char *model, const char *what, const char *list, int64_t *v, int max, const char **rest) {
    int n = 0;
    const char *s = list;
    while (*s && !strchr(s, '=')) {
        char *end;
        long long x = strtoll(s, &end, 10);
        if (end == s || x <= 0 || x > (1 << 24) || (*end && *end != ','))
            return dp_seterr(DP_EINVAL, "model %s: bad %s '%s'", model, what, list);
        if (n == max) return dp_seterr(DP_EINVAL, "model %s: more than %d %s", model, max, what);
        v[n++] = x;
        s = *end ? end + 1 : end;
    }
    *rest = s;
    return n;
}

/* mlp:784,512,512,10 -> flatten, fc1, relu1, fc2, relu2, fc3.  The first
 * width must be the flattened input size.  ",dropout=P" (0 <= P < 1) puts a
 * dropout after each hidden ReLU (drop1, drop2, ...). */
static int build_mlp(struct dp_model *m, const char *widths) {
    int64_t w[32];
    int n = 0;
    float drop = 0;
    const char *s = widths;
    const char *dk = strstr(widths, "dropout=");
    if (dk) {
        char *end;
        double p = strtod(dk + 8, &end);
        if (end == dk + 8 || *end || !(p >= 0 && p < 1) || (dk != widths && dk[-1] != ','))
            return dp_seterr(DP_EINVAL, "model mlp: bad dropout in '%s' (expected e.g. mlp:784,256,10,dropout=0.1, "
                             "with 0 <= dropout < 1)", widths);
        drop = (float)p;
    }
    while (*s && s != dk) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v <= 0 || v > (1 << 24))
            return dp_seterr(DP_EINVAL, "model mlp: bad width list '%s' (expected e.g. mlp:784,512,10)", widths);
        if (n == (int)DP_ARRAY_LEN(w)) return dp_seterr(DP_EINVAL, "model mlp: more than 32 widths");
        w[n++] = v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return dp_seterr(DP_EINVAL, "model mlp: bad width list '%s'", widths);
    }
    if (n < 2) return dp_seterr(DP_EINVAL, "model mlp: need at least an input and an output width");
    int64_t in = dp_shape_numel(&m->in_shape);
    if (w[0] != in)
        return dp_seterr(DP_EINVAL, "model mlp: first width %lld does not match the input size %lld",
                         (long long)w[0], (long long)in);
    int rc = dp_flatten(m, "flatten");
    for (int i = 1; i < n && !rc; i++) {
        char name[32];
        snprintf(name, sizeof name, "fc%d", i);
        rc = dp_linear(m, name, w[i], 1);
        if (!rc && i + 1 < n) {
            snprintf(name, sizeof name, "relu%d", i);
            rc = dp_relu(m, name);
            if (!rc && drop > 0) {
                snprintf(name, sizeof name, "drop%d", i);
                rc = dp_dropout(m, name, drop);
            }
        }
    }
    return rc;
}

/* conv C->c1 3x3 pad 1, relu, maxpool 2 -> conv c1->c2 3x3 pad 1, relu,
 * maxpool 2 -> flatten (c2*7*7 on 28x28) -> fc f, relu -> fc 10; "cnn" is
 * cnn:32,64,128.  The spec's list: "C1,C2[,F]". */
static int build_cnn(struct dp_model *m, const char *args, int64_t classes) {
    int64_t v[3] = {32, 64, 128};
    const char *rest = "";
    int n = args ? int_list("cnn", "channel list (expected cnn:C1,C2[,F], e.g. cnn:64,128)", args, v, 3, &rest) : 3;
    if (n < 0) return n;
    if (args && (n < 2 || *rest))
        return dp_seterr(DP_EINVAL, "model cnn: bad channel list '%s' (expected cnn:C1,C2[,F], e.g. cnn:64,128: "
                         "the two convolutions' channels and the hidden fc width, 128 by default)", args);
    int rc = 0;
    if (!rc) rc = dp_conv2d(m, "conv1", v[0], 3, 1, 1, 1);
    if (!rc) rc = dp_relu(m, "relu1");
    if (!rc) rc = dp_maxpool2d(m, "pool1", 2, 2);
    if (!rc) rc = dp_conv2d(m, "conv2", v[1], 3, 1, 1, 1);
    if (!rc) rc = dp_relu(m, "relu2");
    if (!rc) rc = dp_maxpool2d(m, "pool2", 2, 2);
    if (!rc) rc = dp_flatten(m, "flatten");
    if (!rc) rc = dp_linear(m, "fc1", v[2], 1);
    if (!rc) rc = dp_relu(m, "relu3");
    if (!rc) rc = dp_linear(m, "fc2", classes, 1);
    return rc;
}

/* A small ResNet for 28x28 inputs (torchvision naming), the CIFAR family
 * of He et al. (depth 6n + 2: three stages of n basic blocks each):
 * conv1 3x3 C->w (no bias), bn1, relu -> layer1.0..n-1 (w) -> layer2.0..n-1
 * (2w, the first with stride 2, 14x14) -> layer3.0..n-1 (4w, stride 2, 7x7)
 * -> global average pool -> fc 10.  "resnet" is resnet:8,32 (n = 1). */
static int build_resnet(struct dp_model *m, const char *args, int64_t classes) {
    int64_t v[2] = {8, 32};
    const char *rest = "";
    int k = args ? int_list("resnet", "depth (expected resnet:DEPTH[,WIDTH], e.g. resnet:20)", args, v, 2, &rest) : 2;
    if (k < 0) return k;
    if (args && (k < 1 || *rest))
        return dp_seterr(DP_EINVAL, "model resnet: bad '%s' (expected resnet:DEPTH[,WIDTH], e.g. resnet:20)", args);
    if (v[0] < 8 || (v[0] - 2) % 6)
        return dp_seterr(DP_EINVAL, "model resnet: depth %lld is not 6n + 2 (8, 14, 20, 32, 44, 56, 110: the "
                         "small-image ResNets, three stages of n blocks; ImageNet's resnet18 needs 224x224 inputs)",
                         (long long)v[0]);
    int64_t nb = (v[0] - 2) / 6, w = v[1];
    int rc = 0;
    if (!rc) rc = dp_conv2d(m, "conv1", w, 3, 1, 1, 0);
    if (!rc) rc = dp_batchnorm2d(m, "bn1", 1e-5f, 0.1f);
    if (!rc) rc = dp_relu(m, "relu");
    for (int s = 0; s < 3 && !rc; s++)
        for (int64_t b = 0; b < nb && !rc; b++) {
            char name[32];
            snprintf(name, sizeof name, "layer%d.%lld", s + 1, (long long)b);
            rc = dp_resblock(m, name, w << s, s > 0 && b == 0 ? 2 : 1);
        }
    if (!rc) rc = dp_global_avgpool(m, "avgpool");
    if (!rc) rc = dp_linear(m, "fc", classes, 1);
    return rc;
}

struct gpt_cfg {
    int64_t layers, heads, dim, ctx, vocab;
};

/* "layers=L,heads=H,dim=D,ctx=T[,vocab=V]" in any order, each key once. */
static int parse_gpt(struct gpt_cfg *c, const char *args) {
    static const char *keys[] = {"layers", "heads", "dim", "ctx", "vocab"};
    int64_t v[5] = {-1, -1, -1, -1, -1};
    const char *s = args;
    while (*s) {
        int k = -1;
        for (int i = 0; i < 5; i++) {
            size_t n = strlen(keys[i]);
            if (strncmp(s, keys[i], n) == 0 && s[n] == '=') {
                k = i;
                s += n + 1;
                break;
            }
        }
        if (k < 0 || v[k] >= 0)
            return dp_seterr(DP_EINVAL, "model gpt: bad or repeated key at '%s' (expected "
                             "gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V])", s);
        char *end;
        long long x = strtoll(s, &end, 10);
        if (end == s || x <= 0 || x > (1 << 24))
            return dp_seterr(DP_EINVAL, "model gpt: %s must be a positive integer", keys[k]);
        v[k] = x;
        s = end;
        if (*s == ',') s++;
        else if (*s) return dp_seterr(DP_EINVAL, "model gpt: unexpected '%s'", s);
    }
    for (int i = 0; i < 4; i++)
        if (v[i] < 0) return dp_seterr(DP_EINVAL, "model gpt: missing %s=", keys[i]);
    c->layers = v[0], c->heads = v[1], c->dim = v[2], c->ctx = v[3];
    c->vocab = v[4] >= 0 ? v[4] : 256;
    if (c->dim % c->heads)
        return dp_seterr(DP_EINVAL, "model gpt: dim %lld is not a multiple of heads %lld",
                         (long long)c->dim, (long long)c->heads);
    if (c->layers > 1000 || c->heads > 4096)
        return dp_seterr(DP_EINVAL, "model gpt: %lld layers, %lld heads", (long long)c->layers,
                         (long long)c->heads);
    return DP_OK;
}

/* The PyTorch reference module of tests/torch (F4 of issue 10):
 *   tok, pos Embeddings -> blocks.0 .. blocks.L-1 -> ln_f -> logits = ln_f(x) tok.weight^T
 * Parameter names tok.weight, pos.weight, blocks.i.{ln1,qkv,proj,ln2,fc,fc_out}.*,
 * ln_f.*; no dropout. */
static int build_gpt(struct dp_model *m, const struct gpt_cfg *c) {
    int rc = dp_tokpos_embedding(m, "tok", "pos", c->vocab, c->ctx, c->dim);
    for (int64_t i = 0; i < c->layers && !rc; i++) {
        char name[32];
        snprintf(name, sizeof name, "blocks.%lld", (long long)i);
        rc = dp_transformer_block(m, name, (int)c->heads);
    }
    if (!rc) rc = dp_layernorm(m, "ln_f", 1e-5f);
    if (!rc) rc = dp_tied_lm_head(m, "lm_head", "tok.weight");
    return rc;
}

int dp_model_spec_reads_tokens(const char *spec) { return spec && strncmp(spec, "gpt:", 4) == 0; }

int dp_model_from_spec(struct dp_model **out, const char *spec, int64_t C, int64_t H, int64_t W) {
    return dp_model_from_spec_outputs(out, spec, C, H, W, 10);
}

/* "mlp:hidden=H1,H2,...[,dropout=P]" as the full width list "D,H1,H2,...,K[,dropout=P]". */
static int mlp_hidden(char *def, size_t cap, const char *hidden, int64_t D, int64_t K) {
    const char *dk = strstr(hidden, "dropout=");
    size_t hl = dk ? (size_t)(dk - hidden) : strlen(hidden);
    if (hl && hidden[hl - 1] == ',') hl--;
    if (!hl) return dp_seterr(DP_EINVAL, "model mlp: no hidden widths in 'hidden=%s' (expected e.g. mlp:hidden=64 "
                              "or mlp:hidden=256,256,dropout=0.1)", hidden);
    int n = snprintf(def, cap, "%lld,%.*s,%lld%s%s", (long long)D, (int)hl, hidden, (long long)K, dk ? "," : "",
                     dk ? dk : "");
    if (n < 0 || (size_t)n >= cap) return dp_seterr(DP_EINVAL, "model mlp: 'hidden=%s' is too long", hidden);
    return DP_OK;
}

int dp_model_from_spec_outputs(struct dp_model **out, const char *spec, int64_t C, int64_t H, int64_t W,
                               int64_t classes) {
    *out = NULL;
    if (classes < 1 || classes > (1 << 24))
        return dp_seterr(DP_EINVAL, "model %s: %lld outputs", spec, (long long)classes);
    struct dp_shape in = {3, {C, H, W, 0}};
    struct gpt_cfg gc = {0};
    const int gpt = dp_model_spec_reads_tokens(spec);
    if (gpt) {
        int rc = parse_gpt(&gc, spec + 4);
        if (rc) return rc;
        in = (struct dp_shape){1, {gc.ctx, 0, 0, 0}}; /* T token ids */
    }
    struct dp_model *m;
    int rc = dp_model_init(&m, spec, &in);
    if (rc) return rc;
    char def[512];
    if (strcmp(spec, "mlp") == 0) {
        snprintf(def, sizeof def, "%lld,512,512,%lld", (long long)(C * H * W), (long long)classes);
        rc = build_mlp(m, def);
    } else if (strncmp(spec, "mlp:hidden=", 11) == 0) {
        rc = mlp_hidden(def, sizeof def, spec + 11, C * H * W, classes);
        if (!rc) rc = build_mlp(m, def);
    } else if (strncmp(spec, "mlp:", 4) == 0) {
        rc = build_mlp(m, spec + 4);
    } else if (gpt) {
        rc = build_gpt(m, &gc);
    } else if (strcmp(spec, "cnn") == 0 || strncmp(spec, "cnn:", 4) == 0) {
        rc = build_cnn(m, spec[3] ? spec + 4 : NULL, classes);
    } else if (strcmp(spec, "resnet") == 0 || strncmp(spec, "resnet:", 7) == 0) {
        rc = build_resnet(m, spec[6] ? spec + 7 : NULL, classes);
    } else {
        rc = dp_seterr(DP_EINVAL, "unknown model '%s' (expected mlp, cnn, resnet, mlp:W0,W1,...[,dropout=P], mlp:hidden=H1,...[,dropout=P], "
                       "cnn:C1,C2[,F], resnet:DEPTH[,WIDTH] or gpt:layers=L,heads=H,dim=D,ctx=T)", spec);
    }
    if (!rc) rc = dp_model_finalize(m);
    if (rc) {
        dp_model_free(m);
        return rc;
    }
    *out = m;
    return DP_OK;
}
