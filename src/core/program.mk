# A relaybus program beside the server (relaybus-mongo, relaybus-agent):
# src/$(NAME)/*.cpp and src/core's one build (core.mk), linked with the
# pkg-config package $(PKG) and what the core needs. The including Makefile
# sets NAME, PKG and, if it needs them, EXTRA_CXXFLAGS.
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/../..)
HERE := $(ROOT)/src/$(NAME)
BUILD := $(ROOT)/build/$(NAME)

CXX ?= g++
CXXFLAGS ?= -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers \
	$(EXTRA_CXXFLAGS)
CPPFLAGS += -I$(ROOT)/src $(shell pkg-config --cflags $(PKG)) -MMD -MP
LDLIBS += $(shell pkg-config --libs $(PKG)) -lcurl -lssl -lcrypto -lrdkafka -pthread

# src/core's objects, the ones the extension and the core tests link too.
include $(ROOT)/src/core/core.mk
OBJS := $(CORE_OBJS) $(patsubst $(ROOT)/src/%.cpp,$(BUILD)/%.o,$(wildcard $(HERE)/*.cpp))
BIN := $(ROOT)/relaybus-$(NAME)

.PHONY: all objects clean
all: $(BIN)
# The program's own objects, which need nothing of src/core's build: test/run_all.sh
# compiles them beside the extension's build and links once that has ended.
objects: $(filter-out $(CORE_OBJS),$(OBJS))

$(BIN): $(OBJS)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/$(NAME)/%.o: $(HERE)/%.cpp
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c -o $@ $<

clean:
	rm -rf $(BUILD) $(BIN)

-include $(OBJS:.o=.d)
