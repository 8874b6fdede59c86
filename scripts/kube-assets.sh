#!/usr/bin/env bash
# Builds the Kubernetes binaries the tests need — kube-apiserver and etcd for
# envtest (pkg/kubediscovery), and with KUBE_ASSETS_ALL=1 also kubectl, the
# kubelet, the controller manager, the scheduler, kube-proxy and helm for the
# single-node cluster of `make test-kubernetes` — once, from the Go module
# proxy, into a cache outside the repository that survives between runs on
# one machine.
#
# Why build: envtest cannot download its binaries here (no network but the
# package registries), and Debian ships neither a kube-apiserver nor helm.
#
# Idempotent: a binary whose stamp names the same version is kept; the
# script prints the directory (KUBEBUILDER_ASSETS) on its last line.
# Measured on this project's 2-core machines: kube-apiserver and etcd cold
# 2 min 52 s (idle), 6 min 7 s with an empty Go build cache under load 7;
# KUBE_ASSETS_ALL=1 then adds 3 min 20 s (one go build, load 5-7; it was
# about 6 minutes one binary at a time); warm: well under a second.
#
# Usage: scripts/kube-assets.sh            # kube-apiserver, etcd
#        KUBE_ASSETS_ALL=1 scripts/kube-assets.sh
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.34.2}
# The published k8s.io/* staging modules carry the same minor/patch as v0.x.
KUBE_STAGING_VERSION=${KUBE_STAGING_VERSION:-v0.${KUBE_VERSION#v1.}}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE=${KUBE_ASSETS_CACHE:-/var/cache/sandboxd-test/kube}
OUT="$CACHE/$KUBE_VERSION/bin"
GO=${GO:-go}

mkdir -p "$OUT"
# One build at a time: two concurrent `make test` runs must not both spend
# 1.9 GB on kube-apiserver.
exec 9>"$CACHE/.lock"
flock 9

# fresh NAME VERSION: true when $OUT/NAME exists and was built for VERSION.
fresh() {
	[[ -x "$OUT/$1" && -f "$OUT/$1.version" && "$(cat "$OUT/$1.version")" == "$2" ]]
}

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

want=(kube-apiserver)
if [[ "${KUBE_ASSETS_ALL:-}" == 1 ]]; then
	want+=(kubectl kubelet kube-controller-manager kube-scheduler kube-proxy)
fi
missing=()
for b in "${want[@]}"; do fresh "$b" "$KUBE_VERSION" || missing+=("$b"); done

if ((${#missing[@]})); then
	# k8s.io/kubernetes from the proxy has no staging/ directory but its go.mod
	# still replaces every k8s.io/* staging module with ./staging/...: copy the
	# module, drop go.work and those replaces, and require the published
	# modules of the same release instead.
	src=$($GO mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[[ -d "$src" ]] || { echo "kube-assets: k8s.io/kubernetes@$KUBE_VERSION not downloaded" >&2; exit 1; }
	work="$CACHE/$KUBE_VERSION/src"
	if [[ ! -f "$work/.prepared" ]]; then
		rm -rf "$work"
		cp -r "$src" "$work"
		chmod -R u+w "$work"
		rm -f "$work/go.work" "$work/go.work.sum"
		(
			cd "$work"
			# Every staging module is required as v0.0.0 and replaced by a path.
			mods=$(sed -n 's#^\t\(k8s.io/[^ ]*\) => ./staging/.*#\1#p' go.mod)
			for m in $mods; do
				$GO mod edit -dropreplace="$m" -require="$m@$KUBE_STAGING_VERSION"
			done
			# No tidy (it would fetch every test dependency of the tree):
			# GOFLAGS=-mod=mod lets the build add the sums it needs.
		)
		touch "$work/.prepared"
	fi
	echo "kube-assets: building ${missing[*]} $KUBE_VERSION" >&2
	# The version a build from the module proxy cannot find in git:
	# without it the binaries say v0.0.0-master, which clients reject.
	minor=${KUBE_VERSION#v1.}
	minor=${minor%%.*}
	vpkg=k8s.io/component-base/version
	ldflags="-s -w -X $vpkg.gitVersion=$KUBE_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
	# One go build for all of them: the packages they share are compiled
	# once and the two cores stay busy across binaries (links included),
	# instead of one binary's serial tail at a time.
	pkgs=()
	for b in "${missing[@]}"; do pkgs+=("./cmd/$b"); done
	rm -rf "$OUT/.new" && mkdir -p "$OUT/.new"
	(cd "$work" && nice -n 10 $GO build -trimpath -ldflags "$ldflags" -o "$OUT/.new/" "${pkgs[@]}")
	for b in "${missing[@]}"; do
		mv "$OUT/.new/$b" "$OUT/$b"
		echo "$KUBE_VERSION" >"$OUT/$b.version"
	done
	rmdir "$OUT/.new"
fi

if ! fresh etcd "$ETCD_VERSION"; then
	# etcd's own go.mod has replace lines, so `go install pkg@version` refuses
	# it: a two-line wrapper module builds the same main.
	echo "kube-assets: building etcd $ETCD_VERSION" >&2
	w="$CACHE/etcd-$ETCD_VERSION"
	rm -rf "$w" && mkdir -p "$w"
	cat >"$w/main.go" <<-'EOF'
		// Command etcd is etcd's server main, built outside etcd's own module.
		package main

		import (
			"os"

			"go.etcd.io/etcd/server/v3/etcdmain"
		)

		func main() { etcdmain.Main(os.Args) }
	EOF
	(
		cd "$w"
		$GO mod init sandboxd-test/etcd >/dev/null 2>&1
		$GO mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
		$GO mod tidy >/dev/null
		nice -n 10 $GO build -trimpath -ldflags '-s -w' -o "$OUT/etcd.new" .
	)
	mv "$OUT/etcd.new" "$OUT/etcd"
	echo "$ETCD_VERSION" >"$OUT/etcd.version"
fi

if [[ "${KUBE_ASSETS_ALL:-}" == 1 ]] && ! fresh helm "$HELM_VERSION"; then
	echo "kube-assets: building helm $HELM_VERSION" >&2
	GOBIN="$OUT/.helm" nice -n 10 $GO install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	mv "$OUT/.helm/helm" "$OUT/helm" && rmdir "$OUT/.helm"
	echo "$HELM_VERSION" >"$OUT/helm.version"
fi

echo "$OUT"
