/*
 * mlfs_drain.c - `mlfs drain <mnt> NODE [--undo]`: marks a node of the job
 * for draining (the node behind the mount puts etcd's drain/<id>): with
 * "elastic" in the config, the job's controller lays the job out without
 * it, taking its state from it while it is up (docs/many-nodes.md). Also
 * tools_control, the request on a mount's control file that mlfs verify
 * and this command make.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mount/mount.h"
#include "ptc/ptc.h"
#include "tools/tools.h"

json_t *tools_control(const char *mnt, const json_t *req, size_t reply_max, const char *cmd)
{
	char path[4096], *text = json_dumps(req, JSON_COMPACT), *reply = malloc(reply_max);
	int err = text && reply ? 0 : ENOMEM;
	json_t *r = NULL;

	snprintf(path, sizeof(path), "%s/%s", mnt, MLFS_CTL_NAME);
	int fd = err ? -1 : open(path, O_RDWR | O_CLOEXEC);
	if (!err && fd < 0) {
		fprintf(stderr, "mlfs %s: %s: %s\n", cmd, path, strerror(errno));
		free(text);
		free(reply);
		return NULL;
	}
	if (fd >= 0) {
		if (write(fd, text, strlen(text)) < 0)
			err = errno;
		ssize_t got = pread(fd, reply, reply_max - 1, 0);
		close(fd);
		r = got > 0 ? json_loadb(reply, (size_t)got, 0, NULL) : NULL;
	}
	free(text);
	free(reply);
	if (err || !json_is_true(json_object_get(r, "ok"))) {
		const char *e = json_string_value(json_object_get(r, "error"));
		fprintf(stderr, "mlfs %s: %s\n", cmd, e && *e ? e : strerror(err ? err : EIO));
		json_decref(r);
		return NULL;
	}
	return r;
}

int cmd_drain(int argc, char **argv)
{
	bool undo = argc == 4 && strcmp(argv[3], "--undo") == 0;
	if ((argc != 3 && !undo) || argv[1][0] == '-' || argv[2][0] == '-') {
		fprintf(stderr, "usage: mlfs drain <mnt> NODE [--undo]\n");
		return 2;
	}
	json_t *req = json_pack("{sssssb}", "op", "drain", "node", argv[2], "undo", undo);
	json_t *r = req ? tools_control(argv[1], req, 65536, "drain") : NULL;
	json_decref(req);
	if (!r)
		return 1;
	printf(undo ? "node %s: no longer marked for draining\n"
		    : "node %s: marked for draining (an elastic job lays itself out without it)\n",
	       argv[2]);
	json_decref(r);
	return 0;
}
