/*
 * test_job.c - job/ files' content buffers (store/mlfs_job.c): the hash
 * cached with the content, copy on write of pinned buffers, reference
 * counts and the memory they count.
 *
 * A property test drives one file with random writes, truncations, sets
 * and pins against a plain byte array: after every change the file's bytes
 * equal the model's and its cached hash equals mlfs_hash of them, and
 * every buffer pinned earlier still holds the bytes and hash it had when
 * pinned. Memory counts return to the tree's nodes alone once the file and
 * the pins are gone, which a double release would make negative (an
 * assert) and a double free would show under ASan.
 *
 * Directories of many children: lookups, creates, unlinks and renames
 * against a model (the children's index), and the index refused by
 * --max-memory.
 *
 * The swap's merge (mlfs_job_keep_newer): what a staged tree takes from
 * the live one, by mtime, and when it refuses.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>

#include "cluster/cluster_i.h"
#include "store/store.h"
#include "tests/unit/unit.h"

/* A directory "job" with one empty file "f". */
struct tree {
	struct xf_mem mem;
	struct mlfs_job *root, *f;
	int64_t nodes; /* mem.used by the two nodes */
};

static void tree_init(struct tree *t, int64_t limit)
{
	memset(t, 0, sizeof(*t));
	t->mem.limit = limit;
	assert_non_null(t->root = mlfs_job_new_dir("job", &t->mem));
	assert_int_equal(mlfs_job_create(t->root, "f", false, &t->f), 0);
	t->nodes = atomic_load(&t->mem.used);
	assert_true(t->nodes > 0);
}

static void tree_release(struct tree *t)
{
	mlfs_job_free(t->root);
	assert_int_equal(atomic_load(&t->mem.used), 0);
}

/* @f holds exactly @n bytes @want, and its cached hash is theirs. */
static void check_file(const struct mlfs_job *f, const uint8_t *want, size_t n)
{
	assert_int_equal(f->size, n);
	assert_true(mlfs_job_hash(f) == mlfs_hash(want, n));
	if (n == 0) {
		assert_null(f->buf);
		return;
	}
	assert_non_null(f->buf);
	assert_int_equal(f->buf->size, n);
	assert_true(f->buf->cap >= n);
	assert_memory_equal(f->buf->bytes, want, n);
	assert_true(f->buf->hash == mlfs_hash(f->buf->bytes, n));
}

static void test_hash_cached(void **state)
{
	(void)state;
	struct tree t;
	const uint8_t hello[] = "hello, job/";
	tree_init(&t, 0);

	check_file(t.f, NULL, 0);
	assert_true(mlfs_job_hash(t.f) == mlfs_hash("", 0));
	assert_int_equal(mlfs_job_hash(t.root), 0);
	assert_int_equal(mlfs_job_set(t.f, hello, 11), 0);
	check_file(t.f, hello, 11);
	assert_int_equal(atomic_load(&t.f->buf->refs), 1);

	/* The manifest reports the cached hash, not one of the bytes: a
	 * tampered cache shows through. */
	json_t *m = mlfs_job_manifest(t.root);
	char want[20];
	snprintf(want, sizeof(want), "%016" PRIx64, mlfs_hash(hello, 11));
	assert_int_equal(json_array_size(m), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(m, 0), "h")), want);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(m, 0), "n")), 11);
	json_decref(m);
	uint64_t real = t.f->buf->hash;
	t.f->buf->hash = 0x1234;
	m = mlfs_job_manifest(t.root);
	assert_string_equal(json_string_value(json_object_get(json_array_get(m, 0), "h")),
			    "0000000000001234");
	json_decref(m);
	t.f->buf->hash = real;

	assert_int_equal(mlfs_job_set(t.root, hello, 11), -EISDIR);
	assert_int_equal(mlfs_job_write(t.root, 0, hello, 11), -EISDIR);
	assert_int_equal(mlfs_job_truncate(t.root, 1), -EISDIR);
	assert_int_equal(mlfs_job_share(t.root, t.f->buf), -EISDIR);
	tree_release(&t);
}

/* Appends continue the streaming hash; it must equal the one-shot hash at
 * every length, across XXH3's internal block and stripe sizes. */
