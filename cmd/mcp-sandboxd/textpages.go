package main

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// unmapBinaryHugePages stops the daemon's own binary from being mapped in
// 2 MiB pieces and lets go of the mappings of it that start-up made, so
// that the daemon's resident set holds the parts of its code it runs, not
// the whole of a 140 MB binary (client-go, the MCP schema library, ...).
//
// The kernel caches the binary in large folios and maps a whole one
// (2 MiB, FilePmdMapped in smaps) at the first touch of any page in it:
// the daemon started at ~105 MiB RSS, ~90 of it clean pages of its own
// file and only ~15 anonymous. MADV_NOHUGEPAGE on those mappings makes
// later faults map only the pages around the fault (fault-around), and
// MADV_DONTNEED drops what start-up mapped; both only change the page
// tables of the daemon: the file stays in the page cache (runc init
// executes the same binary), and a page that is needed again is faulted
// back in from there.
//
// Only the mappings of the binary that are read-only and hold no page of
// their own (smaps "Anonymous: 0 kB": code, read-only data) are touched:
// MADV_DONTNEED on a private mapping throws away the pages written to it,
// the writable data and also the relocated, then write-protected, RELRO
// part of a cgo binary (its GOT), which would refault unrelocated. Best
// effort: a failure is logged and changes nothing else.
func unmapBinaryHugePages(log *slog.Logger) {
	var exe syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &exe); err != nil {
		log.Debug("resident binary pages: stat own binary", "err", err)
		return
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		log.Debug("resident binary pages: read mappings", "err", err)
		return
	}
	defer f.Close()
	type region struct{ start, end uintptr }
	var (
		regions []region
		cur     *region // the binary's read-only mapping being read
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if isMappingHeader(line) {
			cur = nil
			if s, e, ro := readOnlyMappingOf(line, exe.Dev, exe.Ino); ro {
				cur = &region{s, e}
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Anonymous:"); ok && cur != nil {
			if strings.TrimSpace(rest) == "0 kB" {
				regions = append(regions, *cur)
			}
			cur = nil
		}
	}
	if err := sc.Err(); err != nil {
		log.Debug("resident binary pages: read mappings", "err", err)
		return
	}
	// madvise after the read: the advice splits and merges mappings.
	for _, r := range regions {
		for _, advice := range []int{unix.MADV_NOHUGEPAGE, unix.MADV_DONTNEED} {
			if _, _, errno := unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, uintptr(advice)); errno != 0 {
				log.Debug("resident binary pages: madvise", "range", fmt.Sprintf("%#x-%#x", r.start, r.end), "advice", advice, "err", errno)
				break
			}
		}
	}
}

// isMappingHeader reports whether an smaps line starts a mapping
// ("start-end perms offset dev inode [path]") rather than being one of its
// "Key: value" lines.
func isMappingHeader(line string) bool {
	f := strings.Fields(line)
	return len(f) >= 5 && !strings.HasSuffix(f[0], ":") && strings.Contains(f[0], "-")
}

// readOnlyMappingOf parses a /proc/self/maps line and reports the address
// range of a mapping of the file dev:ino that is not writable.
func readOnlyMappingOf(line string, dev, ino uint64) (start, end uintptr, ok bool) {
	f := strings.Fields(line)
	if len(f) < 6 || len(f[1]) != 4 || f[1][1] == 'w' {
		return 0, 0, false
	}
	if n, err := strconv.ParseUint(f[4], 10, 64); err != nil || n != ino {
		return 0, 0, false
	}
	maj, min, found := strings.Cut(f[3], ":")
	if !found {
		return 0, 0, false
	}
	ma, err1 := strconv.ParseUint(maj, 16, 32)
	mi, err2 := strconv.ParseUint(min, 16, 32)
	if err1 != nil || err2 != nil || unix.Mkdev(uint32(ma), uint32(mi)) != dev {
		return 0, 0, false
	}
	lo, hi, found := strings.Cut(f[0], "-")
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(lo, 16, 64)
	e, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}
