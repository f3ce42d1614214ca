#!/usr/bin/env bash
# Redraws docs/demo-web.png, the README's picture of the live page: runs the
# live demo with --web, waits for the end of its run, and has headless
# Chromium take the page at 1280x900.
#
# Usage: scripts/demo-screenshot.sh [--dev] [demo options, e.g. --duration 30]
#   --dev  build with the dev profile (quicker to build) instead of release
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
if [ "${1:-}" = "--dev" ]; then
    profile=dev
    shift
fi
bin="$(cargo build --profile "$profile" -p seawall-demo --message-format=json \
    | sed -n 's/.*"executable":"\([^"]*\/seawall-demo\)".*/\1/p' | tail -n 1)"
[ -x "$bin" ] || { echo "cannot find the seawall-demo binary" >&2; exit 1; }

work="$(mktemp -d)"
"$bin" --web --port 0 "$@" >"$work/out" 2>&1 &
demo=$!
cleanup() {
    kill "$demo" 2>/dev/null || true
    wait "$demo" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "==> waiting for the end of the run"
until grep -q "the live page stays up" "$work/out"; do
    if ! kill -0 "$demo" 2>/dev/null; then cat "$work/out" >&2; exit 1; fi
    sleep 1
done
url="$(sed -n 's/^live page: \(http[^ ]*\)$/\1/p' "$work/out")"
chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --hide-scrollbars \
    --user-data-dir="$work/profile" --virtual-time-budget=5000 \
    --window-size=1280,900 --screenshot=docs/demo-web.png "$url" 2>/dev/null
echo "==> docs/demo-web.png ($url)"
