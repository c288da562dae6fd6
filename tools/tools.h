/*
 * tools.h - subcommands of the `mlfs` command line.
 *
 * Each returns the process exit status: 0 on success, 1 on a failure it
 * has explained on stderr, 2 on a usage error.
 */
#ifndef MLFS_TOOLS_H
#define MLFS_TOOLS_H

#include <jansson.h>

int cmd_plan(int argc, char **argv);
int cmd_schema(int argc, char **argv);
int cmd_mount(int argc, char **argv);
int cmd_umount(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_reconfigure(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_dataset(int argc, char **argv);

/* Reads a whole file into a new NUL-terminated buffer; NULL and a message
 * on stderr on failure. *len gets the size. */
char *tools_read_file(const char *path, size_t *len);

#endif
