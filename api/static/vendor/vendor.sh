#!/usr/bin/env bash
# Vendor the dashboard's JavaScript from the npm registry (no CDN at run time).
#   api/static/vendor/vendor.sh          fetch with `npm pack`, check, and copy
#   api/static/vendor/vendor.sh --check  fetch and compare with what is committed
# The tarball is checked against the npm registry's recorded integrity (sha512) and the
# copied files against SHA256SUMS, so a changed upstream file cannot slip in unnoticed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
PKG=uplot
VERSION=1.6.32
INTEGRITY="sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
FILES=(dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PKG@$VERSION" >/dev/null)
tarball="$work/$PKG-$VERSION.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
if [[ "$got" != "$INTEGRITY" ]]; then
    echo "integrity mismatch for $PKG@$VERSION: $got" >&2
    exit 1
fi
tar xzf "$tarball" -C "$work"
dest="$here/uplot"
if [[ "${1:-}" == "--check" ]]; then
    for f in "${FILES[@]}"; do
        cmp "$work/package/$f" "$dest/$(basename "$f")"
    done
    (cd "$dest" && sha256sum --quiet -c SHA256SUMS)
    echo "vendored $PKG@$VERSION matches the npm registry"
else
    mkdir -p "$dest"
    for f in "${FILES[@]}"; do cp "$work/package/$f" "$dest/"; done
    (cd "$dest" && sha256sum "${FILES[@]##*/}" > SHA256SUMS)
    echo "vendored $PKG@$VERSION into $dest"
fi
