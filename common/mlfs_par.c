/*
 * mlfs_par.c - a parallel loop: one worker function run by the caller and
 * up to n - 1 threads started for the call, all joined before it returns.
 * The workers share their work through @arg (typically an atomic index
 * into an array of items); a thread that cannot be started only makes the
 * loop slower, never wrong.
 */
#include <pthread.h>

#include "common/common.h"

int mlfs_par_run(int n, void *(*worker)(void *), void *arg)
{
	pthread_t tid[MLFS_PAR_MAX];
	int started = 0;

	if (n > MLFS_PAR_MAX)
		n = MLFS_PAR_MAX;
	while (started + 1 < n && !pthread_create(&tid[started], NULL, worker, arg))
		started++;
	worker(arg);
	for (int i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	return started + 1;
}
