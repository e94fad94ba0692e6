# Splitting the model (issue 31, docs/parallel.md): dptrain train --pp on threads and under mpirun,
# and dptrain plan --pp / --layout auto.  Sourced by tests/cli.sh: it uses ok, bad, skip,
# expect_error, hash_of, same_hash, BIN, T, MPIRUN and the gpt section's GPTRUN and token file.
# About 20 seconds.

# Pipeline parallelism (issue 31, Q1): 2 stages with one micro-batch train one worker's bits; the
# layout is printed; the timeline has each micro-batch's forward and backward; the pipelined
# checkpoint resumes on one worker; and the mistakes each give one line
GPP=(--model gpt:layers=2,heads=2,dim=16,ctx=8 "${GPTRUN[@]:2}" --epochs 1)
if "$BIN" train "${GPP[@]}" --workers 1 --out "$T/gpp1" >"$T/gpp1.log" 2>&1 &&
   "$BIN" train "${GPP[@]}" --workers 2 --pp 2 --micro-batches 1 --out "$T/gpp2" >"$T/gpp2.log" 2>&1 &&
   grep -q '^pipeline: 2 stages x 1 replica, 1 micro-batch, 1f1b: stage 0 tok+pos\.\..* parameters, [0-9]*%); stage 1 ' "$T/gpp2.log" &&
   same_hash "$(hash_of "$T/gpp1/checkpoint.bin")" "$(hash_of "$T/gpp2/checkpoint.bin")"; then
  ok gpt_pipeline_one_microbatch_equals_one_worker
else bad gpt_pipeline_one_microbatch_equals_one_worker "$(tail -3 "$T/gpp2.log")"; fi
if "$BIN" train "${GPP[@]}" --workers 2 --pp 2 --micro-batches 4 --pp-schedule gpipe --max-steps 2 \
     --timeline "$T/gpp.json" >"$T/gppt.log" 2>&1 &&
   [[ $(grep -c '"name": "forward", .*"micro": 3}' "$T/gpp.json") -eq 4 ]] &&
   [[ $(grep -c '"name": "backward", .*"micro": 0}' "$T/gpp.json") -eq 4 ]]; then
  ok gpt_pipeline_timeline_micro_batches
else bad gpt_pipeline_timeline_micro_batches "$(tail -3 "$T/gppt.log")"; fi
if "$BIN" train "${GPP[@]}" --workers 1 --resume "$T/gpp2/checkpoint.bin" --epochs 2 >"$T/gppr.log" 2>&1 &&
   "$BIN" train "${GPP[@]}" --workers 1 --resume "$T/gpp1/checkpoint.bin" --epochs 2 >"$T/gppr1.log" 2>&1 &&
   [[ -n $(grep '^done:' "$T/gppr.log") && $(grep '^done:' "$T/gppr.log" | sed 's/^done: [0-9.]*s//') == $(grep '^done:' "$T/gppr1.log" | sed 's/^done: [0-9.]*s//') ]]; then
  ok gpt_pipeline_checkpoint_resumes_unpipelined
else bad gpt_pipeline_checkpoint_resumes_unpipelined "$(tail -2 "$T/gppr.log")" "$(tail -2 "$T/gppr1.log")"; fi
# --init-from with stages: each worker copies its span (and the tied copy) from the file's
# parameters, the rest given back: one worker's bits from the same file, with one micro-batch
if "$BIN" ckpt export "$T/gpp1/checkpoint.bin" --safetensors "$T/gpp1.safetensors" >/dev/null 2>&1 &&
   "$BIN" train "${GPP[@]}" --workers 1 --max-steps 2 --init-from "$T/gpp1.safetensors" --out "$T/gppi1" >"$T/gppi1.log" 2>&1 &&
   "$BIN" train "${GPP[@]}" --workers 4 --pp 4 --micro-batches 1 --max-steps 2 --init-from "$T/gpp1.safetensors" \
     --out "$T/gppi4" >"$T/gppi4.log" 2>&1 &&
   same_hash "$(hash_of "$T/gppi1/checkpoint.bin")" "$(hash_of "$T/gppi4/checkpoint.bin")"; then
  ok gpt_pipeline_init_from_equals_one_worker
