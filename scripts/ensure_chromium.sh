#!/usr/bin/env bash
# Make sure a headless Chromium is available for the HTML report tests
# (tests/test_compare_html.py). Installs Debian's `chromium` when running as root with apt;
# otherwise only warns: those tests then skip, and the build never fails here.
# Set MLDBG_NO_APT=1 to never install anything (the browser tests then skip).
set -u

for name in chromium chromium-browser google-chrome; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done

if [ -n "${MLDBG_NO_APT:-}" ]; then
    echo "ensure_chromium: MLDBG_NO_APT is set: not installing chromium;" \
        "the HTML report browser tests will be skipped" >&2
    exit 0
fi

if [ "${EUID:-1}" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: no browser found; installing Debian's chromium with apt-get as root" \
        "(for the HTML report tests; MLDBG_NO_APT=1 skips this and those tests)"
    if DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
        && command -v chromium >/dev/null 2>&1; then
        exit 0
    fi
    echo "ensure_chromium: warning: apt-get did not install chromium;" \
        "the HTML report browser tests will be skipped" >&2
    exit 0
fi

echo "ensure_chromium: warning: no chromium, chromium-browser or google-chrome on PATH;" \
    "the HTML report browser tests will be skipped (install chromium to run them)" >&2
exit 0
