/*
 * mlfs_mapcopy.c - copies from shared file mappings that survive the file
 * shrinking under them: the SIGBUS of such a copy becomes -EIO.
 *
 * A copy sets this thread's guard (a sigjmp_buf) around its memcpy; our
 * SIGBUS handler jumps back to the guard when one is set, and otherwise
 * restores the previous disposition, which the fault then meets when the
 * instruction runs again (a SIGBUS outside our copies is not ours to
 * handle). The handler is (re)installed before copies, since a library or
 * test harness may have replaced it. Users: the dataset source's direct
 * reads (mlfs_srcdirect.c) and, through mlfs_mapcopy, the store's
 * import of checkpoint files.
 *
 * Threads: any; the guard is per thread, bus_lock (a leaf) serialises
 * installing the handler.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "common/common.h"

/* The guard of this thread's copy from a mapping, while one runs. */
static __thread sigjmp_buf
    *volatile bus_guard; /* volatile: memcpy does not read it, the handler does */
static struct sigaction bus_prev;
static pthread_mutex_t bus_lock = PTHREAD_MUTEX_INITIALIZER;

static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
	(void)sig, (void)si, (void)ctx;
	if (bus_guard)
		siglongjmp(*bus_guard, 1);
	/* Not a guarded copy: back to the previous disposition, which the
	 * fault meets when the instruction runs again. */
	sigaction(SIGBUS, &bus_prev, NULL);
}

static bool bus_ours(void)
{
	struct sigaction cur;

	return sigaction(SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
	       cur.sa_sigaction == on_sigbus;
}

void mlfs_mapcopy_guard(void)
{
	struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};

	if (bus_ours())
		return;
	sigemptyset(&sa.sa_mask);
	pthread_mutex_lock(&bus_lock);
	if (!bus_ours())
		sigaction(SIGBUS, &sa, &bus_prev);
	pthread_mutex_unlock(&bus_lock);
}

int mlfs_mapcopy_raw(void *dst, const uint8_t *src, size_t len)
{
	sigjmp_buf jb;

	if (sigsetjmp(jb, 0)) { /* 0: no sigprocmask call per copy */
		sigset_t bus;
		bus_guard = NULL;
		sigemptyset(&bus);
		sigaddset(&bus, SIGBUS); /* blocked since the handler ran */
		pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
		return -EIO;
	}
	bus_guard = &jb;
	atomic_signal_fence(memory_order_seq_cst); /* the copy stays inside */
	memcpy(dst, src, len);
	atomic_signal_fence(memory_order_seq_cst);
	bus_guard = NULL;
	return 0;
}

int mlfs_mapcopy(void *dst, const void *src, size_t len)
{
	mlfs_mapcopy_guard();
	return mlfs_mapcopy_raw(dst, src, len);
}
