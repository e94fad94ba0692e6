/*
 * dp/nn.h — layers with explicit forward/backward, and models built from them.
 *
 * A model has two parts:
 *   - struct dp_model: the structure (layers, parameter layout, shapes).  It is
 *     immutable after dp_model_finalize() and shared by all replicas.
 *   - struct dp_replica: one worker's state: the flat parameter slab, the flat
 *     gradient slab with the same layout, the buffer slab (BatchNorm running
 *     statistics), and the activation arena for one step.
 *
 * Parameters are registered in construction order, so each layer's parameters
 * form one contiguous range [param_off, param_off + param_count) of the slab.
 * Backward runs the layers in reverse and, after each layer, calls
 * ctx->grad_ready(offset, count) for that layer's range (a layer in slices,
 * dp_model_set_unit, reports each slice's range and its bias's as it writes
 * them, instead): the data-parallel reducer uses it to start a bucket's
 * all-reduce while backward goes on.
 *
 * Shapes.  Layers see per-sample shapes (batch dimension B excluded), fixed
 * when the model is built; B varies per call (last batch, data-parallel shard).
 * Images are (C, H, W) in NCHW order as in PyTorch; sequences are (T, C).
 * A model whose input is token ids (a language model) reads them from
 * ctx->batch->tokens in its first layer (an embedding), which receives x == NULL.
 *
 *     struct dp_model *m;
 *     dp_model_from_spec(&m, "cnn", 1, 28, 28);       // or build: see examples/
 *     struct dp_replica r;
 *     dp_replica_init(&r, m, 128);                    // max batch
 *     dp_model_init_params(m, &r, seed);
 *     float loss;
 *     dp_model_forward_backward(m, &r, &batch, &loss, NULL);
 */
#ifndef DP_NN_H
#define DP_NN_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DP_MAX_DIMS 4

struct dp_shape {
    int ndim;
    int64_t d[DP_MAX_DIMS];
};
int64_t dp_shape_numel(const struct dp_shape *s);

/* One mini-batch (or one worker's shard of it). */
struct dp_batch {
    int64_t B;                  /* samples in this batch */
    const float *x;             /* (B, in_shape) inputs, or NULL for token models */
    const int32_t *tokens;      /* (B, T) token ids for token models, else NULL */
    const int32_t *targets;     /* (B) class labels, or (B, T) next tokens */
    const float *target;        /* a regression (loss mse): (B, K) targets, targets NULL */
    const int64_t *sample_idx;  /* (B) global index of each sample (keys RNG) */
    int64_t epoch;
};

struct dp_ctx;
/* Called after a layer's backward with the gradient range it finished. */
typedef void (*dp_grad_ready_fn)(void *arg, int64_t offset, int64_t count);
/* Called by layers that need statistics over the global batch (BatchNorm in
 * data-parallel mode): sums buf[0..n) over all workers, in place. */
typedef int (*dp_stat_sync_fn)(void *arg, double *buf, int64_t n);

/* Tensor parallelism (Megatron-LM's, within a group of `size` workers that see the same
 * batch): a layer that splits (the transformer block: attention by heads, its MLP column then
 * row; a token table and the tied head that reads it: by token, their loss over the split
 * logits) computes its `rank`'s slice of each matrix product, and its partial sums meet in
 * allreduce (sums buf[0..n) over the group, in place).  Every worker holds every parameter;
 * a split parameter's gradient is written only in the worker's slice (dp_param_info.tp_split),
 * a replicated one's in full on every worker of the group. */
struct dp_tp {
    int rank, size;
    int (*allreduce)(void *arg, float *buf, int64_t n);
    void *arg;
};

/* Everything a layer's forward/backward needs besides its inputs. */
struct dp_layer;

