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
INSTALLER=tests/report/install.sh
. "$(dirname "$0")/../fixtures/apt.sh"

have_all chromium chromedriver tmux && exit 0

need_apt_root "apt-get install chromium chromium-driver tmux" \
    "install Chromium, its chromedriver and tmux yourself (chromium, chromedriver and tmux on PATH)"
apt_install chromium chromium-driver tmux
require_all chromium chromedriver tmux
echo "tests/report/install.sh: $(chromium --version 2>/dev/null | head -n 1), $(tmux -V)"