static void test_append_hash(void **state)
{
	(void)state;
	struct tree t;
	static uint8_t model[300000];
	size_t n = 0, step = 1;
	tree_init(&t, 0);

	for (size_t i = 0; i < sizeof(model); i++)
		model[i] = (uint8_t)(i * 131 + (i >> 9));
	while (n < sizeof(model)) {
		size_t k = step < sizeof(model) - n ? step : sizeof(model) - n;
		struct mlfs_jbuf *before = t.f->buf;
		assert_int_equal(mlfs_job_write(t.f, n, model + n, k), 0);
		n += k;
		check_file(t.f, model, n);
		/* held by the file alone: changed in place, never copied */
		assert_true(!before || t.f->buf == before);
		step = step * 3 % 5003 + 1;
	}
	assert_non_null(t.f->buf->xs);
	tree_release(&t);
}

static void test_pinned_survives_rewrite(void **state)
{
	(void)state;
	struct tree t;
	tree_init(&t, 0);

	assert_int_equal(mlfs_job_write(t.f, 0, (const uint8_t *)"hello", 5), 0);
	struct mlfs_jbuf *b = mlfs_jbuf_get(t.f->buf);
	assert_int_equal(atomic_load(&b->refs), 2);
	int64_t one = atomic_load(&t.mem.used) - t.nodes;

	/* Overwritten while pinned: the file gets a new buffer. */
	assert_int_equal(mlfs_job_write(t.f, 0, (const uint8_t *)"HE", 2), 0);
	assert_ptr_not_equal(t.f->buf, b);
	check_file(t.f, (const uint8_t *)"HEllo", 5);
	assert_int_equal(atomic_load(&b->refs), 1);
	assert_int_equal(b->size, 5);
	assert_memory_equal(b->bytes, "hello", 5);
	assert_true(b->hash == mlfs_hash("hello", 5));
	assert_int_equal(atomic_load(&t.mem.used) - t.nodes, 2 * one);

	/* Appended, truncated, emptied, removed: the pin still reads. */
	struct mlfs_jbuf *c = mlfs_jbuf_get(t.f->buf);
	assert_int_equal(mlfs_job_write(t.f, 5, (const uint8_t *)" world", 6), 0);
	check_file(t.f, (const uint8_t *)"HEllo world", 11);
	assert_memory_equal(c->bytes, "HEllo", 5);
	assert_int_equal(c->size, 5);
	assert_true(c->hash == mlfs_hash("HEllo", 5));
	assert_int_equal(mlfs_job_truncate(t.f, 2), 0);
	check_file(t.f, (const uint8_t *)"HE", 2);
	assert_int_equal(mlfs_job_truncate(t.f, 0), 0);
	check_file(t.f, NULL, 0);
	assert_int_equal(atomic_load(&t.mem.used), t.nodes + 2 * one);
	assert_int_equal(mlfs_job_unlink(t.root, "f", false), 0);
	mlfs_job_free(t.root);
	assert_memory_equal(b->bytes, "hello", 5);
	assert_memory_equal(c->bytes, "HEllo", 5);
	assert_int_equal(atomic_load(&b->refs), 1);
	assert_int_equal(atomic_load(&c->refs), 1);
	/* counted until the pins go, each once */
	assert_int_equal(atomic_load(&t.mem.used), 2 * one);
	mlfs_jbuf_put(b);
	mlfs_jbuf_put(c);
	assert_int_equal(atomic_load(&t.mem.used), 0);
}

/* One buffer shared by two trees (the live one and one staged for a
 * commit) is counted once and freed by the last of them. */
