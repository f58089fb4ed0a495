#!/usr/bin/env bash
# Assemble onnxruntime's C/C++ SDK for scripts/cpp from the package registries only.
#
#   scripts/get_onnxruntime_sdk.sh [DEST]      (DEST defaults to scripts/cpp/third_party/onnxruntime)
#
# * The shared library libonnxruntime.so.1.* comes from the `onnxruntime` PyPI wheel that ckpred
#   already depends on (found through $PYTHON, default: python3 on PATH; its onnxruntime/capi/).
# * The headers come from Debian trixie's `libonnxruntime-dev`, fetched with `apt-get download`
#   through a private apt configuration (own sources list, state and cache dirs) that points the
#   mirror this system is already configured with at trixie; the package is unpacked with
#   `dpkg -x`, never installed. No host name is hard-coded here.
# * The C API is versioned (OrtApiBase::GetApi(ORT_API_VERSION)): headers older than the library
#   work, newer ones do not, so the script refuses headers newer than the library.
#
# Result: DEST/include/*.h, DEST/lib/libonnxruntime.so{,.1,.1.x.y}, DEST/VERSIONS.
# Idempotent: does nothing when DEST already holds a matching SDK (FORCE=1 redoes it).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${1:-$HERE/cpp/third_party/onnxruntime}"
PYTHON="${PYTHON:-python3}"
SUITE="${ORT_HEADERS_SUITE:-trixie}"

die() { echo "get_onnxruntime_sdk: $*" >&2; exit 1; }

# -- 1. the library from the wheel -------------------------------------------------------------
CAPI="$("$PYTHON" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))' 2>/dev/null)" \
  || die "cannot import onnxruntime with $PYTHON (set PYTHON=/path/to/venv/bin/python)"
LIB="$(ls "$CAPI"/libonnxruntime.so.1.* 2>/dev/null | head -n1 || true)"
[[ -n "$LIB" ]] || die "no libonnxruntime.so.1.* in $CAPI (is this the CPU onnxruntime wheel?)"
LIB_VERSION="${LIB##*/libonnxruntime.so.}"          # e.g. 1.31.1
LIB_MINOR="$(echo "$LIB_VERSION" | cut -d. -f2)"

if [[ -z "${FORCE:-}" && -f "$DEST/VERSIONS" ]] && grep -qx "library=$LIB_VERSION" "$DEST/VERSIONS" \
   && [[ -f "$DEST/include/onnxruntime_cxx_api.h" ]]; then
  echo "get_onnxruntime_sdk: $DEST already holds the SDK for onnxruntime $LIB_VERSION"
  exit 0
fi

# -- 2. the headers from Debian $SUITE via a private apt configuration --------------------------
command -v apt-get >/dev/null || die "apt-get not found: the headers come from Debian's libonnxruntime-dev"
command -v dpkg >/dev/null || die "dpkg not found"

