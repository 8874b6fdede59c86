#!/usr/bin/env bash
# Installs what building, running and testing mcp-sandboxd needs on Debian.
# Idempotent: packages already present are not touched, so a second run is a
# few dpkg queries and `go mod download` from the module cache.
set -euo pipefail

# Debian packages, each for a reason:
#   libseccomp-dev pkg-config  cgo build of libcontainer's seccomp support (-tags seccomp)
#   libc6-dev                  glibc's libc.a: the agent is linked statically with cgo (its C
#                              job-exec helper, pkg/agent/server/jobexec.c); gcc only recommends it
#   mmdebstrap                 builds the language root filesystems from Debian packages
#   runc                       baseline for the lifecycle benchmark (never used by the daemon)
#   iproute2 tmux              integration tests: network namespaces, a real terminal for PTY tests
#   ca-certificates            HTTPS for apt inside image builds
#   systemd                    systemd-analyze verify of the unit in the tests
#   chromium                   the web editor's browser tests (pkg/webui/browsertest, chromedp)
#   qemu-system-x86 qemu-utils the VM backend (pkg/vm): QEMU and qemu-img for overlays
#   ovmf swtpm                 UEFI firmware and the TPM 2.0 emulator of the Windows profile
#                              (tested by booting the Linux guest with them)
#   git                        the cargo registry index the network install test serves (a bare
#                              repository over git's dumb HTTP protocol, pkg/engine)
#   apt-utils gnupg            the Debian mirror root-mode apt-get installs from in the adversarial
#                              suite: apt-ftparchive makes its indexes and Release, gpg signs it
#                              (testenv.NewAptRepository)
#   e2fsprogs                  mkfs.ext4: the Linux guest's root disk (-d, no loop mount) and the
#                              templates of disk-backed sandboxes (pkg/storage)
#   grub-efi-amd64-bin grub-common mtools dosfstools fdisk
#                              the UEFI boot disk made from the Linux guest (pkg/vm MakeBootDisk:
#                              a stock image that boots by itself): grub-mkstandalone with the
#                              x86_64-efi modules, the FAT EFI partition made and filled on an
#                              image file (mkfs.vfat, mcopy -i), the GPT written by sfdisk
#   openssh-client rsync       the SSH endpoint's tests drive it with the real ssh, scp, sftp
#                              and rsync (pkg/sshd)
#   postgresql                 the fleet's shared store (pkg/store/pgstore): tests start a private
#                              cluster with its initdb and pg_ctl as an unprivileged user on a unix
#                              socket in a temp dir (testenv.Postgres); the package's own cluster
#                              and service are never used
#   prometheus                 its promtool checks and unit-tests the alert rules of
#                              deploy/prometheus (deploy/prometheus/rules_test.go); the server and
#                              its service are never used
# (The Linux guest's kernel, qemu-guest-agent and busybox come from Debian packages
# installed into the guest image by rootfs/vm/vm-linux.yaml, not on the host.)
packages=(libseccomp-dev libc6-dev pkg-config mmdebstrap runc iproute2 tmux ca-certificates systemd chromium
	qemu-system-x86 qemu-utils ovmf swtpm e2fsprogs git apt-utils gnupg
	grub-efi-amd64-bin grub-common mtools dosfstools fdisk openssh-client rsync postgresql prometheus)
# The MCP black-box tests drive the server with the official TypeScript SDK,
# and the web editor is bundled with esbuild: Node.js from Debian unless a
# node is already on PATH.
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

# The OCI registry the image tests pull from (distribution/distribution, the
# registry Docker Hub runs), built from its Go module into the test tools
# cache; internal/testenv.RegistryBin builds it the same way if missing.
# Keep the version in step with testenv.RegistryVersion.
registry_version=v3.1.2
tools_dir=${SANDBOXD_TEST_TOOLS:-/var/tmp/mcp-sandboxd-test-tools}
if [[ ! -x $tools_dir/registry-$registry_version/registry ]]; then
	mkdir -p "$tools_dir/registry-$registry_version"
	(cd /tmp && GOBIN=$tools_dir/registry-$registry_version GOFLAGS=-mod=mod CGO_ENABLED=0 \
		go install "github.com/distribution/distribution/v3/cmd/registry@$registry_version")
fi

