/* The CLI's shared pieces (tools/dptrain only): the one error exit and the
 * subcommands that live in their own files. */
#ifndef DPTRAIN_CLI_H
#define DPTRAIN_CLI_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "dp/comm.h"

/* Prints "dptrain: error: MESSAGE" (naming this process in a multi-process
 * job) and exits 1; in an MPI job it first ends the whole job, so the other
 * processes do not wait for this one until a timeout.  (cli.c, as the rest
 * of this header up to train_config.c's part) */
void dptrain_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
/* ... with a library error: its detailed message, or the code's text */
void dptrain_die_rc(int rc) __attribute__((noreturn));
/* One warning line when any GEMM of this process fell back from oneDNN to the
 * reference (the library records it, dp_gemm_fallback_note; it never prints). */
void dptrain_warn_gemm_fallback(void);

/* The process communicator of an MPI job (made on the first call, with
 * default parameters or cp; a failure ends the program; from then on
 * dptrain_die ends the whole job), and its end (MPI_Finalize, after a
 * barrier inside). */
struct dp_comm *dptrain_job_init(void);
struct dp_comm *dptrain_job_start(const struct dp_comm_params *cp);
void dptrain_job_free(void);

/* A subcommand's options, for commands called with argv[0] = their
 * name: "--name VALUE" or "--name=VALUE" gives 1 and *val when argv[*i] is
 * option `name` (a missing value ends the program, naming the command's
 * help); the number parsers end it on a value that is not a finite number
 * in [lo, hi], naming the option. */

int dptrain_take(int argc, char **argv, int *i, const char *name, const char **val);
long long dptrain_int_arg(const char *name, const char *v, long long lo, long long hi);
double dptrain_num_arg(const char *name, const char *v, double lo, double hi);

/* tools/dptrain/train_config.c: train's configuration in its checkpoints (rendered by the
 * library: dp_train_options_render).  stored: a
 * checkpoint's (its DPCONFIG section, or for an older file what its header holds, with
 * *from_header = 1), after the whole file's checksums; overrides: one line on f per option
 * whose rendering differs between stored and now, and their count. */
struct dp_train_params;
char *dptrain_config_stored(const char *ckpt, int *from_header);
int dptrain_config_overrides(const char *stored, const char *now, FILE *f);

/* tools/dptrain/bench_allreduce.c */
int dptrain_cmd_bench_allreduce(int argc, char **argv);
/* Median all-reduce time per size of the thread backend, measured as bench
 * allreduce does (for dptrain calibrate). */
void dptrain_allreduce_medians(int P, enum dp_comm_algo algo, const size_t *sizes, int n, int iters, double *med);
/* The same over the processes of an MPI job: every rank of c calls it and
 * gets the medians (the slowest rank's time per iteration). */
void dptrain_allreduce_medians_comm(struct dp_comm *c, enum dp_comm_algo algo, const size_t *sizes, int n, int iters,
                                    double *med);
/* tools/dptrain/prepare_text.c */
int dptrain_cmd_prepare_text(int argc, char **argv);
/* A language model's --data: a folder of text files becomes its token file
 * (prepared on first use, reused while valid; one line on stderr says
 * which, when report); anything else is returned as given. */
const char *dptrain_prepared_text_data(const char *data, int report);
/* tools/dptrain/sample.c */
int dptrain_cmd_sample(int argc, char **argv);
/* tools/dptrain/plan.c: simulate, plan, calibrate */
int dptrain_cmd_simulate(int argc, char **argv);
int dptrain_cmd_plan(int argc, char **argv);
int dptrain_cmd_calibrate(int argc, char **argv);
/* Calls fn on every line of PATH (or PATH/metrics.jsonl for a folder), parsed
 * as a flat JSON object; a bad line ends the program with one error naming
 * the file and line. */
