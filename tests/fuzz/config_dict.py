"""atheris target: the binding's config dict parser (csrc/python/config.c,
pyconfig_from_dict), which every call into the core (run, validate, probe)
goes through, fed hostile Python objects through ``_core.validate``.

Each input edits a valid core dict (``config.core_config(Config())``): a
few fields get values from PALETTE (wrong types, huge and negative ints,
NaN, str and bytes with NULs or surrogates, str/int/float subclasses,
objects whose ``__index__``/``__float__``/``__iter__`` raise, return odd
things or change the dict being parsed, nested and endless containers),
fields go missing, extra keys come in (non-str keys, str subclasses, a name
with a NUL after it), and the dict itself may be a subclass with odd
``__getitem__``/``keys``. The parser must refuse with one of the
exceptions it documents (ConfigError, TypeError, ValueError, KeyError,
OverflowError, or the validator's CoreError), with a message, or accept a
dict that holds exactly the core's fields; anything else escaping, or a
crash, is a finding. Run it with PYTHONMALLOC=debug (tests/project/test_fuzz.py and
benchmarks/fuzz.sh do): freed objects are then overwritten, so a use after
free crashes here instead of reading stale memory.

    python tests/fuzz/config_dict.py -max_total_time=60 tests/fuzz/corpus/config_dict
"""
import math
import sys

import atheris

# Python coverage for uffdkvm's own modules (atheris instruments whole
# top-level packages); the parser itself is _core's C, whose coverage the ASan
# build gives. Instrumenting every module uffdkvm imports, the standard
# library's too, took 7 s of each start; uffdkvm's alone, 3.
with atheris.instrument_imports(include=["uffdkvm"]):
    import uffdkvm
    from uffdkvm import _core
    from uffdkvm.config import core_config

BASE = core_config(uffdkvm.Config())
KEYS = sorted(BASE)
ALLOWED_EXTRA = {"inject", "inject_after"} if _core.TEST_HOOKS else set()
REFUSALS = (uffdkvm.ConfigError, TypeError, ValueError, KeyError, OverflowError,
            _core.CoreError)


class Odd(Exception):
    """What the hostile objects raise: never a refusal the parser may pass on as its own."""


class StrSub(str):
    pass


class IntSub(int):
    pass


class FloatSub(float):
    pass


class EqRaises(str):
    """A key equal to a field's name by hash, whose comparison raises while
    the parser runs (the harness's own dict and set operations compare it
    with ARMED off)."""
    ARMED = False

    def __eq__(self, other):
        if EqRaises.ARMED:
            raise Odd("__eq__")
        return str.__eq__(self, other)

    __hash__ = str.__hash__


class IndexRaises:
    def __index__(self):
        raise Odd("__index__")

    def __float__(self):
        raise Odd("__float__")


class IndexOdd:
    def __index__(self):
        return "not an int"

    def __float__(self):
        return "not a float"


class IterRaises:
    def __iter__(self):
        raise Odd("__iter__")


class IterBreaksOff:
    def __iter__(self):
        yield 1
        raise Odd("in the middle")


class DictSub(dict):
    """The C side reads a dict's own storage: these must not matter."""
    def __getitem__(self, key):
        raise Odd("__getitem__")

    def keys(self):
        raise Odd("keys")

    def __iter__(self):
        raise Odd("__iter__")


class Mutator:
    """Changes the dict being parsed from inside a conversion: deletes its
    own entry (so that only the parser holds it, if it holds it at all),
    adds or drops other keys."""
    def __init__(self, d, key, how):
        self.d, self.key, self.how = d, key, how

    def _mutate(self):
        if self.how == 0:
            self.d.pop(self.key, None)
        elif self.how == 1:
            self.d["not_a_field"] = 1
        elif self.how == 2:
            self.d.clear()
        else:
            for k in list(self.d):
                self.d[k] = None

    def __iter__(self):
        self._mutate()
        self.__dict__.clear()  # drop the references the object holds
        return iter([0, 1])

    def __index__(self):
        self._mutate()
        return 1

    def __float__(self):
        self._mutate()
        return 0.5