static void test_share_counts_once(void **state)
{
	(void)state;
	struct tree a, s;
	uint8_t bytes[10000];
	tree_init(&a, 0);
	tree_init(&s, 0);
	for (size_t i = 0; i < sizeof(bytes); i++)
		bytes[i] = (uint8_t)(i ^ (i >> 8));

	assert_int_equal(mlfs_job_set(a.f, bytes, sizeof(bytes)), 0);
	struct mlfs_jbuf *b = a.f->buf;
	assert_int_equal(mlfs_job_share(s.f, b), 0);
	assert_ptr_equal(s.f->buf, b);
	assert_int_equal(s.f->size, sizeof(bytes));
	assert_true(mlfs_job_hash(s.f) == mlfs_hash(bytes, sizeof(bytes)));
	assert_int_equal(atomic_load(&b->refs), 2);
	assert_int_equal(atomic_load(&a.mem.used), a.nodes + (int64_t)sizeof(bytes));
	assert_int_equal(atomic_load(&s.mem.used), s.nodes);

	/* A write to either copies; the other keeps the bytes. */
	assert_int_equal(mlfs_job_write(s.f, 3, (const uint8_t *)"x", 1), 0);
	assert_ptr_not_equal(s.f->buf, b);
	assert_ptr_equal(a.f->buf, b);
	check_file(a.f, bytes, sizeof(bytes));
	bytes[3] = 'x';
	check_file(s.f, bytes, sizeof(bytes));
	assert_int_equal(atomic_load(&b->refs), 1);

	/* Shared again, then the first tree goes: the second still reads. */
	assert_int_equal(mlfs_job_share(s.f, b), 0);
	assert_int_equal(atomic_load(&s.mem.used), s.nodes);
	mlfs_job_free(a.root);
	assert_int_equal(atomic_load(&b->refs), 1);
	assert_int_equal(atomic_load(&a.mem.used), (int64_t)sizeof(bytes));
	bytes[3] = 3; /* as before the write */
	check_file(s.f, bytes, sizeof(bytes));
	tree_release(&s);
	assert_int_equal(atomic_load(&a.mem.used), 0);

	/* Sharing nothing, or an empty buffer, empties the file. */
	tree_init(&s, 0);
	assert_int_equal(mlfs_job_set(s.f, bytes, 5), 0);
	assert_int_equal(mlfs_job_share(s.f, NULL), 0);
	check_file(s.f, NULL, 0);
	tree_release(&s);
}

/* Past --max-memory a change fails with ENOSPC and leaves the file, and a
 * pinned copy, as they were. */
static void test_enospc_unchanged(void **state)
{
	(void)state;
	struct tree t;
	uint8_t big[9000];
	memset(big, 7, sizeof(big));
	tree_init(&t, 0);
	t.mem.limit = t.nodes + 4096 + 100;

	assert_int_equal(mlfs_job_write(t.f, 0, big, 4000), 0);
	struct mlfs_jbuf *b = t.f->buf;
	assert_int_equal(mlfs_job_write(t.f, 4000, big, 5000), -ENOSPC);
	check_file(t.f, big, 4000);
	assert_ptr_equal(t.f->buf, b);
	assert_int_equal(mlfs_job_set(t.f, big, 9000), -ENOSPC);
	check_file(t.f, big, 4000);

	/* Pinned: even a one-byte change needs a second buffer. */
	struct mlfs_jbuf *pin = mlfs_jbuf_get(t.f->buf);
	assert_int_equal(mlfs_job_write(t.f, 0, (const uint8_t *)"z", 1), -ENOSPC);
	assert_ptr_equal(t.f->buf, pin);
	check_file(t.f, big, 4000);
	mlfs_jbuf_put(pin);
	assert_int_equal(mlfs_job_write(t.f, 0, (const uint8_t *)"z", 1), 0);
	assert_ptr_equal(t.f->buf, b);
	big[0] = 'z';
	check_file(t.f, big, 4000);
	tree_release(&t);
}

/* A file @name under @dir holding @text, written at @ns. */
static struct mlfs_job *file_at(struct mlfs_job *dir, const char *name, const char *text,
				int64_t ns)
{
	struct mlfs_job *f;
	assert_int_equal(mlfs_job_create(dir, name, false, &f), 0);
	assert_int_equal(mlfs_job_set(f, (const uint8_t *)text, strlen(text)), 0);
	mlfs_job_set_mtime(f, ns);
	return f;
}

static struct mlfs_job *dir_of(struct mlfs_job *dir, const char *name)
{
	struct mlfs_job *d;
	assert_int_equal(mlfs_job_create(dir, name, true, &d), 0);
	return d;
}

static struct mlfs_job *at(struct mlfs_job *root, const char *path)
{
	struct mlfs_job *j = root;
	while (j && *path) {
		size_t n = strcspn(path, "/");
		j = mlfs_job_child(j, path, n);
		path += n + (path[n] == '/');
	}
	return j;
}

