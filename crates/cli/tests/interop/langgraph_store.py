"""LangGraph's Python SDK (PyPI `langgraph-sdk`) against `toolgraph serve`'s store.

Usage: langgraph_store.py BASE_URL API_KEY. Prints, as one JSON object, what the client saw:
items put, read, searched (by namespace prefix, by a filter, by words) and listed by
namespace; another person of the same tenant seeing none of them; an item with a time to live
kept alive by a read and gone once unread; a deletion; refusals of a bad namespace and a bad
time to live. The Rust test (tests/langgraph.rs) asserts on it.
"""

import json
import sys
import time

from langgraph_common import client_of, refused

base, key = sys.argv[1], sys.argv[2]
me = client_of(base, key, 1).store
other = client_of(base, key, 2).store
out = {}

# Written a few milliseconds apart: the most recently written comes first.
me.put_item(["prefs"], "lang", {"text": "Prefers answers in Spanish", "kind": "lang", "n": 1})
time.sleep(0.02)
me.put_item(["prefs", "school"], "class", {"text": "Her child is in class 5A", "kind": "family", "n": 2})
time.sleep(0.02)
me.put_item(["prefsx"], "other", {"text": "Not under prefs", "kind": "family", "n": 3})
out["got"] = me.get_item(["prefs"], "lang")
out["other_got"] = refused(lambda: other.get_item(["prefs"], "lang"))
out["under_prefs"] = [i["key"] for i in me.search_items(["prefs"])["items"]]
out["family"] = [i["key"] for i in me.search_items([], filter={"kind": "family"})["items"]]
out["n_over_1"] = [i["key"] for i in me.search_items([], filter={"n": {"$gt": 1}})["items"]]
out["words"] = [[i["key"], i["score"]] for i in me.search_items([], query="Spanish answers?")["items"]]
out["paged"] = [i["key"] for i in me.search_items([], limit=1, offset=1)["items"]]
out["other_search"] = other.search_items([])["items"]
out["namespaces"] = me.list_namespaces()["namespaces"]
out["namespaces_prefs"] = me.list_namespaces(prefix=["prefs"], max_depth=1)["namespaces"]

# A time to live of 3 s (in minutes, as LangGraph takes it): a read at 2 s keeps it past 3 s;
# unread after that, it is gone by 6 s.
me.put_item(["notes"], "brief", {"text": "Short-lived"}, ttl=0.05)
time.sleep(2)
out["alive_at_2"] = me.get_item(["notes"], "brief")["key"]
time.sleep(2)
out["alive_at_4"] = me.get_item(["notes"], "brief", refresh_ttl=False)["key"]
time.sleep(2)
out["gone_at_6"] = refused(lambda: me.get_item(["notes"], "brief"))

me.delete_item(["prefs"], "lang")
out["deleted"] = refused(lambda: me.get_item(["prefs"], "lang"))
out["bad_namespace"] = refused(lambda: me.put_item(["prefs", ""], "k", {"x": 1}))
out["bad_ttl"] = refused(lambda: me.put_item(["prefs"], "k", {"x": 1}, ttl=-1))
out["bad_filter"] = refused(lambda: me.search_items([], filter={"n": {"$in": [1]}}))
print(json.dumps(out))