@atheris.instrument_func
def value(fdp, d, key):
    """One hostile value, chosen by the input."""
    kind = fdp.ConsumeIntInRange(0, 31)
    if kind == 0:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 80))  # any width, signed
    if kind == 1:
        return fdp.PickValueInList([0, -1, 1 << 31, 1 << 32, (1 << 64) - 1, 1 << 64, 1 << 200,
                                    -(1 << 63), True, False])
    if kind == 2:
        return fdp.ConsumeFloat()
    if kind == 3:
        return fdp.PickValueInList([math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324])
    if kind == 4:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 300))
    if kind == 5:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
    if kind == 6:
        return fdp.PickValueInList(["a\0b", "\udc80", "x" * 5000, b"a\0b", b"\xff" * 10,
                                    bytearray(b"abc"), memoryview(b"abc")])
    if kind == 7:
        return StrSub(fdp.ConsumeUnicode(20))
    if kind == 8:
        return IntSub(fdp.ConsumeIntInRange(-5, 1 << 40))
    if kind == 9:
        return FloatSub(fdp.ConsumeFloat())
    if kind == 10:
        return None
    if kind == 11:
        return [fdp.ConsumeIntInRange(-2, 1 << 33) for _ in range(fdp.ConsumeIntInRange(0, 8))]
    if kind == 12:
        return tuple(value(fdp, d, key) for _ in range(fdp.ConsumeIntInRange(0, 4)))
    if kind == 13:
        return [[1, 2], [3]]
    if kind == 14:
        return (i for i in range(fdp.ConsumeIntInRange(0, 100)))
    if kind == 15:
        return {1, 2, 3}
    if kind == 16:
        return {"a": 1}
    if kind == 17:
        return range(fdp.ConsumeIntInRange(0, 1 << 16))
    if kind == 18:
        return IndexRaises()
    if kind == 19:
        return IndexOdd()
    if kind == 20:
        return IterRaises()
    if kind == 21:
        return IterBreaksOff()
    if kind == 22:
        return [IndexRaises()]
    if kind == 23:
        return [IndexOdd(), 1]
    if kind == 24:
        return Mutator(d, key, fdp.ConsumeIntInRange(0, 3))
    if kind == 25:
        return [Mutator(d, key, fdp.ConsumeIntInRange(0, 3))]
    if kind == 26:
        return object()
    if kind == 27:
        return 1j
    if kind == 28:
        return str(fdp.ConsumeIntInRange(0, 100))
    if kind == 29:
        return b"1"
    if kind == 30:
        return BASE[fdp.PickValueInList(KEYS)]  # another field's (valid) value
    return BASE[key]


@atheris.instrument_func
def extra_key(fdp):
    kind = fdp.ConsumeIntInRange(0, 7)
    name = fdp.PickValueInList(KEYS)
    if kind == 0:
        return fdp.ConsumeUnicode(12)
    if kind == 1:
        return name + "\0" + fdp.ConsumeUnicode(4)
    if kind == 2:
        return StrSub(name)
    if kind == 3:
        return EqRaises(name)
    if kind == 4:
        return fdp.ConsumeIntInRange(-3, 3)
    if kind == 5:
        return name.encode()
    if kind == 6:
        return "\udc80" + name
    return (name,)


@atheris.instrument_func
def TestOneInput(data):
    fdp = atheris.FuzzedDataProvider(data)
    d = dict(BASE)
    for _ in range(fdp.ConsumeIntInRange(0, 6)):
        action = fdp.ConsumeIntInRange(0, 3)
        key = fdp.PickValueInList(KEYS)
        if action <= 1:
            d[key] = value(fdp, d, key)
        elif action == 2:
            d.pop(key, None)
        else:
            k = extra_key(fdp)
            d[k] = value(fdp, d, key) if fdp.ConsumeBool() else BASE[key]
    if fdp.ConsumeBool():
        d = DictSub(d)
    # What the dict holds when parsing starts (a Mutator may change it meanwhile).
    keys_before = set(dict.keys(d))
    EqRaises.ARMED = True
    try:
        _core.validate(d)
    except REFUSALS as e:
        if not str(e):
            raise AssertionError(f"{type(e).__name__} without a message for {d!r}") from e
        return
    finally:
        EqRaises.ARMED = False
    # Accepted: it held every field of the core and nothing else, when parsing began.
    if keys_before - ALLOWED_EXTRA != set(BASE):
        extra = keys_before - set(BASE) - ALLOWED_EXTRA
        raise AssertionError(f"validate accepted a dict with keys {sorted(map(repr, extra))} "
                             f"more and {sorted(set(BASE) - keys_before)} missing")


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
