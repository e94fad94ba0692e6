/* dptrain's help texts (the commands that live in main.c; the others keep
 * theirs beside their code). */
#include <string.h>

#include "dp/comm.h"
#include "dp/core.h"
#include "cli.h"

#ifdef DP_WITH_MPI
#include <mpi.h> /* Open MPI's version, for --version */
#endif

#define DEFAULT_DATA DPTRAIN_DEFAULT_DATA

const char *const dptrain_help_main =
    "usage: dptrain <command> [options]\n"
    "\n"
    "Data-parallel neural-network training in C.\n"
    "\n"
    "commands:\n"
    "  train          train a model on an IDX dataset (Fashion-MNIST by default), or gpt on text\n"
    "  eval           evaluate a checkpoint on the test set\n"
    "  ckpt info      print a checkpoint's header and parameter hash\n"
    "  ckpt export    write a checkpoint's weights as safetensors (PyTorch names)\n"
    "  ckpt diff      compare two checkpoints (max relative difference, hashes)\n"
    "  bench allreduce  all-reduce time, algorithm and bus bandwidth by message size\n"
    "  prepare-text   write a token file from text files (fortunes by default)\n"
    "  sample         generate text with a gpt checkpoint (prompt, temperature, top-k, seed)\n"
    "  plan           predict a step: buckets, all-reduce algorithms, overlap, ZeRO memory\n"
    "  calibrate      measure alpha, beta, gamma and compute per sample: a profile for plan\n"
    "  simulate       discrete-event simulation of steps: sync, ssp, async, backup workers\n"
    "  plot           SVG plots of runs (metrics.jsonl) and of plan/simulate outputs\n"
    "  help CMD       help for one command (same as CMD --help)\n"
    "  --version, -V  the version and the build: git commit, compiler, gemm backends, mpi\n"
    "\n"
    "Run 'dptrain train --help' for the training options.  Several processes:\n"
    "  mpirun -np N dptrain train ...   (docs/cluster.md)\n";

/* train's options in the order a person meets them: the everyday ones
 * first, then one group per subject, the research and tuning knobs last. */
