/* Flatten: a per-sample reshape (C, H, W) -> (C*H*W), as torch.nn.Flatten()
 * with start_dim = 1.  The data are already contiguous in that order, so
 * forward and backward are copies (the model gives every layer its own
 * output buffer).
 *
 * Letters: B batch, n = numel of one sample. */
#include <string.h>

#include "nn/layers_impl.h"

/* Forward:  y = x   viewed as (B, n)
 * Backward: dx = dy viewed as the input shape */
static int flatten_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x,
                           int64_t B) {
    if (y != x) memcpy(y, x, sizeof(float) * (size_t)(B * dp_shape_numel(&l->in_shape)));
    return DP_OK;
}

static int flatten_backward(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                            const float *x, const float *y, int64_t B) {
    if (dx && dx != dy) memcpy(dx, dy, sizeof(float) * (size_t)(B * dp_shape_numel(&l->in_shape)));
    return DP_OK;
}

static const struct dp_layer_ops flatten_ops = {"flatten", flatten_forward, flatten_backward, NULL};

int dp__flatten_make(struct dp_model *m, struct dp_layer **out, const char *name,
                     const struct dp_shape *in) {
    *out = NULL;
    struct dp_layer *l;
    int rc = dp_layer_make(m, &l, &flatten_ops, name, in);
    if (rc) return rc;
    l->out_shape = dp__shape1(dp_shape_numel(in));
    *out = l;
    return DP_OK;
}

int dp_flatten(struct dp_model *m, const char *name) {
    struct dp_shape in = dp_model_cur_shape(m);
    struct dp__model_mark mk = dp__model_mark(m);
    struct dp_layer *l;
    int rc = dp__flatten_make(m, &l, name, &in);
    return dp__layer_record(m, l, rc, &mk, "flatten %s", name);
}
