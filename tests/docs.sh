#!/usr/bin/env bash
# The docs say what the code does, and stand alone.  Checks:
#   1. nothing in the repository cites a design file outside it (../shared, DESIGN.md, STYLE.md);
#   2. docs/ddp.md does not say the MPI backend "comes later" (it exists);
#   3. MPICH is never claimed: a line naming it says it is not supported (the build is Open MPI's);
#   4. every raw-output file cited in docs/ exists under bench/results/;
#   5. every section of docs/results.md with a figure, and every paragraph of docs/ddp.md with a
#      figure, names the raw file under bench/results/ that the figure comes from.
# Closes with "N passed, N failed, 0 skipped".
#   bash tests/docs.sh [ROOT]
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT" || exit 1
pass=0 fail=0
ok() { echo "ok   docs: $1"; pass=$((pass + 1)); }
bad() { echo "FAIL docs: $1"; fail=$((fail + 1)); }

hits=$(grep -rnE '\.\./shared|DESIGN\.md|STYLE\.md' README.md Makefile docs include src tools tests bench scripts \
    --exclude-dir=results --exclude=docs.sh 2>/dev/null)
if [[ -z $hits ]]; then ok "no reference to a design file outside the repository"
else bad "references outside the repository:"; echo "$hits" | sed 's/^/    /'; fi

hits=$(grep -niE 'comes later|will come later' docs/ddp.md)
if [[ -z $hits ]]; then ok "docs/ddp.md does not promise the MPI backend for later"
else bad "docs/ddp.md says something comes later:"; echo "$hits" | sed 's/^/    /'; fi

hits=$(grep -rniE 'mpich' README.md docs | grep -viE 'not supported|is not Open MPI')
if [[ -z $hits ]]; then ok "MPICH is not claimed"
else bad "MPICH claimed without saying it is unsupported:"; echo "$hits" | sed 's/^/    /'; fi

out=$(python3 - <<'EOF'
import os, re, sys
res = sorted(os.listdir("bench/results"))
# full names (scaling-2026-11-30-073536.md, or a directory of raw logs) and the short form
# "-093630.md" that a table uses for a second file of the same script
FULL = re.compile(r"\b([a-z][a-z_-]*-20\d\d-\d\d-\d\d-\d{6}(?:\.(?:md|tsv|txt))?)")
SHORT = re.compile(r"`-(\d{6}(?:\.(?:md|tsv|txt))?)`")
FIG = re.compile(r"\d(?:[\d ,.]*\d)?\s?(?:ms\b|%|GB/s|MB/s|Gbit/s|samples/s|×)")
problems = []
def cites(text):
    return FULL.search(text) or SHORT.search(text)
for fn in sorted(os.listdir("docs")):
    if not fn.endswith(".md"):
        continue
    text = open(os.path.join("docs", fn)).read()
    for m in FULL.finditer(text):
        if m.group(1) not in res:
            problems.append(f"missing-raw docs/{fn}: {m.group(1)} not in bench/results/")
    for m in SHORT.finditer(text):
        if not any(r.endswith("-" + m.group(1)) for r in res):
            problems.append(f"missing-raw docs/{fn}: -{m.group(1)} matches no file in bench/results/")
# results.md: per section (## / ###); a section holds a figure if a table row or a sentence has one
text = open("docs/results.md").read()
sections = re.split(r"\n(?=#{2,3} )", text)
for s in sections[1:]:
    title = s.splitlines()[0]
    if FIG.search(s) and not cites(s):
        problems.append(f"uncited docs/results.md: section '{title}' has figures but names no raw file")
# ddp.md: per paragraph
for para in re.split(r"\n\s*\n", open("docs/ddp.md").read()):
    if FIG.search(para) and not cites(para):
        first = para.strip().splitlines()[0][:70]
        problems.append(f"uncited docs/ddp.md: paragraph '{first}...' has figures but names no raw file")
print("\n".join(problems))
EOF
)
if grep -q '^missing-raw' <<<"$out"; then bad "cited raw files exist:"; grep '^missing-raw' <<<"$out" | sed 's/^missing-raw /    /'
else ok "every raw file cited in docs/ exists in bench/results/"; fi
if grep -q '^uncited' <<<"$out"; then bad "figures name their raw file:"; grep '^uncited' <<<"$out" | sed 's/^uncited /    /'
else ok "every figure in docs/results.md and docs/ddp.md names its raw file"; fi

echo "docs: $pass passed, $fail failed, 0 skipped"
[[ $fail -eq 0 ]]
