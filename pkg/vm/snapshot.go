package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// snapshotNameRE: names go into HMP command lines and qcow2 snapshot
// tables, so no spaces, quotes or '/'.
var snapshotNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// CheckSnapshotName validates a snapshot name.
func CheckSnapshotName(name string) error {
	if !snapshotNameRE.MatchString(name) {
		return errdefs.Invalidf("name: %q must be 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Snapshot saves the running VM's RAM, device and disk state under name,
// inside its overlay (an internal qcow2 snapshot, HMP savevm). The guest
// pauses for the duration. An existing snapshot of that name is replaced.
func (v *VM) Snapshot(ctx context.Context, name string) error {
	if err := CheckSnapshotName(name); err != nil {
		return err
	}
	if _, err := v.mon.hmp(ctx, "savevm "+name); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "vm %s: snapshot %s", v.rec.ID, name)
	}
	return nil
}

// Restore returns the VM to a snapshot. The guest agent's stream is reset
// and resynchronised: replies in flight at snapshot time would otherwise
// be read as answers to new requests.
func (v *VM) Restore(ctx context.Context, name string) error {
	if err := CheckSnapshotName(name); err != nil {
		return err
	}
	names, err := v.Snapshots(ctx)
	if err != nil {
		return err
	}
	if !containsString(names, name) {
		return errdefs.NotFoundf("name: vm %s has no snapshot %q", v.rec.ID, name)
	}
	if _, err := v.mon.hmp(ctx, "loadvm "+name); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "vm %s: restore %s", v.rec.ID, name)
	}
	v.resetQGA()
	return v.WaitReady(ctx)
}

// DeleteSnapshot removes a snapshot.
func (v *VM) DeleteSnapshot(ctx context.Context, name string) error {
	if err := CheckSnapshotName(name); err != nil {
		return err
	}
	if _, err := v.mon.hmp(ctx, "delvm "+name); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "vm %s: delete snapshot %s", v.rec.ID, name)
	}
	return nil
}

// Snapshots lists the VM's snapshot names (HMP "info snapshots"; the
// reply is one short line per snapshot, far below go-qemu's 64 KiB line
// limit for any sane number of snapshots).
func (v *VM) Snapshots(ctx context.Context) ([]string, error) {
	out, err := v.mon.hmp(ctx, "info snapshots")
	if err != nil {
		if strings.Contains(err.Error(), "no snapshots") || strings.Contains(out, "There is no snapshot") {
			return nil, nil
		}
		return nil, err
	}
	var names []string
	// Format (QEMU 7.2):
	//   List of snapshots present on all disks:
	//   ID        TAG               VM SIZE                DATE     VM CLOCK     ICOUNT
	//   --        ready             94.2 MiB 2026-11-22 12:00:00 00:00:02.345
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "--" || isDigits(f[0])) {
			names = append(names, f[1])
		}
	}
	return names, nil
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// SaveTemplate turns a ready VM into a template for fast starts: it saves
// the ready snapshot, quits QEMU (flushing the overlay) and moves the
// overlay to dst, then removes the rest of the VM. VMs started with
// Spec.FromTemplate = dst and the same machine spec resume from that
// snapshot instead of booting.
func (v *VM) SaveTemplate(ctx context.Context, dst string) error {
	if err := v.Snapshot(ctx, ReadySnapshot); err != nil {
		return err
	}
	v.resetQGA()
	if _, err := v.mon.run(ctx, "quit", nil); err != nil {
		return err
	}
	select {
	case <-v.done:
	case <-time.After(10 * time.Second):
		return errdefs.Unavailablef("vm %s: qemu did not quit", v.rec.ID)
	}
	tmp := dst + ".tmp"
	if err := os.Rename(filepath.Join(v.dir, overlay), tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return v.Destroy(ctx)
}

var shotSeq atomic.Uint64

// pngMagic starts every PNG file.
var pngMagic = []byte("\x89PNG\r\n\x1a\n")

// Screenshot returns the VM's display as PNG (QMP screendump with
// format=png, QEMU >= 7.1; go-qemu's typed call predates the format
// argument, so the command is sent raw). The daemon opens the file and
// hands QEMU the descriptor (add-fd, then /dev/fdset/N): QEMU, running as
// an unprivileged user after -runas, needs no access to the VM's directory.
func (v *VM) Screenshot(ctx context.Context) ([]byte, error) {
	path := filepath.Join(v.dir, shotsDir, fmt.Sprintf("screen-%d.png", shotSeq.Add(1)))
	defer os.Remove(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	raw, err := v.mon.runWithFile(ctx, "add-fd", map[string]any{"opaque": "screenshot"}, f)
	f.Close() // QEMU holds its own copy
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "vm %s: screenshot: pass file", v.rec.ID)
	}
	var set struct {
		ID int `json:"fdset-id"`
	}
	if err := json.Unmarshal(raw, &set); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "vm %s: screenshot: add-fd reply", v.rec.ID)
	}
	defer func() {
		_, _ = v.mon.run(context.WithoutCancel(ctx), "remove-fd", map[string]int{"fdset-id": set.ID})
	}()
	fdset := fmt.Sprintf("/dev/fdset/%d", set.ID)
	if _, err := v.mon.run(ctx, "screendump", map[string]string{"filename": fdset, "format": "png"}); err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "vm %s: screenshot", v.rec.ID)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(b, pngMagic) {
		return nil, errdefs.Unavailablef("vm %s: screendump did not write a PNG", v.rec.ID)
	}
	return b, nil
}
