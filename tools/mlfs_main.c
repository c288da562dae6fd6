/*
 * mlfs_main.c - the `mlfs` command: dispatches subcommands.
 */
#include <stdio.h>
#include <string.h>

#include "tools/tools.h"

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *usage;
} cmds[] = {
    {"mount", cmd_mount,
     "mount <mnt> --node ID --cluster cluster.json [-f] [--max-memory BYTES] [--threads N]\n"
     "               [--data-cache BYTES] [--prefetch N] [--http-timeout SECONDS]\n"
     "               [--http-deadline SECONDS] [--log-level LEVEL] [--token-file F]\n"
     "               [--peer-listen HOST:PORT]"},
    {"umount", cmd_umount,
     "umount <mnt> [--force]   (warns when it would lose the only copy of a step)"},
    {"status", cmd_status, "status <mnt> [--json]"},
    {"reconfigure", cmd_reconfigure, "reconfigure <mnt> new.json [--no-wait]"},
    {"import", cmd_import,
     "import <mnt> --from DIR|F.safetensors [--step N] [--state NAME] [--names schema|hf]\n"
     "              [--map FILE] [--every-node [--wait S]]   (DIR: .npy files, a snapshot or\n"
     "              safetensors; --every-node: every node of the job its own ranks)"},
    {"export", cmd_export,
     "export <mnt> --to DIR [--format npy|safetensors] [--names schema|hf] [--map FILE]\n"
     "              [--shard-mib N]"},
    {"snapshot", cmd_snapshot, "snapshot <mnt> --to DIR [--level N] [--wait SECONDS]"},
    {"verify", cmd_verify, "verify <mnt>      (every partition of the node against its checksum)"},
    {"drain", cmd_drain, "drain <mnt> NODE [--undo]   (an elastic job leaves NODE out)"},
    {"reset", cmd_reset, "reset --cluster cluster.json      (every node down: the job afresh)"},
    {"resume", cmd_resume,
     "resume --cluster cluster.json [--from DIR] [--wait SECONDS]\n"
     "               (every node lost its memory: restore the newest snapshot)"},
    {"plan", cmd_plan,
     "plan --schema S --from A.json --to B.json [--cluster C] [--down ID,...] [--json]"},
    {"suggest", cmd_suggest,
     "suggest --schema S --cluster C [--nodes ID,...] [--from CONFIG] [--global-batch B]\n"
     "               [--micro-batch M] [--seq L] [--hidden H] [--heads A] [--profile P.json]\n"
     "               [--top K] [--json]   (the fastest layouts by a cost model)"},
    {"dataset", cmd_dataset, "dataset index DIR --dtype D --shape N[,N...] [--out FILE]"},
    {"schema", cmd_schema,
     "schema megatron-gpt|llama|moe --layers N --hidden H --heads A --vocab V [--ffn F]\n"
     "               [--kv-heads G] [--seq S] [--tied] [--dtype D] [--moments-dtype D]\n"
     "               moe: --experts E [--expert-ffn F] [--shared-experts S] [--dense-layers 0]"},
};

static void usage(FILE *f)
{
	fprintf(f, "usage:\n");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		fprintf(f, "  mlfs %s\n", cmds[i].usage);
}

int main(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (strcmp(argv[1], cmds[i].name) == 0)
			return cmds[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "mlfs: unknown command \"%s\"\n", argv[1]);
	usage(stderr);
	return 2;
}
