package runtime

// sandboxd_initexec: the C constructor that hands a `runc init` child over
// to the sealed sandbox-init (see initexec.go for how and why).

/*
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

// Must match initMemfdName and exeseal's "runc_cloned:" prefix.
#define SANDBOXD_INIT_LINK "/memfd:runc_cloned:sandbox-init (deleted)"
#define SANDBOXD_INIT_SEALS (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)

extern char **environ;

// Priority 200 runs before nsenter's constructor, which has none.
__attribute__((constructor(200))) static void sandboxd_initexec(int argc, char **argv) {
	if (argc < 2 || argv == NULL || strcmp(argv[1], "init") != 0)
		return;
	const char *pipe = getenv("_LIBCONTAINER_INITPIPE");
	if (pipe == NULL || *pipe == '\0')
		return;
	int limit = atoi(pipe);
	// libcontainer's descriptors follow the ExtraFiles: the memfd is below.
	for (int fd = 3; fd < limit; fd++) {
		char path[64], link[128];
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		ssize_t n = readlink(path, link, sizeof(link) - 1);
		if (n < 0)
			continue;
		link[n] = '\0';
		if (strcmp(link, SANDBOXD_INIT_LINK) != 0)
			continue;
		// Close-on-exec first, whatever follows: the exec below (or, if
		// this process goes on as the daemon's own init, its exec of the
		// agent) closes it, so that neither sandbox-init nor the agent
		// and its jobs hold it. runc init leaves descriptors below
		// 3+len(ExtraFiles) as they are; this one is then a hole, which
		// nothing fills but close-on-exec descriptors (Go opens every
		// file close-on-exec).
		if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
			return;
		int seals = fcntl(fd, F_GET_SEALS);
		if (seals < 0 || (seals & SANDBOXD_INIT_SEALS) != SANDBOXD_INIT_SEALS)
			return;
		syscall(SYS_execveat, fd, "", argv, environ, AT_EMPTY_PATH);
		// The exec failed: this process goes on as the daemon's own init,
		// as it did before sandbox-init existed.
		return;
	}
}
*/
import "C"
