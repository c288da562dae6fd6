/*
 * net_pb.c - the protobuf wire format of the etcd messages mlfs sends and
 * reads (etcd's rpc.proto and kv.proto): a writer for requests, a reader
 * of fields, and the replies' parsers; and gRPC's framing around them (a
 * message's 5-byte header, the grpc-status and grpc-message trailers),
 * which the unary calls (net_http.c) and the watch stream share.
 *
 * DESIGN
 * etcd's gRPC API is what its JSON gateway calls for every request; mlfs
 * calls it directly (net_etcd.c, net_etcd_watch.c), which takes the
 * gateway's JSON marshalling by reflection out of etcd's CPU. The few
 * messages used are written and read here from the wire format itself
 * (varints and length-delimited fields; protobuf's encoding guide), with
 * no generated code and no protobuf library: the format is stable, and
 * the fields read are a handful per message. A reader skips the fields it
 * does not know, as protobuf requires, so a newer etcd's additions change
 * nothing. Every parser is pure and bounded by its input (fuzz_etcdpb):
 * a length past the end, a varint over 10 bytes, a group or an unknown
 * wire type is -EINVAL, never a read out of bounds.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "net/net.h"
#include "net/net_i.h"

/* ----------------------------------------------------------------- writer */

/* Room for @n more bytes in @b (b->err set when there is none). */
static bool room(struct net_pb_buf *b, size_t n)
{
	if (b->err)
		return false;
	if (b->n + n <= b->cap)
		return true;
	size_t cap = b->cap ? b->cap * 2 : 256;
	while (cap < b->n + n)
		cap *= 2;
	uint8_t *p = realloc(b->p, cap);
	if (!p) {
		b->err = -ENOMEM;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

static void raw_varint(struct net_pb_buf *b, uint64_t v)
{
	if (!room(b, 10))
		return;
	do {
		b->p[b->n++] = (uint8_t)(v & 0x7f) | (v > 0x7f ? 0x80 : 0);
		v >>= 7;
	} while (v);
}

void net_pb_varint(struct net_pb_buf *b, uint32_t field, uint64_t v)
{
	raw_varint(b, (uint64_t)field << 3 | 0);
	raw_varint(b, v);
}

void net_pb_bytes(struct net_pb_buf *b, uint32_t field, const void *p, size_t n)
{
	raw_varint(b, (uint64_t)field << 3 | 2);
	raw_varint(b, n);
	if (n && room(b, n)) {
		memcpy(b->p + b->n, p, n);
		b->n += n;
	}
}

void net_pb_message(struct net_pb_buf *b, uint32_t field, const struct net_pb_buf *m)
{
	if (m->err)
		b->err = m->err;
	else
		net_pb_bytes(b, field, m->p, m->n);
}

int net_grpc_frame(const uint8_t *msg, size_t n, uint8_t **out, size_t *len)
{
	if (n > UINT32_MAX)
		return -EFBIG;
	uint8_t *f = malloc(n + 5);
	if (!f)
		return -ENOMEM;
	f[0] = 0; /* not compressed */
	f[1] = (uint8_t)(n >> 24);
	f[2] = (uint8_t)(n >> 16);
	f[3] = (uint8_t)(n >> 8);
	f[4] = (uint8_t)n;
	if (n)
		memcpy(f + 5, msg, n);
	*out = f;
	*len = n + 5;
	return 0;
}

void net_pb_prefix_end(struct net_pb_buf *b, uint32_t field, const char *key)
{
	size_t k = strlen(key);
	char *end = malloc(k + 1);
	if (!end) {
		b->err = -ENOMEM;
		return;
	}
	memcpy(end, key, k);
	while (k && (uint8_t)end[k - 1] == 0xff)
		k--;
	if (k == 0) { /* every key */
		end[0] = '\0';
		k = 1;
	} else {
		end[k - 1]++;
	}
	net_pb_bytes(b, field, end, k);
	free(end);
}

uint32_t net_grpc_length(const uint8_t *frame)
{
	return (uint32_t)frame[1] << 24 | (uint32_t)frame[2] << 16 | (uint32_t)frame[3] << 8 |
	       frame[4];
}

static int hexval(char c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
				      : -1;
}

void net_grpc_trailer(const char *line, size_t len, long *status, char *msg, size_t cap)
{
	while (len && strchr(" \r\n", line[len - 1]))
		len--;
	if (len > 12 && strncasecmp(line, "grpc-status:", 12) == 0) {
		char num[16];
		snprintf(num, sizeof(num), "%.*s", (int)(len - 12), line + 12);
		*status = strtol(num, NULL, 10);
	} else if (len > 13 && cap && strncasecmp(line, "grpc-message:", 13) == 0) {
		size_t i = 13, o = 0;
		while (i < len && line[i] == ' ')
			i++;
		for (; i < len && o + 1 < cap; i++) {
			char ch = line[i];
			int hi = i + 2 < len ? hexval(line[i + 1]) : -1;
			int lo = i + 2 < len ? hexval(line[i + 2]) : -1;
			if (ch == '%' && hi >= 0 && lo >= 0) {
				ch = (char)(hi << 4 | lo);
				i += 2;
			}
			msg[o++] = (uint8_t)ch < 0x20 ? ' ' : ch;
		}
		msg[o] = '\0';
	}
}

void net_pb_free(struct net_pb_buf *b)
{
	free(b->p);
	*b = (struct net_pb_buf){0};
}

/* ----------------------------------------------------------------- reader */

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64; shift += 7) {
		if (*p == end)
			return -EINVAL;
		uint8_t c = *(*p)++;
		*v |= (uint64_t)(c & 0x7f) << shift;
		if (!(c & 0x80))
			return 0;
	}
	return -EINVAL;
}

