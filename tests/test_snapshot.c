/* --ckpt-every-steps in the background (src/train/snapshot.c): the file a
 * background write leaves is the one a write in the step leaves, the folder
 * keeps the latest two, a resume from either finishes with the straight
 * run's bits, and a write that fails ends the run with its message. */
#include <sys/stat.h>
#include <unistd.h>

#include "ddp_util.h"
#include "test.h"

/* mlp, 2 workers, momentum and top-k compression (optimizer state and the
 * error-feedback section both in the file), a checkpoint every 5 steps, 12 steps. */
static struct dp_train_params snap_params(const char *dir) {
    struct dp_train_params p = base("mlp", 2);
    ASSERT_OK(dp_compress_parse("topk:0.1", &p.dp.compress));
    p.io.out_dir = dir;
    p.io.ckpt_every_steps = 5;
    p.run.max_steps = 12;
    return p;
}

static void expect_same_checkpoint(const char *a, const char *b, int64_t step) {
    struct dp_ckpt_header ha, hb;
    ASSERT_OK(dp_ckpt_read_header(a, &ha));
    ASSERT_OK(dp_ckpt_read_header(b, &hb));
    ASSERT_EQ(ha.step, step);
    ASSERT_EQ(hb.step, step);
    ASSERT_EQ(ha.optim_step, hb.optim_step);
    ASSERT_TRUE(ha.optim_state_len > 0);
    ASSERT_TRUE(ha.param_hash == hb.param_hash);
    ASSERT_TRUE(ha.payload_crc == hb.payload_crc); /* parameters, buffers and optimizer state */
    void *ea, *eb;
    uint64_t na, nb;
    ASSERT_OK(dp_ckpt_read_section(a, DP_CKPT_EF_TAG, &ea, &na));
    ASSERT_OK(dp_ckpt_read_section(b, DP_CKPT_EF_TAG, &eb, &nb));
    ASSERT_TRUE(na > 0 && na == nb && memcmp(ea, eb, (size_t)na) == 0);
    free(ea), free(eb);
}

TEST_T(snapshot_writes_what_the_step_writes, 300) {
    require_data();
    char bg[512], sync[512], a[600], b[600];
    dp_test_path(bg, "snap_bg");
    dp_test_path(sync, "snap_sync");
    struct dp_train_params p = snap_params(bg);
    int64_t n;
    free(train(&p, &n));
    p = snap_params(sync);
    p.io.ckpt_sync = 1;
    free(train(&p, &n));
    /* the latest two: step 12's (the run's end) and step 10's before it */
    snprintf(a, sizeof a, "%s/checkpoint.bin", bg), snprintf(b, sizeof b, "%s/checkpoint.bin", sync);
    expect_same_checkpoint(a, b, 12);
    snprintf(a, sizeof a, "%s/checkpoint.prev.bin", bg), snprintf(b, sizeof b, "%s/checkpoint.prev.bin", sync);
    expect_same_checkpoint(a, b, 10);
    ASSERT_EQ(dp_test_files_in(bg), 3); /* the two checkpoints and metrics.jsonl: no temporary file left */
}

/* Deterministic mode: resuming the background checkpoint of step 10 (the
 * one kept as checkpoint.prev.bin) at another worker count ends with the
 * straight run's bits. */
TEST_T(snapshot_resume_same_bits, 300) {
    require_data();
    char dir[512], prev[600];
    dp_test_path(dir, "snap_det");
    struct dp_train_params p = base("mlp", 1);
    p.dp.deterministic = 1;
    p.run.max_steps = 14;
    int64_t n1, n;
    float *ref = train(&p, &n1);
    p.dp.workers = 2;
    p.io.out_dir = dir;
    p.io.ckpt_every_steps = 5;
    p.run.max_steps = 12;
    free(train(&p, &n));
    snprintf(prev, sizeof prev, "%s/checkpoint.prev.bin", dir);
    struct dp_ckpt_header h;
    ASSERT_OK(dp_ckpt_read_header(prev, &h));
    ASSERT_EQ(h.step, 10);
    p.dp.workers = 3;
    p.io.out_dir = NULL;
    p.io.resume = prev;
    p.run.max_steps = 14;
    float *got = train(&p, &n);
    ASSERT_EQ(n, n1);
    ASSERT_TRUE(memcmp(ref, got, sizeof(float) * (size_t)n) == 0);
    free(ref), free(got);
}

