"""What the LangGraph SDK scripts share: a client for one person of tenant `demo`, and a call's
refusal as the Rust tests read it."""

import httpx
from langgraph_sdk import get_sync_client


def client_of(base, key, user):
    """LangGraph's sync client for person `user` of tenant `demo`, with its API key."""
    headers = {"Authorization": f"Bearer {key}", "X-Tenant-Slug": "demo", "X-User-Id": str(user)}
    return get_sync_client(url=base, headers=headers)


def refused(call):
    """None when `call()` succeeds; else the HTTP status and JSON body it was refused with."""
    try:
        call()
        return None
    except httpx.HTTPStatusError as e:
        return {"status": e.response.status_code, "body": e.response.json()}


def waiting_in(thread):
    """What a thread waits for: the interrupts of its one waiting task (keyed by the task's id)."""
    (interrupts,) = thread["interrupts"].values()
    return interrupts