struct dp_ctx {
    float *params;            /* the replica's parameter slab */
    float *grads;             /* gradient slab, same layout; backward accumulates (+=) */
    float *buffers;           /* non-trainable state (BN running stats) */
    struct dp_arena *arena;   /* per-step memory, reset by the model every step */
    void **saved;             /* per-layer slot for state saved by forward for backward */
    const struct dp_batch *batch;
    int training;             /* 1: training mode (dropout on, BN batch stats) */
    uint64_t seed;            /* run seed for dropout / augmentation */
    float loss_scale;         /* d(loss)/d(per-sample loss): 1/B for a mean */
    dp_grad_ready_fn grad_ready;
    void *grad_ready_arg;
    dp_stat_sync_fn stat_sync; /* NULL on one worker */
    void *stat_sync_arg;
    /* Deterministic mode (ghost batch statistics): when set, BatchNorm normalises with this
     * batch's own statistics (stat_sync is not called) and, in place of updating its running
     * statistics, adds this batch's mean and unbiased variance in fixed point
     * (round(v * DP_STAT_FIXED_SCALE), held exactly in a double) to stat_acc at its buffer
     * range, and 1 to the count in its num_batches_tracked slot.  Integer sums, so the sum over
     * any split of the batches is the same bits; dp_model_apply_stats then applies their mean. */
    double *stat_acc;
    const struct dp_tp *tp; /* tensor parallelism (NULL, or size 1: none) */
    /* The pass's layer_begin hook (dp_pass.layer_begin), for a layer that runs in slices
     * (dp_layer.slice_rows): it calls it before each slice with a view of itself whose
     * parameters are that slice's (dp__layer_slice_begin).  NULL: none. */
    int (*layer_begin)(void *arg, int phase, int layer, const struct dp_layer *l);
    void *layer_begin_arg;
};

struct dp_layer;
struct dp_model;

/* The interface each layer type implements.  Arguments follow one order:
 * outputs, inputs, then dimensions.  x is (B, in_shape), y is (B, out_shape).
 *
 * forward: computes y from x.  May keep what backward needs in
 *   ctx->saved[l->id] (memory from ctx->arena).
 * backward: given x, y (as computed by forward) and dy, writes dx (overwrite,
 *   not accumulate; dx may be NULL when the input gradient is not needed) and
 *   accumulates parameter gradients into ctx->grads (+=).
 * free: frees the layer's private state (optional, may be NULL). */
struct dp_layer_ops {
    const char *type;
    int (*forward)(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x, int64_t B);
    int (*backward)(struct dp_layer *l, struct dp_ctx *ctx, float *dx, const float *dy,
                    const float *x, const float *y, int64_t B);
    void (*free)(struct dp_layer *l);
};

struct dp_layer {
    const struct dp_layer_ops *ops;
    char name[64];           /* PyTorch-style prefix, e.g. "conv1", "layer1.0" */
    int id;                  /* index into ctx->saved; unique in the model */
    struct dp_shape in_shape, out_shape;
    int64_t param_off, param_count;   /* range in the parameter slab (floats) */
    int64_t tied_off, tied_count;     /* another (earlier) layer's parameters this one also reads and
                                         adds gradients into (the tied LM head: tok.weight); 0: none */
    int64_t buffer_off, buffer_count; /* range in the buffer slab */
    int64_t flops_fwd;       /* multiply-adds × 2 per sample, forward */
    void *priv;              /* the layer type's own state */
    /* Fusion (dp_model_finalize).  fuse_relu, set by a constructor whose layer can apply
     * ReLU to its own output (conv2d, linear, batchnorm2d; NULL otherwise): asks it to do so from then
     * on, in its epilogue while the output is in cache (forward y = max(f(x), 0); backward
     * masks dy by [y > 0] as it reads it); 1 when it does.  fused = 1 marks the ReLU layer
     * after it: dp_model_run skips it, its output being its input and its dx its dy. */
    int (*fuse_relu)(struct dp_layer *l);
    int fused;
    /* A composite's fusions within itself (the residual block: bn1 with the ReLU after it), or
     * NULL; dp_model_finalize calls it unless fusion is off. */
    void (*fuse_inner)(struct dp_layer *l);
    /* Tensor parallelism (struct dp_tp): 1 when, under a group, the layer's output is only the
     * rank's slice of its last dimension (the tied head: its vocabulary slice, dp_tp_slice),
     * which the loss then reads split (dp_softmax_xent_split). */
    int tp_out_split;
    /* Slices (dp_model_set_unit).  A layer whose parameters are `rows` rows of `row_len` floats,
     * then perhaps a tail (a linear layer: weight (OUT, IN), then its bias) can run its
     * forward and backward in slices of output features; rows 0: it cannot.  slice_rows > 0:
     * it does, slice_rows rows at a time (the last slice the remainder), each slice's
     * parameters a range of its own for ZeRO (the tail another). */
    int64_t rows, row_len, slice_rows;
    /* Parts (dp_model_set_unit).  A composite whose children's parameters lie in the order its
     * forward runs them, and whose backward runs them in exactly the reverse order (the
     * transformer block, attention), lists them in kids; parts = 1: the unit cut it, so each
     * child begins (layer_begin) and reports its gradient (grad_ready) on its own, a range of
     * its own for ZeRO (dp__kid_forward, dp__kid_backward), or cut in turn. */
    struct dp_layer *kids[6];
    int nkids, parts;
};