static int64_t ns_of(const struct mlfs_job *j)
{
	return (int64_t)j->mtime.tv_sec * 1000000000LL + j->mtime.tv_nsec;
}

/* The staged tree @into at a swap takes the live tree's files it lacks or
 * holds older (content shared, mtime kept), and keeps its own newer ones;
 * a newer file against a directory refuses; past --max-memory it fails. */
static void test_keep_newer(void **state)
{
	(void)state;
	struct xf_mem mem = {0};
	struct mlfs_job *into = mlfs_job_new_dir("job", &mem),
			*live = mlfs_job_new_dir("job", &mem);
	assert_non_null(into);
	assert_non_null(live);
	const int64_t t = 1700000000LL * 1000000000LL;

	file_at(into, "rewritten", "the union's", t + 10);
	struct mlfs_job *lr = file_at(live, "rewritten", "written during the attempt", t + 20);
	file_at(into, "newer", "another node's, later", t + 30);
	file_at(live, "newer", "this node's, earlier", t + 15);
	struct mlfs_job *same = file_at(into, "same", "alike", t + 5);
	struct mlfs_job *ls;
	assert_int_equal(mlfs_job_create(live, "same", false, &ls), 0);
	assert_int_equal(mlfs_job_share(ls, same->buf), 0);
	mlfs_job_set_mtime(ls, t + 5);
	file_at(into, "staged-only", "kept", t + 1);
	struct mlfs_job *lf = file_at(live, "fresh", "in no manifest", t + 40);
	file_at(dir_of(dir_of(live, "d2"), "e"), "y", "deep", t + 41);
	file_at(dir_of(into, "d"), "x", "x", t + 2);
	file_at(dir_of(live, "d"), "x2", "beside x", t + 42);
	dir_of(into, "k"); /* a directory, against an older file */
	file_at(live, "k", "older than the directory", t - 100);
	struct mlfs_job *empty;
	assert_int_equal(mlfs_job_create(live, "empty", false, &empty), 0);
	mlfs_job_set_mtime(empty, t + 43);

	int kept = 0;
	assert_int_equal(mlfs_job_keep_newer(into, live, &kept), 0);
	assert_int_equal(kept, 5); /* rewritten, fresh, d2/e/y, d/x2, empty */
	struct mlfs_job *r = at(into, "rewritten");
	check_file(r, (const uint8_t *)"written during the attempt", 26);
	assert_ptr_equal(r->buf, lr->buf);
	assert_true(ns_of(r) == t + 20);
	check_file(at(into, "newer"), (const uint8_t *)"another node's, later", 21);
	assert_true(ns_of(at(into, "newer")) == t + 30);
	assert_ptr_equal(at(into, "same")->buf, ls->buf);
	check_file(at(into, "staged-only"), (const uint8_t *)"kept", 4);
	struct mlfs_job *f = at(into, "fresh");
	assert_ptr_equal(f->buf, lf->buf);
	assert_true(ns_of(f) == t + 40);
	check_file(at(into, "d2/e/y"), (const uint8_t *)"deep", 4);
	check_file(at(into, "d/x"), (const uint8_t *)"x", 1);
	check_file(at(into, "d/x2"), (const uint8_t *)"beside x", 8);
	assert_true(at(into, "k")->dir);
	check_file(at(into, "empty"), NULL, 0);
	/* a second merge finds nothing newer */
	kept = 0;
	assert_int_equal(mlfs_job_keep_newer(into, live, &kept), 0);
	assert_int_equal(kept, 0);

	/* A newer file where the union put a directory: no merge keeps both. */
	mlfs_job_set_mtime(at(live, "k"), ns_of(at(into, "k")) + 1);
	assert_int_equal(mlfs_job_keep_newer(into, live, &kept), -EEXIST);
	mlfs_job_free(into);
	mlfs_job_free(live);
	assert_int_equal(atomic_load(&mem.used), 0); /* shared buffers released once */

	/* Past the memory limit: -ENOSPC (the caller keeps the live tree). */
	struct xf_mem small = {0};
	into = mlfs_job_new_dir("job", &small);
	live = mlfs_job_new_dir("job", &small);
	for (int i = 0; i < 50; i++) {
		char name[16];
		snprintf(name, sizeof(name), "f%d", i);
		file_at(live, name, "z", t + i);
	}
	small.limit = atomic_load(&small.used) + 64;
	assert_int_equal(mlfs_job_keep_newer(into, live, &kept), -ENOSPC);
	mlfs_job_free(into);
	mlfs_job_free(live);
	assert_int_equal(atomic_load(&small.used), 0);
}

