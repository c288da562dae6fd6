/*
 * mlfs_mount.c - the commands that talk to a mount: mount, umount, status,
 * reconfigure, import, export.
 *
 * Everything goes through the mount's files (config.json, status.json,
 * full/, the control file), so these commands need no other channel to the
 * daemon and work from any process that sees the mount.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mount/mount.h"
#include "ptc/ptc.h"
#include "tools/tools.h"

/* Parses "123", "64M", "2G", "1T" (binary units). -1 on error. */
static int64_t parse_bytes(const char *s)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	int shift = 0;
	if (errno || v <= 0 || end == s)
		return -1;
	switch (*end) {
	case 'K':
	case 'k':
		shift = 10;
		end++;
		break;
	case 'M':
	case 'm':
		shift = 20;
		end++;
		break;
	case 'G':
	case 'g':
		shift = 30;
		end++;
		break;
	case 'T':
	case 't':
		shift = 40;
		end++;
		break;
	}
	if (*end == 'i' || *end == 'B')
		end++;
	if (*end == 'B')
		end++;
	if (*end || v > (INT64_MAX >> shift))
		return -1;
	return (int64_t)v << shift;
}

/* Parses whole seconds in [1, @max] into *@ms; false if it is not. */
static bool parse_seconds(const char *s, int max, int *ms)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 1 || v > max)
		return false;
	*ms = (int)v * 1000;
	return true;
}

int cmd_mount(int argc, char **argv)
{
	static const struct option opts[] = {{"node", required_argument, NULL, 'n'},
					     {"cluster", required_argument, NULL, 'c'},
					     {"max-memory", required_argument, NULL, 'm'},
					     {"threads", required_argument, NULL, 't'},
					     {"foreground", no_argument, NULL, 'f'},
					     {"data-cache", required_argument, NULL, 'D'},
					     {"prefetch", required_argument, NULL, 'P'},
					     {"http-timeout", required_argument, NULL, 'T'},
					     {"http-deadline", required_argument, NULL, 'L'},
					     {"log-level", required_argument, NULL, 'l'},
					     {"token-file", required_argument, NULL, 'K'},
					     {"peer-listen", required_argument, NULL, 'A'},
					     {NULL, 0, NULL, 0}};
	struct mlfs_options o = {.prefetch = -1};
	char *end;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "f", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			o.node_id = optarg;
			break;
		case 'K':
			o.token_file = optarg;
			break;
		case 'A':
			o.peer_listen = optarg;
			break;
		case 'c':
			o.cluster_path = optarg;
			break;
		case 'f':
			o.foreground = true;
			break;
		case 'm':
			if ((o.max_memory = parse_bytes(optarg)) < 0) {
				fprintf(stderr, "mlfs mount: --max-memory \"%s\" is not a size\n",
					optarg);
				return 2;
			}
			break;
		case 'D':
			if ((o.data_cache = parse_bytes(optarg)) < 0) {
				fprintf(stderr, "mlfs mount: --data-cache \"%s\" is not a size\n",
					optarg);
				return 2;
			}
			break;
		case 'P':
			o.prefetch = (int)strtol(optarg, &end, 10);
			if (*end || end == optarg || o.prefetch < 0 || o.prefetch > 1024) {
				fprintf(stderr, "mlfs mount: --prefetch must be in [0, 1024]\n");
				return 2;
			}
			break;
		case 'T':
			if (!parse_seconds(optarg, 3600, &o.http_timeout_ms)) {
				fprintf(stderr,
					"mlfs mount: --http-timeout \"%s\" is not a whole "
					"number of seconds in [1, 3600]\n",
					optarg);
				return 2;
			}
			break;
		case 'L':
			if (!parse_seconds(optarg, 86400, &o.http_deadline_ms)) {
				fprintf(stderr,
					"mlfs mount: --http-deadline \"%s\" is not a whole "
					"number of seconds in [1, 86400]\n",
					optarg);
				return 2;
			}
			break;
		case 'l':
			if (mlfs_log_level_parse(optarg, &o.log_level)) {
				fprintf(stderr,
					"mlfs mount: --log-level \"%s\" is not one of error, "
					"warning, info, debug\n",
					optarg);
				return 2;
			}
			break;
		case 't':
			o.threads = atoi(optarg);
			if (o.threads < 1 || o.threads > 1024) {
				fprintf(stderr, "mlfs mount: --threads must be in [1, 1024]\n");
				return 2;
			}
			break;
		default:
			return 2;
		}
	}
	if (optind != argc - 1 || !o.node_id || !o.cluster_path) {
		fprintf(stderr,
			"usage: mlfs mount <mnt> --node ID --cluster cluster.json [-f] "
			"[--max-memory BYTES] [--threads N] [--data-cache BYTES] [--prefetch N] "
			"[--http-timeout SECONDS] [--http-deadline SECONDS] "
			"[--log-level error|warning|info|debug] [--token-file F] "
			"[--peer-listen HOST:PORT]\n");
		return 2;
	}
	o.mountpoint = argv[optind];
	return mlfs_daemon_run(&o);
}

