/*
 * fuzz_etcdpb.c - fuzzes the readers of etcd's protobuf replies (net_pb.c):
 * a watch message, a range reply, a key-value, a header, the field walker,
 * and a gRPC trailer line.
 *
 * The whole input goes to each reader. None may read past the input, and
 * each either parses or says -EINVAL (or -ENOMEM). What parses is checked
 * against its invariants: every key and value is NUL-terminated at its
 * length, every key is non-empty, the event count is the walker's count of
 * field 11. Then the first key-value that parses is written back with
 * net_pb_bytes/net_pb_varint, and reading that gives the same key-value
 * (the writer and the reader agree).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/net_i.h"
#include "tests/fuzz/fuzz.h"

static void check_kv(const struct net_etcd_kv *kv)
{
	CHECK(kv->key && kv->key[0] != '\0');
	CHECK(kv->value && kv->value[kv->len] == '\0');
}

/* @kv written back as a KeyValue and read again: the same. */
static void round_trip(const struct net_etcd_kv *kv)
{
	struct net_pb_buf b = {0};
	struct net_etcd_kv again;

	net_pb_bytes(&b, 1, kv->key, strlen(kv->key));
	net_pb_varint(&b, 2, (uint64_t)kv->create_revision);
	net_pb_varint(&b, 3, (uint64_t)kv->mod_revision);
	net_pb_varint(&b, 4, (uint64_t)kv->version);
	net_pb_bytes(&b, 5, kv->value, kv->len);
	net_pb_varint(&b, 6, (uint64_t)kv->lease);
	if (b.err) {
		net_pb_free(&b);
		return;
	}
	int rc = net_pb_kv(b.p, b.n, &again);
	CHECK(rc == 0 || rc == -ENOMEM);
	if (rc == 0) {
		CHECK(strcmp(again.key, kv->key) == 0);
		CHECK(again.len == kv->len && memcmp(again.value, kv->value, kv->len) == 0);
		CHECK(again.create_revision == kv->create_revision &&
		      again.mod_revision == kv->mod_revision && again.version == kv->version &&
		      again.lease == kv->lease);
		free(again.key);
		free(again.value);
	}
	net_pb_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* the walker: every field within the input; count field 11 */
	const uint8_t *p = data, *end = data + size;
	struct net_pb_field f;
	size_t events = 0;
	int r;
	while ((r = net_pb_next(&p, end, &f)) == 1) {
		CHECK(p <= end && f.num >= 1);
		CHECK(!f.p || (f.p >= data && f.p + f.n <= end));
		events += f.num == 11 && f.p;
	}
	CHECK(r == 0 || r == -EINVAL);

	struct net_pb_watch w;
	int rc = net_pb_watch_reply(data, size, &w);
	CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	if (rc == 0) {
		CHECK(w.n == events);
		for (size_t i = 0; i < w.n; i++)
			check_kv(&w.ev[i].kv);
		CHECK(strlen(w.cancel_reason) < sizeof(w.cancel_reason));
		net_pb_watch_free(&w);
	}

	struct net_etcd_kv *kvs;
	size_t n;
	int64_t rev = -1;
	rc = net_pb_range_reply(data, size, &kvs, &n, &rev);
	CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	if (rc == 0) {
		for (size_t i = 0; i < n; i++)
			check_kv(&kvs[i]);
		net_etcd_kvs_free(kvs, n);
	} else {
		CHECK(kvs == NULL && n == 0);
	}

	struct net_etcd_kv kv;
	rc = net_pb_kv(data, size, &kv);
	CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	if (rc == 0) {
		check_kv(&kv);
		round_trip(&kv);
		free(kv.key);
		free(kv.value);
	}
	rev = 7;
	rc = net_pb_header_revision(data, size, &rev);
	CHECK(rc == 0 || rc == -EINVAL);

	/* the input as a reply's header line: the message stays within its
	 * room, NUL-terminated, with no control byte */
	char msg[9];
	long status = -7;
	memset(msg, 'x', sizeof(msg));
	net_grpc_trailer((const char *)data, size, &status, msg, sizeof(msg));
	if (size > 13 && memchr(msg, 0, sizeof(msg))) {
		for (const char *q = msg; *q; q++)
			CHECK((uint8_t)*q >= 0x20);
	}
	return 0;
}
