#!/bin/bash
# Runs inside the Linux test guest of make test-cgroupv2 (as root, through
# qemu-ga), from the data disk it was put on: makes the guest look like a
# host on cgroup v2 and runs the test binaries of pkg/cgroups and
# pkg/engine there.
# Arguments: the repository path compiled into the test binary (testenv.RepoRoot)
# and the -test.run pattern.
set -euo pipefail
repo=$1 run=$2
data=/mnt/data

echo "== kernel: $(uname -r)  cmdline: $(cat /proc/cmdline)"
if [ "$(stat -f -c %T /sys/fs/cgroup)" != cgroup2fs ]; then
	echo "/sys/fs/cgroup is not cgroup2" >&2
	exit 1
fi
# Mount options as systemd sets them: cgroup namespaces are delegation
# boundaries (a sandbox's agent may write only cgroup.procs and
# cgroup.subtree_control of its namespace root).
mount -o remount,nsdelegate,memory_recursiveprot /sys/fs/cgroup
echo "== cgroup mounts:"
grep cgroup /proc/mounts
echo "== root cgroup.controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "== root cgroup.subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"

# The test binaries find recipes and seccomp profiles under the repository
# path they were built in; the host's apt sources make the image digests
# match (the mirror is part of them).
mkdir -p "$repo"
mount --bind "$data/repo" "$repo"
cp -a "$data/apt/." /etc/apt/
mkdir -p "$data/tmp"
export TMPDIR=$data/tmp SANDBOXD_INTEGRATION=1 SANDBOXD_CGROUPV2=1 \
	SANDBOXD_AGENT=$data/sandbox-agent SANDBOXD_TEST_IMAGES=$data/images

# pkg/cgroups first, on a root cgroup with no controller enabled (a v2
# host without systemd): EnsureParent must enable what sandboxes need.
cd "$repo"
"$data/cgroups.test" -test.v -test.count=1 -test.run '^TestParentLifecycle$' -test.timeout 2m
echo "== root cgroup.subtree_control after EnsureParent: $(cat /sys/fs/cgroup/cgroup.subtree_control)"

# Then as on a systemd host: every available controller enabled in the
# root's subtree_control, the daemon in a leaf cgroup of its own.
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
	echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control
done
echo "== root cgroup.subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
svc=/sys/fs/cgroup/system.slice/mcp-sandboxd-test.service
mkdir -p "$svc"
echo $$ > "$svc/cgroup.procs"
echo "== test process cgroup: $(cat /proc/self/cgroup)"

# Modules the sandbox core needs (no udev in the guest to load them).
modprobe loop
modprobe overlay

"$data/engine.test" -test.v -test.count=1 -test.run "$run" -test.timeout 7m
echo "== guest tests passed"
