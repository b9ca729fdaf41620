# relaybus: PGXS build of the extension, plus the project's test and demo entry points.
#
#   make / make install     build and install relaybus.so and the SQL scripts
#   make installcheck       pg_regress + isolation tests against a running server
#                           that preloads relaybus (PGHOST/PGPORT/PGUSER)
#   make test               every suite on a throwaway cluster, against the default major
#   make test-matrix        the PostgreSQL version lanes (15 to 19), each in a Debian root
#                           (RELAYBUS_MATRIX="17 18" for some; .ci/run runs both)
#   make test-managed       the delivery scripts of both editions against the managed SQL
#                           edition and relaybus-agent (.ci/run runs it too)
#   make demo               build, start a throwaway cluster, publish and consume
#   make mongo              build ./relaybus-mongo (the MongoDB sidecar, docs/mongo.md)
#   make agent              build ./relaybus-agent (delivers the managed SQL edition, docs/managed.md)
#   make managed            build/relaybus-managed--VERSION.sql, the SQL edition (docs/managed.md)

EXTENSION   = relaybus
MODULE_big  = relaybus
# sql/relaybus.sql holds the current definition of every object; the install
# script of the current version is built from it (git-ignored) and CREATE
# EXTENSION runs it alone. The older install scripts and the upgrade scripts
# are files of their own (docs/operations.md, "Changing the SQL").
EXTVERSION  = $(shell sed -n "s/^default_version = '\\(.*\\)'/\\1/p" relaybus.control)
DATA_built  = sql/relaybus--$(EXTVERSION).sql
DATA        = $(filter-out $(DATA_built),$(wildcard sql/relaybus--*.sql))

