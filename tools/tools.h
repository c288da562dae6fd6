/*
 * tools.h - subcommands of the `mlfs` command line.
 *
 * Each returns the process exit status: 0 on success, 1 on a failure it
 * has explained on stderr, 2 on a usage error.
 */
#ifndef MLFS_TOOLS_H
#define MLFS_TOOLS_H

#include <stdio.h>

#include <jansson.h>

int cmd_plan(int argc, char **argv);
int cmd_suggest(int argc, char **argv);
int cmd_schema(int argc, char **argv);
int cmd_mount(int argc, char **argv);
int cmd_umount(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_reconfigure(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_snapshot(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_drain(int argc, char **argv);
int cmd_dataset(int argc, char **argv);
int cmd_reset(int argc, char **argv);
int cmd_resume(int argc, char **argv);

/* Reads a whole file into a new NUL-terminated buffer; NULL and a message
 * on stderr on failure. *len gets the size. */
char *tools_read_file(const char *path, size_t *len);
/* tools_read_file of the open @f, read to its end (@path for messages). */
char *tools_read_stream(FILE *f, const char *path, size_t *len);

/* `mlfs export --format safetensors` (mlfs_stexport.c): every state of the
 * mount at @mnt into @to, named by @names ("schema", "hf") or the mapping
 * file @map_file, in shards of at most @shard_max bytes. 0, or 1 with a
 * message on stderr. */
int tools_export_st(const char *mnt, const char *to, const char *names, const char *map_file,
		    int64_t shard_max);

/* Creates the temporary file through which @dst is written atomically: the
 * hidden ".<name>.XXXXXX" beside it, made unique by mkstemp (O_CREAT |
 * O_EXCL, so nothing planted at a predictable name, such as a symlink, is
 * followed), mode 0644 less the umask. Its name goes to @tmp (@cap bytes).
 * Returns the open descriptor, or -1 with errno set (ENAMETOOLONG when the
 * name does not fit). The caller renames @tmp over @dst, or unlinks it on
 * failure. */
int tools_create_tmp(const char *dst, char *tmp, size_t cap);

/* Reads file @path and parses it with @fn (a ptc_*_parse_text) into *@out:
 * 0, or -1 after printing why. */
#define TOOLS_LOAD(path, fn, out)                                                                  \
	({                                                                                         \
		struct ptc_error err_ = {.text = ""};                                              \
		size_t len_;                                                                       \
		char *text_ = tools_read_file((path), &len_);                                      \
		int rc_ = text_ ? fn(text_, len_, (path), (out), &err_) : -1;                      \
		free(text_);                                                                       \
		if (text_ && rc_)                                                                  \
			fprintf(stderr, "mlfs: %s\n",                                              \
				rc_ == -ENOMEM ? "out of memory" : err_.text);                     \
		rc_ ? -1 : 0;                                                                      \
	})

/* Request @req on mount @mnt's control file, its reply parsed (at most
 * @reply_max bytes): the reply when it says "ok", else NULL after printing
 * "mlfs <@cmd>: <why>" on stderr. */
json_t *tools_control(const char *mnt, const json_t *req, size_t reply_max, const char *cmd);

/* mkdir -p of the directories of @path (its last component is not made):
 * 0 or -errno. @path is restored. */
int tools_make_parents(char *path);

#endif