/* The writer fails (checkpoint.prev.bin is a folder, so the previous
 * checkpoint cannot be kept under that name): the run ends with an error
 * that names it, and no step checkpoint is lost silently. */
TEST_T(snapshot_write_error_ends_the_run, 300) {
    require_data();
    char dir[512], blocker[600], inside[700];
    dp_test_path(dir, "snap_err");
    ASSERT_TRUE(mkdir(dir, 0755) == 0);
    snprintf(blocker, sizeof blocker, "%s/checkpoint.prev.bin", dir);
    ASSERT_TRUE(mkdir(blocker, 0755) == 0);
    snprintf(inside, sizeof inside, "%s/x", blocker);
    dp_test_write_file(inside, "x", 1);
    struct dp_train_params p = snap_params(dir);
    struct dp_trainer *t;
    ASSERT_OK(dp_trainer_init(&t, &p));
    int rc = dp_trainer_run(t);
    ASSERT_EQ(rc, DP_EIO);
    ASSERT_TRUE(strstr(dp_errmsg(), "checkpoint.prev.bin") != NULL);
    dp_trainer_free(t);
}

/* ZeRO: each worker copies its own pieces and the writer puts them at their places in the
 * shared file (snapshot.c).  For stages 1, 2, 3 (and stage 1 with the all-gather ahead, whose
 * pieces are cut per bucket; and stage 3 with a unit, whose ranges are the layers' slices), AdamW
 * (two state parts), 3 workers (shards of unequal sizes): the
 * background file of step 10 and the run's last are the ones --ckpt-sync writes, byte for
 * byte, and no temporary file is left. */
static void zero_snapshot_case(int stage, int ahead, size_t unit) {
    char bg[512], sync[512], a[600], b[600], name[64];
    snprintf(name, sizeof name, "zsnap_bg_%d_%d_%zu", stage, ahead, unit);
    dp_test_path(bg, name);
    snprintf(name, sizeof name, "zsnap_sync_%d_%d_%zu", stage, ahead, unit);
    dp_test_path(sync, name);
    for (int k = 0; k < 2; k++) {
        struct dp_train_params p = base("mlp", 3);
        p.optim.kind = DP_OPTIM_ADAMW;
        p.sched.base_lr = 1e-3f;
        p.dp.zero = stage;
        p.dp.zero_gather = ahead ? DP_ZERO_GATHER_AHEAD : DP_ZERO_GATHER_AUTO;
        p.dp.zero_unit_bytes = unit;
        p.io.out_dir = k ? sync : bg;
        p.io.ckpt_sync = k;
        p.io.ckpt_every_steps = 5;
        p.run.max_steps = 12;
        struct dp_trainer *t;
        ASSERT_OK(dp_trainer_init(&t, &p));
        ASSERT_OK(dp_trainer_run(t));
        struct dp_snapshot_stats st;
        dp_trainer_snapshot_stats(t, &st);
        ASSERT_EQ(st.taken, k ? 0 : 2); /* steps 5 and 10 in the background (12: the run's end, in the step) */
        dp_trainer_free(t);
    }
    for (int prev = 0; prev < 2; prev++) {
        const char *f = prev ? "checkpoint.prev.bin" : "checkpoint.bin";
        snprintf(a, sizeof a, "%s/%s", bg, f), snprintf(b, sizeof b, "%s/%s", sync, f);
        size_t na, nb;
        char *da = dp_test_read_file(a, &na), *db = dp_test_read_file(b, &nb);
        struct dp_ckpt_header h;
        ASSERT_OK(dp_ckpt_read_header(a, &h));
        ASSERT_EQ(h.step, prev ? 10 : 12);
        ASSERT_TRUE(h.optim_state_len == 2 * h.num_params);
        if (!(na == nb && memcmp(da, db, na) == 0))
            dp_test_fail(__FILE__, __LINE__, "--zero %d%s%s: %s differs from the --ckpt-sync run's", stage,
                         ahead ? " (gather ahead)" : "", unit ? " (a unit: the layers' slices)" : "", f);
        free(da), free(db);
    }
    ASSERT_EQ(dp_test_files_in(bg), 3);
}

TEST_T(snapshot_zero_shards_written_in_place, 300) {
    require_data();
    zero_snapshot_case(1, 0, 0);
    zero_snapshot_case(1, 1, 0);
    zero_snapshot_case(2, 0, 0);
    zero_snapshot_case(3, 0, 0);
    zero_snapshot_case(3, 0, 100 << 10); /* --zero-unit-mb 0.1: fc1 and fc2 in slices, each a range */
}
