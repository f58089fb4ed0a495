#!/usr/bin/env bash
# CI only: assemble an onnxruntime C/C++ package for scripts/cpp when no official release
# archive can be fetched, so that the ckpred_select tests run instead of skipping.
#
#   .ci/onnxruntime_sdk.sh DEST        (prints nothing on stdout; DEST/include, DEST/lib on success)
#
# Users do not need this: they give the official onnxruntime-linux-x64-<version>.tgz unpacked as
# ONNXRUNTIME_ROOT, or an installed onnxruntime CMake package (scripts/cpp/CMakeLists.txt).
#
# * The shared library libonnxruntime.so.1.* is the one of the `onnxruntime` wheel installed for
#   $PYTHON (default python3 on PATH), i.e. the same build the Python runtime scores with.
# * The headers come from Debian trixie's `libonnxruntime-dev`, fetched with `apt-get download`
#   through a private apt configuration (its own sources list, state and cache directories
#   below DEST's temporary work folder) that points the Debian mirror this system already uses
#   at trixie; the package is unpacked with `dpkg -x`, never installed, and the system's apt
#   state is not touched.
# * The C API is versioned (OrtApiBase::GetApi(ORT_API_VERSION)): headers older than the library
#   work, newer ones do not, so headers newer than the library are refused.
#
# Exit status 0 with DEST complete, or 1 with one line on stderr saying why (DEST is then removed).
set -euo pipefail

DEST="${1:?usage: .ci/onnxruntime_sdk.sh DEST}"
PYTHON="${PYTHON:-python3}"
SUITE="${ORT_HEADERS_SUITE:-trixie}"
WORK=""

die() {
  echo "onnxruntime_sdk: $*" >&2
  [[ -n "$WORK" ]] && rm -rf "$WORK"
  rm -rf "$DEST"
  exit 1
}

# -- 1. the library of the installed wheel --------------------------------------------------------
CAPI="$("$PYTHON" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))' \
        2>/dev/null)" || die "cannot import onnxruntime with $PYTHON"
LIB="$(ls "$CAPI"/libonnxruntime.so.1.* 2>/dev/null | head -n1 || true)"
[[ -n "$LIB" ]] || die "no libonnxruntime.so.1.* in $CAPI (not the CPU onnxruntime wheel?)"
LIB_VERSION="${LIB##*/libonnxruntime.so.}"           # e.g. 1.31.1
LIB_MINOR="$(echo "$LIB_VERSION" | cut -d. -f2)"

# -- 2. the headers from Debian $SUITE through a private apt configuration ------------------------
command -v apt-get >/dev/null || die "apt-get not found (the headers come from Debian's libonnxruntime-dev)"
command -v dpkg >/dev/null || die "dpkg not found"

# The Debian mirror this machine already uses: the first URI of a deb entry with the main
# component (deb822 .sources files or one-line .list files), the security archive excluded.
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
[[ -n "$MIRROR" ]] || die "no Debian mirror in /etc/apt/sources.list(.d), so libonnxruntime-dev cannot be fetched"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "$KEYRING" ]] || die "$KEYRING missing (package debian-archive-keyring)"

mkdir -p "$(dirname "$DEST")"
WORK="$(mktemp -d "$(dirname "$DEST")/.onnxruntime_sdk.XXXXXX")"
mkdir -p "$WORK/state/lists/partial" "$WORK/cache/archives/partial" "$WORK/etc/sources.list.d" \
         "$WORK/etc/preferences.d" "$WORK/deb"
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
  -o "Acquire::Retries=2"
  -o "Acquire::http::Timeout=60"
  # the work folder is private to this user; apt's download user could not write into it
  -o "APT::Sandbox::User=$(id -un)"
)
# apt's last error line, for the one-line reason
apt_error() { grep -E '^(E|W|Err):' <<<"$1" | tail -n1 | cut -c1-300; }
out="$(timeout 600 apt-get "${APT_OPTS[@]}" -qq update 2>&1)" \
  || die "apt-get update of $SUITE from $MIRROR failed: $(apt_error "$out")"
out="$(cd "$WORK/deb" && timeout 600 apt-get "${APT_OPTS[@]}" -qq download libonnxruntime-dev 2>&1)" \
  || die "apt-get download libonnxruntime-dev ($SUITE from $MIRROR) failed: $(apt_error "$out")"
DEB="$(ls "$WORK"/deb/libonnxruntime-dev_*.deb 2>/dev/null | head -n1 || true)"
[[ -n "$DEB" ]] || die "apt-get download left no libonnxruntime-dev_*.deb"
dpkg -x "$DEB" "$WORK/x" || die "dpkg -x $DEB failed"
HDR="$(find "$WORK/x" -name onnxruntime_cxx_api.h | head -n1)"
[[ -n "$HDR" ]] || die "$(basename "$DEB") holds no onnxruntime_cxx_api.h"
HDR_DIR="$(dirname "$HDR")"
HDR_API="$(sed -n 's/^#define ORT_API_VERSION \([0-9]*\).*/\1/p' "$HDR_DIR/onnxruntime_c_api.h")"
[[ -n "$HDR_API" ]] || die "cannot read ORT_API_VERSION from $(basename "$DEB")'s onnxruntime_c_api.h"
if (( HDR_API > LIB_MINOR )); then
  die "headers of $(basename "$DEB") (ORT_API_VERSION $HDR_API) are newer than the library $LIB_VERSION"
fi

# -- 3. DEST: include/, lib/ and what it was made of ---------------------------------------------
rm -rf "$DEST"
mkdir -p "$DEST/include" "$DEST/lib"
cp -a "$HDR_DIR"/. "$DEST/include/"
cp "$LIB" "$DEST/lib/"
ln -s "libonnxruntime.so.$LIB_VERSION" "$DEST/lib/libonnxruntime.so.1"
ln -s "libonnxruntime.so.1" "$DEST/lib/libonnxruntime.so"
printf 'library=%s\nlibrary_from=%s\nheaders=%s\nheaders_api=%s\n' "$LIB_VERSION" "$LIB" "$(basename "$DEB")" \
  "$HDR_API" > "$DEST/VERSIONS"
rm -rf "$WORK"
echo "onnxruntime_sdk: onnxruntime $LIB_VERSION library + $(basename "$DEB") headers (API $HDR_API) in $DEST" >&2
