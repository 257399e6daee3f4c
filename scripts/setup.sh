#!/usr/bin/env bash
# Installs what building and testing weir needs beyond the Rust toolchain, and only what is
# missing, so a machine that has everything pays nothing:
#
# - libclang and a C++ compiler: the RocksDB state backend (librocksdb-sys runs bindgen and
#   compiles RocksDB);
# - a C compiler and make: librdkafka, built from source by rdkafka-sys;
# - Java 17+ and Maven: the real Kafka broker the Kafka tests start (scripts/kafka.sh);
# - PostgreSQL's server binaries: the apply-once sink's tests (scripts/postgres.sh);
# - Chromium: the web dashboard's tests load it in a real headless browser.
#
#   bash scripts/setup.sh
#
# On Debian and Ubuntu it installs with apt-get, as root or through sudo. Elsewhere, or
# without the rights, it names the packages to install and fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() {
    printf '[setup] %s\n' "$*" >&2
}

need=()

# libclang itself (libclang.so, libclang-14.so.1, ...), not libclang-cpp, which some
# images carry without it and which bindgen cannot use. Only when a manifest uses RocksDB.
# (grep without -q: with pipefail, grep -q closing the pipe early can fail the test.)
if grep -Es '^[[:space:]]*rocksdb[[:space:]]*=' Cargo.toml crates/*/Cargo.toml >/dev/null; then
    if ! ldconfig -p 2>/dev/null | grep -E 'libclang(-[0-9.]+)?\.so' >/dev/null; then
        need+=(libclang-dev)
    fi
    command -v c++ >/dev/null || need+=(g++)
fi
command -v cc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
if ! java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'; then
    need+=(openjdk-17-jre-headless)
fi
command -v mvn >/dev/null || need+=(maven)
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    need+=(postgresql)
fi
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    need+=(chromium)
fi

if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi

if ! command -v apt-get >/dev/null; then
    say "missing: ${need[*]} (Debian package names); install them and run this again"
    exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null; then
    sudo=(sudo)
else
    say "missing: ${need[*]}; run as root, or install them with apt-get, and run this again"
    exit 1
fi
say "installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q >&2
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${need[@]}" >&2
