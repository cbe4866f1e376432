#!/usr/bin/env bash
# Prints a folder holding MLflow (the tracking server and what it imports: Flask, SQLAlchemy,
# alembic, pandas, numpy, pyarrow, scikit-learn, ...), installing it when missing:
# mlflow==$TESSERA_MLFLOW_VERSION (default 3.17.2) with pip into a cache folder outside the
# repository ($TESSERA_CACHE, default ~/.cache/tessera), once. Put it on PYTHONPATH to run
# `python3 -m mlflow server`; tests/trainer/mlflow.rs starts one on the loopback address with it.
#
# The install is large (about 1 GB, a few minutes on a fresh machine) because the `mlflow`
# package pulls the whole tracking server; it happens once per version and is reused after.
set -euo pipefail
VERSION=${TESSERA_MLFLOW_VERSION:-3.17.2}
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
DEST="$CACHE/mlflow-$VERSION"
PYTHON=${PYTHON:-python3}
if [ ! -f "$DEST/mlflow/__init__.py" ]; then
  mkdir -p "$CACHE"
  PARTIAL="$DEST.partial.$$"
  rm -rf "$PARTIAL"
  echo "installing mlflow $VERSION and its requirements into $DEST" >&2
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    --target "$PARTIAL" "mlflow==$VERSION" >&2
  # The server must start from that folder alone: a broken install is not kept.
  if ! PYTHONPATH="$PARTIAL" "$PYTHON" -W ignore -m mlflow server --help >/dev/null; then
    echo "ensure-mlflow.sh: \`python3 -m mlflow server --help\` fails with PYTHONPATH=$PARTIAL" >&2
    rm -rf "$PARTIAL"
    exit 1
  fi
  rm -rf "$DEST"
  mv "$PARTIAL" "$DEST"
fi
echo "$DEST"
