#!/bin/sh
# Install what the real-backend tests (tests/backends/, marker `backend`) need on a fresh
# Debian 12 (bookworm) machine: Prometheus 2.42 and promtool (Debian package `prometheus`),
# Alertmanager 0.25 (`prometheus-alertmanager`, for tests/baseline/), and VictoriaMetrics
# (an OTLP-ingesting store, for tests/baseline/): bookworm's 1.79 predates OTLP, so trixie's
# .deb is downloaded with a private apt configuration (the system's apt sources and dpkg
# state are untouched), unpacked under /opt/otelgpu-victoria-metrics and linked into
# /usr/local/bin.
#
#   sudo tests/backends/install.sh      # or as root in CI
#
# Idempotent and fast when already installed: it returns at once if both binaries are on
# PATH. Nothing is started: the package's service start is blocked by policy-rc.d on CI
# images (no systemd), and the tests start their own Prometheus on a free 127.0.0.1 port.
set -eu
INSTALLER=tests/backends/install.sh
. "$(dirname "$0")/../fixtures/apt.sh"

have_all promtool prometheus prometheus-alertmanager victoria-metrics && exit 0

need_apt_root "apt-get install prometheus (run it with sudo, or set OTELGPU_SKIP_BACKENDS=1 to skip the backend tests)" \
    "install Prometheus >= 2.42 (prometheus and promtool on PATH) yourself, or set OTELGPU_SKIP_BACKENDS=1"
apt_install prometheus prometheus-alertmanager

if ! have_all victoria-metrics; then
    D=$(mktemp -d)
    MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
    mkdir -p "$D/apt/lists/partial" "$D/apt/cache/archives/partial" "$D/debs"
    echo "deb $MIRROR trixie main" > "$D/apt/sources.list"
    O="-o APT::Sandbox::User=root -o Dir::Etc::sourcelist=$D/apt/sources.list -o Dir::Etc::sourceparts=/nonexistent"
    O="$O -o Dir::State::Lists=$D/apt/lists -o Dir::Cache=$D/apt/cache"
    # shellcheck disable=SC2086
    apt-get $O update -qq
    # shellcheck disable=SC2086
    (cd "$D/debs" && apt-get $O download -qq victoria-metrics 2>/dev/null)
    rm -rf /opt/otelgpu-victoria-metrics
    dpkg-deb -x "$D"/debs/victoria-metrics_*.deb /opt/otelgpu-victoria-metrics
    ln -sf /opt/otelgpu-victoria-metrics/usr/bin/victoria-metrics /usr/local/bin/victoria-metrics
    rm -rf "$D"
fi

require_all promtool prometheus prometheus-alertmanager victoria-metrics
echo "tests/backends/install.sh: $(prometheus --version 2>&1 | head -n 1)"
