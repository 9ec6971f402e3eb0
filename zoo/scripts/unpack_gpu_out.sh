#!/usr/bin/env bash
# Reassemble the output of gpu_train_all.sh (DIR holds zoo_models.tar.part-*, zoo_models.sha256,
# train_log.json) into zoo/src/lightspec_zoo/models/{target,draft}.
set -euo pipefail
DIR=${1:?usage: unpack_gpu_out.sh DIR}
cd "$(dirname "$0")/../.."
DEST=${DEST:-zoo/src/lightspec_zoo/models}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat "$DIR"/zoo_models.tar.part-* > "$TMP/zoo_models.tar"
if [ -f "$DIR/zoo_models.sha256" ]; then (cd "$TMP" && sha256sum -c "$DIR/zoo_models.sha256"); fi
mkdir -p "$TMP/x"
tar -C "$TMP/x" -xf "$TMP/zoo_models.tar"
for m in target draft; do
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json README.md; do
    [ -f "$TMP/x/$m/$f" ] || { echo "missing $m/$f"; exit 2; }
  done
done
mkdir -p "$DEST" zoo/build
for m in target draft; do rm -rf "$DEST/$m"; cp -r "$TMP/x/$m" "$DEST/$m"; done
[ -f "$DIR/train_log.json" ] && cp "$DIR/train_log.json" zoo/build/gpu_train_log.json
[ -f "$DIR/summary.txt" ] && cat "$DIR/summary.txt"
du -sh "$DEST"/*
echo "installed into $DEST"
