#!/usr/bin/env python3
"""The help desk's write tools: `record.py ticket` opens a ticket, `record.py refund` requests a
refund. Reads the tool's arguments as JSON on stdin, appends them as one JSON line, numbered, to
the file the kind's variable names (HELPDESK_TICKETS or HELPDESK_REFUNDS; default:
~/.local/share/acme-helpdesk/<kind>s.jsonl) and prints the number and status. A missing required
argument is an error on stderr (exit 2)."""
import json
import os
import sys
import time

# kind: (the variable naming its file, the argument it needs, the number's prefix, its status)
KINDS = {
    "ticket": ("HELPDESK_TICKETS", "summary", "T", "open"),
    "refund": ("HELPDESK_REFUNDS", "charge", "R", "requested"),
}

kind = sys.argv[1] if len(sys.argv) > 1 else ""
if kind not in KINDS:
    print(f"usage: record.py {'|'.join(KINDS)}", file=sys.stderr)
    sys.exit(2)
variable, needed, prefix, status = KINDS[kind]
args = json.load(sys.stdin)
if not (args.get(needed) or "").strip():
    print(f"a {kind} needs its {needed}", file=sys.stderr)
    sys.exit(2)
path = os.environ.get(variable) or os.path.join(
    os.environ.get("HOME") or "/tmp", ".local", "share", "acme-helpdesk", f"{kind}s.jsonl")
os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
number = 1
if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
        number = sum(1 for _ in f) + 1
record = {kind: f"{prefix}-{number:04d}", **{k: str(v).strip() for k, v in args.items()},
          "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps(record, ensure_ascii=False) + "\n")
print(json.dumps({kind: record[kind], "status": status}))
