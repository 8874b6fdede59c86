#!/usr/bin/env bash
# make bench: runs the benchmarks behind issue 24's figures — the engine's
# lifecycle next to `runc run`/`runc exec` of the same bundle (and `podman
# run --rootfs` when podman is installed), run_code next to a chroot, MCP
# over HTTP next to the engine, the REST lifecycle, the cost of tracing on
# an exec (issue 27: two daemons, OTLP export on and off) and the density and
# throughput of BENCH_N idle sandboxes on a real daemon — and prints them as
# one table with their baselines (measured in the same run), ratios and
# targets. Raw `go test -bench` output and the table go to test-output/.
#
#   [BENCH_N=50 BENCHTIME=20x] scripts/bench-table.sh
#   TABLE_ONLY=1 scripts/bench-table.sh      # the table of the last run again
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
n=${BENCH_N:-50}
benchtime=${BENCHTIME:-20x}
out="$top/test-output"
mkdir -p "$out"
raw="$out/bench-raw.txt"
export SANDBOXD_AGENT="$top/bin/sandbox-agent" SANDBOXD_BIN_DIR="$top/bin" CGO_ENABLED=1

bench() { # package pattern benchtime [env...]
	local pkg=$1 pat=$2 bt=$3
	shift 3
	(cd "$top" && env "$@" go test -tags seccomp -run '^$' -bench "$pat" -benchtime "$bt" -count=1 "$pkg") | tee -a "$raw"
}
# TABLE_ONLY=1 prints the table of the last run's raw output again.
if [[ "${TABLE_ONLY:-}" != 1 ]]; then
	: >"$raw"
	bench ./pkg/engine/ 'SandboxLifecycle$|RunCodePython$|RunCodePythonWarmPool$' "$benchtime"
	bench ./test/mcp/ 'RunCode$' "$benchtime"
	bench ./test/e2e/ 'RESTLifecycle$' "$benchtime"
	# Tracing's cost: exec on a daemon exporting every span to an OTLP
	# receiver next to one with telemetry off (issue 27).
	bench ./test/e2e/ 'ExecTracing$' "${TRACING_BENCHTIME:-200x}"
	bench ./test/e2e/ 'Density$' 1x SANDBOXD_BENCH_N="$n"
fi

# "Benchmark<Name>[/sub]-<procs> <N> <value> <unit> ..." → "<Name> <unit> <value>"
awk '/^Benchmark/ { name = $1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name);
	for (i = 3; i < NF; i += 2) print name, $(i+1), $i }' "$raw" >"$out/bench-metrics.txt"