/* A pinned buffer and what it held when pinned. */
struct pin {
	struct mlfs_jbuf *b;
	uint8_t *bytes;
	size_t n;
	uint64_t hash;
};

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* The digest a node's entry carries (mlfs_jobsync_digest): the same for two
 * trees that hold the same paths, kinds, sizes, hashes and times, whatever
 * order they were made in; another when any of these differs. */
static char *digest_of(struct mlfs_job *root, char out[17])
{
	json_t *m = mlfs_job_manifest(root);
	assert_non_null(m);
	assert_int_equal(mlfs_jobsync_digest(m, out), 0);
	json_decref(m);
	assert_int_equal(strlen(out), 16);
	return out;
}

static void test_digest(void **state)
{
	(void)state;
	struct xf_mem mem = {0};
	struct mlfs_job *a = mlfs_job_new_dir("job", &mem), *b = mlfs_job_new_dir("job", &mem);
	const int64_t t = 1700000000LL * 1000000000LL;
	char da[17], db[17], empty[17];

	assert_non_null(a);
	assert_non_null(b);
	digest_of(a, empty);
	assert_string_equal(digest_of(b, db), empty);
	/* the same tree, built in the other order */
	file_at(a, "x", "one", t + 1);
	struct mlfs_job *ad = dir_of(a, "d");
	file_at(ad, "y", "two", t + 2);
	mlfs_job_set_mtime(ad, t + 3);
	struct mlfs_job *bd = dir_of(b, "d");
	file_at(bd, "y", "two", t + 2);
	mlfs_job_set_mtime(bd, t + 3);
	struct mlfs_job *bx = file_at(b, "x", "one", t + 1);
	assert_string_equal(digest_of(a, da), digest_of(b, db));
	assert_string_not_equal(da, empty);
	/* a time alone */
	mlfs_job_set_mtime(bx, t + 5);
	assert_string_not_equal(digest_of(b, db), da);
	mlfs_job_set_mtime(bx, t + 1);
	assert_string_equal(digest_of(b, db), da);
	/* content of the same size */
	assert_int_equal(mlfs_job_set(bx, (const uint8_t *)"eno", 3), 0);
	mlfs_job_set_mtime(bx, t + 1);
	assert_string_not_equal(digest_of(b, db), da);
	assert_int_equal(mlfs_job_set(bx, (const uint8_t *)"one", 3), 0);
	mlfs_job_set_mtime(bx, t + 1);
	assert_string_equal(digest_of(b, db), da);
	/* a file where the other has a directory of the same name and time */
	assert_int_equal(mlfs_job_unlink(b, "d", true), -ENOTEMPTY);
	assert_int_equal(mlfs_job_unlink(bd, "y", false), 0);
	assert_int_equal(mlfs_job_unlink(b, "d", true), 0);
	file_at(b, "d", "", t + 3);
	file_at(a, "z", "", t + 4);
	file_at(b, "z", "", t + 4);
	assert_string_not_equal(digest_of(a, da), digest_of(b, db));
	mlfs_job_free(a);
	mlfs_job_free(b);
	assert_int_equal(atomic_load(&mem.used), 0);
}

