# mlfs - tensor filesystem for elastic training.
# make [all] | test | demo | deps | bench | fuzz | soak | chaos | format | clean
# make SANITIZE=address,undefined test

PY      ?= /usr/bin/python3
CC      ?= cc
BUILD   ?= build
export BUILD
PKGS    := jansson fuse3 libcurl libmicrohttpd libxxhash libzstd
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-declarations -Werror
CPPFLAGS += -D_GNU_SOURCE -I. $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS  += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread -lm
ifneq ($(SANITIZE),)
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif
ALL_CFLAGS = -std=gnu11 $(WARN) $(CFLAGS)

DEB_PKGS := libfuse3-dev fuse3 libmicrohttpd-dev libcurl4-openssl-dev libjansson-dev \
	libzstd-dev libxxhash-dev libcmocka-dev pkg-config python3-numpy python3-pytest etcd-server \
	python3-torch python3-matplotlib iperf3 spin clang-format

# The modules, one static library each, and what each may include (its own
# headers and these folders' public headers). `make check-deps` enforces the
# graph (tests/check_deps.sh); docs/internals/README.md explains it.
#   ptc       -                       pure: schema, config, layout, plan
#   common    ptc                     log, .npy, hashing, parallel loops, mapped copies
#   net       ptc                     HTTP server and client, etcd client (ptc.h: struct ptc_error)
#   transform ptc common              executes plans
#   dataset   ptc common net transform
#   store     ptc common transform dataset
#   cluster   ptc common net transform dataset store
#   mount     ptc common transform dataset store (and cluster in mlfs_daemon.c, start-up)
#   tools     public headers only (ptc.h, mount.h, cluster.h)
MODULES   := mount cluster store dataset transform net common ptc
DEPS_ptc       :=
DEPS_common    := ptc
DEPS_net       := ptc
DEPS_transform := ptc common
DEPS_dataset   := ptc common net transform
DEPS_store     := ptc common transform dataset
DEPS_cluster   := ptc common net transform dataset store
DEPS_mount     := ptc common transform dataset store
DEPS_tools     := ptc mount cluster
export $(foreach m,$(MODULES) tools,DEPS_$(m))
TOOLS_SRC := $(wildcard tools/*.c)
TOOLS_OBJ := $(TOOLS_SRC:%.c=$(BUILD)/obj/%.o)
# Link order: dependents first.
LIBS      := $(foreach m,$(MODULES),$(BUILD)/lib$(m).a)
$(foreach m,$(MODULES),$(eval $(BUILD)/lib$(m).a: $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard $(m)/*.c))))
$(BUILD)/lib%.a:
	@rm -f $@
	ar rcs $@ $^

UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all binaries test unit demo deps bench fuzz format format-check clean check-deps soak chaos model

.DEFAULT_GOAL := all
all: $(BUILD)/mlfs

$(BUILD)/obj/%.o: %.c $(wildcard */*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -c -o $@ $<

$(BUILD)/mlfs: $(TOOLS_OBJ) $(LIBS)
	$(CC) $(LDFLAGS) -o $@ $(TOOLS_OBJ) $(LIBS) $(LDLIBS)

$(BUILD)/tests/test_%: tests/unit/test_%.c $(LIBS) $(wildcard tests/unit/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(LIBS) \
		$(shell pkg-config --libs cmocka) $(LDLIBS)

# Fuzz targets: a replay-and-mutate driver for `make test` (any compiler),
# libFuzzer for `make fuzz` (clang).
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/tests/%)
$(BUILD)/tests/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/driver.c tests/fuzz/fuzz.h $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< tests/fuzz/driver.c \
		$(LIBS) $(LDLIBS)

FUZZ_SECONDS ?= 300
fuzz: deps
	@command -v clang >/dev/null || apt-get install -y clang
	$(MAKE) BUILD=build/libfuzzer CC=clang SANITIZE=address,undefined \
		CFLAGS="-O1 -g -fsanitize=fuzzer-no-link" \
		$(foreach m,$(MODULES),build/libfuzzer/lib$(m).a)
	@mkdir -p build/libfuzzer/tests
	set -e; for f in $(FUZZ_SRC); do n=$$(basename $$f .c); \
		clang $(CPPFLAGS) -g -O1 -fsanitize=fuzzer,address,undefined -o build/libfuzzer/tests/$$n \
			$$f $(foreach m,$(MODULES),build/libfuzzer/lib$(m).a) $(LDLIBS); \
		mkdir -p build/corpus/$$n; \
		build/libfuzzer/tests/$$n -max_total_time=$(FUZZ_SECONDS) build/corpus/$$n tests/fuzz/corpus/$$n; \
	done

deps:
	@missing=""; for p in $(DEB_PKGS); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "make deps: installing$$missing"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

unit: $(UNIT_BIN) $(FUZZ_BIN)
	set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done
	set -e; for f in $(FUZZ_BIN); do n=$$(basename $$f); echo "== $$f (short run)"; \
		$$f -runs=20000 tests/fuzz/corpus/$$n; done

# What make test builds, compiled on every core (the tests themselves run one
# at a time: unit, then e2e).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
binaries: all $(BUILD)/tests/sim_control $(UNIT_BIN) $(FUZZ_BIN)

test: deps
	$(MAKE) check-deps format-check
	$(MAKE) -j$(JOBS) binaries
	$(MAKE) unit
	tests/model/check.sh
	$(PY) -m pytest -q tests/e2e
ifeq ($(SANITIZE),)
	@echo "== again under AddressSanitizer and UBSan (build/asan)"
	@# All but the two PyTorch runs of five layouts each (2 min of CPU in the
	@# workers, the daemon doing what test_reconf and test_cluster do);
	@# test_elastic_without_a_human runs in both passes.
	$(MAKE) -j$(JOBS) BUILD=$(BUILD)/asan SANITIZE=address,undefined binaries
	$(MAKE) BUILD=$(BUILD)/asan SANITIZE=address,undefined unit
	BUILD=$(BUILD)/asan $(PY) -m pytest -q tests/e2e -k "not test_elastic_training"
endif

# The soak test alone, longer: make soak SOAK_SECONDS=600 (make test runs it 30 s, in each pass).
SOAK_SECONDS ?= 600
soak: deps
	$(MAKE) all
	MLFS_SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m pytest -q -s tests/e2e/test_soak.py

# The randomized adversary of the control plane (tests/chaos/chaos.py: a kill -9,
# a freeze or etcd's loss at a random moment of every reconfiguration, every
# invariant checked after each), not part of make test: make chaos
# CHAOS_SECONDS=600 CHAOS_SEED=2 CHAOS_NODES=4.
CHAOS_SECONDS ?= 300
CHAOS_SEED ?= 1
CHAOS_NODES ?= 5
chaos: deps
	$(MAKE) all
	$(PY) tests/chaos/chaos.py --seconds $(CHAOS_SECONDS) --seed $(CHAOS_SEED) \
		--nodes $(CHAOS_NODES)

demo: deps
	$(MAKE) all
	./examples/demo.sh

# build/mlfs to $(PREFIX)/bin and the Python package (python/) with pip, offline: no
# dependencies fetched (NumPy, PyTorch: Debian's), no build isolation. The package
# goes to $(PREFIX)'s site directory for $(PY) (Debian: lib/python3.X/dist-packages,
# which pip --prefix would put under $(PREFIX)/local); Debian marks its Python
# externally managed, so pip is told it may install beside it.
# make install [PREFIX=/usr/local] [DESTDIR=/staging]
PREFIX  ?= /usr/local
.PHONY: install
install: all
	install -D -m 755 $(BUILD)/mlfs $(DESTDIR)$(PREFIX)/bin/mlfs
	site=$$($(PY) -c 'import sys, sysconfig as s; d = s.get_path("purelib", "posix_prefix", {"base": sys.argv[1]}); print(d[:-len("site-packages")] + "dist-packages" if getattr(s, "get_default_scheme", str)() == "posix_local" else d)' $(PREFIX)); \
	system=$$($(PY) -c 'import os, sysconfig as s; print("--break-system-packages" if os.path.exists(os.path.join(s.get_path("stdlib"), "EXTERNALLY-MANAGED")) else "")'); \
	$(PY) -m pip install --no-deps --no-build-isolation --no-index $$system \
		--upgrade --target "$(DESTDIR)$$site" ./python

bench: deps
	$(MAKE) all $(BUILD)/tests/bench_plan $(BUILD)/tests/bench_plan_scale $(BUILD)/tests/sim_control $(BUILD)/tests/bench_sum
	./$(BUILD)/tests/bench_plan
	./$(BUILD)/tests/bench_plan_scale
	./$(BUILD)/tests/bench_sum
	BUILD=$(BUILD) $(PY) tests/bench/bench_sum.py --size-mib 1500
	BUILD=$(BUILD) $(PY) tests/bench/bench_snapshot.py --size-mib 1024
	$(PY) tests/bench/bench_store.py --size-mib 1024
	$(PY) tests/bench/bench_data.py --size-mib 512
	$(PY) tests/bench/bench_data.py --size-mib 1024 --global-batch 2048 --steps 16
	$(PY) tests/bench/bench_cluster.py --size-mib 1500
	$(PY) tests/bench/bench_stview.py --size-mib 256
	$(PY) tests/bench/bench_jobdir.py --files 20000
	$(PY) tests/bench/bench_control.py --nodes 4,16,32,64
	$(PY) tests/bench/bench_etcd_cost.py --watchers 32
	BUILD=$(BUILD) $(PY) examples/elastic_auto.py --out $(BUILD)/elastic-auto
	$(PY) tests/bench/bench_sim.py --nodes 1000,10000 --timeout 120
	$(PY) tests/bench/bench_sim.py --nodes 10000 --timeout 120 --sim-args "--to-nodes 1"
	$(PY) tests/bench/bench_sim.py --nodes 10000 --watches 100 --timeout 150 \
		--sim-args "--keepalive-ms 10000 --lease-ttl 30"
	BUILD=$(BUILD) $(PY) tests/bench/bench_suggest.py --nodes 1,2,3,4

$(BUILD)/tests/bench_%: tests/bench/bench_%.c $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(LIBS) $(LDLIBS)

# The control plane of N nodes simulated against one etcd (tests/bench/bench_sim.py):
# sim_control.c (its DESIGN block, main) and the other files of sim_i.h.
SIM_SRC := $(wildcard tests/bench/sim_*.c)
$(BUILD)/tests/sim_control: $(SIM_SRC) tests/bench/sim_i.h $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(SIM_SRC) $(LIBS) $(LDLIBS)

# The protocol model (spin), bounded: a few seconds.
model: deps
	tests/model/check.sh

check-deps:
	@tests/check_deps.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

# Every C file as the root .clang-format has it (make format fixes them).
format-check:
	@command -v clang-format >/dev/null || { echo "format-check: clang-format is missing (make deps)"; exit 1; }
	clang-format --dry-run -Werror $$(git ls-files '*.c' '*.h')
	@echo "format-check: every C file is formatted"

clean:
	rm -rf build