awk -v n="$n" '
{ v[$1 " " $2] = $3 }
function g(k) { return (k in v) ? v[k] : "" }
function row(fig, ours, base, bname, target,   r) {
	r = (ours != "" && base != "" && base > 0) ? sprintf("%.2f×", ours / base) : "—"
	printf "| %-52s | %10s | %-28s | %7s | %-22s |\n", fig, (ours == "" ? "—" : sprintf("%.2f", ours)), (base == "" ? "—" : sprintf("%s %.2f", bname, base)), r, target
}
END {
	printf "| %-52s | %10s | %-28s | %7s | %-22s |\n", "figure (medians, ms unless said)", "ours", "baseline, same run", "ratio", "target"
	printf "|%s|%s|%s|%s|%s|\n", "------------------------------------------------------", "------------", "------------------------------", "---------", "------------------------"
	runc = g("SandboxLifecycle runc-run-ms")
	row("create → ready, engine", g("SandboxLifecycle create-ms"), "", "", "≤ 15")
	row("create → ready, REST", g("RESTLifecycle rest-create-ms"), runc, "runc run", "≤ 20")
	row("create + exec true + terminate, engine", g("SandboxLifecycle create-ms") + g("SandboxLifecycle exec-ms") + g("SandboxLifecycle terminate-ms"), runc, "runc run", "≤ 1.0× runc run")
	row("create + exec true + terminate, REST", g("RESTLifecycle rest-lifecycle-ms"), runc, "runc run", "≤ 1.0× runc run")
	if (g("SandboxLifecycle podman-run-ms") != "")
		row("create + exec true + terminate, REST", g("RESTLifecycle rest-lifecycle-ms"), g("SandboxLifecycle podman-run-ms"), "podman run --rootfs", "—")
	row("exec true, engine", g("SandboxLifecycle exec-ms"), g("SandboxLifecycle runc-exec-ms"), "runc exec", "≤ 2")
	row("exec true, REST", g("RESTLifecycle rest-exec-ms"), g("SandboxLifecycle runc-exec-ms"), "runc exec", "≤ 2")
	row("exec true, REST, tracing on (OTLP, every span)", g("ExecTracing exec-on-ms"), g("ExecTracing exec-off-ms"), "tracing off", "≤ off + 0.2 ms")
	row("what tracing adds to an exec (ms)", g("ExecTracing tracing-ms"), "", "", "≤ 0.2")
	row("terminate, engine", g("SandboxLifecycle terminate-ms"), "", "", "≤ 4")
	row("terminate, REST", g("RESTLifecycle rest-terminate-ms"), "", "", "≤ 4")
	# What REST adds, against an engine in the process of the REST benchmark,
	# calls alternated (the engine rows above come from another run, minutes
	# earlier: the load of the host between the two moves them more than REST).
	row("create → ready, REST, vs the engine in its run", g("RESTLifecycle rest-create-ms"), g("RESTLifecycle engine-create-ms"), "engine, same run", "—")
	row("exec true, REST, vs the engine in its run", g("RESTLifecycle rest-exec-ms"), g("RESTLifecycle engine-exec-ms"), "engine, same run", "—")
	row("terminate, REST, vs the engine in its run", g("RESTLifecycle rest-terminate-ms"), g("RESTLifecycle engine-terminate-ms"), "engine, same run", "—")
	row("run_code Python print(1), fresh sandbox", g("RunCodePython run_code-ms"), g("RunCodePython chroot-ms"), "chroot", "≤ 2.0× chroot")
	row("run_code Python print(1), warm pool", g("RunCodePythonWarmPool run_code-ms"), g("RunCodePythonWarmPool chroot-ms"), "chroot", "≤ 1.2× chroot")
	row("run_code through MCP over HTTP", g("RunCode/mcp_http ns/op") / 1e6, g("RunCode/engine ns/op") / 1e6, "engine", "≤ 1.1× engine")
	row(sprintf("creates/s, 8 clients, up to %d live", g("Density sandboxes")), g("Density creates/s"), "", "", "≥ 50")
	row(sprintf("terminates/s, 8 clients, from %d live", g("Density sandboxes")), g("Density terminates/s"), "", "", "≥ 100")
	row(sprintf("host memory per idle sandbox, %d live (MiB)", g("Density sandboxes")), g("Density MiB/sandbox"), "", "", "≤ 1.5")
	row(sprintf("cgroup memory of the sandboxes, per idle sandbox, %d live (MiB)", g("Density sandboxes")), g("Density cgroup-MiB/sandbox"), "", "", "(floor of the above)")
	row(sprintf("daemon RSS with %d live (MiB)", g("Density sandboxes")), g("Density rss-live-MiB"), g("Density rss-start-MiB"), "at start", sprintf("≤ %.0f (64 + 32 KiB each)", 64 + g("Density sandboxes") / 32))
	row("daemon RSS per live sandbox (KiB)", g("Density rss-KiB/sandbox"), "", "", "≤ 32")
	row("  of it anonymous (KiB; heap in use, stacks)", g("Density anon-KiB/sandbox"), "", "", "(heap " g("Density heap-inuse-KiB/sandbox") ", stacks " g("Density stack-KiB/sandbox") ")")
	row("  daemon goroutines per live sandbox", g("Density goroutines/sandbox"), "", "", "—")
	row("daemon RSS after all ended (MiB)", g("Density rss-end-MiB"), g("Density rss-start-MiB"), "at start", "near its start")
}' "$out/bench-metrics.txt" | tee "$out/bench-table.md"
