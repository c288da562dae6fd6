/*
 * mlfs_verify.c - `mlfs verify <mnt>`: asks the node behind the mount
 * (.mlfs-ctl {"op": "verify"}) to hash every partition it holds again and
 * compare each with the checksum kept since the partition was committed;
 * prints the mismatches, exit status 1 when there is any.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mount/mount.h"
#include "ptc/ptc.h"
#include "tools/tools.h"

/* The reply of a verify can list every partition of the node. */
#define VERIFY_REPLY_MAX (4 << 20)

int cmd_verify(int argc, char **argv)
{
	const char *req = "{\"op\":\"verify\"}";
	char path[4096];

	if (argc != 2 || argv[1][0] == '-') {
		fprintf(stderr, "usage: mlfs verify <mnt>\n");
		return 2;
	}
	snprintf(path, sizeof(path), "%s/%s", argv[1], MLFS_CTL_NAME);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "mlfs verify: %s: %s\n", path, strerror(errno));
		return 1;
	}
	ssize_t n = write(fd, req, strlen(req));
	int err = n < 0 ? errno : 0;
	char *reply = malloc(VERIFY_REPLY_MAX);
	ssize_t got = reply ? pread(fd, reply, VERIFY_REPLY_MAX - 1, 0) : -1;
	close(fd);
	json_t *r = got > 0 ? json_loadb(reply, (size_t)got, 0, NULL) : NULL;
	free(reply);
	if (err || !json_is_true(json_object_get(r, "ok"))) {
		const char *e = json_string_value(json_object_get(r, "error"));
		fprintf(stderr, "mlfs verify: %s\n", e && *e ? e : strerror(err ? err : EIO));
		json_decref(r);
		return 1;
	}
	json_t *bad = json_object_get(r, "mismatches");
	size_t i;
	json_t *m;
	json_array_foreach(bad, i, m)
	{
		printf("MISMATCH rank %" JSON_INTEGER_FORMAT " %s/%s: %" JSON_INTEGER_FORMAT
		       " bytes hash to %s, committed as %s\n",
		       json_integer_value(json_object_get(m, "rank")),
		       json_string_value(json_object_get(m, "state")),
		       json_string_value(json_object_get(m, "tensor")),
		       json_integer_value(json_object_get(m, "bytes")),
		       json_string_value(json_object_get(m, "now")),
		       json_string_value(json_object_get(m, "stored")));
	}
	printf("verified %" JSON_INTEGER_FORMAT " partitions (%" JSON_INTEGER_FORMAT
	       " bytes) of layout version %" JSON_INTEGER_FORMAT ": %zu mismatch%s\n",
	       json_integer_value(json_object_get(r, "partitions")),
	       json_integer_value(json_object_get(r, "bytes")),
	       json_integer_value(json_object_get(r, "version")), json_array_size(bad),
	       json_array_size(bad) == 1 ? "" : "es");
	int rc = json_array_size(bad) ? 1 : 0;
	json_decref(r);
	return rc;
}