static json_t *read_json(const char *mnt, const char *name);

/* <mnt>/<name> parsed by @parse into *@out; 0, or -1 (no message: the
 * mount may be gone). */
#define LOAD_MNT(mnt, name, parse, out)                                                            \
	({                                                                                         \
		char p_[PATH_MAX];                                                                 \
		size_t l_;                                                                         \
		struct ptc_error e_;                                                               \
		snprintf(p_, sizeof(p_), "%s/%s", (mnt), (name));                                  \
		char *t_ = access(p_, R_OK) == 0 ? tools_read_file(p_, &l_) : NULL;                \
		int r_ = t_ && parse(t_, l_, (name), (out), &e_) == 0 ? 0 : -1;                    \
		free(t_);                                                                          \
		r_;                                                                                \
	})

/*
 * What `mlfs umount` would lose: when this node's saved step is newer than
 * the newest snapshot it knows of (status.json "snapshots") and one of its
 * ranks has no copy on another node that is up (ptc_layout_sole_rank), a
 * warning naming the step into @msg, and 1; else 0. Anything unreadable
 * (a mount that is gone) gives 0: there is nothing to ask.
 */
static int loss_warning(const char *mnt, char *msg, size_t cap)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/status.json", mnt);
	if (access(path, R_OK))
		return 0;
	json_t *st = read_json(mnt, "status.json");
	json_t *step = json_object_get(st, "step");
	json_t *snaps = json_object_get(st, "snapshots");
	json_t *newest = json_object_get(snaps, "newest_step");
	struct ptc_schema *s = NULL;
	struct ptc_config *c = NULL;
	struct ptc_cluster *cl = NULL;
	struct ptc_layout l;
	bool have_layout = false, *up = NULL;
	int rc = 0;

	if (!json_is_integer(step) || json_integer_value(step) < 0 ||
	    (json_is_integer(newest) && json_integer_value(newest) >= json_integer_value(step)))
		goto out;
	if (LOAD_MNT(mnt, "schema.json", ptc_schema_parse_text, &s) ||
	    LOAD_MNT(mnt, "config.json", ptc_config_parse_text, &c) ||
	    LOAD_MNT(mnt, "cluster.json", ptc_cluster_parse_text, &cl))
		goto out;
	struct ptc_error err;
	if (ptc_layout_init(&l, s, c, cl, "config.json", &err))
		goto out;
	have_layout = true;
	int me = ptc_cluster_find(cl, json_string_value(json_object_get(st, "node")));
	if (me < 0 || !(up = calloc((size_t)cl->nnodes, sizeof(*up))))
		goto out;
	size_t i;
	json_t *n;
	json_array_foreach(json_object_get(json_object_get(st, "cluster"), "nodes"), i, n)
	{
		int k = ptc_cluster_find(cl, json_string_value(json_object_get(n, "id")));
		const char *state = json_string_value(json_object_get(n, "state"));
		if (k >= 0)
			up[k] = json_is_true(json_object_get(n, "up")) &&
				!(state && strcmp(state, "lost") == 0);
	}
	int r = ptc_layout_sole_rank(&l, me, up);
	if (r < 0)
		goto out;
	char snap[PATH_MAX + 64] = "there is no snapshot";
	if (json_is_integer(newest))
		snprintf(snap, sizeof(snap),
			 "the newest snapshot is step %" JSON_INTEGER_FORMAT " (%s)",
			 json_integer_value(newest),
			 json_string_value(json_object_get(snaps, "newest")));
	snprintf(msg, cap,
		 "mlfs umount: warning: node %s holds the only copy of step %" JSON_INTEGER_FORMAT
		 " of rank %d (no DP replica or backup on a node that is up), and %s: unmounting "
		 "loses it. Keep it first with `mlfs snapshot %s --to DIR`.\n",
		 cl->nodes[me].id, json_integer_value(step), r, snap, mnt);
	rc = 1;
