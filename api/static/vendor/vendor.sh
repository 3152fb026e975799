#!/usr/bin/env bash
# Vendor the dashboard's and /docs' JavaScript from the npm registry (no CDN at run time).
#   api/static/vendor/vendor.sh          fetch with `npm pack`, check, and copy
#   api/static/vendor/vendor.sh --check  fetch and compare with what is committed
# Each tarball is checked against the npm registry's recorded integrity (sha512) and the
# copied files against SHA256SUMS, so a changed upstream file cannot slip in unnoticed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mode="${1:-}"

vendor() {  # package version integrity destination files...
    local pkg="$1" version="$2" integrity="$3" dest="$here/$4"
    shift 4
    local files=("$@")
    local work
    work="$(mktemp -d)"
    (cd "$work" && npm pack --silent "$pkg@$version" >/dev/null)
    local tarball="$work/$pkg-$version.tgz"
    local got
    got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
    if [[ "$got" != "$integrity" ]]; then
        echo "integrity mismatch for $pkg@$version: $got" >&2
        rm -rf "$work"
        exit 1
    fi
    tar xzf "$tarball" -C "$work"
    if [[ "$mode" == "--check" ]]; then
        for f in "${files[@]}"; do
            cmp "$work/package/$f" "$dest/$(basename "$f")"
        done
        (cd "$dest" && sha256sum --quiet -c SHA256SUMS)
        echo "vendored $pkg@$version matches the npm registry"
    else
        mkdir -p "$dest"
        for f in "${files[@]}"; do cp "$work/package/$f" "$dest/"; done
        (cd "$dest" && sha256sum "${files[@]##*/}" > SHA256SUMS)
        echo "vendored $pkg@$version into $dest"
    fi
    rm -rf "$work"
}

vendor uplot 1.6.32 \
    "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==" \
    uplot dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE
# Swagger UI for /docs (Apache-2.0; NOTICE kept, and the bundle's third-party licenses).
vendor swagger-ui-dist 5.35.0 \
    "sha512-U06rpMtW9V3XPGOBeamTUSr0Z09jMX4IJuANpE/EZbAhw0G8CgwrzU4YmXkn/h0wCDNsXdGarTNNHC3sU8yVUQ==" \
    swagger-ui swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css \
    favicon-32x32.png LICENSE NOTICE
