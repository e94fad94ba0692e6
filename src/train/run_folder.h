/* The run folder (src/train/run_folder.c): the trainer's only entry to it. */
#ifndef DP_TRAIN_RUN_FOLDER_H
#define DP_TRAIN_RUN_FOLDER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The stdio buffer of metrics.jsonl: larger than any record, so that each
 * record, flushed at its end, reaches the file in one write. */
#define DP_METRICS_RECORD_MAX (1 << 20)

/* check: the refusal alone, before anything is loaded.  open: rank 0 before the run: refuses a folder that holds another run (unless
 * `resume` is its own checkpoint, or overwrite), makes it with its parents,
 * cuts metrics.jsonl back to `resume`'s length when resuming it (what was
 * cut is appended to note), and opens metrics.jsonl (*metrics; path gets
 * its name). */
int dp__run_folder_check(const char *dir, const char *resume, int overwrite);
int dp__run_folder_open(const char *dir, const char *resume, int overwrite, FILE **metrics, char *path,
                        size_t path_len, char *note, size_t note_len);

/* The failure record: when a run fails, each process writes
 * DIR/failure.p<process>.json (atomically; one JSON object on one line):
 *
 *   {"kind": "failure", "process": 1, "host": "h1", "steps_done": 57,
 *    "lost_processes": [2], "error": "comm: timeout after 5 s in ..."}
 *
 * lost_processes: the processes (MPI ranks) that a --comm-timeout found
 * silent (dp_comm_lost_ranks).  A supervisor (dptrain launch) reads the
 * records to learn which hosts to exclude. */
int dp__run_folder_failure(const char *dir, int process, int64_t steps_done, const char *error, const int *lost,
                           int nlost);

#endif
