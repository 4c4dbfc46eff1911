"""A spy on a fast twin, for the tests of ``tests/fast/``: ``calls = spy_on(monkeypatch, name)``
puts a wrapper into ``minitx.configuration``'s table of twins that records each call in
``calls`` and then runs the real twin (the table is restored after the test)."""
from minitx import configuration


def spy_on(monkeypatch, name: str) -> list:
    real = configuration.twins()[name]
    calls = []

    def spy(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setitem(configuration._TWINS, name, spy)
    return calls
