# Toward elastic training (issue 33; sourced by tests/cli.sh: its helpers, BIN, DATA, T, SMALL):
# --ckpt-every-steps writes in the background and keeps the latest two checkpoints, the one
# before resumes, --overwrite removes both; simulate and plan price failures.

# --- E2: background checkpoints -------------------------------------------------------
"$BIN" train --model mlp --workers 2 --max-steps 12 --ckpt-every-steps 5 "${SMALL[@]}" --out "$T/bg" >"$T/bg.log" 2>&1
"$BIN" train --model mlp --workers 2 --max-steps 12 --ckpt-every-steps 5 --ckpt-sync "${SMALL[@]}" --out "$T/fg" \
  >"$T/fg.log" 2>&1
# the final checkpoint (step 12) and the one before it (step 10, from the background writer)
if [[ $(step_of "$T/bg/checkpoint.bin") == 12 && $(step_of "$T/bg/checkpoint.prev.bin") == 10 ]] &&
   grep -q "^checkpoints in the background: 2, per checkpoint: the step paid .* ms" "$T/bg.log" &&
   grep -q "^checkpoint $T/bg/checkpoint.bin (step 10)" "$T/bg.log"; then ok ckpt_background_keeps_two
else bad ckpt_background_keeps_two "$(ls "$T/bg")" "$(tail -4 "$T/bg.log")"; fi
# the background writer's step-10 file is the step's own, byte for byte
if cmp -s "$T/bg/checkpoint.prev.bin" "$T/fg/checkpoint.prev.bin" && ! grep -q "in the background" "$T/fg.log"; then
  ok ckpt_background_same_bytes_as_sync
else bad ckpt_background_same_bytes_as_sync "$(cmp "$T/bg/checkpoint.prev.bin" "$T/fg/checkpoint.prev.bin" 2>&1)"; fi
# the one before resumes in its folder (metrics cut back to step 10) to the same end
if "$BIN" train --resume "$T/bg/checkpoint.prev.bin" --out "$T/bg" --workers 2 --max-steps 12 "${SMALL[@]}" \
     >"$T/bgr.log" 2>&1 && same_hash "$(hash_of "$T/bg/checkpoint.bin")" "$(hash_of "$T/fg/checkpoint.bin")" &&
   [[ $(steps_of "$T/bg/metrics.jsonl" | tr '\n' ' ') == "$(seq -s ' ' 1 12) " ]]; then ok ckpt_prev_resumes
else bad ckpt_prev_resumes "$(tail -3 "$T/bgr.log")" "$(steps_of "$T/bg/metrics.jsonl" | tr '\n' ' ')"; fi
if "$BIN" train --model mlp --max-steps 2 "${SMALL[@]}" --out "$T/bg" --overwrite >/dev/null 2>&1 &&
   [[ ! -e $T/bg/checkpoint.prev.bin && $(step_of "$T/bg/checkpoint.bin") == 2 ]]; then ok ckpt_overwrite_removes_prev
else bad ckpt_overwrite_removes_prev "$(ls "$T/bg")"; fi

# --- E5: failures in simulate and plan -----------------------------------------------
# 100 workers of 1 s steps, job MTBF 1000 s, C = 10 s: Young-Daly's sqrt(2 x 10 x 1000) = 141 steps
if "$BIN" simulate --workers 100 --steps 5 --compute-ms 1000 --mtbf-hours 27.777778 --snapshot-ms 10000 \
     --recovery-s 30 --job-steps 20000 >"$T/fs.log" 2>&1 &&
   grep -q "^failures: worker MTBF 27.7778 h, job MTBF 1000 s at 100 workers" "$T/fs.log" &&
   grep -q "^snapshot every 141 steps (Young-Daly" "$T/fs.log" &&
   grep -q "^goodput 0\.8[0-9]* (Daly's formula: 0\.8[0-9]*)" "$T/fs.log"; then ok simulate_failures
else bad simulate_failures "$(cat "$T/fs.log")"; fi
if "$BIN" simulate --workers 100 --steps 5 --compute-ms 1000 --mtbf-hours 27.777778 --snapshot-ms 10000 --json |
   python3 -c 'import json, sys; o = json.load(sys.stdin); assert o["fail_every"] == 141 and 0 < o["fail_goodput"] < 1' \
   2>"$T/fj.err"; then ok simulate_failures_json
else bad simulate_failures_json "$(cat "$T/fj.err")"; fi
if "$BIN" plan --params 1e8 --workers 64 --mtbf-hours 10000 --snapshot-ms 500 --recovery-s 120 >"$T/fp.log" 2>&1 &&
   grep -q "^recommended: --ckpt-every-steps [0-9]* (Young-Daly" "$T/fp.log" &&
   grep -q "^simulated: 0\.99[0-9]* at every [0-9]* steps (recommended); the sweep's best" "$T/fp.log" &&
   [[ $(grep -c '  <-$' "$T/fp.log") -eq 1 ]]; then ok plan_failures_recommends
else bad plan_failures_recommends "$(tail -12 "$T/fp.log")"; fi
expect_error failures_need_mtbf "failures: give --mtbf-hours H" "$BIN" simulate --snapshot-every 10
expect_error failures_bad_mtbf "--mtbf-hours: '0' is not a number in" "$BIN" simulate --mtbf-hours 0
expect_error failures_never_finish "it would never finish" \
  "$BIN" simulate --workers 1000 --compute-ms 1000 --mtbf-hours 1 --snapshot-every 0 --job-steps 100000
expect_error failures_plan_not_with_sweep "--sweep and the failure options exclude each other" \
  "$BIN" plan --params 1e8 --workers 8 --sweep 64 --mtbf-hours 1000
