#!/usr/bin/env bash
# Prepares this machine for the tests and the demo. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
