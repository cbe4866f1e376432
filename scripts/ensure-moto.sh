#!/usr/bin/env bash
# Prints a folder holding moto (a local S3 server from PyPI, `python -m moto.server`) and boto3,
# installing them when missing, with pip into a cache folder outside the repository
# ($TESSERA_CACHE, default ~/.cache/tessera), once. --no-deps with every module pinned: moto's
# own requirements, its `s3` extra (PyYAML, py-partiql-parser) and the server's web framework
# (flask, flask-cors) — not the whole `server` extra, whose CloudFormation, docker and X-Ray
# packages the S3 server never imports (about 115 MB instead of 400). tests/data/s3.rs starts the
# server on the loopback address and uploads MDS shards to it with boto3.
set -euo pipefail
VERSION=${TESSERA_MOTO_VERSION:-5.2.5}
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
DEST="$CACHE/moto-$VERSION"
if [ ! -f "$DEST/moto/server.py" ] || [ ! -f "$DEST/boto3/__init__.py" ] || [ ! -f "$DEST/flask/__init__.py" ]; then
  mkdir -p "$CACHE"
  PARTIAL="$DEST.partial.$$"
  rm -rf "$PARTIAL"
  echo "installing moto $VERSION (S3 server) and boto3 into $DEST" >&2
  PYTHON=${PYTHON:-python3}
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$PARTIAL" "moto==$VERSION" \
    boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 jmespath==1.1.0 \
    python-dateutil==2.9.0.post0 six==1.17.0 urllib3==2.8.0 \
    cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 \
    requests==2.34.2 idna==3.20 charset-normalizer==3.5.3 certifi==2026.10.19.post1 \
    xmltodict==1.0.4 responses==0.26.3 pyyaml==6.0.4 py-partiql-parser==0.6.3 \
    werkzeug==3.1.9 markupsafe==3.0.4 jinja2==3.1.6 \
    flask==3.1.3 blinker==1.9.0 click==8.5.1 itsdangerous==2.2.0 flask-cors==6.0.5 >&2
  rm -rf "$DEST"
  mv "$PARTIAL" "$DEST"
fi
echo "$DEST"