/* ---- parameter registration (used by layer constructors) ----------------- */

enum dp_init_kind {
    DP_INIT_ZERO = 0,
    DP_INIT_CONST,    /* value = a */
    DP_INIT_UNIFORM,  /* U(-a, a) */
    DP_INIT_NORMAL,   /* N(0, a^2) */
    DP_INIT_KIND_COUNT
};

struct dp_param_info {
    char name[96];               /* full PyTorch name, e.g. "layer1.0.conv1.weight" */
    struct dp_shape shape;       /* PyTorch layout, e.g. Linear weight (out, in) */
    int64_t offset, count;       /* floats, in the parameter or buffer slab */
    enum dp_init_kind init;
    float init_a;
    int is_buffer;               /* 1: lives in the buffer slab (running stats) */
    int no_decay;                /* reserved for optimizer parameter groups */
    int tp_split;                /* tensor parallelism: DP_TP_* (how a layer that splits cuts it) */
};
/* A parameter under tensor parallelism (struct dp_tp): replicated, or cut into `size` equal
 * slices along its first dimension (a column-parallel weight's output features, its bias) or
 * its second (a row-parallel weight's input features); rank r holds slice r of each. */
enum { DP_TP_REPLICATED = 0, DP_TP_ROWS = 1, DP_TP_COLS = 2 };

/* Adds a parameter (or, with is_buffer, a buffer) to the model for layer l,
 * named "<l->name>.<name>", and returns its offset in floats (>= 0) or a
 * negative DP_E* code.  Extends l->param_off/param_count (or buffer_*). */
int64_t dp_model_add_param(struct dp_model *m, struct dp_layer *l, const char *name,
                           const struct dp_shape *shape, enum dp_init_kind init, float a,
                           int is_buffer);

/* ---- layer constructors ---------------------------------------------------
 * Each creates a layer whose input has per-sample shape `in`, registers its
 * parameters with m, appends it to `m` and returns 0; or returns DP_E* with a
 * message (bad shapes).  `name` is the PyTorch module name of the layer. */
int dp_linear(struct dp_model *m, const char *name, int64_t out_features, int bias);
int dp_conv2d(struct dp_model *m, const char *name, int64_t out_channels, int kernel, int stride,
              int pad, int bias);
int dp_maxpool2d(struct dp_model *m, const char *name, int kernel, int stride);
int dp_global_avgpool(struct dp_model *m, const char *name);
int dp_relu(struct dp_model *m, const char *name);
int dp_gelu(struct dp_model *m, const char *name);   /* tanh approximation, as GPT-2 */
int dp_dropout(struct dp_model *m, const char *name, float p);
int dp_batchnorm2d(struct dp_model *m, const char *name, float eps, float momentum);
int dp_layernorm(struct dp_model *m, const char *name, float eps);   /* over the last dim */
int dp_flatten(struct dp_model *m, const char *name);
/* Residual basic block (He et al.): y = relu(bn2(conv2(relu(bn1(conv1(x))))) + s(x))
 * with 3x3 convs; s = identity, or 1x1 conv (stride) + BN when the shape changes. */
int dp_resblock(struct dp_model *m, const char *name, int64_t out_channels, int stride);

