#!/usr/bin/env bash
# Every script a user is told to run works from a fresh clone as written (./ci/wheels.sh):
# the shell scripts of ci/, tests/ and benches/, and any such script README.md or another
# Markdown file names, are tracked with their run bit (mode 100755; set it with
# `git update-index --chmod=+x`). A named script git does not track fails too.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
path='' mode='' bad=0 n=0
mapfile -t docs < <(git -C "$ROOT" ls-files '*.md')
while IFS= read -r path; do
    n=$((n + 1))
    mode=$(git -C "$ROOT" ls-files -s -- "$path" | cut -d' ' -f1)
    if [[ -z $mode ]]; then
        echo "BAD  $path: named in the docs but not in git"
        bad=$((bad + 1))
    elif [[ $mode != 100755 ]]; then
        echo "BAD  $path: mode $mode in git, not 100755: git update-index --chmod=+x $path"
        bad=$((bad + 1))
    fi
done < <(
    {
        git -C "$ROOT" ls-files 'ci/*.sh' 'tests/*.sh' 'benches/*.sh'
        (cd "$ROOT" && grep -ohE '(\./)?(ci|tests|benches)/[A-Za-z0-9_./-]+\.sh' "${docs[@]}")
    } | sed 's|^\./||' | sort -u
)
echo "$n script(s) checked, $bad without their run bit in git"
((bad == 0))
