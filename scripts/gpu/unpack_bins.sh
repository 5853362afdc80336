# Sourced by the device scripts (from the repository root): unpack_bins ARCHIVE DIR empties DIR,
# extracts the packed binaries (an xz-compressed tar, see scripts/gpu/pack_backend.sh) into it and
# puts DIR/lib, the shared libraries the GPU machine lacks, first on LD_LIBRARY_PATH. Returns
# non-zero when the archive cannot be extracted.
unpack_bins() {
  rm -rf "$2" && mkdir -p "$2" && xz -dc "$1" | tar -C "$2" -xf - || return 1
  export LD_LIBRARY_PATH="$2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