/* Transformer layers (GPT-2 style).  Inputs are sequences (T, D); a token
 * model's input shape is (T) and its ids come from batch->tokens (x == NULL).
 *   dp_tokpos_embedding: y[t] = tok.weight[id_t] + pos.weight[t]; parameters
 *     "<tok_name>.weight" (vocab, dim) and "<pos_name>.weight" (ctx_len, dim),
 *     N(0, 0.02^2); T <= ctx_len.  Must be the first layer.
 *   dp_gelu_erf: exact GELU x Phi(x), as torch.nn.GELU().
 *   dp_attention: causal multi-head self-attention with a fused QKV Linear
 *     D->3D "<name>.qkv" and an output Linear D->D "<name>.proj" (weights
 *     N(0, 0.02^2), biases 0); D must be a multiple of heads.  Memory O(T^2)
 *     per head.
 *   dp_transformer_block: pre-LN block x += attn(ln1(x)); x += fc_out(gelu(fc(ln2(x))))
 *     with fc D->4D; children "<name>.ln1/.qkv/.proj/.ln2/.fc/.fc_out".
 *   dp_tied_lm_head: logits = x W^T with W the existing (V, D) parameter
 *     `weight` (e.g. "tok.weight"), no bias, no parameters of its own; its
 *     gradient is added into W's, which the owning (earlier) layer reports. */
int dp_tokpos_embedding(struct dp_model *m, const char *tok_name, const char *pos_name,
                        int64_t vocab, int64_t ctx_len, int64_t dim);
int dp_gelu_erf(struct dp_model *m, const char *name);
int dp_attention(struct dp_model *m, const char *name, int heads);
int dp_transformer_block(struct dp_model *m, const char *name, int heads);
int dp_tied_lm_head(struct dp_model *m, const char *name, const char *weight);

/* Creates a layer without appending it (used by composite layers like the
 * residual block to build their children).  Same arguments as above plus the
 * input shape.  The caller owns the returned layer; dp_layer_free frees it. */
int dp_layer_make(struct dp_model *m, struct dp_layer **out, const struct dp_layer_ops *ops,
                  const char *name, const struct dp_shape *in);
void dp_layer_free(struct dp_layer *l);
/* Appends a finished layer to the model's sequence. */
int dp_model_append(struct dp_model *m, struct dp_layer *l);
/* The current output shape of the sequence (the next layer's input shape). */
struct dp_shape dp_model_cur_shape(const struct dp_model *m);

/* ---- loss ----------------------------------------------------------------- */

/* Softmax cross-entropy over rows of logits (R, V) with integer targets (R).
 *   loss_r = logsumexp(z_r) - z_r[t_r]
 *   dz_r   = scale * (softmax(z_r) - onehot(t_r))
 * Returns the SUM of per-row losses in *loss_sum and the number of correct
 * argmax predictions in *correct (either may be NULL).  dlogits may be NULL.
 * A target outside [0, V) returns DP_EINVAL. */
int dp_softmax_xent(float *dlogits, double *loss_sum, int64_t *correct, const float *logits,
                    const int32_t *targets, int64_t R, int64_t V, float scale);
/* The slice [*v0, *v0 + *n) of N that tensor rank r of `size` holds (N size-th parts, the
 * first N mod size one larger). */
void dp_tp_slice(int64_t N, int size, int rank, int64_t *v0, int64_t *n);
/* The same loss over logits split by class across a tensor group (Megatron-LM's vocabulary-
 * parallel cross-entropy), without gathering them: this rank holds classes [v0, v0 + Vl) of V,
 * logits (R, Vl) and dlogits (R, Vl).  The group agrees on each row's max (the ranks' maxima
 * gathered by one sum), then on the sum of exp(z - max), the target's logit and the first argmax
 * (one sum of 3 R), so that every rank returns the whole loss and the same correct count, and its
 * slice of the gradient. */
int dp_softmax_xent_split(float *dlogits, double *loss_sum, int64_t *correct, const float *logits,
                          const int32_t *targets, int64_t R, int64_t V, int64_t v0, int64_t Vl, float scale,
                          const struct dp_tp *tp);
