/*
 * mlfs_idset.c - the nodes of a snapshot by id, and lists of a cluster's
 * node ids packed for etcd (decide_i.h). Pure: no I/O, no threads, no
 * globals.
 *
 * DESIGN
 * At 10,000 nodes, a list of ids is searched once per node (the attempt's
 * participants, the last commit's, the coordinator's votes) only through
 * an index: the snapshot's ids sorted once (mlfs_snap_index), each lookup
 * a binary search (mlfs_snap_find), O((N + M) log N) a round instead of
 * O(N M). A list of ids that etcd sends to every node's watch (the
 * attempt's participants) is packed as ranges of the cluster's node
 * indices (mlfs_ids_pack): every node of the cluster is "0-9999", a few
 * bytes instead of 90 KB per watch.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/decide_i.h"

static int key_cmp(const void *a, const void *b)
{
	const struct mlfs_snap_key *x = a, *y = b;
	int c = strcmp(x->id, y->id);
	return c ? c : (x->node > y->node) - (x->node < y->node);
}

void mlfs_snap_index(const struct mlfs_snap_node *nodes, int nnodes, struct mlfs_snap_key *keys)
{
	for (int i = 0; i < nnodes; i++)
		keys[i] = (struct mlfs_snap_key){nodes[i].id, i};
	if (nnodes > 1)
		qsort(keys, (size_t)nnodes, sizeof(*keys), key_cmp);
}

/* strcmp of the @len bytes at @id (as a string) with @key. */
static int id_cmp(const char *id, size_t len, const char *key)
{
	int c = strncmp(id, key, len);
	/* equal over @len bytes (none NUL): @id is @key or a prefix of it */
	return c ? c : key[len] == '\0' ? 0 : -1;
}

int mlfs_snap_find(const struct mlfs_snap_key *keys, int nnodes, const char *id, size_t len)
{
	int lo = 0, hi = nnodes; /* the first key >= id is in [lo, hi] */

	if (memchr(id, '\0', len))
		return -1; /* no id holds a NUL */
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (id_cmp(id, len, keys[mid].id) > 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < nnodes && id_cmp(id, len, keys[lo].id) == 0 ? keys[lo].node : -1;
}

/* Appends "first[-last]" (a comma before it unless first) to *@s. */
static int append_range(char **s, size_t *cap, size_t *len, int first, int last)
{
	char buf[32];
	int n = last > first ? snprintf(buf, sizeof(buf), "%s%d-%d", *len ? "," : "", first, last)
			     : snprintf(buf, sizeof(buf), "%s%d", *len ? "," : "", first);
	if (*len + (size_t)n + 1 > *cap) {
		size_t ncap = (*cap + (size_t)n + 1) * 2;
		char *t = realloc(*s, ncap);
		if (!t)
			return -ENOMEM;
		*s = t;
		*cap = ncap;
	}
	memcpy(*s + *len, buf, (size_t)n + 1);
	*len += (size_t)n;
	return 0;
}

/* A node index (decimal digits, at most 9) at *@p into *@v, *@p past it:
 * 0, or -EINVAL. */
static int read_index(const char **p, long *v)
{
	const char *q = *p;
	*v = 0;
	while (*q >= '0' && *q <= '9' && q - *p < 9)
		*v = *v * 10 + (*q++ - '0');
	if (q == *p || (*q >= '0' && *q <= '9'))
		return -EINVAL;
	*p = q;
	return 0;
}

char *mlfs_ids_pack(const json_t *ids, const struct ptc_cluster *cl)
{
	size_t cap = 64, len = 0;
	char *s = malloc(cap);
	int n = 0, first = -1, last = -1; /* the range being written */
	size_t i;
	json_t *p;

	if (!s || !json_is_array(ids))
		goto err;
	s[0] = '\0';
	json_array_foreach(ids, i, p)
	{
		const char *id = json_string_value(p);
		while (id && n < cl->nnodes && strcmp(cl->nodes[n].id, id) != 0)
			n++;
		if (!id || n == cl->nnodes)
			goto err; /* not @cl's, or not in its order */
		if (n == last + 1 && first >= 0) {
			last = n++;
			continue;
		}
		if (first >= 0 && append_range(&s, &cap, &len, first, last))
			goto err;
		first = last = n++;
	}
	if (first >= 0 && append_range(&s, &cap, &len, first, last))
		goto err;
	return s;
err:
	free(s);
	return NULL;
}

json_t *mlfs_ids_unpack(const char *packed, const struct ptc_cluster *cl, struct ptc_error *err)
{
	json_t *ids = json_array();
	const char *p = packed;
	long prev = -1;

	if (!ids) {
		ptc_errorf(err, "out of memory");
		return NULL;
	}
	while (*p) {
		long a, b;
		if (read_index(&p, &a))
			goto bad;
		b = a;
		if (*p == '-' && (++p, read_index(&p, &b)))
			goto bad;
		if (*p && *p++ != ',')
			goto bad;
		if (a <= prev || b < a || b >= cl->nnodes) {
			ptc_errorf(err,
				   "node ids \"%.64s\": range %ld-%ld is not ascending within "
				   "the cluster's %d nodes",
				   packed, a, b, cl->nnodes);
			json_decref(ids);
			return NULL;
		}
		for (long n = a; n <= b; n++)
			if (json_array_append_new(ids, json_string(cl->nodes[n].id))) {
				ptc_errorf(err, "out of memory");
				json_decref(ids);
				return NULL;
			}
		prev = b;
		if (!*p && p[-1] == ',')
			goto bad;
	}
	return ids;
bad:
	ptc_errorf(err, "node ids \"%.64s\": expected ranges of node indices such as \"0-3,5\"",
		   packed);
	json_decref(ids);
	return NULL;
}