ROOT       := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
# src/pg/*.cpp is PostgreSQL glue, src/pg/cpp/*.cpp C++ without PostgreSQL
# headers (docs/architecture.md, "The C++/PostgreSQL boundary").
PG_SRCS     = $(wildcard src/pg/*.cpp src/pg/cpp/*.cpp)
# src/core's objects are shared with the core tests and relaybus-mongo (src/core/core.mk).
OBJS        = $(CORE_OBJS) $(PG_SRCS:.cpp=.o)
include src/core/core.mk

# -Werror: every build, on every major, refuses warnings (PGXS adds its own
# warning flags, e.g. 16's -Wshadow=compatible-local).
PG_CXXFLAGS = -std=c++17 -Werror -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-register \
              -fno-omit-frame-pointer -Isrc -MD -MP
SHLIB_LINK  = -lstdc++ -lcurl -lssl -lcrypto -lrdkafka

# pg_regress tests: test/sql/<name>.sql with test/expected/<name>.out.
REGRESS      = $(sort $(notdir $(basename $(wildcard test/sql/*.sql))))
REGRESS_OPTS = --inputdir=test --outputdir=results_regress
# Isolation specs: test/isolation/specs/<name>.spec with test/isolation/expected/<name>.out.
ISOLATION      = $(sort $(notdir $(basename $(wildcard test/isolation/specs/*.spec))))
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=results_isolation

EXTRA_CLEAN = results_regress results_isolation $(OBJS:.o=.d) $(BOUNDARY_CHECKED)

# We build without LLVM bitcode: relaybus's functions gain nothing from JIT
# inlining, and this keeps clang out of the build requirements.
override with_llvm = no

# The PostgreSQL to build against: PG_CONFIG=..., or PG=NN, or the major this
# Debian release installs (scripts/pg-config.sh). test, demo and deps install
# PostgreSQL first when it is missing, so they must not need pg_config to read
# this file.
PG_CONFIG ?= $(shell bash scripts/pg-config.sh 2>/dev/null || echo pg_config)
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(PGXS),)
# Supported majors: 15 to 19. Anything else stops here, in one line.
PG_MAJOR := $(shell $(PG_CONFIG) --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
ifeq ($(filter 15 16 17 18 19,$(PG_MAJOR)),)
$(error relaybus supports PostgreSQL 15, 16, 17, 18 and 19; $(PG_CONFIG) is $(shell $(PG_CONFIG) --version))
endif
include $(PGXS)
# The boundary by file, checked before relaybus.so is linked, from the
# dependency lists the compiles wrote (-MD lists system headers too).
BOUNDARY_CHECKED = src/pg/.boundary-checked
$(BOUNDARY_CHECKED): $(OBJS) scripts/check-boundary.sh
	bash scripts/check-boundary.sh $(includedir_server) $(OBJS:.o=.d)
	@touch $@
$(shlib): $(BOUNDARY_CHECKED)
else ifneq ($(filter-out test test-matrix test-managed demo deps managed agent,$(or $(MAKECMDGOALS),all)),)
$(error $(PG_CONFIG) not found: run `make deps` first (make test and make demo install it themselves))
endif

# The "-- @managed" marker lines (docs/managed.md) are the managed edition's
# business: the extension's script is relaybus.sql without them.
$(DATA_built): sql/relaybus.sql
	sed '/^-- @managed \(begin\|end\) /d' $< >$@

# The managed SQL edition (docs/managed.md): plain SQL and PL/pgSQL, installed
# with psql -f; built from the same source, C-only sections swapped for
# sql/managed/<section>.sql.
# Its upgrade scripts (scripts/managed-upgrade.sh) start at 0.2.0, its first
# version: each takes the extension's upgrade scripts' state changes from there
# to this version and this version's definitions.
MANAGED_SQL = build/relaybus-managed--$(EXTVERSION).sql
MANAGED_FROM = 0.2.0 0.3.0 0.4.0 0.5.0
MANAGED_UPGRADES = $(foreach v,$(MANAGED_FROM),build/relaybus-managed--$(v)--$(EXTVERSION).sql)
managed: $(MANAGED_SQL) $(MANAGED_UPGRADES)
$(MANAGED_SQL): sql/relaybus.sql $(wildcard sql/managed/*.sql) scripts/managed-sql.sh relaybus.control
	@mkdir -p build
	bash scripts/managed-sql.sh sql/relaybus.sql sql/managed $@ $(EXTVERSION)
build/relaybus-managed--%--$(EXTVERSION).sql: $(MANAGED_SQL) scripts/managed-upgrade.sh $(wildcard sql/relaybus--*--*.sql)
	bash scripts/managed-upgrade.sh $* $(EXTVERSION) $(MANAGED_SQL) $@ \
	    $$(bash scripts/upgrade-chain.sh $* $(EXTVERSION))

# Header dependencies (-MD), so an incremental build never mixes old and new layouts.
-include $(OBJS:.o=.d)

.PHONY: test test-matrix test-managed demo deps core-test mongo agent managed format format-check
# relaybus-mongo, the MongoDB sidecar (src/core + src/mongo, libmongoc): not part of PGXS.
mongo:
	$(MAKE) -C src/mongo
# relaybus-agent, the managed SQL edition's deliverer (src/core + src/agent, libpq): not part of PGXS.
agent:
	$(MAKE) -C src/agent
deps:
	bash scripts/install-deps.sh
# run_all.sh and demo.sh print their summary last. On failure make would print
# its own "*** [test] Error 1" after it, so the recipe ends make instead, with
# SIGPIPE: make has no handler for it and shells report no death by it (a
# terminal's bash would print "Killed" after a SIGKILL). Exit status 141.
test:
	@bash test/run_all.sh || kill -PIPE $$PPID
test-matrix:
	@bash test/matrix.sh || kill -PIPE $$PPID
test-managed:
	@RELAYBUS_EDITION=managed bash test/run_all.sh || kill -PIPE $$PPID
demo:
	@bash scripts/demo.sh || kill -PIPE $$PPID
core-test:
	$(MAKE) -C test/core check

# Every C++ file in the one style of .clang-format (Google's, 120 columns), as
# clang-format 14 (Debian 12's) writes it; another major may place a few
# lines differently. `format` rewrites, `format-check` only says which differ.
CLANG_FORMAT ?= $(firstword $(shell command -v clang-format-14 clang-format 2>/dev/null))
CXX_SOURCES = $(shell git ls-files '*.cpp' '*.hpp' '*.h')
format:
	$(if $(CLANG_FORMAT),,$(error clang-format not found: apt-get install clang-format-14))
	$(CLANG_FORMAT) -i $(CXX_SOURCES)
format-check:
	$(if $(CLANG_FORMAT),,$(error clang-format not found: apt-get install clang-format-14))
	$(CLANG_FORMAT) --dry-run --Werror $(CXX_SOURCES)
