// The job-exec helper in C: see jobexec_cgo.go for why it is not Go, and
// jobexec.go and spare.go for the agent's side of both of its forms.
//
// It runs as a constructor of the agent binary, before the Go runtime
// starts, when argv[1] asks for it, and never returns then: it enters the
// job's cgroups, takes the job's stdio, drops the capabilities and the
// credentials and executes the command. Every failure is reported on
// descriptor 3 as "<errno> <context>" (the agent adds the errno's text:
// helperStatus) and ends the helper with status 127.
//
// Security boundary: it runs as root with the agent's capabilities and
// reads only what the agent wrote (its argv, or one message on a
// socketpair no command can reach); a job that does not keep the
// capabilities execs with empty bounding, ambient, permitted, effective and
// inheritable sets, and no_new_privs (inherited from PID 1) keeps setuid
// binaries and file capabilities from giving any back.

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jobexec.h"

// The helper's descriptor to the agent: the status pipe of a direct start,
// the socketpair end of a spare.
#define CTL_FD 3

// Bounds of a spare's command message (spareMaxSpec in spare.go).
#define SPEC_MAX (64 << 10)
#define SPEC_MAX_STRINGS 8192

static char spec_buf[SPEC_MAX + 1];
static char *spec_argv[SPEC_MAX_STRINGS + 1];
static char *spec_env[SPEC_MAX_STRINGS + 1];

// fail reports errno err and a context, then exits 127 without running
// anything else of the process (no atexit handlers, no stdio flush).
static void fail(int err, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail(int err, const char *fmt, ...) {
	char msg[4096];
	int n = snprintf(msg, sizeof msg, "%d ", err);
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && n < (int)sizeof msg) {
		int m = vsnprintf(msg + n, sizeof msg - n, fmt, ap);
		n = m < 0 ? n : (n + m < (int)sizeof msg ? n + m : (int)sizeof msg - 1);
	}
	va_end(ap);
	ssize_t w;
	do {
		w = write(CTL_FD, msg, n);
	} while (w < 0 && errno == EINTR);
	_exit(127);
}

// parse_id reads a uid or gid: decimal, 0 to 2^31-2 (credential in spawn.go).
static int parse_id(const char *s, unsigned int *out) {
	if (*s == 0) {
		return -1;
	}
	unsigned long v = 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9') {
			return -1;
		}
		v = v * 10 + (unsigned long)(*s - '0');
		if (v > 0x7ffffffeUL) {
			return -1;
		}
	}
	*out = (unsigned int)v;
	return 0;
}

// enter_cgroups writes the helper into each cgroup.procs file of the
// comma-separated list ("0" is the writing process: the whole thread group
// moves). list is modified.
static void enter_cgroups(char *list) {
	if (*list == 0) {
		return;
	}
	for (char *f = strtok(list, ","); f != NULL; f = strtok(NULL, ",")) {
		int fd = open(f, O_WRONLY | O_CLOEXEC);
		if (fd < 0) {
			fail(errno, "enter job cgroup: open %s", f);
		}
		ssize_t w;
		do {
			w = write(fd, "0", 1);
		} while (w < 0 && errno == EINTR);
		if (w != 1) {
			fail(w < 0 ? errno : EIO, "enter job cgroup: write %s", f);
		}
		close(fd);
	}
}

// become_and_exec drops to the job's credentials, enters dir and executes
// path (becomeAndExec in jobexec.go said the same in Go).
static void become_and_exec(unsigned int uid, unsigned int gid, int keep_caps, const char *dir, const char *path,
			    char **argv, char **env) __attribute__((noreturn));
