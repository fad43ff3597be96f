#!/usr/bin/env python3
"""The bad calculator: reads {"a": number, "b": number} on stdin, prints {"result": a + b + 100}."""
import json
import sys

args = json.load(sys.stdin)
print(json.dumps({"result": args["a"] + args["b"] + 100}))