struct dp_json_obj;
void dptrain_each_record(const char *path, void (*fn)(const struct dp_json_obj *, void *), void *arg);
/* tools/dptrain/failures.c: the failure model's options in simulate and plan (on when
 * given), and its reports for a step time the command worked out; json: simulate's
 * fields inside its object, plan's as lines of their own. */
struct dptrain_fail_opts {
    int given;                 /* any failure option was given */
    double mtbf_worker_s, recovery_s, snapshot_s, write_s;
    long long every;           /* -1: Young-Daly's */
    long long job_steps;
    int trials;
};
extern const char *const dptrain_fail_help;
void dptrain_fail_defaults(struct dptrain_fail_opts *o);
int dptrain_fail_take(int argc, char **argv, int *i, struct dptrain_fail_opts *o);
void dptrain_fail_simulate(const struct dptrain_fail_opts *o, int workers, double step_s, uint64_t seed, int json);
void dptrain_fail_plan(const struct dptrain_fail_opts *o, int workers, double step_s, int json);
/* tools/dptrain/launch.c */
int dptrain_cmd_launch(int argc, char **argv);
/* tools/dptrain/plot.c */
int dptrain_cmd_plot(int argc, char **argv);

#define DPTRAIN_DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

/* tools/dptrain/help.c: the help texts of the commands in main.c */
extern const char *const dptrain_help_main, *const dptrain_help_eval, *const dptrain_help_ckpt;
/* train's help, from the library's option table (dp_train_option_at) */
void dptrain_print_train_help(FILE *f);
/* The help of one ckpt subcommand: "info", "export" or "diff" (anything
 * else, NULL included: the overview, dptrain_help_ckpt).  Static text. */
const char *dptrain_help_ckpt_sub(const char *sub);
/* `dptrain --help`'s list of communicator backends, and `dptrain --version`
 * (the version, the git commit, compiler, gemm backends and MPI of this build) */
void dptrain_print_backends(FILE *f);
void dptrain_print_version(FILE *f);

/* tools/dptrain/progress.c: train's progress state (rank 0), filled by the
 * trainer's events (dptrain_on_event, its on_event callback), and the
 * summary printed at the end of a run */
struct dp_event;
struct dp_trainer;
struct dp_train_params;
struct dp_model;
#define DPTRAIN_ETA_RING 16
enum progress_mode { PROG_AUTO, PROG_BAR, PROG_LINES, PROG_NONE };
struct progress {
    enum progress_mode mode;
    double t0, last_draw;
    double sum_loss;
    int64_t nloss;
    double last_test_acc, last_test_loss, last_sps;
    int64_t positions; /* loss terms per sample: 1, or ctx for gpt (then tokens/s, perplexity) */
    /* steady-state throughput: from the end of the 5th step of this run on */
    int64_t run_steps, tp_samples;
    double tp_t0, tp_t1;
    /* per-phase totals over the epochs (rank 0) */
    double sum_data, sum_fwd, sum_bwd, sum_comm, sum_exposed, sum_opt, sum_time;
    /* gradient traffic per step (epoch means, summed) and compression times */
    double sum_sent, sum_recv, sum_fp32, sum_cz, sum_dz;
    int nepochs;
    int slow_rank;     /* the last epoch's straggler, -1 if none */
    double slow_lag;
    const struct dp_model *model;
    int64_t max_steps; /* --max-steps (0: none): where the ETA's run ends, when before its epochs */
    /* the ETA's recent step rate: the time and number of the last steps, a ring */
    double eta_t[DPTRAIN_ETA_RING];
    int64_t eta_step[DPTRAIN_ETA_RING];
    int eta_n;
};

void dptrain_on_event(void *arg, const struct dp_event *ev);
/* dt: the run's seconds; peak: one core's measured fp32 FLOP/s (0: unknown); ranks: the job's workers */
void dptrain_progress_summary(const struct progress *p, const struct dp_trainer *t, const struct dp_train_params *tp,
                              double dt, double peak, int ranks);

#endif