out:
	free(up);
	if (have_layout)
		ptc_layout_release(&l);
	ptc_cluster_free(cl);
	ptc_config_free(c);
	ptc_schema_free(s);
	json_decref(st);
	return rc;
}

int cmd_umount(int argc, char **argv)
{
	bool force = argc == 3 && strcmp(argv[2], "--force") == 0;
	if (argc != 2 && !force) {
		fprintf(stderr, "usage: mlfs umount <mnt> [--force]\n");
		return 2;
	}
	char msg[2 * PATH_MAX + 512];
	if (!force && loss_warning(argv[1], msg, sizeof(msg))) {
		fputs(msg, stderr);
		if (isatty(STDIN_FILENO)) { /* a person: ask; a script goes on */
			char line[16] = "";
			fprintf(stderr, "Unmount anyway? [y/N] ");
			if (!fgets(line, sizeof(line), stdin) ||
			    (line[0] != 'y' && line[0] != 'Y')) {
				fprintf(stderr, "mlfs umount: %s stays mounted\n", argv[1]);
				return 1;
			}
		}
	}
	pid_t pid = fork();
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", "-u", argv[1], (char *)NULL);
		_exit(127);
	}
	int st = 0;
	if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	if (umount2(argv[1], 0) == 0)
		return 0;
	fprintf(stderr, "mlfs umount: %s: %s\n", argv[1], strerror(errno));
	return 1;
}

/* The JSON document in @t (@len bytes, taken over; NULL: the read failed
 * and said why), its text into *@text (the caller's; @text NULL: not
 * kept); NULL with a message naming @path on stderr. */
static json_t *json_of_text(char *t, size_t len, const char *path, char **text)
{
	if (!t)
		return NULL;
	json_error_t je;
	json_t *j = json_loadb(t, len, 0, &je);
	if (!j)
		fprintf(stderr, "mlfs: %s: %s\n", path, je.text);
	if (text && j)
		*text = t;
	else
		free(t);
	return j;
}

/* The JSON document read to the end of @f (@path for messages), as
 * json_of_text. */
static json_t *read_json_stream(FILE *f, const char *path, char **text)
{
	size_t len = 0;
	char *t = tools_read_stream(f, path, &len);
	return json_of_text(t, len, path, text);
}

/* Reads <mnt>/<name> as JSON; NULL with a message on failure. */
static json_t *read_json(const char *mnt, const char *name)
{
	char path[PATH_MAX];
	size_t len = 0;
	snprintf(path, sizeof(path), "%s/%s", mnt, name);
	char *t = tools_read_file(path, &len);
	return json_of_text(t, len, path, NULL);
}

