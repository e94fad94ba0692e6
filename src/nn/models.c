/* Named models: "mlp", "cnn", "resnet", "mlp:W0,W1,...". */
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

int dp_model_from_spec(struct dp_model **out, const char *spec, int64_t C, int64_t H, int64_t W) {
    *out = NULL;
    struct dp_shape in = {3, {C, H, W, 0}};
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
    } else if (strcmp(spec, "cnn") == 0) {
        rc = build_cnn(m, classes);
    } else if (strcmp(spec, "resnet") == 0) {
        rc = build_resnet(m, classes);
    } else {
        rc = dp_seterr(DP_EINVAL, "unknown model '%s' (expected mlp, cnn, resnet or mlp:W0,W1,...)", spec);
    }
    if (!rc) rc = dp_model_finalize(m);
    if (rc) {
        dp_model_free(m);
        return rc;
    }
    *out = m;
    return DP_OK;
}
