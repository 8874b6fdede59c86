# mcp-sandboxd build, test and run targets. See README.md.
SHELL := /bin/bash
GO ?= go
PREFIX ?= /usr/local
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/sandboxrunner/mcp-sandboxd/pkg/version.Version=$(VERSION) \
           -X github.com/sandboxrunner/mcp-sandboxd/pkg/version.Commit=$(COMMIT)
# libcontainer needs cgo (nsenter) and -tags seccomp for seccomp support.
# Tests add testhooks: test-only hooks of the daemon's packages (e.g.
# pkg/runtime/testhook_mounts.go), never in a built binary.
TAGS := seccomp
# The agent (PID 1 of every sandbox) is built without Go 1.26's Green Tea
# collector: it touches ~0.1 MiB more of every idle agent (its mark bits
# inside each span; docs/ARCHITECTURE.md, "Where an idle sandbox's memory
# goes"), and an agent collects rarely. Go 1.27 is to drop the opt-out.
# scripts/bench-compare.sh builds each side's agent with this line's value.
AGENT_GOEXPERIMENT := nogreenteagc
TEST_TIMEOUT ?= 60m
DEV_CONFIG ?= dev-state/mcp-sandboxd.yaml

.PHONY: image test-kubernetes fuzz all build deps web test test-unit test-cgroupv2 test-vm-load chaos soak bench bench-compare run fmt vet lint install clean

all: build

deps:
	@scripts/install-deps.sh

