/* dptrain's help texts (the commands that live in main.c; the others keep
 * theirs beside their code). */
#include <string.h>

#include "dp/comm.h"
#include "dp/core.h"
#include "dp/train.h"
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
    "  launch         run a job and keep it going: relaunch after failures, grow with hosts\n"
    "  help CMD       help for one command (same as CMD --help)\n"
    "  --version, -V  the version and the build: git commit, compiler, gemm backends, mpi\n"
    "\n"
    "Run 'dptrain train --help' for the training options.  Several processes:\n"
    "  mpirun -np N dptrain train ...   (docs/cluster.md)\n";

/* train's help: its options from the library's table (src/train/option_table.c, in the
 * order a person meets them: the everyday ones first, then one group per subject, the research
 * and tuning knobs last), with the CLI's own two in their groups. */
static const char *const train_head =
    "usage: dptrain train [options]\n"
    "\n"
    "Trains a model with synchronous data parallelism: one line per epoch, a progress bar or\n"
    "lines with the time left while it runs, and a summary at the end (throughput, time per phase).\n";
static const char *const train_tail =
    "Stopping: SIGINT (Ctrl-C) or SIGTERM stops the run cleanly after the current step, with a\n"
    "checkpoint in --out (--resume continues from it), and exits 130 (SIGINT) or 143 (SIGTERM);\n"
    "a second signal aborts at once.\n";
/* the options only the CLI has: each after `after` in its group (NULL: first in it) */
static const struct {
    struct dp_train_option o;
    const char *after;
} cli_only[] = {
    {{"progress", "MODE", "basics",
      "auto | bar | lines | none [auto: bar on a terminal, else lines]; bar\n"
      "and lines show the time left; none prints only the per-epoch results", 0},
     "workers"},
    {{"backend", "NAME", "data parallelism",
      "auto | thread | mpi: mpi when started by mpirun/srun, else threads\n"
      "in this process [auto]; with mpi the job has processes x workers\n"
      "ranks (a hierarchical all-reduce: threads, then processes)", 0},
     NULL},
};

/* "  --name ARG          first line" (the text in column 22, or two spaces after a long
 * name), then the help's other lines in column 22 */
static void print_option(FILE *f, const struct dp_train_option *o) {
    char head[96];
    snprintf(head, sizeof head, "--%s%s%s", o->name, o->arg && !o->optional ? " " : "", o->arg ? o->arg : "");
    if (strlen(head) <= 18) fprintf(f, "  %-20s", head);
    else if (strlen(head) <= 24) fprintf(f, "  %s  ", head);
    else fprintf(f, "  %s\n%22s", head, "");
    for (const char *l = o->help; *l;) {
        size_t n = strcspn(l, "\n");
        fprintf(f, "%.*s\n", (int)n, l);
        l += n + (l[n] == '\n');
        if (*l) fprintf(f, "%22s", "");
    }
}

static void print_cli_only(FILE *f, const char *group, const char *after) {
    for (size_t k = 0; k < sizeof cli_only / sizeof cli_only[0]; k++)
        if (!strcmp(cli_only[k].o.group, group) &&
            (after ? cli_only[k].after && !strcmp(cli_only[k].after, after) : !cli_only[k].after))
            print_option(f, &cli_only[k].o);
}

void dptrain_print_train_help(FILE *f) {
    fputs(train_head, f);
    const char *group = NULL;
    for (int i = 0;; i++) {
        const struct dp_train_option *o = dp_train_option_at(i);
        if (!o || !group || strcmp(o->group, group)) {
            if (!o) break;
            group = o->group;
            fprintf(f, "\n%s:\n", group);
            print_cli_only(f, group, NULL);
        }
        print_option(f, o);
        print_cli_only(f, group, o->name);
    }
    fputs("\n", f);
    fputs(train_tail, f);
}

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