const char *const dptrain_help_train =
    "usage: dptrain train [options]\n"
    "\n"
    "Trains a model with synchronous data parallelism: one line per epoch, a progress bar or\n"
    "lines with the time left while it runs, and a summary at the end (throughput, time per phase).\n"
    "\n"
    "basics:\n"
    "  --data DIR          IDX files train-*/t10k-* (plain or .gz) [" DEFAULT_DATA "];\n"
    "                      X.npy with --labels y.npy, data.npz, data.csv, a folder of images\n"
    "                      (docs/data.md); gpt: a token file or a folder of text (see data and model)\n"
    "  --model SPEC        mlp | cnn | resnet | mlp:784,W1,...,10[,dropout=P] | mlp:hidden=W1,... |\n"
    "                      cnn:C1,C2[,F] | resnet:DEPTH[,WIDTH] (DEPTH 6n+2: 8, 14, 20, ...) |\n"
    "                      gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V] [mlp]\n"
    "  --epochs N          passes over the training set [1]\n"
    "  --batch N           global batch size, split over the workers [128]\n"
    "  --lr F              learning rate [0.05]\n"
    "  --out DIR           write metrics.jsonl and checkpoint.bin there\n"
    "  --resume FILE       continue exactly from a checkpoint (same --batch, --seed)\n"
    "  --workers P         data-parallel workers, one replica each [one per core]\n"
    "  --progress MODE     auto | bar | lines | none [auto: bar on a terminal, else lines]; bar\n"
    "                      and lines show the time left; none prints only the per-epoch results\n"
    "\n"
    "data and model:\n"
    "  --model-file FILE   a model declared in a file, one layer per line (docs/models.md;\n"
    "                      models/*.txt are the built-in ones); it travels in the checkpoint\n"
    "  --data FILE         gpt: a token file (dptrain prepare-text; docs/text.md)\n"
    "  --data DIR          gpt: a folder of text files, prepared on first use into\n"
    "                      ~/.cache/dptrain ($XDG_CACHE_HOME) and reused while valid\n"
    "  --labels FILE       with --data X.npy: y.npy, a class per sample (float targets with --loss mse)\n"
    "  --test-data FILE    with --data X.npy: the test set's X.npy, and --test-labels FILE its y.npy\n"
    "  --npz-keys X,Y      --data data.npz: its features' and labels' arrays [x,y, or Keras's\n"
    "                      x_train,y_train with x_test,y_test as the test set]\n"
    "  --label-column C    --data data.csv: the labels' column, a header name or a 0-based index\n"
    "                      [the last]; the CSV is parsed once into the cache folder\n"
    "  --csv-header H      auto | yes | no: whether the CSV's first row names the columns [auto]\n"
    "  --image-size H,W    --data DIR of images (DIR/<class>/*.png|jpg): resize each (shorter\n"
    "                      side) and centre-crop it to H x W [their own size, all equal]\n"
    "  --image-channels N  1 (grey) or 3 (RGB) [3 if any image has colour, else 1]\n"
    "  --skip-bad-images   skip and count corrupt images instead of stopping at the first\n"
    "  --val-split F       hold out the fraction F of --data X.npy as the test set (seed-keyed) [none]\n"
    "  --layout L          nchw | nhwc: how X.npy's 4-D samples are stored [nchw]\n"
    "  --normalize MODE    auto | none | MEAN,STD; auto: each channel's mean and std over the\n"
    "                      training split [IDX: 0.2860,0.3530 (Fashion-MNIST's); X.npy: auto]\n"
    "  --loss NAME         cross_entropy | mse (a regression: RMSE and MAE reported) [cross_entropy]\n"
    "  --data-format F     gpt: tokens (dptrain's token file, or an llm.c shard) | u16 (raw uint16\n"
    "                      tokens, nanoGPT's train.bin; the vocabulary is the model's) [tokens]\n"
    "  --train-limit N     use only the first N training samples [all], and read no image\n"
    "                      past them; gpt: N windows per epoch [training tokens / (ctx + 1)]\n"
    "  --test-limit N      evaluate on the first N test samples [all] (read no image past\n"
    "                      them); gpt: validation windows\n"
    "  --crop-pad N        augmentation: random crop with N pixels of zero padding [0]\n"
    "  --hflip             augmentation: random horizontal flip\n"
    "  --init-from FILE    initial weights from a safetensors file (PyTorch names)\n"
    "  --seed N            seed for initialisation, shuffling, dropout, augmentation [1]\n"
    "\n"
    "optimisation:\n"
    "  --optim NAME        sgd | adamw [sgd]\n"
    "  --momentum F        SGD [0]      --nesterov       SGD Nesterov momentum\n"
    "  --weight-decay F    [0]          --beta1 F, --beta2 F, --eps F   AdamW [0.9, 0.999, 1e-8]\n"
    "  --schedule NAME     constant | step | cosine [constant]\n"
    "  --warmup N          cosine: linear warmup steps [0]\n"
    "  --min-lr F          cosine: final learning rate [0]\n"
    "  --step-size N       step: decay every N steps    --gamma F   step: factor [0.1]\n"
    "  --clip F            clip the global gradient norm to F [off]\n"
    "  --max-steps N       stop after N steps in total [off]\n"
    "\n"
    "checkpoints and evaluation:\n"
    "  --ckpt-every N      checkpoint every N epochs [only at the end]\n"
    "  --ckpt-every-steps N  checkpoint every N optimizer steps [off]\n"
    "  --overwrite         replace the run an --out folder already holds (checkpoint.bin,\n"
    "                      metrics.jsonl); without it train refuses such a folder unless resuming it\n"
    "  --eval-every N      evaluate on the test set every N steps too; the figures go to the\n"
    "                      step records of metrics.jsonl [only at the end of each epoch]\n"
    "\n"
    "data parallelism:\n"
    "  --workers P         data-parallel workers (threads, one replica each) per process\n"
    "                      [cores / processes on this host]\n"
    "  --backend NAME      auto | thread | mpi: mpi when started by mpirun/srun, else threads\n"
    "                      in this process [auto]; with mpi the job has processes x workers\n"
    "                      ranks (a hierarchical all-reduce: threads, then processes)\n"
    "  --threads N         compute threads per worker [1]\n"
    "  --accum K           gradient accumulation: K global batches per optimizer step [1]\n"
    "  --bucket-cap-mb F   gradient bucket cap in MiB [auto: a quarter of the gradient,\n"
    "                      1..25 MiB]\n"
    "  --first-bucket-mb F the first (output-side) bucket in MiB [1]\n"
    "  --no-overlap        all-reduce only after backward (for comparison)\n"
    "  --algo NAME         all-reduce algorithm: auto | ring | rhd | direct | native [auto];\n"
    "                      with mpi it applies between processes (native = MPI's own)\n"
    "  --deterministic     bit-identical results for any --workers (fixed chunks, exact sums)\n"
    "  --det-chunk N       deterministic mode: samples per chunk [batch/4, within 8..32]\n"
    "  --check-replicas N  compare every replica's parameter hash every N steps [off]\n"
    "  --skip-nonfinite    skip steps whose loss or gradient is NaN/Inf instead of stopping\n"
    "  --comm-timeout S    fail a collective that blocks longer than S seconds [off]\n"
    "\n"
    "slow workers (docs/ddp.md):\n"
    "  --balance[=K]       heterogeneity-aware batches: every K steps [10] re-split the global\n"
    "                      batch by each rank's measured throughput and update time, so that\n"
    "                      their steps end together (the same gradient; whole --det-chunk\n"
    "                      chunks when deterministic) [off]\n"
    "  --backup-workers B  each step takes the gradients of the first workers - B ranks to finish\n"
    "                      (their samples' mean) and drops the late ones' [off]; under mpirun\n"
    "                      with --workers 1 (through rank 0); no BatchNorm\n"
    "  --mode NAME         sync | async [sync]: async trains through a parameter server; each\n"
    "                      worker loops pull, forward/backward on its own batch of batch/workers,\n"
    "                      push, never waiting for another (no BatchNorm); under mpirun with\n"
    "                      --workers 1, the last --servers ranks serve and the others work\n"
    "  --servers S         parameter-server shards, each with its own lock [min(workers, 4)];\n"
    "                      under mpirun: server ranks, one shard each [1]\n"
    "  --staleness S       stale-synchronous (implies async): a clock's pushes make one update,\n"
    "                      a worker at most S clocks ahead of the slowest (0 = synchronous)\n"
    "  --staleness-lr      scale each update's lr by 1 / (1 + its staleness) [off]\n"
    "                      (epoch lines and metrics.jsonl report the staleness)\n"
    "  --share-lr          async: scale each push's lr by its share of the batch (its samples /\n"
    "                      --batch), so a global batch's pushes move as far as one sync step [off]\n"
    "  --implicit-momentum async SGD: asynchrony acts like momentum 1 - 1/workers; the server runs\n"
    "                      at momentum 1 - workers x (1 - --momentum), so the two compose to it [off]\n"
    "\n"
    "gradient compression (docs/ddp.md):\n"
    "  --compress SPEC     none | bf16 | fp16 | powersgd:RANK | topk:FRACTION | sign [none];\n"
    "                      topk, sign and powersgd keep an error-feedback residual per worker\n"
    "                      (saved in checkpoints)\n"
    "  --powersgd-start N  powersgd: plain all-reduce before optimizer step N [0]\n"
    "  --no-error-feedback topk, sign, powersgd: drop the residual instead of adding it to the\n"
    "                      next step's gradient (to measure what error feedback buys)\n"
    "\n"
    "memory (ZeRO, docs/ddp.md):\n"
    "  --zero N            ZeRO stage: 0 off | 1 each worker keeps the optimizer state of its 1/P\n"
    "                      shard, updates it and all-gathers the parameters | 2 and the gradient:\n"
    "                      each bucket reduce-scattered, its memory given back | 3 and the\n"
    "                      parameters: each bucket gathered before its layers run, then freed [0]\n"
    "  --zero-reduce HOW   --zero 1's gradient reduction: allreduce (bucketed, overlapped with\n"
    "                      backward) | scatter (half the bytes: each bucket reduce-scattered during\n"
    "                      backward with the gather ahead, else the slab after backward) [allreduce]\n"
    "  --zero-gather WHEN  --zero 1's parameter all-gather: step (within the step) | ahead (bucket\n"
    "                      by bucket, waited for by the next forward layer by layer) | auto (ahead\n"
    "                      when the workers span processes, else step) [auto]\n"
    "\n"
    "diagnostics, simulation and tuning:\n"
    "  --timeline FILE     write a Chrome trace (Perfetto, chrome://tracing): one compute and one\n"
    "                      all-reduce track per worker\n"
    "  --simulate-slow RANK:FACTOR[,RANK:FACTOR...]\n"
    "                      make job rank RANK's compute FACTOR (>= 1) times slower by sleeping\n"
    "                      (FACTOR - 1) x its measured compute of each step [off]\n"
    "  --simulate-jitter SPEC  random stalls per (rank, step), replayed by --seed: p=P,ms=MS (a\n"
    "                      stall of MS ms with probability P) and/or lognormal=SIGMA (compute x\n"
    "                      exp(SIGMA z) when that is > 1) [off]; docs/ddp.md\n"
    "  --comm-progress WHO who runs the buckets' all-reduces on threads: thread (each worker's\n"
    "                      communication thread) | caller (the workers themselves, between\n"
    "                      layers; no third thread) | auto (caller when the workers' threads\n"
    "                      fill the process's cores with none left for a communication\n"
    "                      thread each, else thread) [auto]\n"
    "  --comm-spin-us N    a worker waiting for another spins N microseconds before it sleeps\n"
    "                      [auto: 10, 1 with more workers than cores; with caller progress\n"
    "                      up to 2000 while the worker has its core to itself]\n"
    "  --pin-threads       worker r runs only on the r-th core this process may use (its\n"
    "                      affinity: give each process on a host its own cores) [off]\n"
    "  --prefetch N|auto   batches a loader thread prepares ahead; 0: each worker assembles its\n"
    "                      own [auto: 0 where the compute threads fill the CPUs, else 2]\n"
    "  --gemm NAME         dnnl | blas | ref [dnnl when built]\n"
    "\n"
    "Stopping: SIGINT (Ctrl-C) or SIGTERM stops the run cleanly after the current step, with a\n"
    "checkpoint in --out (--resume continues from it), and exits 130 (SIGINT) or 143 (SIGTERM);\n"
    "a second signal aborts at once.\n";

