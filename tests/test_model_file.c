/* Model files (issue 28, M3): the models/ files build the spec strings' models
 * exactly (names, shapes, inits, so the same parameters for a seed), the
 * canonical text, and the parser's errors with their file and line. */
#include <stdio.h>
#include <string.h>

#include "ddp_util.h"
#include "dp/nn.h"
#include "test.h"

/* Two models are the same when their parameters and buffers match one by one
 * (name, shape, offset, init) and a seed's initial values are equal bit for bit. */
static void assert_same_model(const struct dp_model *a, const struct dp_model *b) {
    ASSERT_EQ(a->num_params, b->num_params);
    ASSERT_EQ(a->num_buffers, b->num_buffers);
    ASSERT_EQ(a->nparams, b->nparams);
    ASSERT_EQ(a->flops_fwd, b->flops_fwd);
    for (int i = 0; i < a->nparams; i++) {
        const struct dp_param_info *p = &a->params[i], *q = &b->params[i];
        ASSERT_TRUE(strcmp(p->name, q->name) == 0);
        ASSERT_TRUE(p->offset == q->offset && p->count == q->count && p->is_buffer == q->is_buffer);
        ASSERT_TRUE(p->init == q->init && p->init_a == q->init_a);
        ASSERT_EQ(p->shape.ndim, q->shape.ndim);
        for (int d = 0; d < p->shape.ndim; d++) ASSERT_EQ(p->shape.d[d], q->shape.d[d]);
    }
    struct dp_replica ra, rb;
    ASSERT_OK(dp_replica_init(&ra, a, 2));
    ASSERT_OK(dp_replica_init(&rb, b, 2));
    dp_model_init_params(a, &ra, 42);
    dp_model_init_params(b, &rb, 42);
    ASSERT_TRUE(memcmp(ra.params, rb.params, sizeof(float) * (size_t)a->num_params) == 0);
    ASSERT_TRUE(memcmp(ra.buffers, rb.buffers, sizeof(float) * (size_t)a->num_buffers) == 0);
    dp_replica_free(&ra);
    dp_replica_free(&rb);
}

