# src/core, compiled once for everything that links it: the extension (the
# top-level Makefile), the core tests (test/core/Makefile; their ASan build
# aside), relaybus-mongo and relaybus-agent (src/core/program.mk). Include with ROOT set to the
# repository root; link $(CORE_OBJS), and -include $(CORE_OBJS:.o=.d) (the
# header dependencies) after the includer's first target.
#
# One flag set for all three: position independent (the extension is a shared
# library), hidden visibility (the extension exports only its SQL entry points,
# as PGXS does from PostgreSQL 16), and the union of the warnings the three
# builds asked for, as errors. No PostgreSQL or MongoDB headers.
CORE_BUILD := $(ROOT)/build/core
CORE_SRCS := $(wildcard $(ROOT)/src/core/*.cpp)
CORE_OBJS := $(patsubst $(ROOT)/src/core/%.cpp,$(CORE_BUILD)/%.o,$(CORE_SRCS))
CORE_CXXFLAGS := -std=c++17 -O2 -g -fPIC -fno-omit-frame-pointer -fvisibility=hidden -fvisibility-inlines-hidden \
                 -Wall -Wextra -Werror -Wpointer-arith -Wimplicit-fallthrough=3 -Wcast-function-type -Wformat-security -Wshadow=compatible-local

# Two builds run side by side (the core tests and relaybus-mongo) may make the
# same object at once: each writes its own temporary files and renames them
# into place, so that neither links a half-written object.
$(CORE_BUILD)/%.o: $(ROOT)/src/core/%.cpp
	@mkdir -p $(@D)
	$(CXX) $(CORE_CXXFLAGS) -I$(ROOT)/src -MMD -MP -MT $@ -MF $@.d.$$$$ -c -o $@.tmp.$$$$ $< \
	    && mv -f $@.d.$$$$ $(@:.o=.d) && mv -f $@.tmp.$$$$ $@
