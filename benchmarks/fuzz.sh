#!/bin/sh
# benchmarks/fuzz.sh [SECONDS]: runs every fuzz target (tests/fuzz/, the
# "Fuzzing" section of docs/robustness.md) for SECONDS each (default 60),
# one after another, from its committed seed corpus, and prints per target
# the executions, libFuzzer's coverage (cov: edges, ft: features), the
# corpus it grew to and its findings.
#
# The libFuzzer targets (C, ASan+UBSan) are built by tests/fuzz/Makefile;
# the atheris ones run on uffdkvm's _core built under ASan+UBSan with
# coverage (make atheris-asan), with PYTHONMALLOC=malloc_debug. The targets
# are the Makefile's lists (make list, make list-atheris): a new target
# added there is run here too.
#
# A finding (crash-*, leak-*, timeout-*, oom-*) is copied to
# $FUZZ_FINDINGS (default ./fuzz-findings), one folder per target, and the
# script exits 1; libFuzzer stops a target at its first. Run it by hand; the
# machine is shared, so at low priority:
#
#   nice -n 10 benchmarks/fuzz.sh 300
#
#   PYTHON=...          the interpreter whose atheris and setuptools build and
#                       run the atheris targets (default python3)
#   FUZZ_JOBS=N         targets run N at a time (default 1)
set -eu
seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz="$root/tests/fuzz"
python=${PYTHON:-python3}
findings=${FUZZ_FINDINGS:-$PWD/fuzz-findings}
work=$(mktemp -d "${TMPDIR:-/tmp}/uffdkvm-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
build="$work/build"

make -s -C "$fuzz" BUILD="$build" PYTHON="$python" all atheris-asan >"$work/make.log" 2>&1 || {
	cat "$work/make.log"
	exit 2
}
# Every target the Makefile lists: a new one joins this run, and
# tests/project/test_fuzz.py, by being added to TARGETS (or ATHERIS) there.
c_targets=$(make -s -C "$fuzz" list)
py_targets=$(make -s -C "$fuzz" list-atheris)
asan_env=$(make -s -C "$fuzz" BUILD="$build" PYTHON="$python" asan-env)

# $1: target; the rest: the command. Runs it in the target's own folder.
run() {
	t=$1
	shift
	mkdir -p "$work/$t/corpus"
	# TMPDIR: what a target makes (a socket, files) goes with the work folder.
	(cd "$work/$t" && TMPDIR="$work/$t" "$@" -max_total_time="$seconds" -timeout=30 \
		-rss_limit_mb=2048 -print_final_stats=1 corpus "$fuzz/corpus/$t" \
		>"$work/$t/log" 2>&1) || true
}

started=$(date +%s)
jobs=${FUZZ_JOBS:-1}
n=0
for t in $c_targets; do
	run "$t" "$build/$t" &
	n=$((n + 1))
	[ $((n % jobs)) -ne 0 ] || wait
done
for t in $py_targets; do
	# shellcheck disable=SC2086 # one VAR=value a word
	run "$t" env $asan_env "$python" -S "$fuzz/$t.py" &
	n=$((n + 1))
	[ $((n % jobs)) -ne 0 ] || wait
done
wait

status=0
printf '%-16s %8s %12s %8s %8s %8s  %s\n' target seconds executions cov ft corpus findings
for t in $c_targets $py_targets; do
	log="$work/$t/log"
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	line=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
	cov=$(echo "$line" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
	ft=$(echo "$line" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
	corp=$(echo "$line" | sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p')
	found=$(cd "$work/$t" && ls -d crash-* leak-* timeout-* oom-* 2>/dev/null || true)
	if [ -n "$found" ]; then
		status=1
		mkdir -p "$findings/$t"
		(cd "$work/$t" && cp $found log "$findings/$t/")
		found="$(echo $found | wc -w) in $findings/$t"
	elif ! grep -q '^Done [0-9]* runs' "$log"; then
		status=1
		mkdir -p "$findings/$t"
		cp "$log" "$findings/$t/"
		found="did not finish: $findings/$t/log"
	else
		found=0
	fi
	printf '%-16s %8s %12s %8s %8s %8s  %s\n' "$t" "$seconds" "${execs:-?}" "${cov:-?}" \
		"${ft:-?}" "${corp:-?}" "$found"
done
echo "($(($(date +%s) - started)) s in all, $(nproc) CPUs, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ))"
exit $status
