/*
 * mlfs_verify.c - `mlfs verify <mnt>`: asks the node behind the mount
 * (.mlfs-ctl {"op": "verify"}) to hash every partition it holds again and
 * compare each with the checksum kept since the partition was committed;
 * prints the mismatches, exit status 1 when there is any.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc.h"
#include "tools/tools.h"

/* The reply of a verify can list every partition of the node. */
#define VERIFY_REPLY_MAX (4 << 20)

int cmd_verify(int argc, char **argv)
{
	if (argc != 2 || argv[1][0] == '-') {
		fprintf(stderr, "usage: mlfs verify <mnt>\n");
		return 2;
	}
	json_t *req = json_pack("{ss}", "op", "verify");
	json_t *r = req ? tools_control(argv[1], req, VERIFY_REPLY_MAX, "verify") : NULL;
	json_decref(req);
	if (!r)
		return 1;
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
