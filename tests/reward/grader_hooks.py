"""verify_fn hooks imported by grader worker processes in tests/reward/test_grader.py."""
import os
import time

from graft.reward.verifier import verify


def hang_on_marker(response: str, answer: str):
    """Sleeps forever on responses containing HANG, exits the process on CRASH, else verifies."""
    if "HANG" in response:
        while True:
            time.sleep(3600)
    if "CRASH" in response:
        os._exit(3)
    if "RAISE" in response:
        raise RuntimeError("boom")
    return verify(response, answer)


def hang_always(response: str, answer: str):
    """A grader that never answers."""
    while True:
        time.sleep(3600)
