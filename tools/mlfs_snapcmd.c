/*
 * mlfs_snapcmd.c - `mlfs snapshot <mnt> --to DIR`: asks the node behind the
 * mount (.mlfs-ctl {"op": "snapshot"}) to write the job's saved step into
 * DIR (store/mlfs_snapshot.c); prints what it wrote. The node hosting rank
 * 0 writes manifest.json last, once every node's files are there: in a job
 * of many nodes, run it on every node against a DIR they all reach.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mount/mount.h"
#include "ptc/ptc.h"
#include "tools/tools.h"

int cmd_snapshot(int argc, char **argv)
{
	static const struct option opts[] = {{"to", required_argument, NULL, 't'},
					     {"level", required_argument, NULL, 'l'},
					     {"wait", required_argument, NULL, 'w'},
					     {NULL, 0, NULL, 0}};
	const char *to = NULL;
	long level = -100, wait = -1;
	char *end;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			to = optarg;
			break;
		case 'l':
			level = strtol(optarg, &end, 10);
			if (*end || level < -7 || level > 19) {
				fprintf(stderr, "mlfs snapshot: --level \"%s\": -7 to 19\n",
					optarg);
				return 2;
			}
			break;
		case 'w':
			wait = strtol(optarg, &end, 10);
			if (*end || wait < 0 || wait > 86400) {
				fprintf(stderr, "mlfs snapshot: --wait \"%s\": 0 to 86400\n",
					optarg);
				return 2;
			}
			break;
		default:
			return 2;
		}
	}
	if (optind != argc - 1 || !to) {
		fprintf(stderr,
			"usage: mlfs snapshot <mnt> --to DIR [--level N] [--wait SECONDS]\n");
		return 2;
	}
	char dir[PATH_MAX];
	if (mkdir(to, 0755) && errno != EEXIST) {
		fprintf(stderr, "mlfs snapshot: %s: %s\n", to, strerror(errno));
		return 1;
	}
	if (!realpath(to, dir)) {
		fprintf(stderr, "mlfs snapshot: %s: %s\n", to, strerror(errno));
		return 1;
	}
	json_t *req = json_pack("{ssss}", "op", "snapshot", "to", dir);
	if (level != -100)
		json_object_set_new(req, "level", json_integer(level));
	if (wait >= 0)
		json_object_set_new(req, "wait", json_integer(wait));
	json_t *r = req ? tools_control(argv[optind], req, 4096, "snapshot") : NULL;
	json_decref(req);
	if (!r)
		return 1;
	json_int_t bytes = json_integer_value(json_object_get(r, "bytes"));
	json_int_t zbytes = json_integer_value(json_object_get(r, "compressed"));
	printf("step %" JSON_INTEGER_FORMAT ": this node wrote %" JSON_INTEGER_FORMAT
	       " files, %" JSON_INTEGER_FORMAT " bytes as %" JSON_INTEGER_FORMAT
	       " (zstd level %" JSON_INTEGER_FORMAT ") in %.3f s",
	       json_integer_value(json_object_get(r, "step")),
	       json_integer_value(json_object_get(r, "node_files")), bytes, zbytes,
	       json_integer_value(json_object_get(r, "level")),
	       json_real_value(json_object_get(r, "seconds")));
	if (json_is_true(json_object_get(r, "manifest")))
		printf("; %s/manifest.json written (%" JSON_INTEGER_FORMAT " files)\n", dir,
		       json_integer_value(json_object_get(r, "files")));
	else
		printf("; the node hosting rank 0 writes the manifest\n");
	json_decref(r);
	return 0;
}