int net_pb_next(const uint8_t **p, const uint8_t *end, struct net_pb_field *f)
{
	uint64_t key, n;

	if (*p == end)
		return 0;
	if (read_varint(p, end, &key) || key >> 3 == 0 || key >> 3 > UINT32_MAX)
		return -EINVAL;
	f->num = (uint32_t)(key >> 3);
	f->v = 0;
	f->p = NULL;
	f->n = 0;
	switch (key & 7) {
	case 0: /* varint */
		return read_varint(p, end, &f->v) ? -EINVAL : 1;
	case 1: /* 64-bit */
	case 5: /* 32-bit */
		n = (key & 7) == 1 ? 8 : 4;
		if ((uint64_t)(end - *p) < n)
			return -EINVAL;
		*p += n;
		return 1;
	case 2: /* bytes, strings, messages */
		if (read_varint(p, end, &n) || n > (uint64_t)(end - *p))
			return -EINVAL;
		f->p = *p;
		f->n = (size_t)n;
		*p += n;
		return 1;
	default: /* groups (deprecated) and no such type */
		return -EINVAL;
	}
}

/* @n bytes at @p into a new NUL-terminated string: 0 or -ENOMEM. */
static int dup_bytes(const uint8_t *p, size_t n, char **out)
{
	if (!(*out = malloc(n + 1)))
		return -ENOMEM;
	if (n)
		memcpy(*out, p, n);
	(*out)[n] = '\0';
	return 0;
}

int net_pb_header_revision(const uint8_t *p, size_t n, int64_t *revision)
{
	const uint8_t *end = p + n;
	struct net_pb_field f;
	int r;

	while ((r = net_pb_next(&p, end, &f)) == 1)
		if (f.num == 3 && !f.p) /* ResponseHeader.revision */
			*revision = (int64_t)f.v;
	return r;
}

int net_pb_kv(const uint8_t *p, size_t n, struct net_etcd_kv *kv)
{
	const uint8_t *end = p + n, *key = NULL, *value = NULL;
	size_t nkey = 0, nvalue = 0;
	struct net_pb_field f;
	int r;

	*kv = (struct net_etcd_kv){0};
	while ((r = net_pb_next(&p, end, &f)) == 1) {
		bool bytes = f.p != NULL;
		switch (f.num) { /* mvccpb.KeyValue */
		case 1:
			if (bytes)
				key = f.p, nkey = f.n;
			break;
		case 2:
			kv->create_revision = (int64_t)f.v;
			break;
		case 3:
			kv->mod_revision = (int64_t)f.v;
			break;
		case 4:
			kv->version = (int64_t)f.v;
			break;
		case 5:
			if (bytes)
				value = f.p, nvalue = f.n;
			break;
		case 6:
			kv->lease = (int64_t)f.v;
			break;
		}
	}
	/* keys are text here (a key with a NUL in it would read as another) */
	if (r < 0 || !key || !nkey || memchr(key, 0, nkey))
		return -EINVAL;
	if (dup_bytes(key, nkey, &kv->key))
		return -ENOMEM;
	if (dup_bytes(value, nvalue, &kv->value)) {
		free(kv->key);
		kv->key = NULL;
		return -ENOMEM;
	}
	kv->len = nvalue;
	return 0;
}

