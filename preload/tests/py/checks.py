"""What the scripts of preload/tests/py print for preload/tests/python.rs:
`OK <check>` or `FAIL <check>: <why>` per check (the test wants every one
OK, in its order), then `DONE`."""


def ok(name):
    print(f"OK {name}", flush=True)


def fail(name, why):
    print(f"FAIL {name}: {why}", flush=True)


def check(name, cond, why=""):
    if cond:
        ok(name)
    else:
        fail(name, why)