else bad gpt_pipeline_init_from_equals_one_worker "$(tail -2 "$T/gppi1.log")" "$(tail -2 "$T/gppi4.log")"; fi
# ... and across processes (one stage per process): mpirun -np 2 --pp 2 trains the threads' bits
# (1f1b, 4 micro-batches), -np 4 --pp 2 with one micro-batch two data-parallel workers' bits; the
# checkpoint (rank 0 writes, the last stage sends its optimizer state) is the threads' one
if command -v mpirun >/dev/null && "$BIN" --help | grep -q "mpi (built in)" && [[ $BIN != *-asan* && $BIN != *-tsan* ]]; then
  if "$BIN" train "${GPP[@]}" --workers 2 --pp 2 --micro-batches 4 --out "$T/gppt4" >"$T/gppt4.log" 2>&1 &&
     timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${GPP[@]}" --workers 1 --pp 2 --micro-batches 4 --out "$T/gppm4" \
       >"$T/gppm4.log" 2>&1 &&
     "$BIN" ckpt diff "$T/gppt4/checkpoint.bin" "$T/gppm4/checkpoint.bin" 2>&1 | grep -q 'bit-identical' &&
     "$BIN" train "${GPP[@]}" --workers 1 --resume "$T/gppt4/checkpoint.bin" --epochs 2 >"$T/gppr4t.log" 2>&1 &&
     "$BIN" train "${GPP[@]}" --workers 1 --resume "$T/gppm4/checkpoint.bin" --epochs 2 >"$T/gppr4m.log" 2>&1 &&
     [[ -n $(grep '^done:' "$T/gppr4t.log") && $(grep '^done:' "$T/gppr4t.log" | sed 's/^done: [0-9.]*s//') == $(grep '^done:' "$T/gppr4m.log" | sed 's/^done: [0-9.]*s//') ]] &&
     "$BIN" train "${GPP[@]}" --workers 2 --out "$T/gppd2" >"$T/gppd2.log" 2>&1 &&
     timeout 120 "${MPIRUN[@]}" -np 4 "$BIN" train "${GPP[@]}" --workers 1 --pp 2 --micro-batches 1 --out "$T/gppm22" \
       >"$T/gppm22.log" 2>&1 &&
     same_hash "$(hash_of "$T/gppd2/checkpoint.bin")" "$(hash_of "$T/gppm22/checkpoint.bin")"; then
    ok mpi_gpt_pipeline_equals_threads
  else bad mpi_gpt_pipeline_equals_threads "$(tail -2 "$T/gppm4.log")" "$(tail -2 "$T/gppm22.log" 2>/dev/null)"; fi
  # each stage holds its span only (docs/parallel.md): the checkpoint after step 2 (in the
  # background on threads; in the step across processes, where a background copy would hold the
  # whole state on rank 0) and the last one stream the spans to rank 0, and a resume reads each
  # stage's span from the file: the threads' bits at every point
  if "$BIN" train "${GPP[@]}" --workers 2 --pp 2 --max-steps 3 --ckpt-every-steps 2 --out "$T/gpps" >"$T/gpps.log" 2>&1 &&
     timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${GPP[@]}" --workers 1 --pp 2 --max-steps 3 --ckpt-every-steps 2 \
       --out "$T/gppsm" >"$T/gppsm.log" 2>&1 &&
     grep -q '^checkpoints in the background: 1,' "$T/gpps.log" && ! grep -q '^checkpoints in the background' "$T/gppsm.log" &&
     same_hash "$(hash_of "$T/gpps/checkpoint.prev.bin")" "$(hash_of "$T/gppsm/checkpoint.prev.bin")" &&
     "$BIN" ckpt diff "$T/gpps/checkpoint.bin" "$T/gppsm/checkpoint.bin" 2>&1 | grep -q 'bit-identical' &&
     "$BIN" train "${GPP[@]}" --workers 2 --pp 2 --epochs 2 --resume "$T/gpps/checkpoint.bin" --out "$T/gpps" \
       >"$T/gppsr.log" 2>&1 &&
     timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${GPP[@]}" --workers 1 --pp 2 --epochs 2 \
       --resume "$T/gppsm/checkpoint.bin" --out "$T/gppsm" >"$T/gppsmr.log" 2>&1 &&
     same_hash "$(hash_of "$T/gpps/checkpoint.bin")" "$(hash_of "$T/gppsm/checkpoint.bin")"; then
    ok mpi_pipeline_snapshots_and_resume_equal_threads
  else bad mpi_pipeline_snapshots_and_resume_equal_threads "$(tail -2 "$T/gppsm.log")" "$(tail -2 "$T/gppsmr.log" 2>/dev/null)"; fi
  # (each process that gets to say it before the job ends says it in one line: one or both)
  timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" train "${GPP[@]}" --workers 2 --pp 2 >"$T/gppw.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 && $rc -ne 124 ]] &&
     [[ $(grep -c '^dptrain: error: process [01]: --pp across processes needs one worker per process' "$T/gppw.log") -ge 1 ]] &&
     ! grep -q '^dptrain: error: .*' <(grep -v -- '--pp across processes needs one worker per process' "$T/gppw.log"); then
    ok mpi_pipeline_one_worker_per_process
  else bad mpi_pipeline_one_worker_per_process "exit $rc" "$(head -3 "$T/gppw.log")"; fi