/* Mean squared error over rows of outputs (R, K) with float targets (R, K), per row
 *   loss_r = (1/K) sum_k (o_rk - t_rk)^2        (so the mean over rows is PyTorch's MSELoss)
 *   do_rk  = scale * (2/K) (o_rk - t_rk)
 * *loss_sum gets the sum of loss_r, *abs_sum the sum of (1/K) sum_k |o_rk - t_rk| (the MAE's
 * numerator); either may be NULL, as may dout. */
int dp_mse(float *dout, double *loss_sum, double *abs_sum, const float *out, const float *target, int64_t R,
           int64_t K, float scale);
/* dp_model.loss */
enum dp_loss_kind { DP_LOSS_XENT = 0, DP_LOSS_MSE = 1 };

/* ---- sampling the next token ------------------------------------------------- */

/* One step of a language model's sampler: the next token from one row of
 * logits z (V), the temperature T, top-k and a uniform draw u in [0, 1).
 *   T == 0 or top_k == 1: greedy, the argmax (the lowest index among ties).
 *   Otherwise p_i ~ exp((z_i - max z) / T) over the top_k largest logits
 *   (top_k == 0: all V; ties at the k-th value go to the lower index), and
 *   the token is the first i, in index order, whose cumulative p exceeds
 *   u * sum p (inverse-CDF sampling).
 * Returns the token (>= 0) or DP_EINVAL: V < 1, T < 0 or not finite, top_k
 * outside 0..V, u outside [0, 1), or a logit that is NaN or +Inf (-Inf is a
 * token that is never drawn). */
int dp_sample_token(const float *z, int64_t V, double temperature, int64_t top_k, double u);
/* The uniform draw of dp_sample_token for generated token `step` under
 * `seed`: Philox at key (seed, DP_RNG_SAMPLE), counter (step, 0), 53 bits,
 * in [0, 1).  A pure function of (seed, step). */
double dp_sample_uniform(uint64_t seed, int64_t step);

/* ---- models ---------------------------------------------------------------- */

struct dp_model {
    char spec[128];             /* e.g. "cnn", "mlp:784,1024,256,10" */
    struct dp_shape in_shape;   /* per sample */
    struct dp_layer **layers;   /* the top-level sequence */
    int nlayers, cap_layers;
    int nids;                   /* layer ids handed out (including nested layers) */
    struct dp_param_info *params; /* parameters and buffers, in registration order */
    int nparams, cap_params;
    int64_t num_params;         /* floats in the parameter slab */
    int64_t num_buffers;        /* floats in the buffer slab */
    int64_t flops_fwd;          /* per sample, forward */
    int finalized;
    char *desc;                 /* the canonical text (docs/models.md), written by the layer
                                   constructors: a model file that builds this model; NULL when a
                                   layer of the caller's own cannot be written down */
    int ndesc;                  /* layers the text holds */
    int loss;                   /* enum dp_loss_kind: what dp_model_run computes on the outputs */
    int no_fusion;              /* 1: dp_model_finalize fuses no layers (dp_model_set_fusion) */
};

/* An empty model with per-sample input shape `in`. */
int dp_model_init(struct dp_model **m, const char *spec, const struct dp_shape *in);
/* Checks the model (the last layer's output must be (V) or (T, V) logits), then fuses each
 * ReLU into the layer before it where that layer can apply it itself (struct dp_layer's
 * fuse_relu): the same bits, one pass over the activations fewer. */
int dp_model_finalize(struct dp_model *m);
/* The unit of ZeRO's ranges (--zero-unit-mb); 0: none.  Every top-level layer larger than
 * `bytes` that can be cut is: a layer that runs in slices of output features (dp_layer.rows,
 * a linear layer) runs in slices of at most `bytes` of weight (at least one row), as few as fit
 * and of equal rows; a composite with kids (the transformer block, attention) is cut into its
 * children (parts), each cut the same way in turn if larger.  The slices fix the order of the
 * sum over output features in backward (the input's gradient, one slice at a time), so a model
 * computes the same bits wherever it has the same unit.  Returns the number of top-level
 * layers cut. */
