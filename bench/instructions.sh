#!/usr/bin/env bash
# instructions.sh counts the instructions one benchmark op executes in each
# of several test binaries of package bench, under valgrind's cachegrind:
# a measure that, unlike ns/op, does not move with the machine's load.
# Each binary runs the benchmark with -benchtime Nx and 2Nx; the
# difference of the two totals, divided by N, is the instructions per op
# with the setup (job build, first run at N=1, teardown) cancelled out.
# GOMAXPROCS=1 keeps the scheduler's spinning out of the count.
#
#   bench/instructions.sh 'BenchmarkKeyed/p=1/checkpoint=off' 200000 /tmp/bench-old.test /tmp/bench-new.test
#
# Build a binary of a revision with:
#   git worktree add --detach /tmp/old REV && (cd /tmp/old && go test -c -o /tmp/bench-old.test ./bench)
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 BENCH_REGEX N TEST_BINARY..." >&2; exit 2
fi
bench=$1 n=$2; shift 2
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
irefs() { # binary, benchtime
  GOMAXPROCS=1 valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
    "$1" -test.run '^$' -test.bench "$bench" -test.benchtime "$2x" 2>&1 |
    sed -n 's/.*I *refs: *//p' | tr -d ,
}
for bin in "$@"; do
  a=$(irefs "$bin" "$n"); b=$(irefs "$bin" $((2 * n)))
  [ -n "$a" ] && [ -n "$b" ] || { echo "instructions.sh: no count from $bin (does $bench match a benchmark?)" >&2; exit 1; }
  echo "$bin $bench: $(( (b - a) / n )) instructions per op"
done