/* status.json's "cluster" section as a table: one line per node. */
static void print_cluster(const json_t *c)
{
	size_t i;
	json_t *n;
	if (!json_is_object(c))
		return;
	printf("job %s, etcd %s\n", json_string_value(json_object_get(c, "job")),
	       json_string_value(json_object_get(c, "etcd")));
	printf("  %-16s %-5s %-8s %s\n", "node", "up", "version", "state");
	json_array_foreach(json_object_get(c, "nodes"), i, n)
	{
		json_t *v = json_object_get(n, "version");
		char ver[32] = "-";
		if (json_is_integer(v))
			snprintf(ver, sizeof(ver), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		printf("  %-16s %-5s %-8s %s\n", json_string_value(json_object_get(n, "id")),
		       json_is_true(json_object_get(n, "up")) ? "up" : "down", ver,
		       json_is_string(json_object_get(n, "state"))
			   ? json_string_value(json_object_get(n, "state"))
			   : "-");
	}
	const json_t *a = json_object_get(c, "attempt");
	if (json_is_object(a))
		printf("attempt: v%" JSON_INTEGER_FORMAT " -> v%" JSON_INTEGER_FORMAT
		       ", coordinator %s\n",
		       json_integer_value(json_object_get(a, "from")),
		       json_integer_value(json_object_get(a, "to")),
		       json_string_value(json_object_get(a, "coordinator")));
}

/* status.json's "snapshots": the newest complete one, and the periodic ones. */
static void print_snapshots(const json_t *sn)
{
	if (!json_is_object(sn))
		return;
	const json_t *step = json_object_get(sn, "newest_step");
	if (json_is_integer(step))
		printf("newest snapshot: step %" JSON_INTEGER_FORMAT " in %s\n",
		       json_integer_value(step), json_string_value(json_object_get(sn, "newest")));
	else
		printf("newest snapshot: none\n");
	if (!json_is_string(json_object_get(sn, "dir")))
		return;
	printf("periodic snapshots: every %" JSON_INTEGER_FORMAT
	       " steps into %s, %" JSON_INTEGER_FORMAT " kept; %" JSON_INTEGER_FORMAT
	       " written, %" JSON_INTEGER_FORMAT " skipped",
	       json_integer_value(json_object_get(sn, "every")),
	       json_string_value(json_object_get(sn, "dir")),
	       json_integer_value(json_object_get(sn, "keep")),
	       json_integer_value(json_object_get(sn, "written")),
	       json_integer_value(json_object_get(sn, "skipped")));
	if (json_is_integer(json_object_get(sn, "writing")))
		printf("; writing step %" JSON_INTEGER_FORMAT,
		       json_integer_value(json_object_get(sn, "writing")));
	printf("\n");
	if (json_is_string(json_object_get(sn, "error")))
		printf("snapshot error: %s\n", json_string_value(json_object_get(sn, "error")));
}

int cmd_status(int argc, char **argv)
{
	bool as_json = argc == 3 && strcmp(argv[2], "--json") == 0;
	if (argc != 2 && !as_json) {
		fprintf(stderr, "usage: mlfs status <mnt> [--json]\n");
		return 2;
	}
	json_t *s = read_json(argv[1], "status.json");
	if (!s)
		return 1;
	if (as_json) {
		json_dumpf(s, stdout, JSON_INDENT(1));
		printf("\n");
	} else {
		json_t *last = json_object_get(s, "last");
		printf("node %s: version %" JSON_INTEGER_FORMAT ", %s, step %" JSON_INTEGER_FORMAT
		       "\n",
		       json_string_value(json_object_get(s, "node")),
		       json_integer_value(json_object_get(s, "version")),
		       json_string_value(json_object_get(s, "state")),
		       json_integer_value(json_object_get(s, "step")));
		printf("memory: %" JSON_INTEGER_FORMAT " of %" JSON_INTEGER_FORMAT " bytes\n",
		       json_integer_value(json_object_get(s, "memory_used")),
		       json_integer_value(json_object_get(s, "memory_limit")));
		if (last)
			printf("last reconfiguration v%" JSON_INTEGER_FORMAT
			       " -> v%" JSON_INTEGER_FORMAT ": %" JSON_INTEGER_FORMAT
			       " bytes reused, %" JSON_INTEGER_FORMAT
			       " copied, %" JSON_INTEGER_FORMAT " fetched in %.3f s\n",
			       json_integer_value(json_object_get(last, "from_version")),
			       json_integer_value(json_object_get(last, "to_version")),
			       json_integer_value(json_object_get(last, "bytes_reused")),
			       json_integer_value(json_object_get(last, "bytes_copied")),
			       json_integer_value(json_object_get(last, "bytes_fetched")),
			       json_real_value(json_object_get(last, "seconds")));
		if (json_is_string(json_object_get(s, "error")))
			printf("error: %s\n", json_string_value(json_object_get(s, "error")));
		print_snapshots(json_object_get(s, "snapshots"));
		print_cluster(json_object_get(s, "cluster"));
	}
	json_decref(s);
	return 0;
}

/* Prints status.json's error for a refused write. */
static void print_status_error(const char *mnt, const char *what, int err)
{
	json_t *s = read_json(mnt, "status.json");
	const char *e = json_string_value(json_object_get(s, "error"));
	fprintf(stderr, "mlfs %s: %s\n", what, e ? e : strerror(err));
	json_decref(s);
}

/* Writes @len bytes to @path with one write and a close; 0 or errno. */
static int write_whole(const char *path, const char *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
	if (fd < 0)
		return errno;
	ssize_t n = write(fd, buf, len);
	int err = n < 0 ? errno : (size_t)n != len ? EIO : 0;
	if (close(fd) && !err)
		err = errno;
	return err;
}

/* Whether to wait for the other nodes before printing every node's outcome:
 * this node committed, and some node that is up does not show @version yet
 * (it swaps within a round of the control plane). At most 3 s from the
 * first call (*@since, ms), then the table is printed as it stands. */
static bool settling(const json_t *cluster, int64_t version, int64_t *since)
{
	struct timespec now;
	size_t i;
	json_t *n;

	clock_gettime(CLOCK_MONOTONIC, &now);
	int64_t ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
	if (!*since)
		*since = ms;
	if (ms - *since > 3000)
		return false;
	json_array_foreach(json_object_get(cluster, "nodes"), i,
			   n) if (json_is_true(json_object_get(n, "up")) &&
				  json_integer_value(json_object_get(n, "version")) <
				      version) return true;
	return false;
}

int cmd_reconfigure(int argc, char **argv)
{
	bool wait = !(argc == 4 && strcmp(argv[3], "--no-wait") == 0);
	if (argc != 3 && wait) {
		fprintf(stderr, "usage: mlfs reconfigure <mnt> new.json [--no-wait]\n");
		return 2;
	}
	const char *mnt = argv[1];
	size_t len;
	char *text = tools_read_file(argv[2], &len), path[PATH_MAX];
	if (!text)
		return 1;
	struct ptc_config *c;
	struct ptc_error perr;
	if (ptc_config_parse_text(text, len, argv[2], &c, &perr)) {
		fprintf(stderr, "mlfs reconfigure: %s\n", perr.text);
		free(text);
		return 1;
	}
	int64_t version = c->version;
	ptc_config_free(c);
	snprintf(path, sizeof(path), "%s/config.json", mnt);
	int err = write_whole(path, text, len);
	free(text);
	if (err) {
		print_status_error(mnt, "reconfigure", err);
		return 1;
	}
	if (!wait)
		return 0;
	bool tty = isatty(STDOUT_FILENO);
	struct timespec t0;
	int64_t idle_since = 0;
	char *prev = NULL;
	bool woke = false;
	int rc = 1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	snprintf(path, sizeof(path), "%s/status.json", mnt);
	for (;;) {
		/* status.json stays open until it changes (the mount wakes a
		 * poll of it: mlfs_op_poll), and is read again then */
		FILE *f = fopen(path, "rb");
		if (!f) {
			fprintf(stderr, "mlfs: %s: %s\n", path, strerror(errno));
			break;
		}
		char *stext = NULL;
		json_t *s = read_json_stream(f, path, &stext);
		if (!s) {
			fclose(f);
			break;
		}
		const char *state = json_string_value(json_object_get(s, "state"));
		int64_t v = json_integer_value(json_object_get(s, "version"));
		if (state && strcmp(state, "failed") == 0) {
			if (tty)
				printf("\n");
			fprintf(stderr, "mlfs reconfigure: %s\n",
				json_string_value(json_object_get(s, "error")));
			json_decref(s);
			free(stext);
			fclose(f);
			break;
		}
		if (state && strcmp(state, "idle") == 0 && v >= version &&
		    !settling(json_object_get(s, "cluster"), version, &idle_since)) {
			json_t *last = json_object_get(s, "last");
			if (tty)
				printf("\r%-72s\r", "");
			printf("version %" PRId64 ": %" JSON_INTEGER_FORMAT
			       " bytes reused, %" JSON_INTEGER_FORMAT
			       " copied, %" JSON_INTEGER_FORMAT " fetched in %.3f s\n",
			       v, json_integer_value(json_object_get(last, "bytes_reused")),
			       json_integer_value(json_object_get(last, "bytes_copied")),
			       json_integer_value(json_object_get(last, "bytes_fetched")),
			       json_real_value(json_object_get(last, "seconds")));
			print_cluster(json_object_get(s, "cluster")); /* every node's outcome */
			json_decref(s);
			free(stext);
			fclose(f);
			rc = 0;
			break;
		}
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		double dt =
		    (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
		if (tty && state) { /* live progress: phase, bytes, rate */
			int64_t done = json_integer_value(json_object_get(s, "progress_bytes"));
			int64_t total = json_integer_value(json_object_get(s, "progress_total"));
			printf("\r%-10s %12" PRId64 " / %-12" PRId64 " bytes  %8.1f MB/s  %5.1f s",
			       state, done, total, dt > 0 ? (double)done / dt / 1e6 : 0.0, dt);
			fflush(stdout);
		}
		json_decref(s);
		/* A wake-up that brought nothing new: the mount does not
		 * answer polls (every handle is always readable), so wait as
		 * a poller would: 5 ms for the first second, then 20 ms. */
		bool idle_wake = woke && prev && strcmp(prev, stext) == 0;
		free(prev);
		prev = stext;
		if (idle_wake) {
			struct timespec ts = {0, (dt < 1 ? 5 : 20) * 1000 * 1000};
			nanosleep(&ts, NULL);
			woke = false;
		} else {
			/* the progress and the other nodes' entries move
			 * without a wake-up: read again at least this often */
			struct pollfd p = {.fd = fileno(f), .events = POLLIN | POLLPRI};
			woke = poll(&p, 1, dt < 1 ? 20 : 100) > 0;
		}
		fclose(f);
	}
	free(prev);
	return rc;
}

int cmd_import(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"from", required_argument, NULL, 'f'},  {"step", required_argument, NULL, 's'},
	    {"state", required_argument, NULL, 't'}, {"names", required_argument, NULL, 'n'},
	    {"map", required_argument, NULL, 'm'},   {"every-node", no_argument, NULL, 'e'},
	    {"wait", required_argument, NULL, 'w'},  {NULL, 0, NULL, 0}};
	const char *from = NULL, *state = NULL, *names = NULL, *map = NULL;
	long long step = -1; /* the snapshot's, or 0 */
	int wait_ms = 600 * 1000;
	bool every = false;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			from = optarg;
			break;
		case 't':
			state = optarg;
			break;
		case 'n':
			names = optarg;
			break;
		case 'm':
			map = optarg;
			break;
		case 'e':
			every = true;
			break;
		case 'w':
			if (!parse_seconds(optarg, 86400, &wait_ms)) {
				fprintf(stderr,
					"mlfs import: --wait \"%s\" is not a number of "
					"seconds (1 to 86400)\n",
					optarg);
				return 2;
			}
			break;
		case 's': {
			char *end;
			step = strtoll(optarg, &end, 10);
			if (*end || step < 0) {
				fprintf(stderr, "mlfs import: --step \"%s\" is not a step\n",
					optarg);
				return 2;
			}
			break;
		}
		default:
			return 2;
		}
	}
	if (optind != argc - 1 || !from) {
		fprintf(stderr, "usage: mlfs import <mnt> --from DIR|F.safetensors [--step N] "
				"[--state NAME] [--names schema|hf] [--map FILE] [--every-node "
				"[--wait S]]\n");
		return 2;
	}
	char dir[PATH_MAX], mapabs[PATH_MAX];
	if (!realpath(from, dir) || (map && !realpath(map, mapabs))) {
		fprintf(stderr, "mlfs import: %s: %s\n", realpath(from, dir) ? map : from,
			strerror(errno));
		return 1;
	}
	json_t *req = json_pack("{ssss}", "op", "import", "from", dir);
	if (names)
		json_object_set_new(req, "names", json_string(names));
	if (map)
		json_object_set_new(req, "map", json_string(mapabs));
	if (step >= 0)
		json_object_set_new(req, "step", json_integer(step));
	if (state)
		json_object_set_new(req, "state", json_string(state));
	if (every)
		json_object_set_new(req, "every_node", json_true()),
		    json_object_set_new(req, "wait", json_integer(wait_ms / 1000));
	json_t *r = req ? tools_control(argv[optind], req, 65536, "import") : NULL;
	json_decref(req);
	const char *k, *note = json_string_value(json_object_get(r, "note"));
	json_t *o;
	json_object_foreach(json_object_get(r, "nodes"), k, o) /* only when all imported */
	{
		printf("node %s: %s\n", k, json_string_value(o));
	}
	if (note)
		fprintf(stderr, "mlfs import: %s\n", note);
	json_decref(r);
	return r ? 0 : 1;
}

