package server

// The job-exec helper (jobexec.c) is C, run as a constructor of the agent
// binary before the Go runtime starts, because it lives only to execve: as
// a Go process each helper, and the spare that waits idle in every sandbox,
// cost the runtime's own start (threads, heap arenas: 0.66 MiB of
// anonymous memory and 4 threads for a spare doing nothing) and its
// execve tore a Go address space down (0.63 ms of an exec of `true`,
// docs/ARCHITECTURE.md). The constructor is the technique of runc's nsexec.
//
// The agent is linked statically (the flags below): it runs in any root
// file system, with or without a C library of its own.

// #cgo LDFLAGS: -static
// #include "jobexec.h"
import "C"
