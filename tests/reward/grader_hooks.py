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


def interrupted_until(response: str, answer: str):
    """Answers ``interrupted`` (as the code reward does when a stop reached its sandbox) for responses ``STOP:N:PATH
    ...`` until it has seen them N times (counted in the file PATH), then verifies."""
    if response.startswith("STOP:"):
        _, n, path = response.split()[0].split(":", 2)
        seen = len(open(path).read()) if os.path.exists(path) else 0
        with open(path, "a") as f:
            f.write("x")
        if seen < int(n):
            return 0.0, "interrupted"
    return verify(response, answer)
