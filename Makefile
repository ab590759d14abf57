# kvtier — build, test and run. See README.md.
#   make            build build/kvtier and build/libkvtier.a
#   make run        build, make the demo model if missing, start the main job
#   make test       build and run every test (unit, CLI, end-to-end)
#   make sanitize   build with ASan+UBSan into build-san/ and run the unit tests there
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

DEMO_MODEL ?= models/demo.gguf
RUN_ARGS   ?=

.PHONY: all run test unit-test sanitize clean deps bench
all: $(BUILD)/kvtier $(BUILD)/libkvtier.a

$(DEPS_OK): scripts/install-deps
	@mkdir -p $(BUILD)
	@scripts/install-deps
	@touch $@

deps: $(DEPS_OK)

$(BUILD)/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libkvtier.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/kvtier: $(CLI_OBJ) $(BUILD)/libkvtier.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libkvtier.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libkvtier.a tests/testutil.h | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(BUILD)/libkvtier.a $(TESTLIBS) $(LDLIBS)

$(DEMO_MODEL): $(BUILD)/kvtier
	@mkdir -p $(dir $@)
	$(BUILD)/kvtier gen-model --arch llama --shape smol-135m --type q8_0 -o $@

run: $(BUILD)/kvtier $(DEMO_MODEL)
	$(BUILD)/kvtier demo -m $(DEMO_MODEL) $(RUN_ARGS)

unit-test: $(TEST_BIN) $(BUILD)/kvtier
	@BUILD=$(BUILD) scripts/run-tests $(TEST_BIN)

test: all $(TEST_BIN)
	@BUILD=$(BUILD) scripts/run-tests $(TEST_BIN) --with-e2e

sanitize:
	$(MAKE) BUILD=build-san OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" unit-test

bench: $(BUILD)/kvtier
	bench/run-all

clean:
	rm -rf build build-san

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)
