package server

import (
	"bytes"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// killSession SIGKILLs every process whose session or process group id is
// sid, repeating while new ones appear. Killing the process group alone
// misses members that moved to another group of the session, and a fork
// racing with the kill can leave a child behind.
func killSession(sid int) {
	for range 10 {
		if killMatching(sid) == 0 {
			return
		}
		// Let the signalled processes die before looking again.
		time.Sleep(10 * time.Millisecond)
	}
}

// killMatching does one /proc scan and returns how many processes it
// signalled.
func killMatching(sid int) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	killed := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pgrp, session, state, ok := procStat(pid)
		// Zombies are dead already; the reaper collects them.
		if !ok || state == 'Z' || (pgrp != sid && session != sid) {
			continue
		}
		if unix.Kill(pid, unix.SIGKILL) == nil {
			killed++
		}
	}
	return killed
}

// procStat returns the state, process group and session of pid from
// /proc/<pid>/stat.
func procStat(pid int) (pgrp, session int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	// The command name may contain spaces and parentheses; the fields
	// after the last ')' are "state ppid pgrp session ...".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 || len(f[0]) != 1 {
		return 0, 0, 0, false
	}
	pgrp, err1 := strconv.Atoi(string(f[2]))
	session, err2 := strconv.Atoi(string(f[3]))
	if err1 != nil || err2 != nil {
		return 0, 0, 0, false
	}
	return pgrp, session, f[0][0], true
}