const char *const dptrain_help_eval =
    "usage: dptrain eval --ckpt FILE [--data DIR | --data X.npy --labels y.npy] [--threads N]\n"
    "                    [--test-limit N]\n"
    "       dptrain eval --safetensors FILE [--model SPEC | --model-file FILE] [--data DIR]\n"
    "                    [--threads N] [--test-limit N]\n"
    "\n"
    "Evaluates the checkpoint's model (or the weights of a safetensors file, PyTorch names,\n"
    "as 'ckpt export' writes and 'train --init-from' reads) on the test set and prints\n"
    "accuracy and loss.  A gpt model: --data is its token file (or a folder of text files,\n"
    "prepared into the cache folder on first use as train does), and the validation windows\n"
    "give the loss per token and the perplexity.  Your own data: --data X.npy --labels y.npy are\n"
    "the samples evaluated, normalised as the checkpoint's run was (a regression reports RMSE\n"
    "and MAE); --layout nhwc as in train.\n";

/* `dptrain help ckpt`: the overview; each subcommand's own help below. */
const char *const dptrain_help_ckpt =
    "usage: dptrain ckpt info FILE\n"
    "       dptrain ckpt export FILE --safetensors OUT\n"
    "       dptrain ckpt diff A B [--tol F]\n"
    "\n"
    "  info     a checkpoint's header and the hash of its parameters\n"
    "  export   its weights as safetensors, with PyTorch names\n"
    "  diff     how far two checkpoints of the same model differ\n"
    "\n"
    "Run 'dptrain ckpt CMD --help' for one of them (docs/checkpoint.md: the format).\n";