int tools_make_parents(char *path)
{
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		int rc = mkdir(path, 0755);
		*p = '/';
		if (rc && errno != EEXIST)
			return -errno;
	}
	return 0;
}

/* Copies @src to @dst through a new temporary file beside it (removed on
 * failure); 0 or errno. */
static int copy_file(const char *src, char *dst)
{
	char tmp[PATH_MAX + 8], buf[1 << 16];
	int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, err = 0;

	if (in < 0)
		return errno;
	if ((err = -tools_make_parents(dst)) ||
	    (out = tools_create_tmp(dst, tmp, sizeof(tmp))) < 0) {
		err = err ? err : errno;
		close(in);
		return err;
	}
	for (;;) {
		ssize_t n = read(in, buf, sizeof(buf));
		if (n <= 0) {
			err = n < 0 ? errno : 0;
			break;
		}
		if (write(out, buf, (size_t)n) != n) {
			err = errno ? errno : EIO;
			break;
		}
	}
	close(in);
	if (close(out) && !err)
		err = errno;
	if (!err && rename(tmp, dst))
		err = errno;
	if (err)
		unlink(tmp);
	return err;
}

static const char export_usage[] =
    "usage: mlfs export <mnt> --to DIR [--format npy|safetensors] [--names schema|hf]\n"
    "                   [--map FILE] [--shard-mib N]\n";

