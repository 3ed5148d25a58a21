#!/usr/bin/env bash
# dashboard_chromium_test.sh BUILD_DIR — the rendezvous's live ring page in a
# real browser.
#
# Installs Debian's `chromium` package when it is missing (exit 77 if that is
# impossible or takes more than 5 minutes). Starts a rendezvous with
# --metrics_port and 4 workers on 127.0.0.1, rank 2 throttled with the
# test-only --test_reduce_delay, runs ring all-reduces on every rank, waits
# until `halkactl health` names rank 2 the straggler, then loads
# http://127.0.0.1:PORT/?job=J in headless Chromium (--dump-dom) and checks
# the rendered DOM: the page finished a refresh (body data-ready="1"), 4
# member nodes (svg circles with data-rank 0..3), rank 2's node marked as the
# straggler (red fill, "(straggler)" label), the ring edge 2->3 drawn as the
# slowest (thick line), the diagnosis text and 4 member table rows. Then the
# page's timeline view (?view=timeline): a row group per rank with op,
# phase, wait, reduce and wire spans. Screenshots of both go to the log dir
# ($HALKA_SYSTEM_KEEP_LOGS keeps them; their paths are printed).
#
# Exit: 0 pass, 1 fail, 77 skip (no chromium and it cannot be installed).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/system/lib.sh
source "$HERE/lib.sh"
sys_binaries "${1:-}"
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 needed"; exit 1; }

# ------------------------------------------------------------ chromium

CHROME=$(sys_require_package chromium 300 chromium chromium-browser google-chrome) || exit $?

sys_init

G=4
SLOW=2
NEXT=$(( (SLOW + 1) % G ))
JOB="dash-$$"
COUNT=$(( 4 * 1024 * 1024 / 4 ))   # float32: 4 MiB per rank
REPEAT=8
log "logs in $SYS_LOG; $("$CHROME" --version 2>/dev/null | head -n1)"

# ------------------------------------------------------------ halka job

worker_flags() { (( $1 == SLOW )) && echo "--test_reduce_delay=5ms"; }
sys_start_loopback_job "$G" "$JOB" --chunk_bytes=262144
log "rendezvous $RDV_ADDR, ring page on :$RDV_M, rank $SLOW throttled (--test_reduce_delay=5ms)"

names=()
t0=$(now_ns)
for (( r = 0; r < G; ++r )); do
  run_bg "ar.r$r" timeout --foreground -s KILL 120 "$CTL_BIN" allreduce \
    --worker="${ADDR[r]}" --algo=ring --count=$COUNT --dtype=float32 --op=sum \
    --repeat=$REPEAT --timeout=60s
  names+=("ar.r$r")
done
wait_bg 130 "${names[@]}"
for (( r = 0; r < G; ++r )); do
  [[ "$(bg_rc "ar.r$r")" == 0 ]] ||
    fail "halkactl on rank $r exited $(bg_rc "ar.r$r"): $(tail -n 5 "$SYS_LOG/ar.r$r.err")"
  assert_eq "$(grep -cE "#wrong 0\$" "$SYS_LOG/ar.r$r.out")" "$REPEAT" "rank $r: #wrong 0 lines"
done
log "$G x $REPEAT ring all-reduces of 4 MiB in $(fmt_s "$(ms_since "$t0")") s"

