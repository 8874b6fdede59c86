package e2e

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxrunner/mcp-sandboxd/internal/testenv"
)

// TestDaemonBinaryPagesTrimmed: once ready, the daemon holds no 2 MiB
// mapping of its own binary (its resident set is the code it runs, not
// the whole file: cmd/mcp-sandboxd/textpages.go), and dropping those
// mappings broke nothing — a sandbox is created, runs a command and is
// terminated afterwards (a dropped relocated page would crash it).
func TestDaemonBinaryPagesTrimmed(t *testing.T) {
	d := testenv.NewDaemon(t)
	d.Start()
	id := createSandbox(d)
	if out := d.MustCtl("exec", id, "--", "echo", "alive"); out != "alive\n" {
		t.Fatalf("exec after the trim: %q", out)
	}
	d.MustCtl("rm", id)

	var exe syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/exe", d.PID()), &exe); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", d.PID()))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		ours     bool // the current mapping is of the daemon's binary
		code     bool // ... and executable (its text: never written, always trimmed)
		mappings int
		pmd      int64
		advised  int // code mappings marked MADV_NOHUGEPAGE ("nh" in VmFlags)
		codeMaps int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) >= 5 && strings.Contains(fl[0], "-") && !strings.HasSuffix(fl[0], ":") {
			ino, _ := strconv.ParseUint(fl[4], 10, 64)
			ours = ino == exe.Ino && fl[1][1] != 'w'
			code = ours && fl[1][2] == 'x'
			if ours {
				mappings++
			}
			if code {
				codeMaps++
			}
			continue
		}
		// Whatever the page cache holds (a freshly copied binary is not in
		// large folios, so FilePmdMapped alone can be 0 without the trim),
		// the advice itself shows on the code's mappings.
		if code && len(fl) >= 1 && fl[0] == "VmFlags:" && slices.Contains(fl[1:], "nh") {
			advised++
		}
		if ours && len(fl) == 3 && fl[0] == "FilePmdMapped:" {
			kb, err := strconv.ParseInt(fl[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			pmd += kb
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if mappings == 0 {
		t.Fatalf("no read-only mapping of the daemon's binary (inode %d) in its smaps", exe.Ino)
	}
	if codeMaps == 0 || advised != codeMaps {
		t.Errorf("%d of the %d executable mappings of the daemon's binary are marked no-huge-page (MADV_NOHUGEPAGE)", advised, codeMaps)
	}
	if pmd != 0 {
		t.Errorf("the daemon maps %d KiB of its binary in 2 MiB pieces after start", pmd)
	}
}
