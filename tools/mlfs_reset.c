/*
 * mlfs_reset.c - `mlfs reset --cluster cluster.json`: a job of many nodes
 * started afresh, once every node is down (cluster/mlfs_reset.c says what
 * goes). For a job whose nodes all restarted without their memory: they
 * are "lost", and no config may make their zero-filled partitions the
 * job's state; after a reset the operator mounts them again, writes a
 * config and imports a checkpoint.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster.h"
#include "ptc/ptc.h"
#include "tools/tools.h"

int cmd_reset(int argc, char **argv)
{
	static const struct option opts[] = {{"cluster", required_argument, NULL, 'c'},
					     {NULL, 0, NULL, 0}};
	const char *path = NULL;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "c:", opts, NULL)) != -1) {
		if (c != 'c')
			return 2;
		path = optarg;
	}
	if (!path || optind != argc) {
		fprintf(stderr, "usage: mlfs reset --cluster cluster.json\n");
		return 2;
	}
	struct ptc_cluster *cl = NULL;
	struct ptc_error err = {.text = ""};
	if (TOOLS_LOAD(path, ptc_cluster_parse_text, &cl))
		return 1;
	int rc;
	json_t *removed = json_array();
	rc = mlfs_cluster_reset(cl, removed, &err);
	if (rc) {
		fprintf(stderr, "mlfs reset: %s\n", err.text);
	} else {
		size_t i;
		json_t *k;
		printf("job \"%s\" reset: its schema and nodes stay; mount them, write "
		       "config.json and import a checkpoint\n",
		       cl->job);
		json_array_foreach(removed, i, k) printf("  removed %s\n", json_string_value(k));
	}
	json_decref(removed);
	ptc_cluster_free(cl);
	return rc ? 1 : 0;
}

int cmd_resume(int argc, char **argv)
{
	static const struct option opts[] = {{"cluster", required_argument, NULL, 'c'},
					     {"from", required_argument, NULL, 'f'},
					     {"wait", required_argument, NULL, 'w'},
					     {NULL, 0, NULL, 0}};
	const char *path = NULL, *from = NULL;
	int c, wait_s = 600;

	optind = 1;
	while ((c = getopt_long(argc, argv, "c:f:w:", opts, NULL)) != -1) {
		if (c == 'c')
			path = optarg;
		else if (c == 'f')
			from = optarg;
		else if (c == 'w' && (wait_s = atoi(optarg)) > 0 && wait_s <= 86400)
			;
		else
			return 2;
	}
	if (!path || optind != argc) {
		fprintf(
		    stderr,
		    "usage: mlfs resume --cluster cluster.json [--from DIR] [--wait SECONDS]\n");
		return 2;
	}
	struct ptc_cluster *cl = NULL;
	struct ptc_error err = {.text = ""};
	if (TOOLS_LOAD(path, ptc_cluster_parse_text, &cl))
		return 1;
	int rc;
	char abs[PATH_MAX];
	if (from && !realpath(from, abs)) {
		fprintf(stderr, "mlfs resume: %s: %s\n", from, strerror(errno));
		ptc_cluster_free(cl);
		return 1;
	}
	json_t *out = json_object();
	rc = mlfs_cluster_resume(cl, from ? abs : NULL, wait_s, out, &err);
	if (json_is_string(json_object_get(out, "dir")))
		printf("job \"%s\": version %" JSON_INTEGER_FORMAT
		       " restored from %s (step %" JSON_INTEGER_FORMAT ")\n",
		       cl->job, json_integer_value(json_object_get(out, "version")),
		       json_string_value(json_object_get(out, "dir")),
		       json_integer_value(json_object_get(out, "step")));
	const char *id;
	json_t *v;
	json_object_foreach(json_object_get(out, "nodes"), id, v)
	    printf("  %-16s %s\n", id, json_string_value(v));
	if (rc)
		fprintf(stderr, "mlfs resume: %s\n", err.text);
	json_decref(out);
	ptc_cluster_free(cl);
	return rc ? 1 : 0;
}
