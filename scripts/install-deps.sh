#!/usr/bin/env bash
# Installs what building, running and testing mcp-sandboxd needs on Debian.
# Idempotent: packages already present are not touched, so a second run is a
# few dpkg queries and `go mod download` from the module cache.
set -euo pipefail

# Debian packages, each for a reason:
#   libseccomp-dev pkg-config  cgo build of libcontainer's seccomp support (-tags seccomp)
#   mmdebstrap                 builds the language root filesystems from Debian packages
#   runc                       baseline for the lifecycle benchmark (never used by the daemon)
#   iproute2 tmux              integration tests: network namespaces, a real terminal for PTY tests
#   ca-certificates            HTTPS for apt inside image builds
#   systemd                    systemd-analyze verify of the unit in the tests
#   e2fsprogs                  mkfs.ext4 formats the templates of disk-backed sandboxes (pkg/storage)
packages=(libseccomp-dev pkg-config mmdebstrap runc iproute2 tmux ca-certificates systemd e2fsprogs)
# The MCP black-box tests drive the server with the official TypeScript SDK:
# Node.js from Debian unless a node is already on PATH.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

if ((${#missing[@]})); then
	if [[ $EUID -ne 0 ]]; then
		echo "install-deps: missing packages ${missing[*]}; run as root" >&2
		exit 1
	fi
	echo "install-deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cd "$(dirname "$0")/.."
go mod download

# The MCP TypeScript SDK for the black-box tests (pinned by test/mcp/package-lock.json).
if [[ ! -e test/mcp/node_modules/@modelcontextprotocol/sdk/package.json || test/mcp/package-lock.json -nt test/mcp/node_modules/.package-lock.json ]]; then
	(cd test/mcp && npm ci --no-audit --no-fund --loglevel=error)
fi