TEST(model_files_match_specs) {
    static const struct {
        const char *file, *spec;
    } pairs[] = {{"models/mlp.txt", "mlp"},
                 {"models/cnn.txt", "cnn"},
                 {"models/resnet.txt", "resnet"},
                 {"models/gpt-small.txt", "gpt:layers=4,heads=4,dim=128,ctx=64"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        struct dp_model *f, *s;
        ASSERT_OK(dp_model_from_file(&f, pairs[i].file));
        ASSERT_OK(dp_model_from_spec(&s, pairs[i].spec, 1, 28, 28));
        assert_same_model(f, s);
        ASSERT_TRUE(f->desc && s->desc && strcmp(f->desc, s->desc) == 0); /* the spec's text is the file's */
        ASSERT_TRUE(strncmp(f->spec, "file:", 5) == 0 && strstr(pairs[i].file, f->spec + 5));
        ASSERT_EQ(dp_model_text_reads_tokens(f->desc), dp_model_spec_reads_tokens(pairs[i].spec));
        /* the canonical text is a model file that builds the same model, and is its own canon */
        struct dp_model *c;
        ASSERT_OK(dp_model_from_text(&c, f->desc, "canonical"));
        assert_same_model(c, s);
        ASSERT_TRUE(strcmp(c->desc, f->desc) == 0);
        dp_model_free(c);
        dp_model_free(f);
        dp_model_free(s);
    }
}

TEST(model_file_canonical_text) {
    struct dp_model *m;
    ASSERT_OK(dp_model_from_text(&m,
                                 "  # a comment line\n"
                                 "input 3 8 8   # RGB\n"
                                 "\n"
                                 "conv2d c1 kernel=3 out=4\tpad=1\r\n"
                                 "batchnorm bn\n"
                                 "relu r\n"
                                 "maxpool p kernel=2\n"
                                 "resblock b out=8 stride=2\n"
                                 "dropout d p=0.25\n"
                                 "global_avgpool g\n"
                                 "linear fc out=5 bias=0",
                                 "my.txt"));
    ASSERT_TRUE(strcmp(m->spec, "file:my.txt") == 0);
    ASSERT_TRUE(strcmp(m->desc, "input 3 8 8\n"
                                "conv2d c1 out=4 kernel=3 stride=1 pad=1 bias=1\n"
                                "batchnorm bn eps=1e-05 momentum=0.1\n"
                                "relu r\n"
                                "maxpool p kernel=2 stride=2\n"
                                "resblock b out=8 stride=2\n"
                                "dropout d p=0.25\n"
                                "global_avgpool g\n"
                                "linear fc out=5 bias=0\n"
                                "loss cross_entropy\n") == 0);
    ASSERT_EQ(dp_model_num_classes(m), 5);
    /* the same statements on one line, separated by ';' (the safetensors metadata's form) */
    struct dp_model *one;
    ASSERT_OK(dp_model_from_text(&one, "input 3 8 8; conv2d c1 out=4 kernel=3 pad=1;batchnorm bn ;relu r; maxpool p "
                                       "kernel=2; resblock b out=8 stride=2; dropout d p=0.25; global_avgpool g; "
                                       "linear fc out=5 bias=0; loss cross_entropy # the end",
                                 "one.txt"));
    ASSERT_TRUE(strcmp(one->desc, m->desc) == 0);
    dp_model_free(one);
    /* a regression's loss: in the text, and set on a built model, the text following */
    ASSERT_OK(dp_model_from_text(&one, "input 1 1 3; flatten f; linear fc out=2; loss mse", "reg.txt"));
    ASSERT_TRUE(one->loss == DP_LOSS_MSE && strstr(one->desc, "\nloss mse\n"));
    ASSERT_OK(dp_model_set_loss(one, DP_LOSS_XENT));
    ASSERT_TRUE(one->loss == DP_LOSS_XENT && strstr(one->desc, "\nloss cross_entropy\n") && !strstr(one->desc, "mse"));
    dp_model_free(one);
    ASSERT_TRUE(dp_model_find_param(m, "b.downsample.0.weight") != NULL);
    ASSERT_TRUE(dp_model_find_param(m, "fc.bias") == NULL);
    dp_model_free(m);
}

/* Each mistake: refused with the origin, the line and what was expected. */
TEST(model_file_errors) {
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"", "no input line"},
        {"# only a comment\n", "no input line"},
        {"linear fc out=10\n", "f.txt:1: 'linear' before the input statement"},
        {"input 1 28\n", "f.txt:1: input: expected 'input C H W'"},
        {"input 1 28 0\n", "f.txt:1: input W: expected an integer in 1.."},
        {"input 1 28 28\ninput 1 28 28\n", "f.txt:2: a second input statement"},
        {"input 1 28 28\n", "no layers"},
        {"input 1 4 4\nflatten f\nlinaer fc out=2\n", "f.txt:3: unknown layer 'linaer' (expected input, loss, or a "
                                                     "layer: linear, conv2d"},
        {"input 1 4 4\nflatten\n", "f.txt:2: flatten: expected a name"},
        {"input 1 4 4\nflatten f-1\n", "f.txt:2: flatten: expected a name of letters"},
        {"input 1 4 4\nflatten f\nlinear fc\n", "f.txt:3: linear fc: missing out="},
        {"input 1 4 4\nflatten f\nlinear fc out=2 out=3\n", "f.txt:3: linear: key 'out' given twice"},
        {"input 1 4 4\nflatten f\nlinear fc out=2 width=3\n", "f.txt:3: linear: unknown key 'width' (linear takes "
                                                              "out, bias)"},
        {"input 1 4 4\nflatten f\nlinear fc out=two\n", "f.txt:3: linear out=: expected an integer"},
        {"input 1 4 4\nflatten f\nlinear fc out=2 bias=2\n", "f.txt:3: linear bias=: expected an integer in 0..1"},
        {"input 1 4 4\nflatten f\nlinear fc 2\n", "f.txt:3: linear fc: expected KEY=VALUE, got '2'"},
        {"input 1 4 4\nflatten f\ndropout d p=1\nlinear fc out=2\n", "f.txt:3: dropout p=: expected a number in"},
        {"input 1 4 4\nflatten f\nrelu r foo=1\nlinear fc out=2\n", "relu takes none"},
        {"input 1 4 4\nconv2d c out=2\n", "f.txt:2: conv2d c: missing kernel="},
        {"input 1 4 4\nconv2d c out=2 kernel=9\n", "f.txt:2: conv2d c"},
        {"input 1 4 4\nflatten f\nlinear fc out=2\nloss hinge\n", "f.txt:4: loss: expected 'loss cross_entropy' "
         "(softmax cross-entropy, for classes) or 'loss mse'"},
        {"input tokens 4\nembedding tok pos=pos vocab=8 dim=4\nlm_head h tied=tok.weight\nloss mse\n", "loss mse needs (K) outputs"},
        {"input 1 4 4\nflatten f\nloss cross_entropy\nlinear fc out=2\n", "f.txt:4: 'linear' after the loss"},
        {"input 1 4 4\nembedding tok pos=pos vocab=10 dim=4\n", "embedding: needs the token input"},
        {"input tokens 8\nembedding tok pos=pos vocab=10 dim=4\nlm_head h tied=nope.weight\n", "f.txt:3: lm head h: no parameter 'nope.weight' to tie to"},
        {"input 1 4 4\nflatten f\nlinear fc out=2 a=1 b=2 c=3 d=4 e=5 f=6 g=7 h=8 i=9 j=10 k=11 l=12 m=13 n=14\n",
         "more than 16 words"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct dp_model *m = (struct dp_model *)&m;
        dp_clearerr();
        int rc = dp_model_from_text(&m, bad[i].text, "dir/f.txt");
        if (rc != DP_EINVAL || !strstr(dp_errmsg(), bad[i].needle) || m != NULL)
            dp_test_fail(__FILE__, __LINE__, "case %zu: rc %d, message '%s', expected '%s'", i, rc, dp_errmsg(),
                         bad[i].needle);
    }
    char longline[1100];
    memset(longline, 'x', sizeof longline - 1);
    longline[sizeof longline - 1] = 0;
    struct dp_model *m;
    ASSERT_ERR(dp_model_from_text(&m, longline, "f.txt"), DP_EINVAL, "f.txt:1: line longer than 1024");
    ASSERT_ERR(dp_model_from_file(&m, "/nonexistent/m.txt"), DP_ENOENT, "model file /nonexistent/m.txt: No such");
    FILE *f = fopen("/tmp/dptest-model-nul.txt", "wb");
    ASSERT_TRUE(f != NULL);
    fwrite("input 1 4 4\n\0flatten f\n", 1, 23, f);
    fclose(f);
    ASSERT_ERR(dp_model_from_file(&m, "/tmp/dptest-model-nul.txt"), DP_EINVAL, "holds a NUL byte");
    remove("/tmp/dptest-model-nul.txt");
    ASSERT_EQ(dp_model_text_reads_tokens("# c\n  input\ttokens 8\n"), 1);
    ASSERT_EQ(dp_model_text_reads_tokens("input 1 4 4\n"), 0);
    ASSERT_EQ(dp_model_text_reads_tokens("input tokens"), 0);
    ASSERT_EQ(dp_model_text_reads_tokens(NULL), 0);
}

