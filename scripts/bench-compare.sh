#!/usr/bin/env bash
# Compares the engine's lifecycle and run_code benchmarks of a base revision
# with the working tree, in one run: both test binaries are built first, then
# run alternately (ROUNDS rounds each, BENCHTIME iterations a round), so that
# the machine's load falls on both alike (in alternating order). Prints the median of each metric's
# per-round medians and the ratio working tree / base.
#
#   [ROUNDS=3 BENCHTIME=20x BENCH=regexp PKGS="./pkg/engine/ ./test/mcp/" BENCH_LOCK=/tmp/x.lock] scripts/bench-compare.sh [BASE_REV]   (default: HEAD~1)
#
# PKGS are the packages whose benchmarks run (default: the engine's); each
# runs BENCH. Packages other than pkg/engine start real daemons (test/e2e's
# RESTLifecycle, test/mcp's RunCode): each side then also gets its own
# mcp-sandboxd and sandboxctl (SANDBOXD_BIN_DIR), so that both run the
# daemon of their own revision.
set -euo pipefail
base=${1:-HEAD~1}
rounds=${ROUNDS:-3}
benchtime=${BENCHTIME:-20x}
bench=${BENCH:-.} # a -test.bench pattern: e.g. the benchmarks both revisions have
pkgs=${PKGS:-./pkg/engine/}
# BENCH_LOCK: a lock file (flock) each round's runs hold, not the builds, so
# that benchmarks never overlap other integration tests on a shared host.
lock=${BENCH_LOCK:-}
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/bench-compare.XXXXXX)
trap 'git -C "$top" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

testbin() { # package → the name of its test binary
	local p=${1#./}
	p=${p%/}
	echo "${p//\//_}.test"
}
build() { # tree out
	# The agent as that side's Makefile builds it (AGENT_GOEXPERIMENT).
	local agentexp
	agentexp=$(sed -n 's/^AGENT_GOEXPERIMENT *:*= *//p' "$1/Makefile")
	(cd "$1" && CGO_ENABLED=1 GOEXPERIMENT=$agentexp go build -trimpath -tags netgo,osusergo -o "$2/sandbox-agent" ./cmd/sandbox-agent &&
		# sandbox-init (beside the agent) where the revision has it
		{ [ ! -d cmd/sandbox-init ] || CGO_ENABLED=1 go build -tags seccomp -trimpath -o "$2/sandbox-init" ./cmd/sandbox-init; }) || return
	local p
	for p in $pkgs; do
		(cd "$1" && CGO_ENABLED=1 go test -c -tags seccomp -o "$2/$(testbin "$p")" "$p") || return
		if [[ $p != ./pkg/engine/ && ! -e $2/mcp-sandboxd ]]; then
			(cd "$1" && CGO_ENABLED=1 go build -tags seccomp -o "$2/mcp-sandboxd" ./cmd/mcp-sandboxd &&
				CGO_ENABLED=0 go build -o "$2/sandboxctl" ./cmd/sandboxctl) || return
		fi
	done
}
git -C "$top" worktree add --detach "$work/base" "$base" >/dev/null
# What git does not hold: the MCP test client's packages (the test binary
# runs node in its own tree) and the web bundle the daemon embeds.
for d in test/mcp/node_modules; do
	[[ -e $top/$d ]] && ln -s "$top/$d" "$work/base/$d"
done
cp -r "$top/pkg/webui/dist/." "$work/base/pkg/webui/dist/"
mkdir -p "$work/bin-base" "$work/bin-head"
build "$work/base" "$work/bin-base"
build "$top" "$work/bin-head"

round() { # r
	local side p order="base head"
	# Odd rounds run base first, even rounds head first: whatever one run
	# leaves to the next (a daemon's teardown, cold caches) falls on both.
	((${1} % 2 == 0)) && order="head base"
	for side in $order; do
		for p in $pkgs; do
			# A test binary runs in its package's directory, as go test runs it.
			(cd "$top/$p" && SANDBOXD_AGENT="$work/bin-$side/sandbox-agent" SANDBOXD_BIN_DIR="$work/bin-$side" \
				"$work/bin-$side/$(testbin "$p")" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" -test.count 1) \
				| awk -v side="$side" '/^Benchmark/ { for (i = 3; i < NF; i += 2) print side, $1, $(i+1), $i }' >>"$work/results"
		done
	done
}
for ((r = 1; r <= rounds; r++)); do
	if [[ -n $lock ]]; then
		(flock 9 && round "$r") 9>"$lock"
	else
		round "$r"
	fi
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
		if (p[2] == "ns/op") { # shown in ms; 0 when a benchmark reports its medians instead
			if (b == 0 && h == 0) continue
			p[2] = "ms/op"; b /= 1e6; h /= 1e6
		}
		printf "%-44s %-20s %10.2f %10.2f %8s\n", p[1], p[2], b, h, (b > 0 ? sprintf("%.3f", h / b) : "-")
	}
}' "$work/results" | sort >"$work/table"
# RESULTS=file keeps every round's figures ("side benchmark metric value").
[[ -n ${RESULTS:-} ]] && cp "$work/results" "$RESULTS"
printf "%-44s %-20s %10s %10s %8s\n" benchmark metric base head head/base
cat "$work/table"
