#!/usr/bin/env bash
# The SDK's public API exposes no generated proto and no gRPC: a trainer's
# program (sdk_public_headers_main.cc), and a file that includes every
# public header (client/include/halka/*.h, common/include/halka/*.h),
# compile with exactly the SDK's include directories (client/include,
# common/include, Abseil's), without the generated protos' directory or the
# source root, and the headers they pull in (the compiler's own list, -MD)
# hold no *.pb.h, grpc, grpcpp or google/protobuf header (those share
# /usr/include with Abseil on Debian, so the list is the proof) and no
# header of the source tree outside those two directories. The program then
# links against libhalka_client.a and its private dependencies alone (the
# libraries CMake gives a program that links only halka::client) and runs;
# its symbols hold no worker, rendezvous, parameter-server or
# embedded-cluster code. CONTROL (a program that links LocalCluster) must
# be flagged by the same symbol check.
#
#   sdk_public_headers_test.sh CXX NINJA SOURCE_DIR BUILD_DIR SDK_ONLY_TARGET \
#                              CONTROL_BINARY [ABSEIL_INCLUDE_DIR...]
set -euo pipefail
cxx=$1 ninja=$2 source=$(realpath "$3") build=$(realpath "$4") target=$5
control=$6
shift 6
if [[ ! -f $build/build.ninja ]]; then
  echo "not a Ninja build: skipped"; exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

includes=(-I"$source/client/include" -I"$source/common/include")
for d in "$@"; do
  [[ -n $d && $d != /usr/include ]] && includes+=(-isystem "$d")
done

# Every file the compiler read ($1, its -MD list; paths made canonical)
# must be allowed.
check_deps() {
  local read bad
  read=$(sed 's/^[^:]*://' "$1" | tr -s ' \\' '\n\n' | grep -v '^$' |
         xargs realpath -m)
  bad=$(grep -E '\.pb\.h$|/grpcpp?/|/google/protobuf/|^'"$build"'/' <<<"$read" || true)
  bad+=$'\n'$(grep -E "^$source/" <<<"$read" |
         grep -vE "^$source/(client/include|common/include)/" |
         grep -vE "^$source/tests/unit/sdk_public_headers_main\.cc$" || true)
  bad=$(grep -v '^$' <<<"$bad" || true)
  if [[ -n $bad ]]; then
    echo "FAIL: $2 pulls in headers outside the SDK's public API:"
    head -20 <<<"$bad"; return 1
  fi
  echo "  read $(wc -l <<<"$read") files, none a proto, gRPC or internal header"
}

# 1. Every public header, included together.
{
  for h in "$source"/client/include/halka/*.h "$source"/common/include/halka/*.h; do
    echo "#include \"halka/$(basename "$h")\""
  done
} > "$tmp/all_public_headers.cc"
compile_all=("$cxx" -std=gnu++17 "${includes[@]}" -MD -MF "$tmp/all.d"
             -c "$tmp/all_public_headers.cc" -o "$tmp/all.o")
echo "compile (every public header):"; echo "  ${compile_all[*]}"
sed 's/^/    /' "$tmp/all_public_headers.cc"
"${compile_all[@]}"
check_deps "$tmp/all.d" "including every public header"

# 2. The program: compile, link against the SDK alone, run.
compile=("$cxx" -std=gnu++17 -O1 "${includes[@]}" -MD -MF "$tmp/main.d"
         -c "$source/tests/unit/sdk_public_headers_main.cc" -o "$tmp/main.o")
echo "compile:"; echo "  ${compile[*]}"
"${compile[@]}"
check_deps "$tmp/main.d" "sdk_public_headers_main.cc"

# The libraries CMake links a program that links only halka::client with
# (its last command: `... -o client/TARGET LIBS && :`).
line=$("$ninja" -C "$build" -t commands "$target" | tail -n 1)
libs=$(sed -E "s/.* -o client\/$target +//; s/ *&& *:? *$//" <<<"$line")
if [[ $libs == "$line" || " $libs " != *" client/libhalka_client.a "* ]]; then
  echo "FAIL: cannot read the SDK's libraries from $target's link line:"
  echo "$line"; exit 1
fi
link="$cxx $tmp/main.o -o $tmp/sdk_public_headers $libs"
echo "link (in $build):"; echo "  $link"
(cd "$build" && eval "$link")
"$tmp/sdk_public_headers"

# Daemon code would show as its classes' symbols.
daemon='halka::(WorkerNode|WorkerService|RendezvousService|RendezvousState|ParameterServer[A-Za-z]*|LocalCluster|EmbeddedWorker|EmbeddedRendezvous)\b'
nm -C "$tmp/sdk_public_headers" > "$tmp/sdk.nm"
nm -C "$control" > "$tmp/control.nm"
if found=$(grep -E "$daemon" "$tmp/sdk.nm") && [[ -n $found ]]; then
  echo "FAIL: the SDK-only program holds daemon code:"; head -5 <<<"$found"
  exit 1
fi
if ! grep -qE "$daemon" "$tmp/control.nm"; then
  echo "FAIL: the symbol check does not flag $control (it links LocalCluster)"
  exit 1
fi
echo "OK: the public headers name no proto or gRPC; the program links the SDK alone"
