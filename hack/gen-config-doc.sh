#!/usr/bin/env bash
# Writes `crust config default` between the markers of
# docs/configuration.md (make docs), so the reference cannot drift: a unit
# test (runtime config.rs) fails when the two differ.
set -euo pipefail
cd "$(dirname "$0")/.."
crust=${CRUST_BIN:-target/debug/crust}
doc=docs/configuration.md
defaults=$("$crust" config default)
python3 - "$doc" "$defaults" <<'PY'
import sys
path, defaults = sys.argv[1], sys.argv[2]
text = open(path).read()
begin, end = "<!-- crust config default: begin -->\n", "<!-- crust config default: end -->\n"
i, j = text.index(begin) + len(begin), text.index(end)
text = text[:i] + "```toml\n" + defaults.rstrip("\n") + "\n```\n" + text[j:]
open(path, "w").write(text)
PY