# The Debian mirror this machine already uses: first URI of a deb entry serving the system's
# main suite (deb822 .sources files or one-line sources.list), security archive excluded.
mirror_uri() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    awk 'BEGIN{RS=""; IGNORECASE=1}
         /(^|\n)Types:[^\n]*deb/ && /(^|\n)Components:[^\n]*main/ {
           uri=""; suites="";
           n=split($0, lines, "\n");
           for (i=1;i<=n;i++) { if (lines[i] ~ /^URIs:/) {sub(/^URIs:[ \t]*/, "", lines[i]); split(lines[i], u, " "); uri=u[1]}
                                if (lines[i] ~ /^Suites:/) suites=lines[i] }
           if (uri != "" && uri !~ /security/ && suites !~ /security/) { print uri; exit }
         }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    awk '$1=="deb" && $0 ~ / main/ && $0 !~ /security/ {
           for (i=2;i<=NF;i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i ~ /:\/\//) { print $i; exit } }' "$f"
  done
}
MIRROR="$(mirror_uri | grep -i debian | head -n1 || true)"
[[ -n "$MIRROR" ]] || MIRROR="$(mirror_uri | head -n1 || true)"
[[ -n "$MIRROR" ]] || die "no Debian mirror found in /etc/apt/sources.list(.d); cannot fetch libonnxruntime-dev"

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "$KEYRING" ]] || die "$KEYRING missing (package debian-archive-keyring)"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/state/lists/partial" "$WORK/cache/archives/partial" "$WORK/etc/sources.list.d" "$WORK/etc/preferences.d" "$WORK/deb"
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" > "$WORK/etc/sources.list"
APT_OPTS=(
  -o "Dir::Etc::sourcelist=$WORK/etc/sources.list"
  -o "Dir::Etc::sourceparts=$WORK/etc/sources.list.d"
  -o "Dir::Etc::preferencesparts=$WORK/etc/preferences.d"
  -o "Dir::State=$WORK/state"
  -o "Dir::State::status=/var/lib/dpkg/status"
  -o "Dir::Cache=$WORK/cache"
  -o "APT::Get::List-Cleanup=false"
  -o "Acquire::Languages=none"
  # Our temp dirs are private to the caller; apt's download user could not write into them.
  -o "APT::Sandbox::User=$(id -un)"
)
echo "get_onnxruntime_sdk: fetching libonnxruntime-dev headers from $SUITE ($MIRROR)"
apt-get "${APT_OPTS[@]}" -qq update || die "apt-get update of the private $SUITE sources failed"
(cd "$WORK/deb" && apt-get "${APT_OPTS[@]}" -qq download libonnxruntime-dev) \
  || die "apt-get download libonnxruntime-dev failed"
DEB="$(ls "$WORK"/deb/libonnxruntime-dev_*.deb | head -n1)"
dpkg -x "$DEB" "$WORK/x"
HDR_DIR="$(dirname "$(find "$WORK/x" -name onnxruntime_cxx_api.h | head -n1)")"
[[ -f "$HDR_DIR/onnxruntime_cxx_api.h" ]] || die "$DEB has no onnxruntime_cxx_api.h"
HDR_API="$(sed -n 's/^#define ORT_API_VERSION \([0-9]*\).*/\1/p' "$HDR_DIR/onnxruntime_c_api.h")"
[[ -n "$HDR_API" ]] || die "cannot read ORT_API_VERSION from the headers"
if (( HDR_API > LIB_MINOR )); then
  die "headers (ORT_API_VERSION $HDR_API) are newer than the library $LIB_VERSION; use an onnxruntime wheel >= 1.$HDR_API"
fi

# -- 3. lay out DEST atomically ----------------------------------------------------------------
STAGE="$(mktemp -d "$(dirname "$DEST")/.sdk.XXXXXX" 2>/dev/null || { mkdir -p "$(dirname "$DEST")"; mktemp -d "$(dirname "$DEST")/.sdk.XXXXXX"; })"
mkdir -p "$STAGE/include" "$STAGE/lib"
cp -a "$HDR_DIR"/. "$STAGE/include/"
cp "$LIB" "$STAGE/lib/"
ln -s "libonnxruntime.so.$LIB_VERSION" "$STAGE/lib/libonnxruntime.so.1"
ln -s "libonnxruntime.so.1" "$STAGE/lib/libonnxruntime.so"
{
  echo "library=$LIB_VERSION"
  echo "library_from=$LIB"
  echo "headers=$(basename "$DEB")"
  echo "headers_api=$HDR_API"
} > "$STAGE/VERSIONS"
rm -rf "$DEST.old"
[[ -e "$DEST" ]] && mv "$DEST" "$DEST.old"
mv "$STAGE" "$DEST"
rm -rf "$DEST.old"
echo "get_onnxruntime_sdk: onnxruntime $LIB_VERSION library + $(basename "$DEB") headers (API $HDR_API) in $DEST"
