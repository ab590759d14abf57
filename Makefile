# kvtier — build, test and run. See README.md.
#   make            build build/kvtier and build/libkvtier.a
#   make run        build, serve the trained demo model (data/models/, docs/models.md) as the main job
#   make test       build and run every test (unit, CLI, end-to-end)
#   make sanitize   build with ASan+UBSan into build-san/; unit tests and every e2e script there
#   make fuzz       libFuzzer targets (tests/fuzz/fuzz_*.c) in build-fuzz/, each run FUZZ_SECONDS
#   make tsan       ThreadSanitizer build in build-tsan/; the server e2e suite (8 concurrent clients)
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
CFLAGS  ?=
CFLAGS  += -std=c11 -Isrc $(OPT) -g -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -pthread -MMD -MP $(SAN)
LDLIBS  := -lmicrohttpd -lcjson -lpcre2-8 -lxxhash -lhiredis -lssl -lcrypto -lm -pthread
TESTLIBS := -lcmocka

SRC_DIRS := src/util src/gguf src/kernels src/kv src/model src/text src/cache src/engine src/server
LIB_SRC  := $(foreach d,$(SRC_DIRS),$(wildcard $(d)/*.c))
CLI_SRC  := $(wildcard src/cli/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
DEPS_OK  := $(BUILD)/.deps-ok
# the web pages (docs/web.md): web/src bundled with the npm packages of web/package-lock.json by
# web/build.mjs (esbuild) into $(BUILD)/web/, then made C data by scripts/embed-web
WEB_IN   := web/package-lock.json web/build.mjs web/THIRD_PARTY_LICENSES.md $(wildcard web/src/*)
WEB_OBJ  := $(BUILD)/gen/web_assets.o
LIB_OBJ  += $(WEB_OBJ)
NEED_NODE = @command -v node >/dev/null && command -v npm >/dev/null || \
	{ echo "make: node and npm are needed to bundle the web pages in web/ (scripts/install-deps installs them)"; exit 1; }

DEMO_MODEL ?= data/models/kjv-target-q8_0.gguf
RUN_ARGS   ?=

.PHONY: all run test unit-test e2e-test sanitize tsan fuzz fuzz-build clean deps bench
all: $(BUILD)/kvtier $(BUILD)/libkvtier.a

$(DEPS_OK): scripts/install-deps
	@mkdir -p $(BUILD)
	@scripts/install-deps
	@touch $@

deps: $(DEPS_OK)

$(BUILD)/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

web/node_modules/.package-lock.json: web/package-lock.json | $(DEPS_OK)
	$(NEED_NODE)
	cd web && npm ci --no-audit --no-fund --silent

$(BUILD)/web.stamp: $(WEB_IN) web/node_modules/.package-lock.json
	$(NEED_NODE)
	node web/build.mjs $(BUILD)/web
	@touch $@

$(BUILD)/gen/web_assets.c: $(BUILD)/web.stamp scripts/embed-web
	@mkdir -p $(dir $@)
	scripts/embed-web $(BUILD)/web $@

$(WEB_OBJ): $(BUILD)/gen/web_assets.c
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libkvtier.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/kvtier: $(CLI_OBJ) $(BUILD)/libkvtier.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libkvtier.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libkvtier.a tests/testutil.h tests/fixture_model.h | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(BUILD)/libkvtier.a $(TESTLIBS) $(LDLIBS)

# stand-alone benchmark programs bench/NAME.c that need only the library (e.g. build/bench/membw)
$(BUILD)/bench/%: bench/%.c $(BUILD)/libkvtier.a | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(BUILD)/libkvtier.a $(LDLIBS)

# the demo model is committed (scripts/train-models made it); gen-model files are for shapes only
run: $(BUILD)/kvtier
	@test -f $(DEMO_MODEL) || { echo "make run: $(DEMO_MODEL) is missing (git checkout data/models, or scripts/train-models)"; exit 1; }
	$(BUILD)/kvtier demo -m $(DEMO_MODEL) $(RUN_ARGS)

unit-test: $(TEST_BIN) $(BUILD)/kvtier
	@BUILD=$(BUILD) scripts/run-tests $(TEST_BIN)

test: all $(TEST_BIN)
	@BUILD=$(BUILD) scripts/run-tests $(TEST_BIN) --with-e2e

e2e-test: all
	@BUILD=$(BUILD) scripts/run-tests --with-e2e

SAN_ASAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
sanitize:
	$(MAKE) BUILD=build-san OPT=-O1 SAN="$(SAN_ASAN)" unit-test
	ASAN_OPTIONS=abort_on_error=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(MAKE) BUILD=build-san OPT=-O1 SAN="$(SAN_ASAN)" e2e-test

# halt_on_error: the first data race ends the server, so the e2e test fails
tsan:
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 E2E_ONLY="server_api server_batching" \
	  $(MAKE) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" e2e-test

# libFuzzer: the library built by clang with coverage + ASan/UBSan in build-fuzz/, one binary per
# tests/fuzz/fuzz_NAME.c; each runs FUZZ_SECONDS over tests/fuzz/corpus/NAME/ (new inputs go to
# build-fuzz/corpus/NAME/, crashes to build-fuzz/crash-NAME-*; keep a crash as a seed once fixed)
FUZZ_SECONDS ?= 30
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
fuzz-build:
	$(MAKE) BUILD=build-fuzz CC=clang OPT=-O1 SAN="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" build-fuzz/libkvtier.a
	$(MAKE) $(FUZZ_BIN)
build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c build-fuzz/libkvtier.a
	clang -std=c11 -Isrc -O1 -g -D_GNU_SOURCE -pthread $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $< build-fuzz/libkvtier.a $(LDLIBS)
fuzz: fuzz-build
	@set -e; for b in $(FUZZ_BIN); do n=$${b#build-fuzz/fuzz_}; mkdir -p build-fuzz/corpus/$$n tests/fuzz/corpus/$$n; \
	  echo "=== fuzz $$n ($(FUZZ_SECONDS) s)"; \
	  $$b -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/crash-$$n- \
	    build-fuzz/corpus/$$n tests/fuzz/corpus/$$n >build-fuzz/fuzz-$$n.log 2>&1 \
	    || { tail -40 build-fuzz/fuzz-$$n.log; exit 1; }; grep -E "^Done [0-9]+ runs" build-fuzz/fuzz-$$n.log; done

bench: $(BUILD)/kvtier
	bench/run-all

clean:
	rm -rf build build-san build-tsan build-fuzz

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)
