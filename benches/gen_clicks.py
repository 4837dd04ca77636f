#!/usr/bin/env python3
"""Deterministic generator of a "clicks" stream to join with a bookshop orders stream.

Reads an orders folder written by ``gen_orders.py`` (``orders-NNNNN.json``, JSON lines
``{"order_id","customer_id","status","amount","occurred_at","session_id"}``; lines that are not
valid orders are skipped) and writes a clicks folder with the same number of files, named alike
(``orders-00007.json`` -> ``clicks-00007.json``), one JSON object a line:

  {"click_id":50000123,"session_id":"s-00a228e03a7134fe","clicked_at":"2024-03-01T00:03:07.123Z","url":"/books/history/4711"}

Python's standard library only; same inputs and arguments (including --seed) => byte-identical
output (only ``random.Random.random`` / ``getrandbits`` and integer arithmetic are used, no libm,
no set iteration).

What the clicks are
-------------------
* **Clicks of the orders' sessions**: each distinct ``session_id`` of the orders (first valid
  occurrence) gets clicks with probability ``--session-frac`` (0.7); ``--multi-frac`` (0.1) of
  those get 2 or 3 clicks (duplicate join keys). ``clicked_at = occurred_at - U(0, 1.5 x
  --bound-s)``, so about two thirds fall inside a time bound ``occurred_at BETWEEN clicked_at AND
  clicked_at + bound`` and the rest before it.
* **Null sessions** (``--null-frac`` of all clicks, 2 %): ``"session_id":null``.
* **Orphans**: clicks whose session has no order (fresh ``s-`` ids). First the clicks of sessions
  whose orders come after the stream's last slot (phantom orders at the orders' rate over the
  1.5 x bound after it, clicked as above, the clicks that arrive in time kept): a stream cut out of
  a longer one has them, and without them the clicks would thin out towards the end. Then
  uniformly spread ones: at least ``--orphan-frac`` (5 %) of all clicks, more to bring the total to
  about ``--clicks-per-order`` (1.0) per valid order line.
* **Malformed lines** (``--malformed-frac`` of all lines, 0.5 %): clicks of an order session, inside
  the bound, each made one of ``truncated`` (cut mid-line), ``garbage`` (not JSON), ``id_str``
  (``"click_id":"C-<n>"``) or ``ts_bad`` (``"clicked_at":"yesterday"``), round robin over a random
  permutation.
* About 1 % of the urls need quoting in CSV or are not ASCII (a comma, double quotes, ``é``).

Time model (as gen_orders.py)
-----------------------------
Arrival (processing) time is cut into ``files`` slots of ``slot`` seconds from ``start``; file i
holds the clicks whose arrival falls in slot i, in arrival order; its mtime is ``MTIME_BASE + i``,
the mtime gen_orders.py gives orders file i. The slot start and length are ``--start`` and
``--slot-seconds`` if given, else gen_orders' manifest beside the orders folder
(``<orders>.manifest.json``), else estimated from the orders (each file's latest ``occurred_at``
is just before its slot's end).

* on time: arrival = clicked_at + a few seconds (U(0, 4 s), 10 % U(4 s, 30 s));
* late (``--late-frac``, 5 %): arrival in slot s+k, k = 1..``--late-max-files`` (2), s the slot of
  ``clicked_at``, anywhere in that slot;
* too late (``--too-late-frac``, 1 %): arrival = clicked_at + U(``--too-late-min-s``,
  ``--too-late-max-s``) (20..60 min, as gen_orders.py), never in slot 0 (it is then on time).

A click that would arrive before ``start`` (its session's order came early and the click was
more than the on-time delay before the stream began) or after the last slot is not written; the
manifest counts them.

Also writes ``<out>.manifest.json`` (beside the folder) with the counts of every category.
"""
import argparse
import datetime as dt
import json
import os
import random
import sys
import time

