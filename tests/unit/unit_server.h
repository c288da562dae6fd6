/*
 * unit_server.h - tests/e2e/rangeserver.py as a child process of a unit test
 * (cmocka), for the HTTP tests of test_source_http and test_net.
 *
 * The binary must run from the repository root, as `make unit` does; a
 * server that does not start fails the test, it is never a skip.
 */
#ifndef MLFS_TESTS_UNIT_SERVER_H
#define MLFS_TESTS_UNIT_SERVER_H

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/unit.h"

#define UNIT_PYTHON "/usr/bin/python3"
#define UNIT_SERVER "tests/e2e/rangeserver.py"

/* A rangeserver.py child. */
struct unit_server {
	pid_t pid;
	int port;
};

/*
 * Starts rangeserver.py over @root with the extra arguments @extra (NULL-
 * terminated, may be NULL) and reads its "PORT n" line. Fails the test when
 * it cannot.
 */
static inline void unit_server_start(struct unit_server *sv, const char *root,
				     const char *const *extra)
{
	const char *argv[24] = {UNIT_PYTHON, UNIT_SERVER, "--root", root, "--port", "0"};
	int p[2], n = 6;
	char line[64] = "";
	size_t len = 0;

	while (extra && *extra && n < 22)
		argv[n++] = *extra++;
	argv[n] = NULL;
	if (access(UNIT_PYTHON, X_OK) || access(UNIT_SERVER, R_OK)) {
		print_error("cannot run %s %s (run from the repository root)\n", UNIT_PYTHON,
			    UNIT_SERVER);
		fail();
	}
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	sv->pid = fork();
	assert_true(sv->pid >= 0);
	if (sv->pid == 0) {
		dup2(p[1], 1);
		execv(UNIT_PYTHON, (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	/* Up to 15 s for the first line. */
	for (int waited = 0; !memchr(line, '\n', len) && len + 1 < sizeof(line) && waited < 150;) {
		struct pollfd pfd = {.fd = p[0], .events = POLLIN};
		if (poll(&pfd, 1, 100) == 0) {
			waited++;
			continue;
		}
		ssize_t got = read(p[0], line + len, sizeof(line) - 1 - len);
		if (got <= 0)
			break;
		len += (size_t)got;
		line[len] = 0;
	}
	close(p[0]);
	if (sscanf(line, "PORT %d", &sv->port) != 1 || sv->port <= 0) {
		print_error("%s did not start (first line \"%s\")\n", UNIT_SERVER, line);
		kill(sv->pid, SIGKILL);
		waitpid(sv->pid, NULL, 0);
		sv->pid = -1;
		fail();
	}
}

/* Stops @sv if it runs (SIGTERM, then waits for it). */
static inline void unit_server_stop(struct unit_server *sv)
{
	if (sv->pid <= 0)
		return;
	kill(sv->pid, SIGTERM);
	waitpid(sv->pid, NULL, 0);
	sv->pid = -1;
}

#endif
