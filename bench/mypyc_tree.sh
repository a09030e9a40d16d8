#!/usr/bin/env bash
# A copy of this tree with its hot pure modules compiled by mypyc, for --base.
#
#   bench/mypyc_tree.sh /tmp/ik-mypyc
#   python -m bench --only cost --no-postgres --base /tmp/ik-mypyc \
#       --cost-rows ik-sqlite-full,floor-sqlite-full,ik-sqlite-full-overlap,loop-ik-sqlite
#
# The list leaves out what mypyc refused or broke (bench/README.md, "mypyc, measured").
# The PostgreSQL adapter subclasses the compiled engine, which CPython refuses: SQLite only.
set -euo pipefail
target=${1:?usage: bench/mypyc_tree.sh DIRECTORY}
here=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$target" && mkdir -p "$target"
git -C "$here" archive --format=tar HEAD src pyproject.toml | tar -x -C "$target"
cd "$target/src"
# mypyc reads mypy's settings here; setuptools would choke on the project's pyproject.
printf '[mypy]\nstrict = True\npython_version = 3.11\n' > mypy.ini
ik=intention_kernel
modules=(
    $ik/_json.py $ik/_calls.py $ik/_turns.py $ik/_checkpoint.py $ik/_replies.py
    $ik/_facts.py
    $ik/_runtime/{answer,execute,interpret,journal,plan,reply,rounds,state}.py
    $ik/durability/_contract/{options,ownership}.py
    $ik/durability/_engine/{checkpoints,deliveries,effect_calls,effects,journal}.py
    $ik/durability/_engine/{recorded,resolution,transaction}.py
    $ik/durability/_layout/{codec,rows,sql,timer_rows}.py
    $ik/durability/sqlite/{_adapter,_filelock,_bodies}.py
)
"$here/.venv/bin/mypyc" "${modules[@]}" > mypyc.log 2>&1 || { tail -20 mypyc.log; exit 1; }
echo "compiled ${#modules[@]} modules into $target/src"