MTIME_BASE = 1_700_000_000  # gen_orders.py's: clicks file i gets the mtime of orders file i
CLICK_ID_BASE = 50_000_000
MALFORMED_KINDS = ["truncated", "garbage", "id_str", "ts_bad"]
CATEGORIES = ["fiction", "science", "history", "children", "travel", "cooking", "poetry", "comics"]
# Urls that need CSV quoting or are not ASCII (written with json.dumps, ensure_ascii=False).
SPECIAL_URLS = ["/search?q=war,peace&page=2", '/books/"best"-sellers', "/books/café-culture"]
EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
DAY_MS = 86_400_000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--orders", required=True, help="folder of orders-NNNNN.json (gen_orders.py --out)")
    p.add_argument("--out", required=True, help="folder for clicks-NNNNN.json (created; must hold no clicks files)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bound-s", type=float, default=3600.0,
                   help="the join's time bound: clicked_at = occurred_at - U(0, 1.5 x bound)")
    p.add_argument("--start", default=None, help="arrival time of slot 0 (UTC, as gen_orders.py --start)")
    p.add_argument("--slot-seconds", type=float, default=None, help="arrival-time span of one file")
    p.add_argument("--session-frac", type=float, default=0.7, help="fraction of the orders' sessions with clicks")
    p.add_argument("--multi-frac", type=float, default=0.1, help="fraction of those with 2 or 3 clicks")
    p.add_argument("--clicks-per-order", type=float, default=1.0,
                   help="target number of clicks per valid order line (orphans fill up to it)")
    p.add_argument("--orphan-frac", type=float, default=0.05, help="minimum fraction of clicks without an order")
    p.add_argument("--null-frac", type=float, default=0.02, help="fraction of clicks with a null session_id")
    p.add_argument("--late-frac", type=float, default=0.05)
    p.add_argument("--late-max-files", type=int, default=2)
    p.add_argument("--too-late-frac", type=float, default=0.01)
    p.add_argument("--too-late-min-s", type=float, default=1200.0)
    p.add_argument("--too-late-max-s", type=float, default=3600.0)
    p.add_argument("--malformed-frac", type=float, default=0.005)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Timestamps: 'YYYY-MM-DDTHH:MM:SS.mmmZ' <-> epoch milliseconds, fast (a million of each).
# ---------------------------------------------------------------------------------------------

_day_of = {}   # 'YYYY-MM-DD' -> days since the epoch
_date_of = {}  # days since the epoch -> 'YYYY-MM-DD'


