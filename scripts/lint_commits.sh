#!/usr/bin/env bash
# Commit subjects under 72 characters (the why goes in the body), for every commit after the
# one that made this rule (DEVELOPERS.md): `git log --oneline` reads as a list, not paragraphs.
# Outside a git checkout (an unpacked sdist) there is nothing to check.
set -euo pipefail
SINCE=${LINT_COMMITS_SINCE:-1fd97236a4f5}   # the last commit before the rule
cd "$(dirname "$0")/.."
git rev-parse --git-dir >/dev/null 2>&1 || exit 0
range="$SINCE..HEAD"
if ! git cat-file -e "$SINCE^{commit}" 2>/dev/null; then
  # a shallow clone holds only newer commits: check those it has
  [ "$(git rev-parse --is-shallow-repository)" = true ] || { echo "lint_commits: $SINCE is not in this clone's history" >&2; exit 1; }
  range=HEAD
fi
export LC_ALL=C.UTF-8   # ${#s} counts characters, not bytes
long=$(git log --format='%s' "$range" | while IFS= read -r s; do if [ ${#s} -gt 72 ]; then echo "$s"; fi; done)
if [ -n "$long" ]; then
  echo "lint_commits: subjects over 72 characters (the why goes in the body):" >&2
  echo "$long" >&2
  exit 1
fi