# The web editor's bundle (web/ → pkg/webui/dist), embedded by the daemon:
# type-checked and rebuilt when its sources change. Always before the Go
# build, so that a clean clone's binary carries the editor.
WEB_SRC := $(wildcard web/src/*) web/build.mjs web/package-lock.json web/tsconfig.json

pkg/webui/dist/index.html: $(WEB_SRC) | deps
	cd web && npx --no-install tsc --noEmit -p . && node build.mjs

web: deps pkg/webui/dist/index.html

build: deps web
	@mkdir -p bin
	CGO_ENABLED=1 $(GO) build -tags $(TAGS) -ldflags '$(LDFLAGS)' -o bin/mcp-sandboxd ./cmd/mcp-sandboxd
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o bin/sandboxctl ./cmd/sandboxctl
	CGO_ENABLED=1 GOEXPERIMENT=$(AGENT_GOEXPERIMENT) $(GO) build -trimpath -tags netgo,osusergo -ldflags '-s -w $(LDFLAGS)' -o bin/sandbox-agent ./cmd/sandbox-agent
	# Every container's `runc init` (pkg/runtime/initexec.go): cgo for nsenter,
	# seccomp for the filter it installs; found beside the agent.
	CGO_ENABLED=1 $(GO) build -tags $(TAGS) -trimpath -ldflags '-s -w' -o bin/sandbox-init ./cmd/sandbox-init

# The OCI image of the daemon (deploy/image, no Docker): a Debian base of the
# host's suite made by mmdebstrap (cached in bin/.image-cache) and bin/'s
# binaries, as an OCI archive for `ctr import`. IMAGE_VM=1 adds QEMU and swtpm.
IMAGE_NAME ?= mcp-sandboxd:$(VERSION)
IMAGE_OUT ?= bin/mcp-sandboxd-image.tar
image: build
	$(GO) run ./deploy/image -bin bin -out $(IMAGE_OUT) -name '$(IMAGE_NAME)' -version '$(VERSION)' $(if $(filter 1,$(IMAGE_VM)),-vm)

# A real single-node Kubernetes v1.34 cluster in namespaces of its own, the
# chart installed with two gateway replicas, a sandbox used through the
# gateway's Service (create, streamed exec, files, terminal) and again after
# the node daemon's pod was replaced and it adopted the sandbox, then a
# teardown checked against the host's state before
# (scripts/test-kubernetes.sh; root; not part of make test, which must run
# first: it fills the shared image cache; CI runs both, .ci/run). Its
# binaries are cached in /var/cache/sandboxd-test/kube: about 6 minutes
# more than make test cold, about a minute warm (docs/kubernetes.md).
test-kubernetes: build
	scripts/test-kubernetes.sh

# Integration tests need root; SANDBOXD_INTEGRATION=1 turns their skip into a failure.
# -p 1: packages one at a time, so that timing-sensitive checks (the CPU quota
# test) do not compete with another package's sandboxes for the two cores.
# Test artifacts (the browser tests' screenshots) stay in test-output/_artifacts/;
# each test logs its directory.
# scripts/kube-assets.sh builds kube-apiserver and etcd for the envtest tests
# (pkg/kubediscovery) once into /var/cache/sandboxd-test/kube (about 3
# minutes cold, instant warm) and prints their directory.
test: build
	@mkdir -p test-output
	KUBEBUILDER_ASSETS=$$(scripts/kube-assets.sh) && export KUBEBUILDER_ASSETS && \
	SANDBOXD_INTEGRATION=1 SANDBOXD_AGENT=$(CURDIR)/bin/sandbox-agent SANDBOXD_BIN_DIR=$(CURDIR)/bin \
		CGO_ENABLED=1 $(GO) test -tags $(TAGS),testhooks -count=1 -p 1 -timeout $(TEST_TIMEOUT) \
		-artifacts -outputdir=$(CURDIR)/test-output ./...

# The sandbox core's cgroup tests on cgroup v2: boots the Linux test guest
# of the VM backend with only the unified hierarchy and runs pkg/engine's
# cgroup tests inside it (test/cgroupv2; about 4 minutes under TCG).
test-cgroupv2: build
	SANDBOXD_INTEGRATION=1 SANDBOXD_AGENT=$(CURDIR)/bin/sandbox-agent SANDBOXD_BIN_DIR=$(CURDIR)/bin \
		CGO_ENABLED=1 $(GO) test -tags $(TAGS),cgroupv2 -count=1 -v -timeout 15m ./test/cgroupv2/

# VMs booting on a saturated host (pkg/vm TestBootUnderLoad, build tag
# vmload): VM_LOAD_BOOTS (default 10) cold boots of the test guest one after
# another beside 4 busy loops per CPU in a cgroup of their own, each ready
# within its derived budget (docs/vm.md "Boot timeouts"). Its own target, not
# make test: ten cold TCG boots with the CPUs saturated take minutes on 2
# cores. Run by .ci/run, bounded by its -timeout.
VM_LOAD_BOOTS ?= 10
test-vm-load: build
	SANDBOXD_INTEGRATION=1 SANDBOXD_AGENT=$(CURDIR)/bin/sandbox-agent SANDBOXD_BIN_DIR=$(CURDIR)/bin \
		VM_LOAD_BOOTS=$(VM_LOAD_BOOTS) CGO_ENABLED=1 $(GO) test -tags $(TAGS),vmload -count=1 -v -timeout 30m \
		-run '^TestBootUnderLoad$$' ./pkg/vm/

# The chaos test (test/chaos, build tag chaos, so make test does not run it
# twice): CHAOS_KILLS (default 50) kill -9s of a real daemon at random
# moments under eight clients, a restart after each, the state checked
# against every acknowledged operation, nothing left at the end. It prints
# its seed: CHAOS_SEED=N replays its choices. Figures in
# test-output/chaos-report.json. Run by .ci/run; under 10 minutes on 2 cores.
CHAOS_KILLS ?= 50
chaos: build
	@mkdir -p test-output
	SANDBOXD_INTEGRATION=1 SANDBOXD_AGENT=$(CURDIR)/bin/sandbox-agent SANDBOXD_BIN_DIR=$(CURDIR)/bin \
		CHAOS_KILLS=$(CHAOS_KILLS) CHAOS_REPORT=$(CURDIR)/test-output/chaos-report.json \
		CGO_ENABLED=1 $(GO) test -tags $(TAGS),chaos -count=1 -v -timeout 15m -run '^TestChaos$$' ./test/chaos/

# The soak (test/chaos, build tag soak; not in make test or CI): SOAK_CYCLES
# create/exec/terminate cycles with four clients, the daemon's RSS, open
# descriptors and goroutines sampled; fails on a leak. Figures in
# test-output/soak-report.json. 10,000 cycles take hours on 2 cores.
SOAK_CYCLES ?= 10000
soak: build
	@mkdir -p test-output
	SANDBOXD_INTEGRATION=1 SANDBOXD_AGENT=$(CURDIR)/bin/sandbox-agent SANDBOXD_BIN_DIR=$(CURDIR)/bin \
		SOAK_CYCLES=$(SOAK_CYCLES) SOAK_REPORT=$(CURDIR)/test-output/soak-report.json \
		CGO_ENABLED=1 $(GO) test -tags $(TAGS),soak -count=1 -v -timeout 24h -run '^TestSoak$$' ./test/chaos/

test-unit:
	CGO_ENABLED=1 $(GO) test -tags $(TAGS) -count=1 -short ./...

# Fuzz targets, each for FUZZTIME (their seed corpora, f.Add seeds and
# testdata/fuzz, run as plain tests in make test). One target at a time:
# go test -fuzz takes a single target per package run.
FUZZTIME ?= 60s
FUZZ_TARGETS := \
	./pkg/config:FuzzParse \
	./pkg/agent:FuzzReadFrame \
	./pkg/agent:FuzzValidatePath \
	./pkg/apitypes:FuzzDecodeRequests \
	./pkg/apitypes:FuzzTemplateCreate \
	./pkg/api:FuzzDecodeJSON \
	./pkg/e2b:FuzzControlPlane \
	./pkg/e2b:FuzzMetadataQuery \
	./pkg/e2b:FuzzEnvdRPC \
	./pkg/sshd:FuzzSessionRequests \
	./pkg/services/images:FuzzDockerfileBuild \
	./pkg/services/webhooks:FuzzCreateWebhook
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "== $$name ($$pkg, $(FUZZTIME))"; \
		CGO_ENABLED=1 $(GO) test -tags $(TAGS) -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

# Lifecycle benchmarks against the runc CLI baseline (see pkg/engine/bench_test.go),
# run_code through MCP over HTTP next to the engine API (test/mcp), the REST
# lifecycle, tracing on vs off and the density run (test/e2e), printed as one table of issue 24's figures with their baselines (scripts/bench-table.sh);
# BENCH_N idle sandboxes for the density run.
BENCH_N ?= 50
bench: build
	BENCH_N=$(BENCH_N) scripts/bench-table.sh

# The same benchmarks for BASE (a git revision) and the working tree, run
# alternately in one run, with medians and ratios (scripts/bench-compare.sh).
BASE ?= HEAD~1
bench-compare: build
	ROUNDS=$${ROUNDS:-3} scripts/bench-compare.sh $(BASE)

run: build
	@scripts/dev-run.sh

fmt:
	gofmt -w cmd pkg internal test deploy

vet:
	CGO_ENABLED=1 $(GO) vet -tags $(TAGS) ./...

STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint: vet
	@out=$$(gofmt -l cmd pkg internal test deploy); if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	CGO_ENABLED=1 $(GO) run $(STATICCHECK) -tags $(TAGS) ./...

install: build
	install -D -m 0755 bin/mcp-sandboxd $(DESTDIR)$(PREFIX)/bin/mcp-sandboxd
	install -D -m 0755 bin/sandboxctl $(DESTDIR)$(PREFIX)/bin/sandboxctl
	install -D -m 0755 bin/sandbox-agent $(DESTDIR)/usr/libexec/mcp-sandboxd/sandbox-agent
	install -D -m 0755 bin/sandbox-init $(DESTDIR)/usr/libexec/mcp-sandboxd/sandbox-init
	install -d $(DESTDIR)/usr/share/mcp-sandboxd/rootfs $(DESTDIR)/usr/share/mcp-sandboxd/seccomp-profiles
	cp -r rootfs/. $(DESTDIR)/usr/share/mcp-sandboxd/rootfs/
	install -m 0644 seccomp-profiles/*.json $(DESTDIR)/usr/share/mcp-sandboxd/seccomp-profiles/
	install -D -m 0644 config/mcp-sandboxd.yaml $(DESTDIR)/etc/mcp-sandboxd/mcp-sandboxd.yaml.default
	test -e $(DESTDIR)/etc/mcp-sandboxd/mcp-sandboxd.yaml || install -m 0644 config/mcp-sandboxd.yaml $(DESTDIR)/etc/mcp-sandboxd/mcp-sandboxd.yaml
	if [[ -e config/mcp-sandboxd.service ]]; then install -D -m 0644 config/mcp-sandboxd.service $(DESTDIR)/lib/systemd/system/mcp-sandboxd.service; fi
	# The socket's group (server.socket_group): its members use the daemon
	# without root. Only on the live system, not into a DESTDIR image.
	if [[ -z "$(DESTDIR)" ]] && ! getent group mcp-sandboxd >/dev/null; then groupadd --system mcp-sandboxd; fi

clean:
	rm -rf bin test-output pkg/webui/dist/assets pkg/webui/dist/index.html
