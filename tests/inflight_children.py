"""What the child processes of test_loop_reference_engine.py::test_in_flight_is_shared_between_processes run.

A module of its own: a spawned child imports the module of the function it runs, and this one imports no more
than trtspec.spec.load (the test module imports torch and the models: seconds per child)."""

from trtspec.spec.load import InFlight


def count_in_child(path):
    c = InFlight(path)
    for _ in range(50):
        with c.request():
            assert c() >= 2  # the parent's request and this one
    c.close()


def hold_in_child(path, n):
    c = InFlight(path)
    for _ in range(n):
        c.add(1)
    assert c() == n
    c.add(-n)
    c.close()
