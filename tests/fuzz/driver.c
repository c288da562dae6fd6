/*
 * driver.c - a main() for fuzz targets built without libFuzzer.
 *
 * Usage: fuzz_X [-runs=N] [-seed=S] [-max_total_time=SECS] [-artifact_prefix=P]
 *               [-report_slow_units=SECS] PATH...
 *
 * Runs every file of each PATH (a directory, not recursed, files in name
 * order; or a file) through LLVMFuzzerTestOneInput, then N deterministic
 * mutations of those files (xorshift seeded by -seed, default 1): bit flips,
 * byte sets, inserted JSON and HTTP tokens, deletions, truncation, splices of two
 * files, duplicated ranges, and digit runs replaced by big or negative
 * numbers. -max_total_time stops the mutations early; other libFuzzer
 * flags are accepted and ignored. Each input is passed in a buffer of its
 * exact size, so reading past it is caught by AddressSanitizer.
 *
 * On a crash (signal, failed check, sanitizer report) the input is written
 * to <artifact_prefix>crash-<run> and its name printed; an input slower than
 * -report_slow_units (default 10 s) to <artifact_prefix>slow-unit-<run>.
 * Prints one summary line (with the slowest run) and exits 0 when nothing
 * crashed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Provided by the sanitizer runtimes when linked in. */
void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));

#define MAX_MUTANT (64 * 1024)

struct input {
	char *name;
	uint8_t *data;
	size_t size;
};

static struct {
	struct input *v;
	size_t n, cap;
} corpus;

/* The input being run, for the crash handlers. */
static const uint8_t *cur_data;
static size_t cur_size;
static long cur_run = -1;
static const char *artifact_prefix = "";
static const char *prog = "fuzz";

static uint64_t rng_state = 1;

/* The slowest run so far. */
static double slowest;
static long slowest_run = -1;

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static size_t below(size_t n)
{
	return n ? (size_t)(rnd() % n) : 0;
}

/* Async-signal-safe: writes the current input to an artifact file. */
static void save_crash(void)
{
	static volatile sig_atomic_t saved;
	char path[512], num[24];
	size_t n = 0, k = 0;
	long r = cur_run;
	int fd;

	if (saved || !cur_data)
		return;
	saved = 1;
	for (const char *p = artifact_prefix; *p && n < sizeof(path) - 64; p++)
		path[n++] = *p;
	memcpy(path + n, "crash-", 6);
	n += 6;
	if (r < 0) {
		memcpy(path + n, "corpus", 6);
		n += 6;
	} else {
		do {
			num[k++] = (char)('0' + r % 10);
			r /= 10;
		} while (r);
		while (k)
			path[n++] = num[--k];
	}
	path[n] = '\0';
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd >= 0) {
		ssize_t w = write(fd, cur_data, cur_size);
		(void)w;
		close(fd);
	}
	ssize_t w = write(2, "fuzz driver: crashing input written to ", 39);
	w = write(2, path, n);
	w = write(2, "\n", 1);
	(void)w;
}

static void on_signal(int sig)
{
	save_crash();
	signal(sig, SIG_DFL);
	raise(sig);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Writes @data to <artifact_prefix><kind>-<run>; returns 0 or -1. */
static int save_input(const char *kind, long run, const uint8_t *data, size_t size)
{
	char path[1024];
	FILE *f;

	if (run < 0)
		snprintf(path, sizeof(path), "%s%s-corpus", artifact_prefix, kind);
	else
		snprintf(path, sizeof(path), "%s%s-%ld", artifact_prefix, kind, run);
	if (!(f = fopen(path, "wb")))
		return -1;
	fwrite(data, 1, size, f);
	fclose(f);
	fprintf(stderr, "%s: input of run %ld written to %s\n", prog, run, path);
	return 0;
}

static void run_one(const uint8_t *data, size_t size, double report_slow)
{
	double t0;

	/* An exact-size copy: ASan catches any read past @size. */
	uint8_t *copy = malloc(size ? size : 1);

	if (!copy) {
		fprintf(stderr, "%s: out of memory\n", prog);
		exit(1);
	}
	if (size)
		memcpy(copy, data, size);
	cur_data = copy;
	cur_size = size;
	t0 = now();
	LLVMFuzzerTestOneInput(copy, size);
	t0 = now() - t0;
	cur_data = NULL;
	if (t0 > slowest) {
		slowest = t0;
		slowest_run = cur_run;
		if (report_slow > 0 && t0 >= report_slow) {
			fprintf(stderr, "%s: slow input: %.2fs\n", prog, t0);
			save_input("slow-unit", cur_run, copy, size);
		}
	}
	free(copy);
}

static int read_file(const char *path, struct input *in)
{
	FILE *f = fopen(path, "rb");
	struct stat st;

	if (!f)
		return -errno;
	if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
		fclose(f);
		return -EINVAL;
	}
	in->size = (size_t)st.st_size;
	in->data = malloc(in->size ? in->size : 1);
	in->name = strdup(path);
	if (!in->data || !in->name || fread(in->data, 1, in->size, f) != in->size) {
		free(in->data);
		free(in->name);
		fclose(f);
		return -EIO;
	}
	fclose(f);
	return 0;
}

