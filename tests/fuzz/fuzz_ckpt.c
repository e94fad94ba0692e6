/* libFuzzer harness for the checkpoint reader (dp_ckpt_parse).
 * Built by tests/fuzz/run_ckpt.sh.  With -DDP_FUZZ_GEN it is instead a small
 * program that writes a valid seed checkpoint to argv[1]. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dp/train.h"

#ifndef DP_FUZZ_GEN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct dp_ckpt_header h;
    const float *payload = NULL;
    if (dp_ckpt_parse(data, size, &h, &payload) == DP_OK) {
        /* A checkpoint that parses must be self-consistent: touch every
         * payload float (ASan checks the bounds). */
        volatile float acc = 0;
        int64_t n = h.num_params + h.num_buffers + h.optim_state_len;
        for (int64_t i = 0; i < n; i++) acc += payload[i] * 0.0f;
        (void)acc;
    }
    return 0;
}
#else
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    float params[6] = {1, 2, 3, 4, 5, 6}, bufs[2] = {0, 1}, st[6] = {0};
    struct dp_ckpt_header h;
    memset(&h, 0, sizeof h);
    snprintf(h.model_spec, sizeof h.model_spec, "mlp:4,1");
    h.in_shape[0] = 1, h.in_shape[1] = 2, h.in_shape[2] = 2;
    h.num_params = 6, h.num_buffers = 2, h.optim_state_len = 6;
    h.batch = 4, h.seed = 1;
    if (dp_ckpt_write(argv[1], &h, params, bufs, st)) {
        fprintf(stderr, "%s\n", dp_errmsg());
        return 1;
    }
    return 0;
}
#endif
