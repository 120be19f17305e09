#!/bin/sh
# Install what the real-backend tests (tests/backends/, marker `backend`) need on a fresh
# Debian 12 (bookworm) machine: Prometheus 2.42 and promtool (Debian package `prometheus`),
# Alertmanager 0.25 (`prometheus-alertmanager`, for tests/baseline/).
#
#   sudo tests/backends/install.sh      # or as root in CI
#
# Idempotent and fast when already installed: it returns at once if both binaries are on
# PATH. Nothing is started: the package's service start is blocked by policy-rc.d on CI
# images (no systemd), and the tests start their own Prometheus on a free 127.0.0.1 port.
set -eu

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 \
    && command -v prometheus-alertmanager >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "tests/backends/install.sh: needs root to apt-get install prometheus" \
         "(run it with sudo, or set OTELGPU_SKIP_BACKENDS=1 to skip the backend tests)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/backends/install.sh: no apt-get; install Prometheus >= 2.42 (prometheus and" \
         "promtool on PATH) yourself, or set OTELGPU_SKIP_BACKENDS=1" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null

command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 \
    && command -v prometheus-alertmanager >/dev/null 2>&1 || {
    echo "tests/backends/install.sh: prometheus/promtool/prometheus-alertmanager still missing after apt-get install" >&2
    exit 1
}
echo "tests/backends/install.sh: $(prometheus --version 2>&1 | head -n 1)"
