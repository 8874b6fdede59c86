package main

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestReadOnlyMappingOf(t *testing.T) {
	dev := unix.Mkdev(0xfe, 0)
	for _, c := range []struct {
		line   string
		ok     bool
		lo, hi uintptr
	}{
		{"00403000-02d65000 r-xp 00003000 fe:00 10087887    /usr/bin/mcp-sandboxd", true, 0x403000, 0x2d65000},
		{"02d65000-0654b000 r--p 02965000 fe:00 10087887    /usr/bin/mcp-sandboxd", true, 0x2d65000, 0x654b000},
		// Writable data: never.
		{"0654c000-06652000 rw-p 0614b000 fe:00 10087887    /usr/bin/mcp-sandboxd", false, 0, 0},
		// Another file, or the same inode number on another device.
		{"7fc617820000-7fc617976000 r-xp 00026000 fe:00 326269   /usr/lib/libc.so.6", false, 0, 0},
		{"00403000-02d65000 r-xp 00003000 08:01 10087887    /usr/bin/mcp-sandboxd", false, 0, 0},
		// Anonymous memory, a malformed line.
		{"3f151a800000-3f151b800000 rw-p 00000000 00:00 0", false, 0, 0},
		{"zzz r-xp 0 fe:00 10087887", false, 0, 0},
	} {
		lo, hi, ok := readOnlyMappingOf(c.line, dev, 10087887)
		if ok != c.ok || lo != c.lo || hi != c.hi {
			t.Errorf("readOnlyMappingOf(%q) = %#x, %#x, %v; want %#x, %#x, %v", c.line, lo, hi, ok, c.lo, c.hi, c.ok)
		}
	}
	if !isMappingHeader("00403000-02d65000 r-xp 00003000 fe:00 10087887 /x") || isMappingHeader("Anonymous:             0 kB") || isMappingHeader("VmFlags: rd ex mr mw me sd") {
		t.Error("isMappingHeader tells a mapping from its key lines wrongly")
	}
}
