#!/usr/bin/env bash
# What the GEMM's tiles (src/core/gemm.c: tiles from the shape alone, the same bits for any
# thread count) cost the step: bench/ab.sh on cnn and gpt at 2 workers x 1 thread and 1 worker x
# 2 threads.
#   OLD=/path/to/dptrain-before NEW=build/dptrain bash bench/gemm_tiles.sh     # about 6 minutes
# Writes bench/results/gemm_tiles-<date>.txt.
CONFIGS="cnn_w2t1 cnn_w1t2 gpt_w2t1 gpt_w1t2" NAME=gemm_tiles exec bash "$(dirname "$0")/ab.sh"