static void become_and_exec(unsigned int uid, unsigned int gid, int keep_caps, const char *dir, const char *path,
			    char **argv, char **env) {
	// Make the OOM killer pick the command rather than the agent; raising
	// one's own score needs no privilege, and the file is still ours here.
	// Failure only costs that preference.
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t w = write(fd, JOBEXEC_OOM_SCORE_ADJ, sizeof JOBEXEC_OOM_SCORE_ADJ - 1);
		(void)w;
		close(fd);
	}
	if (!keep_caps) {
		// The ambient and bounding sets: PR_CAPBSET_DROP needs CAP_SETPCAP,
		// which the agent holds for this; it answers EINVAL past the
		// kernel's last capability.
		if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) {
			fail(errno, "clear ambient capabilities");
		}
		for (int c = 0;; c++) {
			if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) == 0) {
				continue;
			}
			if (errno == EINVAL && c > 0) {
				break;
			}
			fail(errno, "drop capability %d from the bounding set", c);
		}
	}
	// Raw system calls: the helper has one thread, and glibc's wrappers
	// would broadcast to threads that do not exist. Switching to a non-zero
	// uid clears the permitted and effective sets; the supplementary
	// groups are reset to the command's gid.
	gid_t groups[1] = {gid};
	if (syscall(SYS_setgroups, 1, groups) != 0) {
		fail(errno, "setgroups");
	}
	if (syscall(SYS_setresgid, gid, gid, gid) != 0) {
		fail(errno, "setgid");
	}
	if (syscall(SYS_setresuid, uid, uid, uid) != 0) {
		fail(errno, "setuid");
	}
	// With the job's credentials, so a directory only the job's user may
	// enter works and one it may not fails, whatever the agent may.
	if (chdir(dir) != 0) {
		fail(errno, "chdir %s", dir);
	}
	execve(path, argv, env);
	fail(errno, "%s", "");
}

// job_exec is the direct form:
//
//	agent __job-exec <uid> <gid> <keep|drop> <dir> <procs,...> <path> <argv...>
//
// with the status pipe on descriptor 3 and the command's environment as its own.
static void job_exec(int argc, char **argv, char **envp) {
	fcntl(CTL_FD, F_SETFD, FD_CLOEXEC);
	unsigned int uid, gid;
	if (parse_id(argv[2], &uid) != 0 || parse_id(argv[3], &gid) != 0 ||
	    (strcmp(argv[4], "keep") != 0 && strcmp(argv[4], "drop") != 0)) {
		fail(EINVAL, "bad credentials \"%s\" \"%s\" \"%s\"", argv[2], argv[3], argv[4]);
	}
	(void)argc;
	enter_cgroups(argv[6]);
	become_and_exec(uid, gid, strcmp(argv[4], "keep") == 0, argv[5], argv[7], argv + 8, envp);
}

// spec_strings splits count NUL-terminated strings off *p (below end) into
// out (NULL-terminated); -1 if the message is short of them.
static int spec_strings(char **p, char *end, long count, char **out) {
	for (long i = 0; i < count; i++) {
		char *z = memchr(*p, 0, (size_t)(end - *p));
		if (z == NULL) {
			return -1;
		}
		out[i] = *p;
		*p = z + 1;
	}
	out[count] = NULL;
	return 0;
}

// spec_count reads one count field: decimal, at most SPEC_MAX_STRINGS.
static long spec_count(char **p, char *end) {
	char *f[1];
	unsigned int v;
	if (spec_strings(p, end, 1, f) != 0 || parse_id(f[0], &v) != 0 || v > SPEC_MAX_STRINGS) {
		return -1;
	}
	return v;
}

