#!/usr/bin/env bash
# Install Debian's chromium and chromium-driver for the dashboard's browser tests
# (tests/browser), when missing. Idempotent: does nothing when both are on PATH.
# Installs with apt-get as root, or through sudo when it needs no password. Where it
# cannot install: with NMBATCH_REQUIRE_BROWSER=1 (as `make test` sets it) it fails, as the
# browser tests then do; otherwise it says so and exits 0 (the browser tests then skip).
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
as_root=""  # nothing as root, "sudo -n" otherwise, "none" when neither works
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        as_root="sudo -n"
    else
        as_root="none"
    fi
fi
if [ "$as_root" = none ] || ! command -v apt-get >/dev/null; then
    if [ "${NMBATCH_REQUIRE_BROWSER:-}" = 1 ]; then
        echo "ensure_chromium: chromium missing, and no apt-get as root (or sudo without a" \
             "password) to install it; NMBATCH_REQUIRE_BROWSER=1 needs it: install Debian's" \
             "chromium and chromium-driver" >&2
        exit 1
    fi
    echo "ensure_chromium: chromium missing and no root apt-get here: browser tests will skip" >&2
    exit 0
fi
echo "ensure_chromium: installing chromium and chromium-driver (apt-get)"
$as_root apt-get update -qq
$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
