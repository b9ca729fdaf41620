#!/usr/bin/env bash
# The C++/PostgreSQL boundary by file (docs/architecture.md), checked on every
# build from the compiler's own dependency lists (-MD: system headers too):
#
#   src/pg/*.cpp      glue: PostgreSQL headers (postgres.h first, through
#                     pg/pg_includes.hpp), no STL container or owning header
#                     (so a longjmp skips no destructor)
#   src/pg/cpp/*.cpp  C++: no PostgreSQL header
#   src/core/*.cpp    no PostgreSQL header (nor a MongoDB one)
#
#   scripts/check-boundary.sh PG_INCLUDEDIR FILE.d...
#
# Each FILE.d is the dependency file of one object. Exits 1 naming every file
# that breaks its rule, and the header that breaks it.
set -euo pipefail

(($# >= 1)) || { echo "usage: $0 PG_INCLUDEDIR FILE.d..." >&2; exit 2; }
pg_include=$1
shift

# Headers that own memory or hold objects with destructors (and the libstdc++
# internals that define those, in case one comes without its public header).
stl='/c\+\+/[^/]+/((string|vector|map|unordered_map|set|unordered_set|deque|list|forward_list|memory|memory_resource|functional|optional|variant|any|sstream|fstream|iostream|istream|ostream|regex|stack|queue|thread|mutex|future|filesystem|random)|bits/(basic_string|stl_vector|stl_map|stl_tree|hashtable|stl_deque|stl_list|unique_ptr|shared_ptr|std_function)\.h)$'
pg="^(${pg_include//./\\.}/|.*/postgres\.h$)"
mongo='/(libmongoc|libbson)-1\.0/'

# The headers a .d file lists, one a line (its targets and continuations gone).
headers() { sed -e 's/^[^:]*://' -e 's/\\$//' "$1" | tr ' ' '\n' | grep -v -e '^$' -e ':$' || true; }

bad=0
fail() { echo "check-boundary: $1" >&2; bad=1; }
for d in "$@"; do
    src=${d%.d}.cpp
    rel=src/pg/${src##*src/pg/}
    list=$(headers "$d")
    case $src in
        */src/pg/cpp/*.cpp | src/pg/cpp/*.cpp)
            hit=$(grep -E -m1 "$pg" <<<"$list" || true)
            [[ -z $hit ]] || fail "$rel is a C++ file (src/pg/cpp) but includes the PostgreSQL header $hit"
            ;;
        */src/pg/*.cpp | src/pg/*.cpp)
            grep -q -E "$pg" <<<"$list" || continue
            # PostgreSQL's headers come in through pg/pg_includes.hpp (C
            # linkage, postgres.h first); a file's own extras follow it.
            first=$(grep -E -m1 -B1 "$pg" <<<"$list")
            [[ $first == */pg/pg_includes.hpp$'\n'*/postgres.h ]] ||
                fail "$rel reaches PostgreSQL's headers other than through pg/pg_includes.hpp (first: ${first//$'\n'/ then })"
            hit=$(grep -E -m1 "$stl" <<<"$list" || true)
            [[ -z $hit ]] || fail "$rel is PostgreSQL glue (src/pg) but includes the STL header $hit: move the C++ to src/pg/cpp behind a plain header"
            ;;
        *)  # src/core (build/core/*.d)
            hit=$(grep -E -m1 -e "$pg" -e "$mongo" <<<"$list" || true)
            [[ -z $hit ]] || fail "$d (src/core) includes $hit: core is plain C++"
            ;;
    esac
done
exit $bad
