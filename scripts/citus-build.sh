#!/usr/bin/env bash
# make citus: builds and installs Citus from its source tarball when citus.so is absent.
# The build tree stays in .citus/build (gitignored), so a second run only re-runs `make install`
# (seconds) on a machine whose PostgreSQL lib directory was reset.
# Exit 0: Citus installed (or already there). Exit 2: no Citus and no source (one line said why).
set -euo pipefail
cd "$(dirname "$0")/.."

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
CITUS_SOURCE=${CITUS_SOURCE:-../shared/vendor/citus/citus-13.2.2.tar.gz}
# The upstream v13.2.2 tarball; any other CITUS_SOURCE is taken as the operator gives it.
CITUS_SHA256=dd2453caec20a830e5e63f1def5c5a98cb6f57ae510407cdcd800916fcdab430
BUILD=.citus/build

pkglib=$("$PG_CONFIG" --pkglibdir)
if [ -f "$pkglib/citus.so" ]; then
  exit 0
fi
if [ ! -f "$CITUS_SOURCE" ]; then
  echo "citus: not installed and no source at $CITUS_SOURCE: install postgresql-15-citus-13.2 from Citus's repository (https://install.citusdata.com) or set CITUS_SOURCE=<citus-13.2.2.tar.gz>" >&2
  exit 2
fi
if [ "$(id -u)" -ne 0 ] && [ ! -w "$pkglib" ]; then
  echo "citus: installing into $pkglib needs root: run sudo make citus" >&2
  exit 1
fi

src_dir=$(cd "$(dirname "$CITUS_SOURCE")" && pwd)
tarball="$src_dir/$(basename "$CITUS_SOURCE")"
patch_file="$src_dir/pg15.20-compat.patch"

if [ ! -f "$BUILD/.built" ]; then
  if [ "$(basename "$tarball")" = "citus-13.2.2.tar.gz" ]; then
    sum=$(sha256sum "$tarball" | cut -d' ' -f1)
    if [ "$sum" != "$CITUS_SHA256" ]; then
      echo "citus: $tarball has sha256 $sum, expected $CITUS_SHA256 (upstream v13.2.2)" >&2
      exit 1
    fi
  fi
  echo "citus: building from $tarball (a few minutes on 2 cores; log in .citus/build.log)"
  rm -rf "$BUILD"
  mkdir -p "$BUILD"
  tar -xzf "$tarball" -C "$BUILD" --strip-components=1
  (
    cd "$BUILD"
    # Citus 13.2.2 defines its own have_createdb_privilege(), which PostgreSQL 15.20 now exports.
    if [ -f "$patch_file" ]; then patch -p1 -s < "$patch_file"; fi
    # libcurl (statistics collection), lz4/zstd (columnar) and krb5 (GSSAPI) come from ensure-deps.
    ./configure PG_CONFIG="$PG_CONFIG"
    make -j"$(nproc)"
  ) > .citus/build.log 2>&1 || { echo "citus: build failed, see the end of .citus/build.log:" >&2; tail -20 .citus/build.log >&2; exit 1; }
  touch "$BUILD/.built"
fi
make -C "$BUILD" install > .citus/install.log 2>&1 || { echo "citus: make install failed, see .citus/install.log" >&2; tail -20 .citus/install.log >&2; exit 1; }
echo "citus: installed $("$PG_CONFIG" --pkglibdir)/citus.so"
