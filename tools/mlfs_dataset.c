/*
 * mlfs_dataset.c - `mlfs dataset index`: an index.json for a folder of raw
 * shards of fixed-size records (docs/dataset.md).
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ptc/ptc.h"
#include "tools/tools.h"

#define USAGE "usage: mlfs dataset index DIR --dtype D --shape N[,N...] [--out FILE]\n"

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

/* "129" or "2,64" into @shape; the number of sizes (at most PTC_MAX_DIMS - 1:
 * a view adds the batch) or -1. */
static int parse_shape(const char *s, int64_t *shape)
{
	int n = 0;
	while (*s) {
		char *end;
		errno = 0;
		long long v = strtoll(s, &end, 10);
		if (end == s || errno || v < 1 || v > ((int64_t)1 << 30) || n == PTC_MAX_DIMS - 1 ||
		    (*end && *end != ','))
			return -1;
		shape[n++] = v;
		s = *end ? end + 1 : end;
	}
	return n;
}

static int index_dir(const char *dir, enum ptc_dtype dt, int ndim, const int64_t *shape,
		     const char *out)
{
	char real[PATH_MAX], outreal[PATH_MAX], path[PATH_MAX + 256];
	struct dirent **names;
	int64_t rec = (int64_t)ptc_dtype_size(dt), total = 0;
	int rc = 1;

	for (int d = 0; d < ndim; d++)
		rec *= shape[d];
	if (rec > ((int64_t)1 << 30)) {
		fprintf(stderr, "mlfs dataset index: records of %" PRId64 " bytes are too large\n",
			rec);
		return 1;
	}
	if (!realpath(dir, real)) {
		fprintf(stderr, "mlfs dataset index: %s: %s\n", dir, strerror(errno));
		return 1;
	}
	char outpath[PATH_MAX + 32];
	snprintf(outpath, sizeof(outpath), "%s/index.json", real);
	if (out)
		snprintf(outpath, sizeof(outpath), "%s", out);
	/* URIs relative to the index when it lies in DIR, else absolute. */
	char *slash = strrchr(outpath, '/');
	bool relative = true;
	if (out) {
		char od[PATH_MAX];
		snprintf(od, sizeof(od), "%.*s", slash ? (int)(slash - outpath) : 1,
			 slash ? outpath : ".");
		relative = realpath(od[0] ? od : "/", outreal) && strcmp(outreal, real) == 0;
	}
	const char *outbase = slash ? slash + 1 : outpath;
	int n = scandir(real, &names, NULL, by_name);
	if (n < 0) {
		fprintf(stderr, "mlfs dataset index: %s: %s\n", real, strerror(errno));
		return 1;
	}
	json_t *shards = json_array(), *idx = NULL;
	int bad = 0;
	for (int i = 0; i < n; i++) {
		const char *name = names[i]->d_name;
		struct stat sb;
		snprintf(path, sizeof(path), "%s/%s", real, name);
		if (name[0] == '.' || strcmp(name, "index.json") == 0 ||
		    (relative && strcmp(name, outbase) == 0) || stat(path, &sb) ||
		    !S_ISREG(sb.st_mode))
			continue;
		if (sb.st_size % rec) {
			fprintf(stderr,
				"mlfs dataset index: %s: %jd bytes is not a multiple of the record "
				"size %" PRId64 " (%s x %d dims)\n",
				path, (intmax_t)sb.st_size, rec, ptc_dtype_name(dt), ndim);
			bad++;
			continue;
		}
		char uri[PATH_MAX + 300];
		snprintf(uri, sizeof(uri), "%s%s", relative ? "" : "file://",
			 relative ? name : path);
		json_array_append_new(shards, json_pack("{sssI}", "uri", uri, "count",
							(json_int_t)(sb.st_size / rec)));
		total += sb.st_size / rec;
	}
	for (int i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (bad)
		goto out;
	if (json_array_size(shards) == 0 || total == 0) {
		fprintf(stderr, "mlfs dataset index: %s holds no records\n", real);
		goto out;
	}
	json_t *jshape = json_array();
	for (int d = 0; d < ndim; d++)
		json_array_append_new(jshape, json_integer(shape[d]));
	size_t nshards = json_array_size(shards);
	idx = json_pack("{sssssoso}", "records", "fixed", "dtype", ptc_dtype_name(dt), "shape",
			jshape, "shards", shards);
	shards = NULL;
	/* A new file beside @outpath, never one planted at a predictable name. */
	char tmp[PATH_MAX + 64];
	int fd = tools_create_tmp(outpath, tmp, sizeof(tmp)), err = fd < 0 ? errno : 0;
	errno = 0;
	if (!err && json_dumpfd(idx, fd, JSON_INDENT(1)))
		err = errno ? errno : EIO;
	if (fd >= 0 && close(fd) && !err)
		err = errno;
	if (!err && rename(tmp, outpath))
		err = errno;
	if (err) {
		fprintf(stderr, "mlfs dataset index: cannot write %s: %s\n", outpath,
			strerror(err));
		if (fd >= 0)
			unlink(tmp);
		goto out;
	}
	printf("%s: %zu shards, %" PRId64 " records of %s [", outpath, nshards, total,
	       ptc_dtype_name(dt));
	for (int d = 0; d < ndim; d++)
		printf("%s%" PRId64, d ? ", " : "", shape[d]);
	printf("] (%" PRId64 " bytes each)\n", rec);
	rc = 0;
out:
	json_decref(shards);
	json_decref(idx);
	return rc;
}

int cmd_dataset(int argc, char **argv)
{
	static const struct option opts[] = {{"dtype", required_argument, NULL, 'd'},
					     {"shape", required_argument, NULL, 's'},
					     {"out", required_argument, NULL, 'o'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	const char *dtype = NULL, *out = NULL;
	int64_t shape[PTC_MAX_DIMS];
	int ndim = -1, c;
	enum ptc_dtype dt;

	if (argc < 2 || strcmp(argv[1], "index") != 0) {
		if (argc >= 2 && strcmp(argv[1], "--help") == 0) {
			printf(USAGE);
			return 0;
		}
		fprintf(stderr, USAGE);
		return 2;
	}
	argc--;
	argv++;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'd':
			dtype = optarg;
			break;
		case 's':
			if ((ndim = parse_shape(optarg, shape)) < 0) {
				fprintf(stderr,
					"mlfs dataset index: --shape \"%s\" is not a list of "
					"positive sizes (at most %d)\n",
					optarg, PTC_MAX_DIMS - 1);
				return 2;
			}
			break;
		case 'o':
			out = optarg;
			break;
		case 'h':
			printf(USAGE);
			return 0;
		default:
			return 2;
		}
	}
	if (optind != argc - 1 || !dtype || ndim < 0) {
		fprintf(stderr, USAGE);
		return 2;
	}
	if (ptc_dtype_parse(dtype, &dt)) {
		fprintf(stderr, "mlfs dataset index: --dtype \"%s\" is not a dtype\n", dtype);
		return 2;
	}
	return index_dir(argv[optind], dt, ndim, shape, out);
}
