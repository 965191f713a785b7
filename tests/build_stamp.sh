# build_stamp.sh: sourced by gpu_check.sh and ab.sh. On a device machine kept warm between calls, the build
# folder holds the objects of the call before, while the working tree copied in keeps the file times of the
# machine it came from. After a call that built a patched tree, the next call's sources are older than those
# objects and make rebuilds nothing: its tests and timings are of the patch (04_model_runner/NOTES.md,
# "Checks before timing"). So a build folder records which sources it was last built from, and sources that
# differ from the record are touched first, which makes every object older than them.

# A digest of the sources make compiles (everything outside build folders and .git).
sources_digest() {
  find . \( -path ./.git -o -path './build*' \) -prune -o -type f \
    \( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.h' -o -name Makefile \) -print0 |
    LC_ALL=C sort -z | xargs -0 md5sum | md5sum | cut -c1-32
}
# Before building into BUILD_DIR: unless it was last built from these very sources, touch them all.
touch_sources_unless_built_from_them() {  # BUILD_DIR
  local digest
  digest=$(sources_digest)
  [ "$(cat "$1/.built_from" 2>/dev/null)" = "$digest" ] && return
  find . \( -path ./.git -o -path './build*' \) -prune -o -type f \
    \( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.h' -o -name Makefile \) -exec touch {} +
}
# After a build of the tree as it is (no patch applied) into BUILD_DIR succeeded.
record_built_from_sources() { mkdir -p "$1" && sources_digest > "$1/.built_from"; }  # BUILD_DIR
# Before building a patched tree into BUILD_DIR: its objects will match no tree that is copied in.
forget_built_from() { rm -f "$1/.built_from"; }  # BUILD_DIR