def parse_ts(s):
    """epoch ms of an ISO-8601 UTC timestamp as gen_orders.py writes it, or None."""
    if not isinstance(s, str):
        return None
    try:
        if len(s) == 24 and s[10] == "T" and s[19] == "." and s[23] == "Z" and s[13] == ":" and s[16] == ":":
            day = _day_of.get(s[:10])
            if day is None:
                day = dt.date.fromisoformat(s[:10]).toordinal() - EPOCH_ORDINAL
                _day_of[s[:10]] = day
            return (day * DAY_MS + int(s[11:13]) * 3_600_000 + int(s[14:16]) * 60_000
                    + int(s[17:19]) * 1000 + int(s[20:23]))
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        return (t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(milliseconds=1)
    except ValueError:
        return None


def fmt_ts(ms):
    day, rem = divmod(ms, DAY_MS)
    date = _date_of.get(day)
    if date is None:
        date = dt.date.fromordinal(day + EPOCH_ORDINAL).isoformat()
        _date_of[day] = date
    h, rem = divmod(rem, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms_ = divmod(rem, 1000)
    return f"{date}T{h:02d}:{m:02d}:{s:02d}.{ms_:03d}Z"


# ---------------------------------------------------------------------------------------------


def read_orders(folder):
    """(file names in name order, lines per file, latest occurred_at per file, sessions, valid lines):
    sessions maps each session_id to the occurred_at (ms) of its first valid order, in order of first
    appearance (a dict: insertion order, never hash order)."""
    names = sorted(n for n in os.listdir(folder) if n.startswith("orders-") and n.endswith(".json"))
    if not names:
        sys.exit(f"no orders-*.json in {folder}")
    sessions, latest, valid = {}, [], 0
    loads = json.loads
    for name in names:
        top = None
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    o = loads(line)
                except ValueError:
                    continue
                if not isinstance(o, dict):
                    continue
                sid = o.get("session_id")
                occ = parse_ts(o.get("occurred_at"))
                if not isinstance(sid, str) or occ is None:
                    continue
                valid += 1
                if sid not in sessions:
                    sessions[sid] = occ
                if top is None or occ > top:
                    top = occ
        latest.append(top)
    return names, latest, sessions, valid


def time_slots(a, names, latest):
    """(start ms, slot ms, where from)."""
    if a.start is not None and a.slot_seconds is not None:
        return parse_ts(a.start + "Z" if not a.start.endswith("Z") else a.start), int(round(a.slot_seconds * 1000)), "args"
    manifest = os.path.normpath(a.orders) + ".manifest.json"
    if os.path.isfile(manifest):
        with open(manifest) as fh:
            args = json.load(fh).get("args", {})
        start = a.start or args.get("start")
        slot = a.slot_seconds or args.get("slot_seconds")
        if start is not None and slot is not None and args.get("files", len(names)) == len(names):
            return parse_ts(start if start.endswith("Z") else start + "Z"), int(round(slot * 1000)), manifest
    # Estimate: an on-time order's occurred_at is a few seconds before its arrival, so file i's latest
    # occurred_at is just before the end of slot i. Whole seconds.
    pts = [(i, (t + 999) // 1000 * 1000) for i, t in enumerate(latest) if t is not None]
    if len(pts) < 2 and a.slot_seconds is None:
        sys.exit("cannot tell the slot length from the orders: pass --start and --slot-seconds")
    if a.slot_seconds is not None:
        slot = int(round(a.slot_seconds * 1000))
    else:
        diffs = sorted((t2 - t1) / (i2 - i1) for (i1, t1), (i2, t2) in zip(pts, pts[1:]))
        slot = int(round(diffs[len(diffs) // 2] / 1000)) * 1000
    if a.start is not None:
        start = parse_ts(a.start if a.start.endswith("Z") else a.start + "Z")
    else:
        starts = sorted(t - (i + 1) * slot for i, t in pts)
        start = starts[len(starts) // 2]
    return start, slot, "estimated from the orders"


def main(argv=None):
    a = parse_args(argv)
    t0 = time.time()
    names, latest, sessions, valid_orders = read_orders(a.orders)
    n_files = len(names)
    start, slot, slots_from = time_slots(a, names, latest)
    if start is None or slot <= 0:
        sys.exit("bad --start / --slot-seconds")
    end = start + n_files * slot
    bound_ms = int(round(a.bound_s * 1000))
    spread = int(round(1.5 * bound_ms))
    too_late_lo = int(round(a.too_late_min_s * 1000))
    too_late_hi = int(round(a.too_late_max_s * 1000))
    rng = random.Random(a.seed)
    rand = rng.random

    # Each kept click: (arrival ms, sequence, session or None, clicked_at ms, url, malformed kind or None)
    clicks = []
    counts = {"on_time": 0, "late": 0, "too_late": 0, "dropped_before_start": 0, "dropped_after_end": 0}

    def ontime_delay():
        u = rand()
        return int(rand() * 4000) if u < 0.9 else 4000 + int(rand() * 26_000)

    def url():
        u = rand()
        if u < 0.01:
            return SPECIAL_URLS[int(rand() * len(SPECIAL_URLS))]
        return f"/books/{CATEGORIES[int(rand() * len(CATEGORIES))]}/{int(rand() * 100_000)}"

    def add(session, clicked, malformed=None):
        """Draws the click's arrival; keeps it if it arrives within the slots. True if kept."""
        u = rand()
        kind = "on_time"
        if malformed is None and u < a.too_late_frac:
            arrival = clicked + too_late_lo + int(rand() * (too_late_hi - too_late_lo))
            kind = "too_late"
            if arrival < start + slot:  # never in slot 0 (as gen_orders.py): on time instead
                arrival, kind = clicked + ontime_delay(), "on_time"
        elif malformed is None and u < a.too_late_frac + a.late_frac:
            s = (clicked - start) // slot
            k = 1 + int(rand() * a.late_max_files)
            arrival = start + (s + k) * slot + int(rand() * slot)
            kind = "late"
        else:
            arrival = clicked + ontime_delay()
        link = url()
        if arrival < start:
            counts["dropped_before_start"] += 1
            return False
        if arrival >= end:
            counts["dropped_after_end"] += 1
            return False
        counts[kind] += 1
        clicks.append((arrival, len(clicks), session, clicked, link, malformed))
        return True

    # 1. The orders' sessions.
    clicked_sessions = multi_sessions = session_clicks = 0
    within_bound = outside_bound = 0
    for sid, occ in sessions.items():
        if rand() >= a.session_frac:
            continue
        clicked_sessions += 1
        n = 1
        if rand() < a.multi_frac:
            n = 2 + int(rand() * 2)
            multi_sessions += 1
        for _ in range(n):
            offset = int(rand() * spread)
            if add(sid, occ - offset):
                session_clicks += 1
                if offset <= bound_ms:
                    within_bound += 1
                else:
                    outside_bound += 1

    target = int(round(a.clicks_per_order * valid_orders))
    span = end - start

    # 2. Null sessions.
    null_clicks = 0
    for _ in range(int(round(a.null_frac * target))):
        if add(None, start + int(rand() * span)):
            null_clicks += 1

    # 3. Orphans: sessions no order has. First the clicks of sessions that order after the stream's
    # end (orders at the same rate in the `spread` after it, their clicks the same way as above):
    # without them the clicks would thin out over the last `spread` of the stream, whose orders come
    # later; the first `spread` has no such gap (its clicks' orders are all in the stream).
    used = set()  # membership only, never iterated

    def orphan_session():
        while True:
            sid = f"s-{rng.getrandbits(63):016x}"
            if sid not in sessions and sid not in used:
                used.add(sid)
                return sid

    future_clicks = 0
    for _ in range(int(round(len(sessions) * spread / span))):
        occ = end + int(rand() * spread)
        if rand() >= a.session_frac:
            continue
        n = 2 + int(rand() * 2) if rand() < a.multi_frac else 1
        sid = orphan_session()
        for _ in range(n):
            clicked = occ - int(rand() * spread)
            if clicked < end and add(sid, clicked):  # (else it arrives after the end too)
                future_clicks += 1
    # Then uniformly spread ones, at least --orphan-frac, up to --clicks-per-order.
    n_orphans = max(int(round(a.orphan_frac * target)), target - session_clicks - null_clicks - future_clicks)
    orphan_clicks = future_clicks
    for _ in range(n_orphans):
        if add(orphan_session(), start + int(rand() * span)):
            orphan_clicks += 1

    # 4. Malformed lines: clicks of order sessions inside the bound, on time, then corrupted.
    good = len(clicks)
    n_mal = int(round(a.malformed_frac * good / (1 - a.malformed_frac))) if a.malformed_frac < 1 else 0
    perm = list(range(n_mal))
    for i in range(n_mal - 1, 0, -1):  # Fisher-Yates on rand() (no library shuffle)
        j = int(rand() * (i + 1))
        perm[i], perm[j] = perm[j], perm[i]
    session_list = list(sessions.items())
    made = 0
    tries = 0
    while made < n_mal and session_list and tries < 100 * (n_mal + 1):
        tries += 1
        sid, occ = session_list[int(rand() * len(session_list))]
        if add(sid, occ - int(rand() * bound_ms), malformed=MALFORMED_KINDS[perm[made] % len(MALFORMED_KINDS)]):
            made += 1

    # 5. Arrival order, ids, files.
    clicks.sort()
    os.makedirs(a.out, exist_ok=True)
    if any(f.startswith("clicks-") for f in os.listdir(a.out)):
        sys.exit(f"{a.out} already contains clicks files")
    by_file = [[] for _ in range(n_files)]
    mal_count = {k: 0 for k in MALFORMED_KINDS}
    for n, (arrival, _seq, sid, clicked, link, malformed) in enumerate(clicks):
        cid = CLICK_ID_BASE + n
        sess = "null" if sid is None else f'"{sid}"'
        line = (f'{{"click_id":{cid},"session_id":{sess},"clicked_at":"{fmt_ts(clicked)}",'
                f'"url":{json.dumps(link, ensure_ascii=False)}}}')
        if malformed is not None:
            mal_count[malformed] += 1
            u = (cid * 2654435761 % 2**32) / 2**32  # a deterministic cut, no draw needed
            if malformed == "truncated":
                line = line[:5 + int(u * (len(line) - 10))]
            elif malformed == "garbage":
                line = f"#### click tracker crashed mid-write {int(u * 1e9):x} ####"
            elif malformed == "id_str":
                line = line.replace(f'"click_id":{cid},', f'"click_id":"C-{cid}",', 1)
            elif malformed == "ts_bad":
                line = line.replace(f'"clicked_at":"{fmt_ts(clicked)}"', '"clicked_at":"yesterday"', 1)
        by_file[(arrival - start) // slot].append(line)
    for i, (name, lines) in enumerate(zip(names, by_file)):
        path = os.path.join(a.out, "clicks-" + name[len("orders-"):])
        with open(path, "w", encoding="utf-8", newline="\n", buffering=1 << 20) as fh:
            if lines:
                fh.write("\n".join(lines))
                fh.write("\n")
        os.utime(path, (MTIME_BASE + i, MTIME_BASE + i))

    per_file = [len(x) for x in by_file]
    manifest = {
        "generator": "gen_clicks.py",
        "args": {k: v for k, v in vars(a).items() if k not in ("orders", "out")},
        "orders_files": n_files,
        "orders_valid_lines": valid_orders,
        "order_sessions": len(sessions),
        "slots_from": slots_from if slots_from in ("args", "estimated from the orders") else "gen_orders manifest",
        "arrival_start": fmt_ts(start),
        "slot_seconds": slot / 1000,
        "lines_total": len(clicks),
        "sessions_with_clicks": clicked_sessions,
        "sessions_with_2_or_3_clicks": multi_sessions,
        "clicks_of_order_sessions": session_clicks,
        "clicks_within_bound": within_bound,
        "clicks_before_bound": outside_bound,
        "clicks_null_session": null_clicks,
        "clicks_orphan_session": orphan_clicks,
        "clicks_orphan_of_sessions_ordering_after_the_end": future_clicks,
        "malformed_lines": made,
        "malformed_by_kind": mal_count,
        "kept_on_time": counts["on_time"],
        "kept_late_1_to_n_files": counts["late"],
        "kept_too_late": counts["too_late"],
        "not_written_before_start": counts["dropped_before_start"],
        "not_written_after_end": counts["dropped_after_end"],
        "lines_per_file_min": min(per_file),
        "lines_per_file_max": max(per_file),
        "seconds": round(time.time() - t0, 2),
    }
    with open(os.path.normpath(a.out) + ".manifest.json", "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.write("\n")
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