elif [[ $BIN == *-asan* || $BIN == *-tsan* ]]; then
  echo "note: mpi_gpt_pipeline_* not run on a sanitizer build (the plain build's cli run has them)"
else
  skip mpi_gpt_pipeline_equals_threads "MPI not built into $BIN"
  skip mpi_pipeline_snapshots_and_resume_equal_threads "MPI not built into $BIN"
  skip mpi_pipeline_one_worker_per_process "MPI not built into $BIN"
fi
# --deterministic: the chunks are the micro-batches; 2 stages x 2 replicas train one worker's bits,
# and under mpirun 2 stages in 2 processes too
if "$BIN" train "${GPP[@]}" --deterministic --det-chunk 2 --workers 1 --out "$T/gppd1" >"$T/gppd1.log" 2>&1 &&
   "$BIN" train "${GPP[@]}" --deterministic --det-chunk 2 --workers 4 --pp 2 --out "$T/gppd4" >"$T/gppd4.log" 2>&1 &&
   same_hash "$(hash_of "$T/gppd1/checkpoint.bin")" "$(hash_of "$T/gppd4/checkpoint.bin")"; then
  ok gpt_pipeline_deterministic_equals_one_worker
else bad gpt_pipeline_deterministic_equals_one_worker "$(tail -2 "$T/gppd4.log")"; fi
if command -v mpirun >/dev/null && "$BIN" --help | grep -q "mpi (built in)" && [[ $BIN != *-asan* && $BIN != *-tsan* ]]; then
  if timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${GPP[@]}" --deterministic --det-chunk 2 --workers 1 --pp 2 \
       --out "$T/gppdm" >"$T/gppdm.log" 2>&1 &&
     same_hash "$(hash_of "$T/gppd1/checkpoint.bin")" "$(hash_of "$T/gppdm/checkpoint.bin")"; then
    ok mpi_gpt_pipeline_deterministic_equals_one_worker
  else bad mpi_gpt_pipeline_deterministic_equals_one_worker "$(tail -2 "$T/gppdm.log")"; fi
elif [[ $BIN != *-asan* && $BIN != *-tsan* ]]; then
  skip mpi_gpt_pipeline_deterministic_equals_one_worker "MPI not built into $BIN"
fi
expect_error pipeline_stages_divide_workers "--pp must divide --workers into stages (got --pp 2 with 3 workers)" \
  "$BIN" train "${GPP[@]}" --workers 3 --pp 2
