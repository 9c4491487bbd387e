#!/usr/bin/env bash
# Install Debian's chromium and chromium-driver for the dashboard's browser tests
# (tests/browser), when missing. Idempotent: does nothing when both are on PATH.
# Installs only as root on a machine with apt-get; elsewhere it says so and exits 0
# (the browser tests then skip, saying chromium was not found).
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "ensure_chromium: chromium missing and no root apt-get here: browser tests will skip" >&2
    exit 0
fi
echo "ensure_chromium: installing chromium and chromium-driver (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver >/dev/null
