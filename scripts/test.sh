#!/usr/bin/env bash
# Runs every test of weir (unit, integration, end-to-end, chaos, Kafka, PostgreSQL and the
# documentation's snippets) on a fresh machine: installs what is missing
# (scripts/setup.sh), then `cargo test --workspace`. The Kafka and PostgreSQL tests start
# their own broker and server and stop them when the test process ends, unless
# WEIR_KAFKA_BROKERS / WEIR_POSTGRES_URL name running ones.
#
#   scripts/test.sh [extra cargo test arguments]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
exec cargo test --workspace "$@"
