#!/usr/bin/env python3
"""Opens a ticket: reads {"summary": ..., "details": ...} on stdin, appends it as one JSON line to
the file HELPDESK_TICKETS names (default: ~/.local/share/acme-helpdesk/tickets.jsonl) and prints
its number. A missing summary is an error on stderr (exit 2)."""
import json
import os
import sys
import time

args = json.load(sys.stdin)
summary = (args.get("summary") or "").strip()
if not summary:
    print("a ticket needs a summary", file=sys.stderr)
    sys.exit(2)
path = os.environ.get("HELPDESK_TICKETS") or os.path.join(
    os.environ.get("HOME") or "/tmp", ".local", "share", "acme-helpdesk", "tickets.jsonl")
os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
number = 1
if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
        number = sum(1 for _ in f) + 1
ticket = {"ticket": f"T-{number:04d}", "summary": summary, "details": args.get("details") or "",
          "opened": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps(ticket, ensure_ascii=False) + "\n")
print(json.dumps({"ticket": ticket["ticket"], "status": "open"}))