expect_error pipeline_unknown_schedule "--pp-schedule: unknown schedule 'interleaved' (expected gpipe or 1f1b)" \
  "$BIN" train "${GPP[@]}" --workers 2 --pp 2 --pp-schedule interleaved
expect_error pipeline_micro_batches_need_pp "--micro-batches is --pp's option" \
  "$BIN" train "${GPP[@]}" --workers 2 --micro-batches 4
expect_error pipeline_more_stages_than_layers "has 5 layers, fewer than the stages" \
  "$BIN" train "${GPP[@]}" --workers 8 --pp 8 --batch 8
expect_error pipeline_not_with_zero3 "--pp does not work with --zero 3: each stage would reduce-scatter" \
  "$BIN" train "${GPP[@]}" --workers 2 --pp 2 --zero 3

# a pipeline's plan: the trainer's split (the same stage line as train's; stage 0's activations
# 27.6 MB, 29.7 before the transformer block's backward kept one (B, T, 4D) buffer fewer), the
# bubble of equal stages (S-1)/(M+S-1) close to 10.8% at M = 8, 1f1b's activations below gpipe's; --layout auto
# ranks the layouts and --memory-per-worker leaves out those that do not fit; the mistakes
GPL=(--model gpt:layers=4,heads=4,dim=128,ctx=64 --workers 2 --batch 64)
pl=$("$BIN" plan "${GPL[@]}" --pp 2 --micro-batches 8 2>&1)
pg=$("$BIN" plan "${GPL[@]}" --pp 2 --micro-batches 8 --pp-schedule gpipe --json 2>&1)
la=$("$BIN" plan "${GPL[@]}" --layout auto --json 2>&1)
lf=$("$BIN" plan "${GPL[@]}" --layout auto --memory-per-worker 40M --json 2>&1)
if grep -q '^  stage 0 tok+pos\.\.blocks\.1: per micro-batch forward .* (activations 27\.[0-9]* MB)$' <<<"$pl" &&
   grep -q '^step .* (bubble 10\.[0-9]%, ' <<<"$pl" && grep -q '"stage_act_bytes": \[1\.1[0-9]*e+08, ' <<<"$pg" &&
   [[ $(grep -c '"kind": "plan_layout"' <<<"$la") -gt $(grep -c '"kind": "plan_layout"' <<<"$lf") ]] &&
   grep -q '"rank": 1, ' <<<"$lf" && ! grep -q '"pp": 1, ' <<<"$lf"; then
  ok plan_pipeline_and_layouts
else bad plan_pipeline_and_layouts "$pl" "$(head -3 <<<"$lf")"; fi
expect_error plan_pipeline_needs_model "--pp, --tp, --micro-batches and --layout need --model" "$BIN" plan --params 1e6 --pp 2
# tensor groups in the plan: --tp alone and with --pp, and --layout auto lists tp layouts
pt=$("$BIN" plan "${GPL[@]}" --tp 2 2>&1)
if grep -q '^pipeline 1 stage x 1 replica of 2-way tensor groups, 1 micro-batch of 64 samples' <<<"$pt" &&
   grep -q "the bottleneck stage's tensor all-reduces [0-9.]* ms a micro-batch" <<<"$pt" &&
   grep -q '"kind": "plan_layout", "rank": [0-9]*, "dp": 1, "pp": 1, "tp": 2, ' <<<"$la"; then
  ok plan_tensor_layouts
else bad plan_tensor_layouts "$pt" "$(grep '"tp": 2' <<<"$la" | head -2)"; fi
expect_error plan_tensor_divides "plan: --tp 4 does not divide --workers 2" "$BIN" plan "${GPL[@]}" --tp 4
expect_error plan_tensor_heads "plan: --tp 2: layer blocks.0 has 3 heads, not a multiple of 2" \
  "$BIN" plan --model gpt:layers=2,heads=3,dim=24,ctx=8 --workers 2 --tp 2