static void test_random_against_model(void **state)
{
	(void)state;
	enum { MAX = 70000, PINS = 8 };
	static uint8_t model[MAX], data[MAX];
	struct pin pins[PINS] = {0};
	struct tree t;
	size_t n = 0;
	uint64_t s = 0x9e3779b97f4a7c15ull;
	tree_init(&t, 0);

	for (int it = 0; it < 4000; it++) {
		uint64_t r = rnd(&s);
		size_t a = (size_t)(rnd(&s) % MAX), k = (size_t)(rnd(&s) % 3000);
		if (r % 4 == 0)
			k = (size_t)(rnd(&s) % 20); /* small writes */
		for (size_t i = 0; i < k; i++)
			data[i] = (uint8_t)rnd(&s);
		switch (r % 9) {
		case 0:
		case 1:
		case 2: /* append */
			a = n;
			/* fall through */
		case 3:
		case 4: /* anywhere, maybe past the end */
			if (a + k > MAX)
				k = MAX - a;
			assert_int_equal(mlfs_job_write(t.f, a, data, k), 0);
			if (a > n)
				memset(model + n, 0, a - n);
			memcpy(model + a, data, k);
			if (a + k > n)
				n = a + k;
			break;
		case 5: /* truncate */
			a = r % 16 == 5 ? 0 : a;
			assert_int_equal(mlfs_job_truncate(t.f, a), 0);
			if (a > n)
				memset(model + n, 0, a - n);
			n = a;
			break;
		case 6: /* set */
			assert_int_equal(mlfs_job_set(t.f, data, k), 0);
			memcpy(model, data, k);
			n = k;
			break;
		default: { /* pin, or drop a pin */
			struct pin *p = &pins[r / 9 % PINS];
			if (p->b) {
				mlfs_jbuf_put(p->b);
				free(p->bytes);
				*p = (struct pin){0};
			} else if (t.f->buf) {
				p->b = mlfs_jbuf_get(t.f->buf);
				p->n = p->b->size;
				p->hash = p->b->hash;
				assert_non_null(p->bytes = malloc(p->n));
				memcpy(p->bytes, p->b->bytes, p->n);
			}
		}
		}
		check_file(t.f, model, n);
		for (int i = 0; i < PINS; i++) {
			if (!pins[i].b)
				continue;
			assert_int_equal(pins[i].b->size, pins[i].n);
			assert_true(pins[i].b->hash == pins[i].hash);
			assert_memory_equal(pins[i].b->bytes, pins[i].bytes, pins[i].n);
		}
	}
	mlfs_job_free(t.root);
	for (int i = 0; i < PINS; i++) {
		mlfs_jbuf_put(pins[i].b);
		free(pins[i].bytes);
	}
	assert_int_equal(atomic_load(&t.mem.used), 0);
}

/* Children of one directory (store/mlfs_job.c indexes them by name from
 * MLFS_JOB_INDEXED on): random creates, unlinks and renames (within the
 * directory and to another) of names from a pool, against a model of which
 * names exist where. After every step each name's lookup in both
 * directories answers as the model says, the lists hold the model's
 * counts, and the index, when there is one, has at most half of its slots
 * used. */