/* A layer of the caller's own (its own ops, appended with dp_model_append) cannot be written
 * down: the model has no canonical text, and everything else works. */
static int own_forward(struct dp_layer *l, struct dp_ctx *ctx, float *y, const float *x, int64_t B) {
    (void)ctx;
    memcpy(y, x, sizeof(float) * (size_t)(B * dp_shape_numel(&l->in_shape)));
    return 0;
}
static const struct dp_layer_ops own_ops = {.type = "own", .forward = own_forward};
TEST(model_text_absent_for_own_layer) {
    struct dp_shape in = {1, {8, 0, 0, 0}};
    struct dp_model *m;
    ASSERT_OK(dp_model_init(&m, "mine", &in));
    ASSERT_OK(dp_linear(m, "fc", 4, 1));
    struct dp_layer *l;
    struct dp_shape cur = dp_model_cur_shape(m);
    ASSERT_OK(dp_layer_make(m, &l, &own_ops, "own", &cur));
    l->out_shape = cur;
    ASSERT_OK(dp_model_append(m, l));
    ASSERT_OK(dp_model_finalize(m));
    ASSERT_TRUE(m->desc == NULL);
    dp_model_free(m);
    /* an input no model file can declare, (T, D) here, leaves no text (not one without its
     * input line) */
    struct dp_shape in2 = {2, {4, 8, 0, 0}};
    ASSERT_OK(dp_model_init(&m, "seq", &in2));
    ASSERT_OK(dp_linear(m, "fc", 3, 1));
    ASSERT_OK(dp_model_finalize(m));
    ASSERT_TRUE(m->desc == NULL);
    dp_model_free(m);
    /* names a model file cannot hold leave no text either (a checkpoint never holds one that
     * would not parse); a name it can hold keeps it */
    static const char *const names[] = {"conv-1", "a=b", "1st", "x y", ".h", "ok_name.0"};
    for (int i = 0; i < 6; i++) {
        ASSERT_OK(dp_model_init(&m, "mine", &in));
        ASSERT_OK(dp_linear(m, names[i], 4, 1));
        ASSERT_OK(dp_model_finalize(m));
        ASSERT_TRUE((m->desc != NULL) == (i == 5));
        if (m->desc) {
            struct dp_model *back;
            ASSERT_OK(dp_model_from_text(&back, m->desc, "back"));
            ASSERT_TRUE(strcmp(back->desc, m->desc) == 0);
            dp_model_free(back);
        }
        dp_model_free(m);
    }
}