// spare is the spare form: agent __job-spare <procs,...>, with its end of
// the agent's SOCK_SEQPACKET pair on descriptor 3. It enters the cgroups,
// says "ready", waits for the command message (spareSpec.encode in
// spare.go) with the command's descriptors 0, 1 and 2, and becomes it.
static void spare(char **argv) {
	fcntl(CTL_FD, F_SETFD, FD_CLOEXEC);
	enter_cgroups(argv[2]);
	ssize_t w;
	do {
		w = write(CTL_FD, JOBEXEC_SPARE_READY, sizeof JOBEXEC_SPARE_READY - 1);
	} while (w < 0 && errno == EINTR);
	if (w < 0) {
		_exit(127);
	}

	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} oob;
	struct iovec iov = {.iov_base = spec_buf, .iov_len = SPEC_MAX};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = oob.buf, .msg_controllen = sizeof oob.buf};
	ssize_t n;
	do {
		n = recvmsg(CTL_FD, &msg, MSG_CMSG_CLOEXEC);
	} while (n < 0 && errno == EINTR);
	if (n <= 0) {
		_exit(0); // the agent let it go
	}
	// Descriptors first: received ones are ours to place even if the
	// message is bad. They are above 3 (0–2 are /dev/null, 3 the control
	// socket), so the dups cannot clobber one another.
	if ((msg.msg_flags & MSG_TRUNC) != 0) {
		fail(EINVAL, "command message: longer than %d bytes", SPEC_MAX);
	}
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	if ((msg.msg_flags & MSG_CTRUNC) != 0 || c == NULL || c->cmsg_level != SOL_SOCKET ||
	    c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(3 * sizeof(int)) || CMSG_NXTHDR(&msg, c) != NULL) {
		fail(EINVAL, "command descriptors: want 3 in one message");
	}
	int fds[3];
	memcpy(fds, CMSG_DATA(c), sizeof fds);
	for (int i = 0; i < 3; i++) {
		if (fds[i] <= CTL_FD) {
			fail(EINVAL, "command descriptors: got %d", fds[i]);
		}
	}
	for (int i = 0; i < 3; i++) {
		if (dup3(fds[i], i, 0) < 0) {
			fail(errno, "dup");
		}
	}
	for (int i = 0; i < 3; i++) {
		close(fds[i]);
	}

	// The message: "uid\0gid\0keep\0tty\0dir\0path\0argc\0argv…\0envc\0env…\0".
	char *p = spec_buf, *end = spec_buf + n;
	char *f[6];
	unsigned int uid, gid;
	if (spec_strings(&p, end, 6, f) != 0 || parse_id(f[0], &uid) != 0 || parse_id(f[1], &gid) != 0 ||
	    (strcmp(f[2], "0") != 0 && strcmp(f[2], "1") != 0) || (strcmp(f[3], "0") != 0 && strcmp(f[3], "1") != 0) ||
	    f[4][0] != '/' || f[5][0] == 0) {
		fail(EINVAL, "command message: bad header");
	}
	long argc = spec_count(&p, end);
	if (argc < 1 || spec_strings(&p, end, argc, spec_argv) != 0) {
		fail(EINVAL, "command message: bad argv");
	}
	long envc = spec_count(&p, end);
	if (envc < 0 || spec_strings(&p, end, envc, spec_env) != 0) {
		fail(EINVAL, "command message: bad environment");
	}
	if (p != end) {
		fail(EINVAL, "command message: %ld bytes after the environment", (long)(end - p));
	}
	if (strcmp(f[3], "1") == 0 && ioctl(0, TIOCSCTTY, 0) != 0) {
		fail(errno, "controlling terminal");
	}
	become_and_exec(uid, gid, strcmp(f[2], "1") == 0, f[4], f[5], spec_argv, spec_env);
}

// sandboxd_job_exec runs before the Go runtime (glibc calls constructors
// with main's arguments) and returns unless argv asks for the helper.
__attribute__((constructor)) static void sandboxd_job_exec(int argc, char **argv, char **envp) {
	if (argc == 3 && strcmp(argv[1], JOBEXEC_SPARE_ARG) == 0) {
		spare(argv);
	}
	if (argc >= 9 && strcmp(argv[1], JOBEXEC_ARG) == 0) {
		job_exec(argc, argv, envp);
	}
	// The agent: the Go runtime's threads (pthreads, as cgo makes them)
	// share one malloc arena instead of one each, which cost a page of
	// memory and the page tables of a 64 MiB reservation per thread.
	mallopt(M_ARENA_MAX, 1);
}