/* Counts the length-delimited fields @num of the message at @p. */
static int count_fields(const uint8_t *p, size_t n, uint32_t num, size_t *cnt)
{
	const uint8_t *end = p + n;
	struct net_pb_field f;
	int r;

	*cnt = 0;
	while ((r = net_pb_next(&p, end, &f)) == 1)
		if (f.num == num && f.p)
			(*cnt)++;
	return r;
}

int net_pb_range_reply(const uint8_t *p, size_t n, struct net_etcd_kv **kvs, size_t *nkvs,
		       int64_t *revision)
{
	const uint8_t *q = p, *end = p + n;
	struct net_pb_field f;
	size_t cnt, got = 0;
	int r, rc = 0;

	*kvs = NULL;
	*nkvs = 0;
	if (count_fields(p, n, 2, &cnt) < 0) /* RangeResponse.kvs */
		return -EINVAL;
	struct net_etcd_kv *a = calloc(cnt ? cnt : 1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	while (rc == 0 && (r = net_pb_next(&q, end, &f)) == 1) {
		if (f.num == 1 && f.p)
			rc = net_pb_header_revision(f.p, f.n, revision) < 0 ? -EINVAL : 0;
		else if (f.num == 2 && f.p && (rc = net_pb_kv(f.p, f.n, &a[got])) == 0)
			got++;
	}
	if (rc) {
		net_etcd_kvs_free(a, got);
		return rc;
	}
	*kvs = a;
	*nkvs = got;
	return 0;
}

void net_pb_watch_free(struct net_pb_watch *w)
{
	for (size_t i = 0; w->ev && i < w->n; i++) {
		free(w->ev[i].kv.key);
		free(w->ev[i].kv.value);
	}
	free(w->ev);
	w->ev = NULL;
	w->n = 0;
}

/* One mvccpb.Event (type 1: PUT 0, DELETE 1; kv 2) into @ev. */
static int watch_event(const uint8_t *p, size_t n, struct net_etcd_event *ev)
{
	const uint8_t *end = p + n;
	struct net_pb_field f;
	bool has_kv = false;
	int r, rc = 0;

	while (rc == 0 && (r = net_pb_next(&p, end, &f)) == 1) {
		if (f.num == 1 && !f.p)
			ev->deleted = f.v == 1;
		else if (f.num == 2 && f.p && !has_kv)
			has_kv = (rc = net_pb_kv(f.p, f.n, &ev->kv)) == 0;
	}
	if (rc == 0 && (r < 0 || !has_kv))
		rc = -EINVAL;
	if (rc && has_kv) {
		free(ev->kv.key);
		free(ev->kv.value);
		ev->kv = (struct net_etcd_kv){0};
	}
	return rc;
}

int net_pb_watch_reply(const uint8_t *p, size_t n, struct net_pb_watch *w)
{
	const uint8_t *q = p, *end = p + n;
	struct net_pb_field f;
	size_t cnt;
	int r, rc = 0;

	*w = (struct net_pb_watch){0};
	/* WatchResponse: header 1, created 3, canceled 4, compact_revision 5,
	 * cancel_reason 6, events 11 */
	if (count_fields(p, n, 11, &cnt) < 0)
		return -EINVAL;
	if (!(w->ev = calloc(cnt ? cnt : 1, sizeof(*w->ev))))
		return -ENOMEM;
	while (rc == 0 && (r = net_pb_next(&q, end, &f)) == 1) {
		if (f.num == 1 && f.p)
			rc = net_pb_header_revision(f.p, f.n, &w->revision) < 0 ? -EINVAL : 0;
		else if (f.num == 3 && !f.p)
			w->created = f.v != 0;
		else if (f.num == 4 && !f.p)
			w->canceled = f.v != 0;
		else if (f.num == 5 && !f.p)
			w->compact_revision = (int64_t)f.v;
		else if (f.num == 6 && f.p)
			snprintf(w->cancel_reason, sizeof(w->cancel_reason), "%.*s",
				 (int)(f.n < sizeof(w->cancel_reason)
					   ? f.n
					   : sizeof(w->cancel_reason) - 1),
				 (const char *)f.p);
		else if (f.num == 11 && f.p && (rc = watch_event(f.p, f.n, &w->ev[w->n])) == 0)
			w->n++;
	}
	if (rc)
		net_pb_watch_free(w);
	return rc;
}
