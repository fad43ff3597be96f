#!/usr/bin/env python3
"""The date and time now: reads {"timezone": "Europe/Madrid"} on stdin, prints the date, the
time, the weekday and the UTC offset there. An unknown zone is an error on stderr (exit 2)."""
import datetime
import json
import sys
import zoneinfo

args = json.load(sys.stdin)
name = args.get("timezone") or "UTC"
try:
    zone = zoneinfo.ZoneInfo(name)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    print(f"unknown time zone '{name}' (use an IANA name such as Europe/Madrid)", file=sys.stderr)
    sys.exit(2)
now = datetime.datetime.now(zone)
print(json.dumps({
    "timezone": name,
    "datetime": now.isoformat(timespec="seconds"),
    "date": now.date().isoformat(),
    "time": now.strftime("%H:%M"),
    "weekday": now.strftime("%A"),
    "utc_offset": now.strftime("%z"),
}))