static void test_many_children(void **state)
{
	(void)state;
	enum { NAMES = 3000, STEPS = 20000 };
	static signed char where[NAMES]; /* -1 none, 0 in a, 1 in b */
	struct xf_mem mem = {0};
	struct mlfs_job *dirs[2], *c;
	uint64_t s = 0x2545f4914f6cdd1dull;
	char name[32], other[32];
	size_t count[2] = {0, 0};

	memset(where, -1, sizeof(where));
	assert_non_null(dirs[0] = mlfs_job_new_dir("a", &mem));
	assert_non_null(dirs[1] = mlfs_job_new_dir("b", &mem));
	for (int it = 0; it < STEPS; it++) {
		int k = (int)(rnd(&s) % NAMES), op = (int)(rnd(&s) % 8);
		int d = (int)(rnd(&s) % 2);
		snprintf(name, sizeof(name), "file-%d", k);
		if (op < 4 && where[k] < 0) { /* create (growing more often) */
			assert_int_equal(mlfs_job_create(dirs[d], name, op == 0, &c), 0);
			where[k] = (signed char)d;
			count[d]++;
		} else if (op < 4) {
			assert_int_equal(mlfs_job_create(dirs[where[k]], name, false, &c), -EEXIST);
		} else if (op < 6 && where[k] >= 0) { /* unlink */
			c = mlfs_job_child(dirs[where[k]], name, strlen(name));
			assert_non_null(c);
			assert_int_equal(mlfs_job_unlink(dirs[where[k]], name, c->dir), 0);
			count[where[k]]--;
			where[k] = -1;
		} else if (where[k] >= 0) { /* rename to a free name, here or there */
			int k2 = (int)(rnd(&s) % NAMES);
			if (where[k2] >= 0)
				continue;
			snprintf(other, sizeof(other), "file-%d", k2);
			assert_int_equal(mlfs_job_rename(dirs[where[k]], name, dirs[d], other, 1),
					 0);
			count[where[k]]--;
			count[d]++;
			where[k2] = (signed char)d;
			where[k] = -1;
		}
		for (int j = 0; j < 8; j++) { /* lookups of names the model knows */
			int q = j == 0 ? k : (int)(rnd(&s) % NAMES);
			snprintf(name, sizeof(name), "file-%d", q);
			for (int e = 0; e < 2; e++) {
				c = mlfs_job_child(dirs[e], name, strlen(name));
				assert_true((c != NULL) == (where[q] == e));
				assert_true(!c || strcmp(c->name, name) == 0);
			}
		}
	}
	for (int e = 0; e < 2; e++) {
		size_t n = 0;
		for (c = dirs[e]->first; c; c = c->next) {
			assert_true(c->parent == dirs[e]);
			assert_true(!c->next || c->next->prev == c);
			n++;
		}
		assert_int_equal(n, count[e]);
		assert_int_equal(dirs[e]->nchildren, count[e]);
		if (count[e] >= MLFS_JOB_INDEXED)
			assert_non_null(dirs[e]->index);
		if (dirs[e]->index)
			assert_true(2 * dirs[e]->index_used <= dirs[e]->index_cap);
	}
	mlfs_job_free(dirs[0]);
	mlfs_job_free(dirs[1]);
	assert_int_equal(atomic_load(&mem.used), 0); /* the indexes' slots too */
}

/* The index's slots are counted in --max-memory; refused, the directory
 * searches its list, and indexes once there is room. */
static void test_children_index_refused(void **state)
{
	(void)state;
	struct xf_mem mem = {0};
	struct mlfs_job *dir = mlfs_job_new_dir("a", &mem), *c;
	char name[32];

	assert_non_null(dir);
	for (int i = 0; i < MLFS_JOB_INDEXED - 1; i++) {
		snprintf(name, sizeof(name), "file-%d", i);
		assert_int_equal(mlfs_job_create(dir, name, false, &c), 0);
	}
	assert_null(dir->index);
	/* room for one more node, not for 64 slots */
	mem.limit = atomic_load(&mem.used) + (int64_t)sizeof(struct mlfs_job) + 64;
	snprintf(name, sizeof(name), "file-%d", MLFS_JOB_INDEXED - 1);
	assert_int_equal(mlfs_job_create(dir, name, false, &c), 0);
	assert_null(dir->index);
	assert_int_equal(dir->nchildren, MLFS_JOB_INDEXED);
	for (int i = 0; i < MLFS_JOB_INDEXED; i++) {
		snprintf(name, sizeof(name), "file-%d", i);
		assert_non_null(mlfs_job_child(dir, name, strlen(name)));
	}
	assert_null(mlfs_job_child(dir, "file-99", 7));
	mem.limit = 0;
	assert_int_equal(mlfs_job_create(dir, "file-99", false, &c), 0);
	assert_non_null(dir->index);
	for (int i = 0; i < MLFS_JOB_INDEXED; i++) {
		snprintf(name, sizeof(name), "file-%d", i);
		assert_true(mlfs_job_child(dir, name, strlen(name)) != NULL);
	}
	assert_true(mlfs_job_child(dir, "file-99", 7) == c);
	mlfs_job_free(dir);
	assert_int_equal(atomic_load(&mem.used), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_hash_cached),
	    cmocka_unit_test(test_append_hash),
	    cmocka_unit_test(test_pinned_survives_rewrite),
	    cmocka_unit_test(test_share_counts_once),
	    cmocka_unit_test(test_enospc_unchanged),
	    cmocka_unit_test(test_random_against_model),
	    cmocka_unit_test(test_keep_newer),
	    cmocka_unit_test(test_digest),
	    cmocka_unit_test(test_many_children),
	    cmocka_unit_test(test_children_index_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