int dp_model_set_unit(struct dp_model *m, size_t bytes);
/* The rows per slice that unit gives a layer of `rows` rows of `row_len` floats (0: whole): as
 * few slices as fit the unit, of equal rows (the last the remainder). */
int64_t dp_unit_slice_rows(int64_t rows, int64_t row_len, size_t bytes);
/* Layer l's ranges for ZeRO and the reducer, highest offset first: one, the whole layer,
 * unless dp_model_set_unit cut it: then its tail (bias) and its slices from the last, or its
 * children's ranges from the last child.  Writes up to max of them (off may be NULL) and
 * returns how many there are. */
int dp_layer_ranges(const struct dp_layer *l, int64_t *off, int64_t *count, int max);
/* on = 0: finalize fuses nothing (every layer runs as written; the tests compare the two).
 * Before dp_model_finalize; DP_EINVAL after it. */
int dp_model_set_fusion(struct dp_model *m, int on);
/* Sets the loss of a model (softmax cross-entropy by default; mean squared error for a
 * regression, whose output must be (K) values per sample), before or after finalize; the
 * canonical text's loss statement follows. */
int dp_model_set_loss(struct dp_model *m, int loss);
void dp_model_free(struct dp_model *m);
/* Builds a named model: "mlp", "cnn", "resnet", "mlp:784,512,10" (widths, the
 * first being the flattened input size), for inputs (C, H, W); or
 * "gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V]" (vocab 256 by default), a
 * language model over T token ids (input shape (T), output (T, V) logits);
 * C, H and W are ignored for it. */
int dp_model_from_spec(struct dp_model **m, const char *spec, int64_t C, int64_t H, int64_t W);
/* Same with `outputs` classes (dp_model_from_spec: 10) where the spec does not
 * list them (mlp, cnn, resnet, and "mlp:hidden=H1,H2,...[,dropout=P]", an mlp
 * whose input width is C*H*W and whose output width is `outputs`). */
int dp_model_from_spec_outputs(struct dp_model **m, const char *spec, int64_t C, int64_t H, int64_t W,
                               int64_t outputs);
/* A model declared in a model file's text (docs/models.md): "input C H W" or
 * "input tokens T", then one layer per line (KIND NAME KEY=VALUE...), and an
 * optional "loss cross_entropy".  `origin` (the file's path) prefixes every
 * error, with the line: "models/my.txt:7: conv2d: missing kernel=".  The
 * model's spec is "file:<origin's last component>" and m->desc holds the
 * canonical text (every key written out, comments dropped), itself a model
 * file: equal texts, the same architecture. */
int dp_model_from_text(struct dp_model **m, const char *text, const char *origin);
/* Reads a model file (at most 1 MiB of text) into *text (dp_free it), or builds from it. */
int dp_model_read_file(const char *path, char **text);
int dp_model_from_file(struct dp_model **m, const char *path);
/* 1 when a model file's text declares a token input ("input tokens T"). */
int dp_model_text_reads_tokens(const char *text);
/* 1 when the model reads token ids (a spec's gpt:..., a file's "input tokens T"). */
int dp_model_reads_tokens(const struct dp_model *m);
/* 1 when spec names a language model over token ids (gpt:...): it trains on a
 * token file and has a loss term per position; 0 for the image models. */
int dp_model_spec_reads_tokens(const char *spec);
/* Number of classes (last dim of the output). */
int64_t dp_model_num_classes(const struct dp_model *m);
/* A parameter or buffer by full name, or NULL. */
const struct dp_param_info *dp_model_find_param(const struct dp_model *m, const char *name);

/* Whether tensor parallelism over `size` workers (struct dp_tp) can split model m: DP_OK when
 * it has a layer that splits (attention, transformer block) and each has a multiple of `size`
 * heads; else an error that says why. */
int dp_model_tp_check(const struct dp_model *m, int size);
/* What each top-level layer i of m all-reduces within a tensor group of `size` for one pass
 * (forward and backward) of one sample: calls[i] all-reduces of floats[i] floats each (on
 * average); 0 for a layer that does not split.  A transformer block: 4 of its (T, D) input; an
 * attention layer: 2; a token table: 1 of its output; the tied head: its input's gradient and the
 * split cross-entropy's two (T positions x (size + 3) floats in all). */