# The MCP TypeScript SDK for the black-box tests (pinned by test/mcp/package-lock.json).
if [[ ! -e test/mcp/node_modules/@modelcontextprotocol/sdk/package.json || test/mcp/package-lock.json -nt test/mcp/node_modules/.package-lock.json ]]; then
	(cd test/mcp && npm ci --no-audit --no-fund --loglevel=error)
fi

# The official TypeScript SDK v2 and its tasks extension package for the
# 2026-07-28 tasks extension's test (test/mcp/exttasks_test.go; pinned by
# test/mcp/exttasks/package-lock.json): a real requester of that wire, which
# the SDK 1.x in test/mcp does not speak.
if [[ ! -e test/mcp/exttasks/node_modules/@modelcontextprotocol/ext-tasks/package.json || test/mcp/exttasks/package-lock.json -nt test/mcp/exttasks/node_modules/.package-lock.json ]]; then
	(cd test/mcp/exttasks && npm ci --no-audit --no-fund --loglevel=error)
fi

# The official E2B SDK for the E2B-compatible API's black-box tests (pinned by
# test/e2b/package-lock.json).
if [[ ! -e test/e2b/node_modules/e2b/package.json || test/e2b/package-lock.json -nt test/e2b/node_modules/.package-lock.json ]]; then
	(cd test/e2b && npm ci --no-audit --no-fund --loglevel=error)
fi

# standardwebhooks, a real Standard Webhooks verifier, checks the daemon's
# webhook signatures in test/e2e/webhooks_test.go (pinned by
# test/webhooks/package-lock.json).
if [[ ! -e test/webhooks/node_modules/standardwebhooks/package.json || test/webhooks/package-lock.json -nt test/webhooks/node_modules/.package-lock.json ]]; then
	(cd test/webhooks && npm ci --no-audit --no-fund --loglevel=error)
fi

# The web editor's build tools and libraries (pinned by web/package-lock.json).
if [[ ! -e web/node_modules/.package-lock.json || web/package-lock.json -nt web/node_modules/.package-lock.json ]]; then
	(cd web && npm ci --no-audit --no-fund --loglevel=error)
fi

# Claude Code for the black-box test in test/claude (pinned by its
# package-lock.json). Its npm package carries the native binary per platform
# as an optional dependency; the test runs that binary, so the package's own
# postinstall (which would copy it over a stub) need not run.
if [[ ! -e test/claude/node_modules/@anthropic-ai/claude-code-linux-x64/claude || test/claude/package-lock.json -nt test/claude/node_modules/.package-lock.json ]]; then
	(cd test/claude && npm ci --no-audit --no-fund --loglevel=error --ignore-scripts)
fi

# Codex CLI and Gemini CLI for the black-box tests in test/clients (pinned
# by its package-lock.json). Codex's npm package carries its native binary
# per platform as an optional dependency and Gemini CLI is one bundled
# script; neither needs an install script (Gemini's optional node-pty, which
# would compile, is only for its interactive shell).
if [[ ! -e test/clients/node_modules/@openai/codex-linux-x64/package.json || ! -e test/clients/node_modules/@google/gemini-cli/bundle/gemini.js || test/clients/package-lock.json -nt test/clients/node_modules/.package-lock.json ]]; then
	(cd test/clients && npm ci --no-audit --no-fund --loglevel=error --ignore-scripts)
fi

# MCP Inspector's CLI for test/clients TestInspector (pinned by
# test/clients/inspector/package-lock.json) with the Node.js it needs
# (>= 22.19), pinned as the npm package "node" like the conformance suite's.
if [[ ! -x test/clients/inspector/node_modules/.bin/node || ! -e test/clients/inspector/node_modules/@modelcontextprotocol/inspector/package.json || test/clients/inspector/package-lock.json -nt test/clients/inspector/node_modules/.package-lock.json ]]; then
	(cd test/clients/inspector && npm ci --no-audit --no-fund --loglevel=error)
fi

# The official MCP conformance suite (test/conformance, pinned by its
# package-lock.json) with the Node.js it needs (>= 22), itself pinned as the
# npm package "node", whose install script (allowed in package.json's
# allowScripts) fetches the platform's Node binary from the npm registry.
if [[ ! -x test/conformance/node_modules/.bin/node || test/conformance/package-lock.json -nt test/conformance/node_modules/.package-lock.json ]]; then
	(cd test/conformance && npm ci --no-audit --no-fund --loglevel=error)
fi