static void add_file(const char *path)
{
	struct input in;

	if (corpus.n == corpus.cap) {
		corpus.cap = corpus.cap ? 2 * corpus.cap : 64;
		corpus.v = realloc(corpus.v, corpus.cap * sizeof(*corpus.v));
		if (!corpus.v) {
			fprintf(stderr, "%s: out of memory\n", prog);
			exit(1);
		}
	}
	if (read_file(path, &in) == 0)
		corpus.v[corpus.n++] = in;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void add_path(const char *path)
{
	struct stat st;
	DIR *d;
	struct dirent *e;
	char **names = NULL;
	size_t n = 0, cap = 0;

	if (stat(path, &st)) {
		fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
		return;
	}
	if (!S_ISDIR(st.st_mode)) {
		add_file(path);
		return;
	}
	if (!(d = opendir(path)))
		return;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 64;
			if (!(names = realloc(names, cap * sizeof(*names))))
				exit(1);
		}
		size_t len = strlen(path) + strlen(e->d_name) + 2;
		if (!(names[n] = malloc(len)))
			exit(1);
		snprintf(names[n++], len, "%s/%s", path, e->d_name);
	}
	closedir(d);
	qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		add_file(names[i]);
		free(names[i]);
	}
	free(names);
}

/* ------------------------------------------------------------- mutations */

/* JSON fragments and the field names of the three files; HTTP headers. */
static const char *const tokens[] = {
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\\u0000",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1.5",
    "1e9",
    "{}",
    "[]",
    "\"\"",
    "\"{L}\"",
    "{L}",
    "/../",
    "//",
    "\n---\n",
    "\"name\"",
    "\"dtype\"",
    "\"shape\"",
    "\"split\"",
    "\"dim\"",
    "\"chunks\"",
    "\"pad_multiple\"",
    "\"place\"",
    "\"tied\"",
    "\"states\"",
    "\"num_layers\"",
    "\"tensors\"",
    "\"version\"",
    "\"tp\"",
    "\"pp\"",
    "\"dp\"",
    "\"nodes\"",
    "\"replicas\"",
    "\"dataset\"",
    "\"devices\"",
    "\"id\"",
    "\"addr\"",
    "\"first\"",
    "\"last\"",
    "\"all\"",
    "\"bfloat16\"",
    "\"float8_e5m2\"",
    "\"data\"",
    "\"optim\"",
    "\"optim/m\"",
    "[1, 2, 3]",
    "[8, 2, 2]",
    "{\"dim\": 0}",
    "{\"dim\": 1, \"chunks\": 2}",
    "{\"dim\": 0, \"pad_multiple\": 128}",
    /* HTTP replies (fuzz_http) */
    "\r\n",
    "HTTP/1.1 206 Partial Content\r\n",
    "HTTP/1.1 200 OK\r\n",
    "HTTP/1.1 416 Range Not Satisfiable\r\n",
    "Content-Range: bytes ",
    "Content-Length: ",
    "bytes */",
    "/*",
    "http://",
};

/* Limits of the parsers and of the integer types, either side. */
static const char *const numbers[] = {
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "33",
    "64",
    "4096",
    "4097",
    "65536",
    "65537",
    "1048576",
    "1048577",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967296",
    "16777217",
    "1099511627776",
    "1099511627777",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "18446744073709551616",
    "-0",
    "1e400",
    "0.5",
};

/* A growable mutant buffer. */
struct buf {
	uint8_t *p;
	size_t n;
};

static void buf_insert(struct buf *b, size_t at, const void *src, size_t len)
{
	if (b->n + len > MAX_MUTANT)
		len = MAX_MUTANT - b->n;
	memmove(b->p + at + len, b->p + at, b->n - at);
	memcpy(b->p + at, src, len);
	b->n += len;
}

static void buf_erase(struct buf *b, size_t at, size_t len)
{
	memmove(b->p + at, b->p + at + len, b->n - at - len);
	b->n -= len;
}

