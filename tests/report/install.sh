#!/bin/sh
# Install what the report and live-view tests (tests/report/) need on a fresh Debian 12
# machine: a real headless browser and its WebDriver (Debian's `chromium` and
# `chromium-driver`; the tests drive them with Selenium, no browser download) and tmux
# (the live view is tested in a real terminal).
#
#   sudo tests/report/install.sh      # or as root in CI; `make test` runs it
#
# Idempotent and fast when already installed.
set -eu

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
    && command -v tmux >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "tests/report/install.sh: needs root to apt-get install chromium chromium-driver tmux" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/report/install.sh: no apt-get; install Chromium, its chromedriver and tmux" \
         "yourself (chromium, chromedriver and tmux on PATH)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver tmux >/dev/null

for tool in chromium chromedriver tmux; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "tests/report/install.sh: $tool still missing after apt-get install" >&2
        exit 1
    }
done
echo "tests/report/install.sh: $(chromium --version 2>/dev/null | head -n 1), $(tmux -V)"
