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


def crash_once(response: str, answer: str):
    """Exits the worker the first time it sees a response naming a marker file (``ONCE:PATH ...``), as a worker
    killed from outside would; verifies it on later tries."""
    if response.startswith("ONCE:"):
        marker = response.split()[0][len("ONCE:"):]
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
    return verify(response, answer)
