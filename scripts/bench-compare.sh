#!/usr/bin/env bash
# Compares the engine's lifecycle and run_code benchmarks of a base revision
# with the working tree, in one run: both test binaries are built first, then
# run alternately (ROUNDS rounds each, BENCHTIME iterations a round), so that
# the machine's load falls on both alike. Prints the median of each metric's
# per-round medians and the ratio working tree / base.
#
#   [ROUNDS=3 BENCHTIME=20x BENCH=regexp] scripts/bench-compare.sh [BASE_REV]   (default: HEAD~1)
set -euo pipefail
base=${1:-HEAD~1}
rounds=${ROUNDS:-3}
benchtime=${BENCHTIME:-20x}
bench=${BENCH:-.} # a -test.bench pattern: e.g. the benchmarks both revisions have
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/bench-compare.XXXXXX)
trap 'git -C "$top" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

build() { # tree out
	(cd "$1" && CGO_ENABLED=1 go build -trimpath -tags netgo,osusergo -o "$2/sandbox-agent" ./cmd/sandbox-agent &&
		# sandbox-init (beside the agent) where the revision has it
		{ [ ! -d cmd/sandbox-init ] || CGO_ENABLED=1 go build -tags seccomp -trimpath -o "$2/sandbox-init" ./cmd/sandbox-init; } &&
		CGO_ENABLED=1 go test -c -tags seccomp -o "$2/engine.test" ./pkg/engine/)
}
git -C "$top" worktree add --detach "$work/base" "$base" >/dev/null
mkdir -p "$work/bin-base" "$work/bin-head"
build "$work/base" "$work/bin-base"
build "$top" "$work/bin-head"

for ((r = 1; r <= rounds; r++)); do
	for side in base head; do
		(cd "$top/pkg/engine" && SANDBOXD_AGENT="$work/bin-$side/sandbox-agent" \
			"$work/bin-$side/engine.test" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" -test.count 1) \
			| awk -v side="$side" '/^Benchmark/ { for (i = 3; i < NF; i += 2) print side, $1, $(i+1), $i }' >>"$work/results"
	done
done

awk '
{ key = $2 " " $3; v[$1, key, ++n[$1, key]] = $4; keys[key] = 1 }
function med(side, key,   m, i, j, t, a) {
	m = n[side, key]; if (m == 0) return "";
	for (i = 1; i <= m; i++) a[i] = v[side, key, i];
	for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
END {
	for (k in keys) {
		split(k, p, " "); b = med("base", k); h = med("head", k)
		if (p[2] == "ns/op") continue
		printf "%-44s %-20s %10.2f %10.2f %8s\n", p[1], p[2], b, h, (b > 0 ? sprintf("%.3f", h / b) : "-")
	}
}' "$work/results" | sort >"$work/table"
printf "%-44s %-20s %10s %10s %8s\n" benchmark metric base head head/base
cat "$work/table"