int cmd_export(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"to", required_argument, NULL, 't'},	 {"format", required_argument, NULL, 'f'},
	    {"names", required_argument, NULL, 'n'},	 {"map", required_argument, NULL, 'm'},
	    {"shard-mib", required_argument, NULL, 's'}, {NULL, 0, NULL, 0}};
	const char *to = NULL, *format = "npy", *names = NULL, *map = NULL;
	long long shard_mib = 4096;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		char *end = NULL;
		if (c == 't')
			to = optarg;
		else if (c == 'f')
			format = optarg;
		else if (c == 'n')
			names = optarg;
		else if (c == 'm')
			map = optarg;
		else if (c == 's' && ((shard_mib = strtoll(optarg, &end, 10)) < 1 || *end))
			c = '?';
		if (c == '?') {
			fprintf(stderr, "%s", export_usage);
			return 2;
		}
	}
	bool st = !strcmp(format, "safetensors");
	if (optind != argc - 1 || !to || (!st && strcmp(format, "npy")) ||
	    (!st && (names || map))) {
		fprintf(stderr, "%s", export_usage);
		return 2;
	}
	const char *mnt = argv[optind];
	if (st)
		return tools_export_st(mnt, to, names, map, (int64_t)shard_mib << 20);
	char path[PATH_MAX], dst[PATH_MAX];
	size_t len;
	snprintf(path, sizeof(path), "%s/schema.json", mnt);
	char *text = tools_read_file(path, &len);
	struct ptc_schema *s;
	struct ptc_error perr;
	if (!text)
		return 1;
	if (ptc_schema_parse_text(text, len, path, &s, &perr)) {
		fprintf(stderr, "mlfs export: %s\n", perr.text);
		free(text);
		return 1;
	}
	free(text);
	int rc = 0, files = 0;
	for (int si = 0; si < s->nstates && !rc; si++)
		for (int ti = 0; ti < s->ntensors && !rc; ti++) {
			if (s->tensors[ti].tied >= 0)
				continue; /* the tie target holds the data */
			size_t np = (size_t)snprintf(path, sizeof(path), "%s/full/%s/%s.npy", mnt,
						     s->states[si].name, s->tensors[ti].name);
			size_t nd = (size_t)snprintf(dst, sizeof(dst), "%s/%s/%s.npy", to,
						     s->states[si].name, s->tensors[ti].name);
			/* Never a truncated name. */
			int err = np >= sizeof(path) || nd >= sizeof(dst) ? ENAMETOOLONG
									  : copy_file(path, dst);
			if (err) {
				fprintf(stderr, "mlfs export: %s -> %s: %s\n", path, dst,
					strerror(err));
				rc = 1;
			}
			files++;
		}
	if (!rc)
		printf("exported %d files to %s\n", files, to);
	ptc_schema_free(s);
	return rc;
}