static void mutate(struct buf *b)
{
	size_t at = below(b->n + 1), len;

	switch (rnd() % 9) {
	case 0: /* flip a bit */
		if (b->n)
			b->p[below(b->n)] ^= (uint8_t)(1u << below(8));
		break;
	case 1: /* set a byte, usually to a JSON character */
		if (b->n) {
			static const char js[] = "{}[]\":,-0123456789.eE \n\\tnul/{L}";
			b->p[below(b->n)] =
			    rnd() % 4 ? (uint8_t)js[below(sizeof(js) - 1)] : (uint8_t)rnd();
		}
		break;
	case 2: /* insert a token */
	{
		const char *t = tokens[below(sizeof(tokens) / sizeof(tokens[0]))];
		buf_insert(b, at, t, strlen(t));
		break;
	}
	case 3: /* delete a range */
		if (at < b->n) {
			len = 1 + below(b->n - at < 16 ? b->n - at : 16);
			buf_erase(b, at, len);
		}
		break;
	case 4: /* truncate */
		b->n = below(b->n + 1);
		break;
	case 5: /* splice: this prefix, another file's suffix */
		if (corpus.n) {
			const struct input *o = &corpus.v[below(corpus.n)];
			size_t from = below(o->size + 1);
			b->n = at;
			buf_insert(b, at, o->data + from, o->size - from);
		}
		break;
	case 6: /* duplicate a range */
		if (b->n) {
			size_t src = below(b->n);
			len = 1 + below(b->n - src < 64 ? b->n - src : 64);
			uint8_t tmp[64];
			memcpy(tmp, b->p + src, len);
			buf_insert(b, at, tmp, len);
		}
		break;
	default: /* replace a digit run with an interesting number */
	{
		size_t i = at, j;
		while (i < b->n && !(b->p[i] >= '0' && b->p[i] <= '9'))
			i++;
		if (i == b->n)
			break;
		for (j = i; j < b->n && b->p[j] >= '0' && b->p[j] <= '9'; j++)
			;
		buf_erase(b, i, j - i);
		const char *num = numbers[below(sizeof(numbers) / sizeof(numbers[0]))];
		buf_insert(b, i, num, strlen(num));
		break;
	}
	}
}

int main(int argc, char **argv)
{
	long runs = -1;
	unsigned long long seed = 1;
	double max_time = 0, report_slow = 10, start = now();
	struct buf b = {.p = malloc(MAX_MUTANT)};
	long done = 0;

	prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	if (!b.p)
		return 1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strncmp(a, "-runs=", 6) == 0)
			runs = strtol(a + 6, NULL, 10);
		else if (strncmp(a, "-seed=", 6) == 0)
			seed = strtoull(a + 6, NULL, 10);
		else if (strncmp(a, "-max_total_time=", 16) == 0)
			max_time = strtod(a + 16, NULL);
		else if (strncmp(a, "-report_slow_units=", 19) == 0)
			report_slow = strtod(a + 19, NULL);
		else if (strncmp(a, "-artifact_prefix=", 17) == 0)
			artifact_prefix = a + 17;
		else if (a[0] == '-')
			continue; /* other libFuzzer flags */
		else
			add_path(a);
	}
	/* Like libFuzzer: without -runs, mutate until -max_total_time, if given. */
	if (runs < 0)
		runs = max_time > 0 ? -1 : 0;

	rng_state = seed ? seed : 1;
	/* Under a sanitizer its own report comes first, then the callback. */
	signal(SIGABRT, on_signal);
	if (__sanitizer_set_death_callback) {
		__sanitizer_set_death_callback(save_crash);
	} else {
		signal(SIGSEGV, on_signal);
		signal(SIGBUS, on_signal);
		signal(SIGFPE, on_signal);
		signal(SIGILL, on_signal);
	}

	for (size_t i = 0; i < corpus.n; i++)
		run_one(corpus.v[i].data, corpus.v[i].size, report_slow);

	for (cur_run = 0; runs < 0 || cur_run < runs; cur_run++) {
		if (max_time > 0 && (cur_run & 63) == 0 && now() - start >= max_time)
			break;
		b.n = 0;
		if (corpus.n) {
			const struct input *in = &corpus.v[below(corpus.n)];
			b.n = in->size < MAX_MUTANT ? in->size : MAX_MUTANT;
			memcpy(b.p, in->data, b.n);
		}
		for (int k = 1 + (int)below(4); k > 0; k--)
			mutate(&b);
		run_one(b.p, b.n, report_slow);
		done++;
	}

	printf("%s: %zu corpus inputs, %ld mutations, seed %llu, %.2fs, slowest %.3fs (run %ld), "
	       "no crash\n",
	       prog, corpus.n, done, seed, now() - start, slowest, slowest_run);
	for (size_t i = 0; i < corpus.n; i++) {
		free(corpus.v[i].data);
		free(corpus.v[i].name);
	}
	free(corpus.v);
	free(b.p);
	return 0;
}