static const char *const help_ckpt_info =
    "usage: dptrain ckpt info FILE\n"
    "\n"
    "Prints the header of checkpoint FILE: format version, model spec, input shape, parameter and\n"
    "buffer counts, the step it was written at (epoch, step in epoch), batch, seed, optimizer and\n"
    "its settings, learning rate and schedule, the payload's CRC-32, and the param hash: FNV-1a 64\n"
    "of the raw parameter and buffer bytes, the hash runs are compared by (train prints it too).\n";

static const char *const help_ckpt_export =
    "usage: dptrain ckpt export FILE --safetensors OUT\n"
    "\n"
    "Writes the weights of checkpoint FILE to OUT as safetensors, with PyTorch state_dict names\n"
    "and layouts, and the model spec, input shape and input normalisation in its metadata\n"
    "(docs/checkpoint.md: loading it in PyTorch).  'train --init-from' and 'eval --safetensors'\n"
    "read it back.\n"
    "\n"
    "  --safetensors OUT   the file to write (required)\n";

static const char *const help_ckpt_diff =
    "usage: dptrain ckpt diff A B [--tol F]\n"
    "\n"
    "Compares two checkpoints of the same model: max |A - B| / max |A| over the parameters (and,\n"
    "separately, the buffers), the steps they were written at, and whether their param hashes are\n"
    "equal (bit-identical).\n"
    "\n"
    "  --tol F             the largest relative difference that counts as the same [1e-5]\n"
    "\n"
    "Exits 0 when both differences are <= F, 1 otherwise (a NaN or Inf in either is a\n"
    "difference).\n";

