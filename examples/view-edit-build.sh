#!/bin/sh
# Works on a project in a sandbox through the FUSE view, as an editor or a
# script on the host would: writes and edits the sources and greps them only
# through MOUNT/<sandbox>/, then builds and runs them inside with `sbx exec`.
#
#   examples/view-edit-build.sh MOUNTPOINT [SANDBOX]
#
# MOUNTPOINT is where `sbx mount` shows the sandboxes (the script mounts it
# when nothing is there yet). Set SBX to the sbx binary if it is not on PATH.
set -eu
SBX=${SBX:-sbx}
MNT=${1:?usage: view-edit-build.sh MOUNTPOINT [SANDBOX]}
ID=${2:-view-demo}

mkdir -p "$MNT"
mountpoint -q "$MNT" || "$SBX" mount "$MNT"
"$SBX" exec -s "$ID" -- 'mkdir -p /workspace/hello' >/dev/null
dir="$MNT/$ID/hello"

# write the project through the view
cat > "$dir/hello.c" <<'C'
#include <stdio.h>
int main(void) { printf("hello from %s\n", "GREETING"); return 0; }
C
printf 'hello: hello.c\n\tcc -O2 -o hello hello.c\n' > "$dir/Makefile"

# edit and grep it with ordinary host tools
sed -i 's/GREETING/the sandbox/' "$dir/hello.c"
grep -n 'the sandbox' "$dir/hello.c"

# build and run it where it lives
"$SBX" exec -s "$ID" -- 'cd /workspace/hello && make -s && ./hello'
ls -l "$dir/hello"