void dp_model_tp_traffic(const struct dp_model *m, int size, double *calls, double *floats);

/* Layers [layer0, layer1) of a model's sequence and the parameters they own,
 * [param_off, param_off + param_count) of the slab (contiguous: parameters are
 * registered in layer order): a pipeline stage's part of the model.  A zeroed
 * span (layer1 = 0) stands for the whole model where a span is optional. */
struct dp_span {
    int layer0, layer1;
    int64_t param_off, param_count;
};
/* The span of layers [l0, l1) (0 <= l0 < l1 <= nlayers), or DP_EINVAL. */
int dp_model_span(const struct dp_model *m, int l0, int l1, struct dp_span *s);

/* One worker's state for a model. */
struct dp_replica {
    const struct dp_model *model;
    float *params;     /* (num_params) */
    float *grads;      /* (num_params) */
    float *buffers;    /* (num_buffers) */
    struct dp_arena arena;
    void **saved;      /* (model->nids) */
    float **acts;      /* (nlayers + 1) activation pointers of the last forward */
    int64_t max_batch;
    int lazy;          /* DP_REPLICA_LAZY_*: the slabs mapped with dp_slab_map */
    float *dlogits;    /* the loss's gradient of the last forward that ended with it (in the arena) */
    int view;          /* 1: the slabs are another replica's (dp_replica_init_view) */
};
int dp_replica_init(struct dp_replica *r, const struct dp_model *m, int64_t max_batch);
/* The same, with the slabs named in `lazy` mapped (dp_slab_map) instead of
 * allocated and touched: zero, and not resident until written (ZeRO 2 and 3,
 * whose workers hold only parts of them); DP_REPLICA_LAZY_ARENA: the arena
 * starts small and grows on the first pass (a pipeline's replica, whose
 * stages run in views). */
enum { DP_REPLICA_LAZY_GRADS = 1, DP_REPLICA_LAZY_PARAMS = 2, DP_REPLICA_LAZY_ARENA = 4 };
int dp_replica_init_lazy(struct dp_replica *r, const struct dp_model *m, int64_t max_batch, int lazy);
void dp_replica_free(struct dp_replica *r);
/* A second set of activations over r's slabs: v borrows r's parameters, gradients and buffers
 * and has its own arena, saved state and activations, sized for layers [l0, l1) on batches of
 * up to max_batch samples.  A pipeline stage holds one per micro-batch in flight.
 * dp_replica_free(v) frees only what is v's own. */
int dp_replica_init_view(struct dp_replica *v, const struct dp_replica *r, int l0, int l1, int64_t max_batch);
/* Initialises parameters and buffers from the seed (PyTorch's default schemes:
 * Linear/Conv weight and bias U(±1/sqrt(fan_in)), BN weight 1, bias 0). */
void dp_model_init_params(const struct dp_model *m, struct dp_replica *r, uint64_t seed);
/* Elements [off, off + len) of those initial values into dst[0, len): of the
 * parameter slab (buffers 0) or the buffer slab (1).  Each element is drawn
 * from the seed by its own index, so a slice has the bits of the same
 * elements of dp_model_init_params (a ZeRO-3 worker draws only its pieces). */
void dp_model_init_slice(const struct dp_model *m, int buffers, float *dst, int64_t off, int64_t len, uint64_t seed);
/* FNV-1a 64 of the raw parameter bytes followed by the buffer bytes. */
uint64_t dp_replica_hash(const struct dp_replica *r);

