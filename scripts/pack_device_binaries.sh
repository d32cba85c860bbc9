#!/usr/bin/env bash
# Packs what a GPU call needs from this machine into one carry folder (ignored by git): the release
# binary built without the bundled demo model (the device reads models/demo from the travelling
# tree; with the model inside, the binary alone compresses to ~23 MB and the tree plus it no longer
# fits the device's 64 MiB), and the cuda test binaries, stripped, as one xz tarball.
#
#   scripts/pack_device_binaries.sh [CARRY_DIR]      # default .carry; add it to .git/info/exclude
#
# On the device: scripts/h200_call.sh STEP... unpacks them and runs tests, benches and checks in one
# call; by hand: tar -xJf CARRY_DIR/bins.tar.xz -C /tmp/b, then run /tmp/b/deltaserve and the tests
# (they find the fixtures through /work/main: ln -s "$PWD" /work/main, as scripts/h200_checks.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
carry=${1:-.carry}
mkdir -p "$carry"
cargo build --release --no-default-features
cargo test -p deltaserve-cuda --release --no-run
pack=$(mktemp -d)
trap 'rm -rf "$pack"' EXIT
cp target/release/deltaserve "$pack/"
for t in ops graphs golden moe fp8 sampling dummy_weights demo_heldout demo_fp8 tensor_parallel device_loss; do
  cp "$(ls -t target/release/deps/$t-* | grep -v '\.d$' | head -1)" "$pack/$t"
done
strip "$pack"/*
tar -cf - -C "$pack" . | xz -9 -T2 > "$carry/bins.tar.xz"
ls -la "$carry/bins.tar.xz"