/* A model built by the caller (dp_train_params.run.model_build): 2 workers give the 1-worker
 * bits; the checkpoint holds its text, so a resume needs no builder and a checkpoint's model
 * is rebuilt alone (dp_ckpt_build_model) under the caller's name. */
static int build_calls;
static int user_build(struct dp_model **out, void *arg) {
    struct dp_shape in = {3, {1, 28, 28, 0}};
    struct dp_model *m;
    int rc = dp_model_init(&m, (const char *)arg, &in);
    if (rc) return rc;
    if ((rc = dp_conv2d(m, "c", 4, 3, 2, 1, 1)) || (rc = dp_relu(m, "r")) || (rc = dp_flatten(m, "f")) ||
        (rc = dp_dropout(m, "d", 0.2f)) || (rc = dp_linear(m, "fc", 10, 1))) { /* (not finalized: the trainer does) */
        dp_model_free(m);
        return rc;
    }
    build_calls++;
    *out = m;
    return 0;
}
TEST(trainer_takes_model_build) {
    require_data();
    char dir[] = "/tmp/dptest-mbuild-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    uint64_t h[2];
    for (int k = 0; k < 2; k++) {
        struct dp_train_params p = base(NULL, k + 1);
        p.run.model_build = user_build;
        p.run.model_build_arg = "users_net";
        p.dp.deterministic = 1;
        p.io.out_dir = dir;
        p.io.overwrite = 1;
        struct dp_trainer *t;
        build_calls = 0;
        ASSERT_OK(dp_trainer_init(&t, &p));
        ASSERT_EQ(build_calls, 1); /* once per process, whatever the workers */
        ASSERT_TRUE(strcmp(dp_trainer_model(t)->spec, "users_net") == 0);
        ASSERT_OK(dp_trainer_run(t));
        h[k] = dp_trainer_param_hash(t);
        dp_trainer_free(t);
    }
    ASSERT_TRUE(h[0] == h[1]);
    char ck[64];
    snprintf(ck, sizeof ck, "%s/checkpoint.bin", dir);
    struct dp_ckpt_header hd;
    ASSERT_OK(dp_ckpt_read_header(ck, &hd));
    struct dp_model *m, *b;
    ASSERT_OK(dp_ckpt_build_model(ck, &hd, &m));
    ASSERT_OK(user_build(&b, "users_net"));
    ASSERT_OK(dp_model_finalize(b));
    assert_same_model(m, b);
    ASSERT_TRUE(strcmp(m->spec, "users_net") == 0 && strcmp(m->desc, b->desc) == 0);
    dp_model_free(m);
    dp_model_free(b);
    /* resumed with no model at all: the checkpoint's text, 1 more epoch */
    struct dp_train_params p = base(NULL, 2);
    p.run.model = NULL;
    p.io.resume = ck;
    p.io.out_dir = dir;
    p.dp.deterministic = 1;
    p.run.epochs = 2;
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    ASSERT_TRUE(strcmp(dp_trainer_model(t)->spec, "users_net") == 0);
    ASSERT_OK(dp_trainer_run(t));
    dp_trainer_free(t);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
}
