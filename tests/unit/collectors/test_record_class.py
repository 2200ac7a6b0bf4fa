"""``record`` behaves as ``dataclass(frozen=True)`` / ``dataclass`` on what the code relies on."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from dataclasses import field

import pytest

from rankscope.collectors.record_class import record


@dataclasses.dataclass(frozen=True)
class StdPoint:
    x: int
    y: float = 0.0
    tags: list = field(default_factory=list)
    note: str = field(default="", compare=False, hash=False, repr=False)


@record
class Point:
    """A documented record: its __init__ is made on the first call (the path most of rankscope's records take)."""

    x: int
    y: float = 0.0
    tags: list = field(default_factory=list)
    note: str = field(default="", compare=False, hash=False, repr=False)


@record
class Point3(Point):
    """Adds a field."""

    z: int = 0


@record(frozen=False)
class Mutable:
    """Not frozen."""

    a: int
    b: list = field(default_factory=list)


@record
class Derived:
    """Sets a field in __post_init__."""

    a: int
    twice: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "twice", 2 * self.a)


@record
class OwnMethods:
    a: int

    def __eq__(self, other):
        return isinstance(other, OwnMethods)

    def __hash__(self):
        return 7

    def __repr__(self):
        return "own"


def test_same_repr_eq_hash_as_a_frozen_dataclass():
    s, r = StdPoint(1, 2.5, (3,), "a"), Point(1, 2.5, (3,), "a")
    assert repr(r) == repr(s).replace("StdPoint", "Point")
    assert r == Point(1, 2.5, (3,), "other note")  # note does not compare
    assert r != Point(2, 2.5, (3,))
    assert hash(r) == hash(Point(1, 2.5, (3,), "b")) == hash((1, 2.5, (3,)))
    assert (r == s) is False and r.__eq__(s) is NotImplemented  # another class: not equal
    assert Point3(1, z=2) != Point(1) and Point3(1, z=2) == Point3(1, z=2)
    assert repr(Point3(1, z=2)) == "Point3(x=1, y=0.0, tags=[], z=2)"


def test_frozen_refuses_assignment_and_deletion():
    p = Point(1)
    for attempt in (lambda: setattr(p, "x", 2), lambda: setattr(p, "new", 2), lambda: delattr(p, "x")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            attempt()
    assert p.x == 1


def test_stdlib_helpers_and_copies_work():
    p = Point(1, tags=[1])
    q = dataclasses.replace(p, x=5)
    assert (q.x, q.tags, p.x) == (5, [1], 1)
    assert dataclasses.is_dataclass(p) and [f.name for f in dataclasses.fields(p)] == ["x", "y", "tags", "note"]
    assert dataclasses.asdict(p) == {"x": 1, "y": 0.0, "tags": [1], "note": ""}
    assert pickle.loads(pickle.dumps(p)) == p and copy.deepcopy(p) == p and copy.copy(p) == p
    assert Point(0).tags is not Point(0).tags  # a list of its own per instance


def test_post_init_and_own_methods():
    assert Derived(3).twice == 6 and Derived(3) == Derived(3)
    o = OwnMethods(1)
    assert (o == OwnMethods(2), hash(o), repr(o)) == (True, 7, "own")


def test_not_frozen_is_mutable_and_unhashable():
    m = Mutable(1)
    m.a = 2
    assert m == Mutable(2) and repr(m) == "Mutable(a=2, b=[])"
    with pytest.raises(TypeError):
        hash(m)


def test_frozen_class_may_not_define_setattr():
    with pytest.raises(TypeError, match="__setattr__"):
        @record
        class Bad:
            a: int

            def __setattr__(self, name, value):
                pass


def _exec_counter(monkeypatch) -> list:
    """Calls of ``exec`` by dataclasses (one per method it makes)."""
    calls = []

    def counted(*a, **k):
        calls.append(a[0].split("(")[0])
        return exec(*a, **k)

    monkeypatch.setattr(dataclasses, "exec", counted, raising=False)
    return calls


def test_a_documented_records_init_is_made_on_its_first_call_only(monkeypatch):
    calls = _exec_counter(monkeypatch)

    @record
    class Lazy:
        """Documented."""

        a: int
        b: list = field(default_factory=list)

    assert calls == []  # nothing compiled while the class is made: most classes of a run are never instantiated
    first = Lazy(1)
    assert len(calls) == 1 and Lazy(2, [3]) == Lazy(2, [3]) and len(calls) == 1
    assert (first.a, first.b) == (1, []) and list(inspect.signature(Lazy).parameters) == ["a", "b"]
    with pytest.raises(TypeError):
        Lazy()  # a required field stays required
    with pytest.raises(TypeError):
        Lazy(1, c=2)


def test_an_undocumented_record_keeps_dataclass_docstring():
    @record
    class Plain:
        a: int
        b: str = "x"

    assert Plain.__doc__ == "Plain(a: 'int', b: 'str' = 'x')" and Plain(1).b == "x"


def test_subclasses_instantiated_before_their_base():
    @record
    class Base:
        """Base."""

        a: int
        b: int = 2

    class Plain(Base):  # not a record: it takes its base's fields and __init__
        def total(self):
            return self.a + self.b

    @record
    class More(Base):
        """More."""

        c: int = 3

    assert Plain(1).total() == 3
    assert (More(1, c=5).a, More(1, c=5).b, More(1, c=5).c) == (1, 2, 5)
    assert Base(4) == Base(4, 2) and repr(Base(4)).endswith("Base(a=4, b=2)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        More(1).c = 0


def test_replace_on_a_first_instance():
    @record
    class Fresh:
        """Never called before replace."""

        a: int
        b: int = 0

    assert dataclasses.replace(Fresh(1), b=3) == Fresh(1, 3)
    assert pickle.loads(pickle.dumps(Derived(2))).twice == 4