# The page shows what the rendezvous knows: wait (bounded) for it to name
# the straggler, so a failure below is the page's, not the heartbeat's.
t0=$(now_ns)
while :; do   # every rank's last operation reached the rendezvous (heartbeat)
  HJ=$(timeout --foreground -s KILL 15 "$CTL_BIN" health --rendezvous="$RDV_ADDR" \
         --job="$JOB" --json 2>/dev/null)
  n=$(HJ=$HJ python3 -c 'import json, os, sys
t = json.loads(os.environ["HJ"]).get("telemetry", [])
print(sum(1 for x in t if int(x.get("ops_completed", 0)) >= int(sys.argv[1])
          and not x.get("current_op")))' "$REPEAT" 2>/dev/null)
  [[ "$n" == "$G" ]] && break
  (( $(now_ns) - t0 > 15 * 1000000000 )) &&
    fail "15 s after the all-reduces the rendezvous has not heard of them from every rank: $HJ"
  sleep 0.2
done
while :; do
  H=$(timeout --foreground -s KILL 15 "$CTL_BIN" health --rendezvous="$RDV_ADDR" \
        --job="$JOB" 2>&1)
  grep -qE "^diagnosis: rank $SLOW is the straggler" <<<"$H" &&
    grep -qE "^[[:space:]]*\*$SLOW->$NEXT .*<- slowest" <<<"$H" && break
  (( $(now_ns) - t0 > 15 * 1000000000 )) &&
    fail "halkactl health did not name rank $SLOW / edge $SLOW->$NEXT within 15 s:
$H"
  sleep 0.3
done
grep -E '^diagnosis:|<- slowest' <<<"$H" | sed 's/^/  health: /'

# ------------------------------------------------------------ the page

URL="http://127.0.0.1:$RDV_M/?job=$JOB"
# Headless Chromium sometimes never exits after its virtual-time budget (a
# known intermittent hang of --headless with --virtual-time-budget; it hung a
# CI run once in 51 runs of this page). That is Chromium's fault, not the
# page's, so each run is bounded at 45 s and, when it is killed, retried with
# a fresh profile, at most 3 attempts, every retry logged. What decides the
# test is what the page rendered (the DOM checks below), never the retries.
chrome() {  # chrome NAME ARGS... : headless chromium, bounded, own session
  local attempt rc
  for attempt in 1 2 3; do
    local profile="$SYS_LOG/chromium-profile.$1.$attempt"
    mkdir -p "$profile"
    rm -f "$SYS_LOG/$1.rc"
    run_bg "$1" timeout --foreground -s KILL 45 "$CHROME" --headless=new --no-sandbox \
      --disable-gpu --no-first-run --no-default-browser-check --disable-extensions \
      --disable-dev-shm-usage --user-data-dir="$profile" "${@:2}"
    wait_bg 55 "$1"
    rc=$(bg_rc "$1")
    [[ "$rc" == 0 ]] && return 0
    [[ "$rc" == 137 ]] ||
      fail "chromium ($1) exited $rc: $(tail -n 10 "$SYS_LOG/$1.err")"
    # timeout killed chromium's browser process only: end its renderers too
    # (the run is a session and process group of its own, from run_bg).
    kill -KILL -- "-${SYS_PID[$1]}" 2>/dev/null || true
    log "chromium ($1) hung past 45 s (attempt $attempt of 3, killed); retrying with a fresh profile"
    cp "$SYS_LOG/$1.err" "$SYS_LOG/$1.attempt$attempt.err" 2>/dev/null || true
  done
  fail "chromium ($1) hung past 45 s in 3 attempts: $(tail -n 10 "$SYS_LOG/$1.err")"
}
t0=$(now_ns)
chrome dom --virtual-time-budget=5000 --dump-dom "$URL"
DOM="$SYS_LOG/dom.out"
log "dumped the DOM of $URL in $(fmt_s "$(ms_since "$t0")") s ($(wc -c <"$DOM") bytes)"

python3 - "$DOM" "$G" "$SLOW" "$NEXT" "$JOB" <<'PYEOF' || fail "the ring page's DOM is not as expected (DOM in $DOM)"
import re, sys
from html.parser import HTMLParser
dom, g, slow, nxt, job = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.tags = []; self.stack = []; self.text = {}
    def handle_starttag(self, tag, attrs):
        a = dict(attrs); self.tags.append((tag, a)); self.stack.append((tag, a, []))
    def handle_endtag(self, tag):
        while self.stack:
            t, a, txt = self.stack.pop()
            s = "".join(txt)
            if self.stack: self.stack[-1][2].append(s)
            if "id" in a: self.text[a["id"]] = s
            self.tags_text.append((t, a, s))
            if t == tag: break
    def handle_data(self, d):
        if self.stack: self.stack[-1][2].append(d)
p = P(); p.tags_text = []; p.feed(dom)
errors = []
def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond: errors.append(what)

body = [a for t, a in p.tags if t == "body"]
check(body and body[0].get("data-ready") == "1", 'body data-ready="1" (a refresh completed)')
sel = [a for t, a, s in p.tags_text if t == "option" and s == job]
check(len(sel) == 1, "job selector lists %s" % job)
circles = {a.get("data-rank"): a for t, a in p.tags if t == "circle"}
check(sorted(circles) == [str(r) for r in range(g)], "%d member nodes (circles data-rank 0..%d): %s" % (g, g - 1, sorted(circles)))
strag = [r for r, a in circles.items() if a.get("fill") == "#d33"]
check(strag == [str(slow)], "only rank %d's node is red (straggler): %s" % (slow, strag))
labels = [s for t, a, s in p.tags_text if t == "text" and "(straggler)" in s]
check(labels == ["w%d (straggler)" % slow], 'label "w%d (straggler)": %s' % (slow, labels))
lines = {a.get("data-edge"): a for t, a in p.tags if t == "line" and a.get("data-edge")}
ring = ["%d->%d" % (r, (r + 1) % g) for r in range(g)]
check(sorted(lines) == sorted(ring), "%d ring edges drawn: %s" % (g, sorted(lines)))
thick = [e for e, a in lines.items() if a.get("stroke-width") == "9"]
check(thick == ["%d->%d" % (slow, nxt)], "edge %d->%d drawn as the slowest (thick): %s" % (slow, nxt, thick))
diag = p.text.get("diag", "")
check(diag.startswith("rank %d is the straggler" % slow), "diagnosis text: %r" % diag[:100])
check(any(t == "div" and a.get("id") == "diag" and a.get("class") == "bad" for t, a in p.tags), 'diagnosis box class "bad"')
state = p.text.get("state", "")
check(state.startswith("healthy, generation 1, %d members" % g), "state line: %r" % state)
rows = len(re.findall(r"<tr><td>\d+</td>", dom.split('id="members"', 1)[-1].split("</table>", 1)[0]))
check(rows == g, "%d rows in the members table: %d" % (g, rows))
edges_tbl = dom.split('id="edges"', 1)[-1].split("</table>", 1)[0]
check(">*%d-&gt;%d<" % (slow, nxt) in edges_tbl, "edges table has ring edge *%d->%d" % (slow, nxt))
sys.exit(1 if errors else 0)
PYEOF

PNG="$SYS_LOG/ring_page.png"
chrome shot --virtual-time-budget=5000 --window-size=1000,800 --hide-scrollbars \
  --screenshot="$PNG" "$URL"
[[ -s "$PNG" ]] || fail "no screenshot written to $PNG"
python3 -c 'import struct, sys
d = open(sys.argv[1], "rb").read(32)
assert d[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
w, h = struct.unpack(">II", d[16:24]); print("screenshot %dx%d" % (w, h))
assert (w, h) == (1000, 800), (w, h)' "$PNG" || fail "screenshot $PNG is not a 1000x800 PNG"
log "screenshot: $PNG ($(wc -c <"$PNG") bytes)"
[[ -n "${HALKA_SYSTEM_KEEP_LOGS:-}" ]] || log "(set HALKA_SYSTEM_KEEP_LOGS=1 to keep it)"

# ------------------------------------------------------------ the timeline view
# The same page's timeline view (?view=timeline): /api/trace gathers every
# rank's timeline; the view draws one row group per rank with its ops,
# phases, chunk waits, reduces and links writing.
TURL="http://127.0.0.1:$RDV_M/?job=$JOB&view=timeline"
chrome tdom --virtual-time-budget=8000 --dump-dom "$TURL"
python3 - "$SYS_LOG/tdom.out" "$G" <<'PYEOF' || fail "the timeline view's DOM is not as expected (DOM in $SYS_LOG/tdom.out)"
import re, sys
dom, g = open(sys.argv[1]).read(), int(sys.argv[2])
errors = []
def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond: errors.append(what)
m = re.search(r'<body[^>]*data-timeline="(\d+)"', dom)
check(m is not None and int(m.group(1)) > 0, "body data-timeline > 0 (spans drawn): %s" % (m.group(1) if m else None))
tl = dom.split('id="tl"', 1)[-1].split("</svg>", 1)[0]
for r in range(g):
    check(re.search(r">rank %d \(w%d\)<" % (r, r), tl) is not None, "a row group for rank %d" % r)
cats = re.findall(r'data-cat="([a-z]+)"', tl)
for c in ("op", "phase", "wait", "reduce", "wire"):
    check(cats.count(c) >= g, "at least %d %s spans drawn: %d" % (g, c, cats.count(c)))
ops = set(re.findall(r">#(\d+)<", tl))
check(1 <= len(ops) <= 6, "the last operations (at most 6) labelled: %s" % sorted(ops, key=int))
sys.exit(1 if errors else 0)
PYEOF
TPNG="$SYS_LOG/timeline_page.png"
chrome tshot --virtual-time-budget=8000 --window-size=1200,800 --hide-scrollbars \
  --screenshot="$TPNG" "$TURL"
[[ -s "$TPNG" ]] || fail "no screenshot written to $TPNG"
log "timeline screenshot: $TPNG ($(wc -c <"$TPNG") bytes)"

log "PASS: the ring page shows $G members, rank $SLOW the straggler, edge $SLOW->$NEXT the slowest; the timeline view draws every rank"
echo "PASS"
