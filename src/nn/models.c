/* Named models: "mlp", "cnn", "resnet", "mlp:W0,W1,...",
 * "gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V]". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/nn.h"

/* mlp:784,512,512,10 -> flatten, fc1, relu1, fc2, relu2, fc3.  The first
 * width must be the flattened input size. */
static int build_mlp(struct dp_model *m, const char *widths) {
    int64_t w[32];
    int n = 0;
    const char *s = widths;
    while (*s) {
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
        }
    }
    return rc;
}

/* conv 1->32 3x3 pad 1, relu, maxpool 2 -> conv 32->64 3x3 pad 1, relu,
 * maxpool 2 -> flatten (64*7*7 = 3136) -> fc 128, relu -> fc 10 */
static int build_cnn(struct dp_model *m, int64_t classes) {
    int rc = 0;
    if (!rc) rc = dp_conv2d(m, "conv1", 32, 3, 1, 1, 1);
    if (!rc) rc = dp_relu(m, "relu1");
    if (!rc) rc = dp_maxpool2d(m, "pool1", 2, 2);
    if (!rc) rc = dp_conv2d(m, "conv2", 64, 3, 1, 1, 1);
    if (!rc) rc = dp_relu(m, "relu2");
    if (!rc) rc = dp_maxpool2d(m, "pool2", 2, 2);
    if (!rc) rc = dp_flatten(m, "flatten");
    if (!rc) rc = dp_linear(m, "fc1", 128, 1);
    if (!rc) rc = dp_relu(m, "relu3");
    if (!rc) rc = dp_linear(m, "fc2", classes, 1);
    return rc;
}

/* A small ResNet for 28x28 inputs (torchvision naming):
 * conv1 3x3 C->32 (no bias), bn1, relu -> layer1.0 (32) -> layer2.0 (64, stride 2,
 * 14x14) -> layer3.0 (128, stride 2, 7x7) -> global average pool -> fc 10. */
static int build_resnet(struct dp_model *m, int64_t classes) {
    int rc = 0;
    if (!rc) rc = dp_conv2d(m, "conv1", 32, 3, 1, 1, 0);
    if (!rc) rc = dp_batchnorm2d(m, "bn1", 1e-5f, 0.1f);
    if (!rc) rc = dp_relu(m, "relu");
    if (!rc) rc = dp_resblock(m, "layer1.0", 32, 1);
    if (!rc) rc = dp_resblock(m, "layer2.0", 64, 2);
    if (!rc) rc = dp_resblock(m, "layer3.0", 128, 2);
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
    *out = NULL;
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
    const int64_t classes = 10;
    char def[64];
    if (strcmp(spec, "mlp") == 0) {
        snprintf(def, sizeof def, "%lld,512,512,%lld", (long long)(C * H * W), (long long)classes);
        rc = build_mlp(m, def);
    } else if (strncmp(spec, "mlp:", 4) == 0) {
        rc = build_mlp(m, spec + 4);
    } else if (gpt) {
        rc = build_gpt(m, &gc);
    } else if (strcmp(spec, "cnn") == 0) {
        rc = build_cnn(m, classes);
    } else if (strcmp(spec, "resnet") == 0) {
        rc = build_resnet(m, classes);
    } else {
        rc = dp_seterr(DP_EINVAL, "unknown model '%s' (expected mlp, cnn, resnet, mlp:W0,W1,... or gpt:layers=L,heads=H,dim=D,ctx=T)", spec);
    }
    if (!rc) rc = dp_model_finalize(m);
    if (rc) {
        dp_model_free(m);
        return rc;
    }
    *out = m;
    return DP_OK;
}
