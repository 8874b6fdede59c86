#!/usr/bin/env bash
# `make run`: run mcp-sandboxd in the foreground with a development config
# whose state lives in ./dev-state (the run dir and socket in /run). Builds the
# shell image on first use, and the python image in the background once the
# daemon is ready (so that the README's first run_code in Python works at
# once; other languages are built on their first use).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
state="$repo/dev-state"
run=/run/mcp-sandboxd-dev
cfg="$state/mcp-sandboxd.yaml"
mkdir -p "$state"

if [[ $EUID -ne 0 ]]; then
	echo "make run: mcp-sandboxd needs root (namespaces, cgroups, mounts)" >&2
	exit 1
fi

if [[ ! -e "$cfg" ]]; then
	cat >"$cfg" <<YAML
# Development configuration written by scripts/dev-run.sh; edit freely.
server:
  socket: $run/api.sock
  http_addr: 127.0.0.1:7070
  auth_token_file: $state/token
paths:
  state_dir: $state/state
  run_dir: $run
  recipes_dir: $repo/rootfs
  seccomp_dir: $repo/seccomp-profiles
  agent_path: $repo/bin/sandbox-agent
sandbox:
  cgroup_parent: /mcp-sandboxd-dev
log:
  level: info
  format: text
YAML
fi

bin/mcp-sandboxd config validate "$cfg" >/dev/null
echo "==> building the shell image if needed (first time: about a minute)"
bin/mcp-sandboxd images build --config "$cfg" shell

http=$(sed -n 's/^  http_addr: *//p' "$cfg")
sock=$(sed -n 's/^  socket: *//p' "$cfg")
cat <<MSG
==> starting mcp-sandboxd serve --config $cfg
    REST socket : $sock
    HTTP        : http://$http  (MCP at /mcp, /healthz, /readyz, /metrics)
    token       : $state/token (created on first start)
    try         : bin/sandboxctl --socket $sock exec \$(bin/sandboxctl --socket $sock create --lang shell) -- uname -a
    web editor  : a one-time login URL follows once the daemon answers (more: bin/sandboxctl --socket $sock ui)
MSG
bin/mcp-sandboxd serve --config "$cfg" &
daemon=$!
# Prebuild python through the daemon once it answers; a run_code that comes
# first waits for this same build (the image store locks per image).
(
	for _ in $(seq 1 600); do
		bin/sandboxctl --socket "$sock" health >/dev/null 2>&1 && break
		sleep 0.2
	done
	if bin/sandboxctl --socket "$sock" images build python >"$state/prebuild-python.log" 2>&1; then
		echo "==> python image ready"
	else
		echo "==> prebuilding python failed (see $state/prebuild-python.log); it is built on first use"
	fi
) &
# Ctrl-C or SIGTERM reach the daemon, which drains and exits; we wait for it.
trap 'kill -TERM $daemon 2>/dev/null' INT TERM
for _ in $(seq 1 600); do
	if url=$(bin/sandboxctl --socket "$sock" ui 2>/dev/null); then
		echo "==> web editor: $url"
		break
	fi
	kill -0 $daemon 2>/dev/null || break
	sleep 0.1
done
status=0
wait $daemon || status=$?
# A trapped signal interrupts wait: wait again for the daemon's own exit.
if kill -0 $daemon 2>/dev/null; then
	status=0
	wait $daemon || status=$?
fi
exit $status