const char *dptrain_help_ckpt_sub(const char *sub) {
    if (sub && !strcmp(sub, "info")) return help_ckpt_info;
    if (sub && !strcmp(sub, "export")) return help_ckpt_export;
    if (sub && !strcmp(sub, "diff")) return help_ckpt_diff;
    return dptrain_help_ckpt;
}

/* ---- the build ---------------------------------------------------------------- */

/* The Makefile passes these to this file alone (from VERSION and git describe),
 * so that a new commit rebuilds one object. */
#ifndef DPTRAIN_VERSION
#define DPTRAIN_VERSION ""
#endif
#ifndef DPTRAIN_COMMIT
#define DPTRAIN_COMMIT ""
#endif

void dptrain_print_backends(FILE *f) {
    fprintf(f, "\nbackends: thread (built in), mpi (%s)\n",
            dp_comm_backend_available("mpi") ? "built in"
                                             : "not built in: install openmpi-bin libopenmpi-dev and rebuild");
}

void dptrain_print_version(FILE *f) {
    fprintf(f, "dptrain %s\n", DPTRAIN_VERSION[0] ? DPTRAIN_VERSION : "(version unknown)");
    fprintf(f, "commit:    %s\n", DPTRAIN_COMMIT[0] ? DPTRAIN_COMMIT : "unknown (not built in a git checkout)");
#if defined(__clang__)
    fprintf(f, "compiler:  clang %d.%d.%d\n", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
    fprintf(f, "compiler:  gcc %s\n", __VERSION__);
#else
    fprintf(f, "compiler:  unknown\n");
#endif
    /* the GEMM backends built in, best first, and the one a run uses unless --gemm says */
    fprintf(f, "gemm:      ");
    for (int b = DP_GEMM_BACKEND_COUNT - 1, n = 0; b >= 0; b--)
        if (dp_gemm_backend_available((enum dp_gemm_backend)b))
            fprintf(f, "%s%s", n++ ? ", " : "", dp_gemm_backend_name((enum dp_gemm_backend)b));
    fprintf(f, " (default %s)\n", dp_gemm_backend_name(dp_gemm_get_backend()));
#if defined(OMPI_MAJOR_VERSION)
    if (dp_comm_backend_available("mpi"))
        fprintf(f, "mpi:       built in (Open MPI %d.%d.%d)\n", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION,
                OMPI_RELEASE_VERSION);
    else
#endif
        fprintf(f, "mpi:       %s\n", dp_comm_backend_available("mpi") ? "built in" : "not built in");
}
