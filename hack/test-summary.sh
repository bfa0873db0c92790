#!/usr/bin/env bash
# Summarises libtest output (cargo test's, or hack/vm/test.sh's log of one
# pass): counts per result, with tests that reported themselves skipped
# (a "SKIPPED: <test>: <reason>" line, see crates/test-support/src/skip.rs `require!`)
# counted as skipped, not passed, and test binaries that ended without a
# result (crash, timeout) counted as crashed. Lists failures and skips.
#
#   hack/test-summary.sh [--known FILE --pass PASS] LABEL LOG...
#
# With --known, failures listed in FILE for PASS (see hack/vm/known-failing)
# are counted as "known failing", printed with their reason, and do not fail
# the run; a listed test that passed is pointed out (its entry can go).
# Exit status 1 when anything else failed or a binary crashed.
set -euo pipefail
known=/dev/null
pass=
while [ $# -gt 0 ]; do
  case "$1" in
    --known) known=$2; shift 2 ;;
    --pass) pass=$2; shift 2 ;;
    *) break ;;
  esac
done
label=$1
shift
awk -v label="$label" -v pass="$pass" -v known_file="$known" '
  # The list first: "PASS SUITE TEST reason...", # comments.
  FILENAME == known_file {
    if ($0 ~ /^[ \t]*(#|$)/) next
    if ($1 != "*" && $1 != pass) next
    reason = $0
    sub(/^[ \t]*[^ \t]+[ \t]+[^ \t]+[ \t]+[^ \t]+[ \t]*/, "", reason)
    known[$2 SUBSEP $3] = reason == "" ? "(no reason given)" : reason
    next
  }
  function start(name) {
    sub(/ \(.*\)$/, "", name)
    if (bin != "" && !done[bin]) crashed[++ncrashed] = bin
    bin = name; nbins++; done[bin] = 0
  }
  /^ *Running / { sub(/^ *Running /, ""); start($0); next }
  /^ *Doc-tests / { sub(/^ *Doc-tests /, ""); start("doc-tests " $0); next }
  {
    line = $0
    # A skip line may land in the middle of a harness line that was
    # written in two parts ("test x ... " then "ok"): take it out, and
    # join the parts.
    i = index(line, "SKIPPED: ")
    if (i > 0) {
      rest = substr(line, i + 9)
      j = index(rest, ": ")
      name = j ? substr(rest, 1, j - 1) : rest
      skipped[bin SUBSEP name] = j ? substr(rest, j + 2) : "(no reason given)"
      line = substr(line, 1, i - 1)
    }
    if (pending != "") {
      if (line ~ /^(ok|FAILED|ignored)/) { line = pending line; pending = "" }
      else if (line != "") pending = ""
    }
    if (line ~ /^test .* \.\.\. *$/) { pending = line; next }
    if (line ~ /^test .* \.\.\. (ok|FAILED|ignored)/) {
      line = substr(line, 6)
      i = index(line, " ... ")
      name = substr(line, 1, i - 1)
      sub(/ +$/, "", name)
      status = substr(line, i + 5)
      result[bin SUBSEP name] = status
      order[++ntests] = bin SUBSEP name
      next
    }
  }
  /^test result: / { done[bin] = 1; next }
  END {
    if (bin != "" && !done[bin]) crashed[++ncrashed] = bin
    for (k = 1; k <= ntests; k++) {
      key = order[k]
      s = result[key]
      split(key, parts, SUBSEP)
      what = parts[2] " (" parts[1] ")"
      if (key in skipped) {
        # A self-reported skip reads as ok (require!) or ignored
        # (libtest-mimic harnesses); either way it did not run.
        nskip++; skips[nskip] = what ": " skipped[key]
      } else if (s ~ /^ok/) {
        npass++
        if (key in known) { nfixed++; fixed[nfixed] = what }
      } else if (s ~ /^FAILED/ && (key in known)) {
        nknown++; knowns[nknown] = what ": " known[key]
      } else if (s ~ /^FAILED/) {
        nfail++; fails[nfail] = what
      } else {
        nign++
      }
    }
    printf "== %s: %d passed, %d failed, %d known failing, %d skipped, %d ignored; %d test binaries", \
      label, npass, nfail, nknown, nskip, nign, nbins
    if (ncrashed) printf ", %d ended without a result", ncrashed
    printf "\n"
    for (k = 1; k <= nfail; k++) print "   FAILED        " fails[k]
    for (k = 1; k <= ncrashed; k++) print "   NO RESULT     " crashed[k] " (crashed or timed out)"
    for (k = 1; k <= nknown; k++) print "   KNOWN FAILING " knowns[k]
    for (k = 1; k <= nfixed; k++) print "   NOW PASSES    " fixed[k] " (listed as known failing: remove its entry)"
    for (k = 1; k <= nskip; k++) print "   SKIPPED       " skips[k]
    exit (nfail + ncrashed) > 0
  }
' "$known" "$@"