expect_error plan_pipeline_stages_divide "3 stages for 2 workers" "$BIN" plan "${GPL[@]}" --pp 3
expect_error plan_layout_nothing_fits "no layout of 2 workers fits" "$BIN" plan "${GPL[@]}" --layout auto --memory-per-worker 1K
# the planned schedule drawn: plot reads plan --pp --json and writes pipeline.svg, one bar per
# micro-batch's forward and backward on each stage (2 x 2 x 4 = 16) besides the frame, the
# background and the legend's two
"$BIN" plan "${GPL[@]}" --pp 2 --micro-batches 4 --json >"$T/ppl.jsonl" 2>&1
if "$BIN" plot --out "$T/ppl" "$T/ppl.jsonl" >"$T/ppl.log" 2>&1 && grep -q "wrote .*pipeline.svg" "$T/ppl.log" &&
   [[ $(grep -c '<rect x=' "$T/ppl/pipeline.svg") -eq $((16 + 3)) ]]; then
  ok plot_pipeline_schedule
else bad plot_pipeline_schedule "$(cat "$T/ppl.log")"; fi
expect_error plan_profile_at_needs_profile "--profile-at needs --profile of calibrate --model" \
  "$BIN" plan "${GPL[@]}" --layout auto --profile-at "$T/none.json"

# Tensor parallelism (issue 31, Q2): --tp 2 prints its layout and trains one worker's model to
# float rounding (the same validation loss to 3 decimals after 2 epochs, not the same bits: a split
# layer sums 2 partial products); its checkpoint is the plain one and resumes on one worker; the
# mistakes each give one line
GTP=(--model gpt:layers=2,heads=4,dim=16,ctx=8 "${GPTRUN[@]:2}" --epochs 2)
val_of() { sed -n 's/^done: .*val loss \([0-9.]*\).*/\1/p' "$1"; }
if "$BIN" train "${GTP[@]}" --workers 1 --out "$T/gtp1" >"$T/gtp1.log" 2>&1 &&
   "$BIN" train "${GTP[@]}" --workers 4 --tp 2 --out "$T/gtp2" >"$T/gtp2.log" 2>&1 &&
   grep -q '^tensor: 2-way groups x 2 replicas (job rank g: replica g / 2, tensor rank g mod 2): attention heads, MLP features and the vocabulary split 2 ways' "$T/gtp2.log" &&
   [[ -n $(val_of "$T/gtp1.log") ]] &&
   awk -v a="$(val_of "$T/gtp1.log")" -v b="$(val_of "$T/gtp2.log")" 'BEGIN {exit !(a - b < 0.001 && b - a < 0.001)}' &&
   "$BIN" train "${GTP[@]}" --workers 1 --resume "$T/gtp2/checkpoint.bin" --epochs 3 >"$T/gtpr.log" 2>&1 &&
   grep -q '^done: ' "$T/gtpr.log"; then
  ok gpt_tensor_parallel_matches_one_worker
else bad gpt_tensor_parallel_matches_one_worker "$(tail -2 "$T/gtp1.log")" "$(tail -3 "$T/gtp2.log")" "$(tail -2 "$T/gtpr.log")"; fi
expect_error tensor_divides_workers "--tp must divide --workers into tensor groups (got --tp 2 with 3 workers)" \
  "$BIN" train "${GTP[@]}" --workers 3 --tp 2
expect_error tensor_heads_divide "--tp 3: layer blocks.0 has 4 heads, not a multiple of 3" \
  "$BIN" train "${GTP[@]}" --workers 3 --tp 3
expect_error tensor_needs_a_transformer "--tp 2: model 'mlp' has no layer that splits" \
  "$BIN" train --model mlp --data "$DATA" --workers 2 --tp 2 --max-steps 1
expect_error tensor_not_deterministic "--tp does not work with --deterministic: a split layer's output sums 2" \
  "$BIN" train "${GTP[@]}" --workers 2 --tp 2 --deterministic