/* Options for one forward(/backward) pass. */
enum { DP_PHASE_FORWARD = 0, DP_PHASE_BACKWARD = 1 };
struct dp_pass {
    int training;               /* 1: train mode */
    uint64_t seed;
    float loss_scale;           /* 0 means 1/B */
    int backward;               /* 1: run backward too (training only) */
    dp_grad_ready_fn grad_ready;
    void *grad_ready_arg;
    dp_stat_sync_fn stat_sync;
    void *stat_sync_arg;
    double *stat_acc;           /* dp_ctx.stat_acc: deterministic mode's statistics (NULL: off) */
    const struct dp_tp *tp;     /* dp_ctx.tp: tensor parallelism (NULL: none) */
    /* Called before each top-level layer's forward (phase DP_PHASE_FORWARD,
     * layers in increasing order) and before its backward (DP_PHASE_BACKWARD,
     * decreasing), with the layer's index and the layer: the parameters it
     * reads are its own range (param_off, param_count; count 0 for a layer
     * without parameters) and its tied range (tied_off, tied_count); a
     * nonzero return stops the pass with it.  ZeRO-3 gathers those
     * parameters here (dp_zero_layer_begin). */
    int (*layer_begin)(void *arg, int phase, int layer, const struct dp_layer *l);
    void *layer_begin_arg;
    /* outputs */
    double loss_sum;            /* sum of per-sample losses */
    int64_t correct;            /* correct predictions (cross-entropy) */
    double abs_sum;             /* mse: sum of per-sample mean absolute errors */
    double t_forward, t_backward; /* seconds */
};
/* Runs forward (and, if p->backward, backward accumulating into r->grads) on
 * one batch (B may be 0: an empty data-parallel share).  The arena is reset at the start.  Logits of the last forward
 * stay in r->acts[nlayers] until the next call. */
int dp_model_run(const struct dp_model *m, struct dp_replica *r, const struct dp_batch *b,
                 struct dp_pass *p);
/* The same pass in two halves over layers [l0, l1) of the sequence, for a pipeline stage.
 * dp_model_forward_range resets the arena and runs layers l0..l1-1 on x (at l0 = 0: the batch's
 * inputs, x ignored); their output stays in r->acts[l1].  When l1 is the last layer it computes
 * the loss (p->loss_sum, correct, abs_sum; otherwise 0) and, with p->backward, the loss's
 * gradient.  dp_model_backward_range then runs their backward from dy, the gradient of
 * r->acts[l1] ((B, out_shape of layer l1 - 1); ignored when l1 is the last layer: the loss's),
 * accumulating the parameter gradients and reporting each range to p->grad_ready as
 * dp_model_run does; *dx_out (may be NULL) gets the gradient of layer l0's input, in r's arena
 * until its next forward (NULL at l0 = 0).  dp_model_run is the two over every layer. */
int dp_model_forward_range(const struct dp_model *m, struct dp_replica *r, const struct dp_batch *b, int l0, int l1,
                           const float *x, struct dp_pass *p);
int dp_model_backward_range(const struct dp_model *m, struct dp_replica *r, const struct dp_batch *b, int l0, int l1,
                            const float *dy, const float **dx_out, struct dp_pass *p);
/* Per layer i of m, per sample: out[i] its output's floats; saved[i] the bytes its training
 * forward keeps in the arena for backward (its output and saved state; the last layer's, with the
 * loss's gradient); scratch[i] the most bytes its backward adds while it runs (scratch and the
 * gradient buffers it writes).  Measured, not estimated: each layer run alone on one zero sample,
 * on a view of its own, from the activations a whole forward gave it.  Arrays of nlayers. */
int dp_model_layer_bytes(const struct dp_model *m, double *out, double *saved, double *scratch);
/* The same for rank 0 of a tensor group of `size` (struct dp_tp; the group's sums skipped: the
 * values are not the model's, the memory is): what each layer keeps and adds when it computes its
 * slice.  size 1: dp_model_layer_bytes. */
int dp_model_layer_bytes_tp(const struct dp_model *m, int size, double *out, double *saved, double *scratch);
/* Deterministic mode's statistics (dp_ctx.stat_acc, num_buffers doubles: the sums over the
 * step's batches, on every worker): each BatchNorm's running statistics move once towards
 * their mean over those batches, running = (1 - momentum) running + momentum mean, and its
 * num_batches_tracked counts one.  A batch statistic must be below 2^24 in magnitude (BatchNorm
 * refuses one that is not), so sums over up to 2^13 batches per step are exact. */
#define DP_STAT_FIXED_SCALE 65536.0
void dp_model_apply_stats(const struct dp_model *m, float *buffers, const double *acc);

#ifdef __cplusplus
}
#endif
#endif
