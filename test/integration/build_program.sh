# build_program, how the integration tests build their small C++ helpers
# (listen_client, kafka_topic) into test/integration/build (sourced by lib.sh
# and kafka_lib.sh, not run).

# build_program OUT SRC [COMPILER ARGS...]: compiles SRC into OUT unless OUT is
# newer, through a temporary file renamed into place, so that suites building
# it side by side never run a half-written binary.
build_program() {
    local out=$1 src=$2 tmp
    shift 2
    [[ -x "$out" && "$out" -nt "$src" ]] && return 0
    mkdir -p "$(dirname "$out")"
    tmp=$(mktemp "$out.XXXXXX")
    if g++ -std=c++17 -O2 -Wall -Wextra -Werror -o "$tmp" "$src" "$@"; then
        mv -f "$tmp" "$out"
        return 0
    fi
    rm -f "$tmp"
    return 1
}