# dp x pp x tp = 1 x 2 x 2: both lines of the layout, the rank order, one worker's model too
if "$BIN" train "${GTP[@]}" --workers 4 --tp 2 --pp 2 --out "$T/gtp22" >"$T/gtp22.log" 2>&1 &&
   grep -q '^pipeline: 2 stages x 1 replica of 2-way tensor groups, 2 micro-batches, 1f1b: stage 0 ' "$T/gtp22.log" &&
   grep -q '^tensor: 2-way groups x 1 replica in each stage (job rank g: stage g / 2, replica (g mod 2) / 2, tensor rank g mod 2): ' "$T/gtp22.log" &&
   awk -v a="$(val_of "$T/gtp1.log")" -v b="$(val_of "$T/gtp22.log")" 'BEGIN {exit !(a - b < 0.001 && b - a < 0.001)}'; then
  ok gpt_pipeline_and_tensor_parallel
else bad gpt_pipeline_and_tensor_parallel "$(grep -E '^(pipeline|tensor|done)' "$T/gtp22.log")"; fi
expect_error tensor_pipeline_divide "--pp 2 x --tp 2 must divide --workers (got 2)" \
  "$BIN" train "${GTP[@]}" --workers 2 --tp 2 --pp 2
# --zero-unit-mb on the gpt: each block cut into its children's ranges (named on the layout
# line); --tp and --pp, which take no ZeRO 2 or 3, refuse it
if "$BIN" train --model gpt:layers=2,heads=4,dim=256,ctx=32 "${GPTRUN[@]:2}" --workers 2 --zero 3 --zero-unit-mb 0.5 \
     --max-steps 2 >"$T/gunit.log" 2>&1 &&
   grep -q '^zero unit: 0.5 MiB ranges; blocks.0 in 12 ranges, blocks.1 in 12 ranges$' "$T/gunit.log"; then
  ok gpt_zero_unit_blocks_in_parts
else bad gpt_zero_unit_blocks_in_parts "$(head -3 "$T/gunit.log")"; fi
expect_error tensor_zero_unit "--tp does not work with --zero-unit-mb yet" "$BIN" train "${GTP[@]}" --workers 2 --tp 2 \
  --zero-unit-mb 1
expect_error pipeline_zero_unit "--pp does not work with --zero-unit-mb yet" "$BIN" train "${GTP[@]}" --workers 2 --pp 2 \
  --zero-unit-mb 1
# ... and under mpirun: each process's 2 workers a tensor group, the 2 replicas across the
# processes, train the threads' --workers 4 --tp 2 model to the bit (each gradient element has one
# non-zero term per replica, and a + b is exact in either order); a process with fewer workers
# than --tp is told so
if command -v mpirun >/dev/null && "$BIN" --help | grep -q "mpi (built in)" && [[ $BIN != *-asan* && $BIN != *-tsan* ]]; then
  if timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${GTP[@]}" --workers 2 --tp 2 --out "$T/gtpm" >"$T/gtpm.log" 2>&1 &&
     grep -q '^tensor: 2-way groups x 2 replicas' "$T/gtpm.log" &&
     same_hash "$(hash_of "$T/gtp2/checkpoint.bin")" "$(hash_of "$T/gtpm/checkpoint.bin")"; then
    ok mpi_gpt_tensor_parallel_equals_threads
  else bad mpi_gpt_tensor_parallel_equals_threads "$(tail -3 "$T/gtpm.log")"; fi
  timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" train "${GTP[@]}" --workers 1 --tp 2 >"$T/gtpm1.log" 2>&1
  if grep -q "error: process [01]: --tp must divide each process's --workers (a group is threads of one process) into tensor groups (got --tp 2 with 1 worker)" "$T/gtpm1.log"; then
    ok mpi_tensor_group_within_a_process
  else bad mpi_tensor_group_within_a_process "$(tail -3 "$T/gtpm1.log")"; fi
elif [[ $BIN == *-asan* || $BIN == *-tsan* ]]; then
  echo "note: mpi_gpt_tensor_* not run on a sanitizer build (the plain build's cli run has them)"
else
  skip mpi_gpt_tensor_parallel_equals_threads "MPI not built into $BIN"
  skip mpi_tensor_group_within_a_process "MPI not built into $BIN"
fi
