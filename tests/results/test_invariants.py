"""Result.from_json raises ResultError, and nothing else, for anything but a
valid Result: text that is not JSON or too large or too deep, values of the
wrong type or range at any level, keys missing or unknown, a future schema;
and Results that break uffdkvm._invariants (a negative count, a total that is
not the sum of its parts). Each hole is a real Result saved, then damaged.
Results the core makes pass the invariants, in every mode of the soak's
matrix."""
import copy
import json
import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import uffdkvm
from helpers.guest_clock import guest_clock_converted
from helpers.hostfacts import facts_for_run, host_skip
from helpers.skips import skip_without_kvm
from benchmarks.test_soak import soak
from uffdkvm import Result, ResultError
from uffdkvm._invariants import check_result


@pytest.fixture(scope="module")
def timed(kvm_reason, tmp_path_factory):
    """Two vCPUs over the same pages, several readers, the guest's stamps
    and the trace: EEXIST, queue and resume stages (or, where KVM moved the
    guest's TSC offset, none and why), every column."""
    skip_without_kvm(kvm_reason)
    r = uffdkvm.run(vcpus=2, mem_per_vcpu="256K", readers=4, overlap=True, wait="epoll",
                    delay_us=20, guest_timing=True, trace_faults=True, read_batch=4)
    assert r.verified and r.eexist > 0
    assert guest_clock_converted(r) == (r.vcpus[0].queue_latency is not None)
    return json.loads(r.to_json())


@pytest.fixture(scope="module")
def prefetched(kvm_reason, tmp_path_factory):
    """A file source with readahead and the background pusher's bytes."""
    skip_without_kvm(kvm_reason)
    snap = tmp_path_factory.mktemp("inv") / "snap"
    uffdkvm.make_snapshot(snap, 1 << 20)
    r = uffdkvm.run(vcpus=2, mem_per_vcpu="512K", readers=2, source="file",
                    source_path=str(snap), prefetch="readahead")
    assert r.verified and r.prefetched_pages and r.source_bytes and r.source_seconds
    return json.loads(r.to_json())


def refused(data, match):
    text = data if isinstance(data, (str, bytes)) else json.dumps(data)
    with pytest.raises(ResultError, match=match) as e:
        Result.from_json(text)
    return str(e.value)


# ---- the text itself

def test_deep_nesting_is_a_result_error_not_a_recursion_error():
    refused("[" * 100_000 + "]" * 100_000, "nested deeper than Python's recursion limit")
    refused('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested deeper")


def test_deep_nesting_inside_a_field_is_named_in_a_short_message(timed):
    d = copy.deepcopy(timed)
    deep = 1
    for _ in range(500):
        deep = [deep]
    d["vcpus"][0]["pass_seconds"] = deep
    message = refused(d, r"\$\.vcpus\[0\]\.pass_seconds\[0\]: expected float")
    assert len(message) < 400


def test_text_over_max_bytes_is_refused_with_the_number(timed, tmp_path):
    text = json.dumps(timed)
    assert Result.from_json(text, max_bytes=len(text)).faults == timed["faults"]
    with pytest.raises(ResultError, match=f"{len(text)} characters of JSON, more than the "
                                          f"{len(text) - 1} read at most"):
        Result.from_json(text, max_bytes=len(text) - 1)
    with pytest.raises(ResultError, match=f"{len(text)} bytes of JSON"):
        Result.from_json(text.encode(), max_bytes=len(text) - 1)
    assert uffdkvm.io.serial.MAX_JSON_BYTES == 1 << 30
    # read_results skips a line too long unread, and reads the ones after it
    path = tmp_path / "runs.jsonl"
    path.write_text(text + "\n" + "[" * (len(text) + 10) + "\n" + text + "\n")
    with pytest.warns(uffdkvm.SweepWarning, match=f"runs.jsonl:2: .*longer than the {len(text)}"):
        assert len(uffdkvm.read_results(path, max_bytes=len(text))) == 2


def test_bytes_that_are_not_utf8(timed):
    text = json.dumps(timed).encode()
    assert Result.from_json(text).faults == timed["faults"]
    refused(text.replace(b'"verify_message": ""', b'"verify_message": "\xff\xfe"'),
            "not UTF-8 text")
    with pytest.raises(ResultError, match="expected JSON text"):
        Result.from_json(12)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", '"nan"', '"inf"'])
def test_non_finite_floats_outside_the_config(timed, literal):
    text = json.dumps(timed).replace('"seconds": ' + json.dumps(timed["seconds"]),
                                     '"seconds": ' + literal, 1)
    refused(text, r"\$\.seconds: .* is not a finite number")
    d = copy.deepcopy(timed)
    d["vcpus"][1]["cpu_seconds"] = json.loads(literal) if literal[0] == '"' else "nan"
    refused(d, r"\$\.vcpus\[1\]\.cpu_seconds: .* not a finite number")


def test_huge_integers(timed):
    d = copy.deepcopy(timed)
    d["readers"][2]["wakeups"] = 2 ** 64 - 1
    d["readers"][2]["spurious_wakeups"] = 2 ** 64  # one past what a uint64_t holds
    refused(d, r"\$\.readers\[2\]\.spurious_wakeups: 18446744073709551616 is outside 0 to "
               r"2\*\*64 - 1")
    d["readers"][2]["wakeups"] = 10 ** 4000
    refused(d, r"\$\.readers\[2\]\.wakeups: an integer of 4001 digits is outside")
    # Python itself refuses to parse more than 4300 digits
    refused(json.dumps(timed).replace('"faults": ', '"faults": ' + "9" * 5000, 1),
            "not JSON: .*digits")


# Wrong types at every level: (path, value, what the message says)
WRONG = [
    (("vcpus",), {}, r"\$\.vcpus: expected tuple"),
    (("vcpus", 0), [], r"\$\.vcpus\[0\]: expected VcpuStats"),
    (("readers", 1, "faults"), "3", r"\$\.readers\[1\]\.faults: expected int, not '3'"),
    (("readers", 1, "faults"), True, r"\$\.readers\[1\]\.faults: expected int, not True"),
    (("readers", 1, "faults"), 3.0, r"\$\.readers\[1\]\.faults: expected int"),
    (("vcpus", 1, "service_latency", "counts"), "x", r"\.service_latency\.counts: expected"),
    (("vcpus", 1, "kvm_stats"), [], r"\$\.vcpus\[1\]\.kvm_stats: expected dict"),
    (("fault_trace", "eexist", 0), 0, r"\$\.fault_trace\.eexist\[0\]: expected bool"),
    (("fault_trace",), "all", r"\$\.fault_trace: expected FaultTrace"),
    (("host", "cpus"), "2", r"\$\.host\.cpus: expected int"),
    (("config", "readers"), [4], r"\$\.config\.readers: expected int"),
    (("config", "wait"), "sometimes", r"\$\.config: not a valid Config: wait"),
    (("verified",), "yes", r"\$\.verified: expected bool"),
]


def damaged(data, path, value):
    d = copy.deepcopy(data)
    at = d
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return d


@pytest.mark.parametrize("path, value, match", WRONG, ids=[".".join(map(str, w[0])) for w in WRONG])
def test_wrong_types_at_any_level(timed, path, value, match):
    refused(damaged(timed, path, value), match)


def test_missing_and_unknown_keys(timed):
    d = copy.deepcopy(timed)
    del d["vcpus"][1]["pages"]
    refused(d, r"\$\.vcpus\[1\]: no 'pages', which VcpuStats requires")
    d = copy.deepcopy(timed)
    del d["vcpus"][1]["service_latency"]["count"]
    refused(d, r"\$\.vcpus\[1\]\.service_latency: no 'count'")
    d = copy.deepcopy(timed)
    d["readers"][0]["faults_per_fortnight"] = 1
    refused(d, r"\$\.readers\[0\]\.faults_per_fortnight: not a field of ReaderStats .*newer")
    d = copy.deepcopy(timed)
    d["extra"] = None
    refused(d, r"\$\.extra: not a field of Result")
    # what uffdkvm itself wrote is read: to_dict()'s derived value, and a
    # page server's counters as properties once were
    d = copy.deepcopy(timed)
    d["per_vcpu_rate"] = 1.0
    assert Result.from_json(json.dumps(d)).faults == timed["faults"]


def test_a_schema_from_the_future_or_of_no_kind(timed):
    refused({**timed, "schema": uffdkvm.io.serial.SCHEMA + 1}, "upgrade uffdkvm")
    refused({**timed, "schema": "4"}, r"\$\.schema: '4' is not a schema")
    refused({**timed, "schema": True}, r"\$\.schema")
    refused("null", "expected a JSON object")
    refused({k: v for k, v in timed.items() if k != "schema"} | {"vcpus": 5}, r"\$")


def test_hostile_values_in_an_old_schema_are_result_errors(timed):
    old = {**timed, "schema": 2}
    old["readers"] = [{"eexist": "many"}]
    refused(old, r"\$: not a Result of schema 2 \(TypeError")
    old = {**timed, "schema": 1, "fault_trace": {"read_ns": 5}}
    refused(old, r"\$: not a Result of schema 1")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damage_is_a_result_error_or_a_result(timed, data):
    """A value anywhere replaced with any JSON value, or the text cut
    anywhere: from_json returns a Result or raises ResultError, never
    anything else."""
    text = json.dumps(timed)
    cut = data.draw(st.integers(0, len(text) - 1))
    with pytest.raises(ResultError):
        Result.from_json(text[:cut])
    paths = []

    def walk(node, path):
        paths.append(path)
        items = node.items() if isinstance(node, dict) else \
            enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            walk(v, (*path, k))
    walk(timed, ())
    path = data.draw(st.sampled_from(paths[1:]))
    junk = data.draw(st.recursive(
        st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) |
        st.floats(allow_nan=False) | st.text(max_size=8) | st.sampled_from(["nan", "inf"]),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4),
                                                                     inner, max_size=3),
        max_leaves=6))
    try:
        Result.from_json(json.dumps(damaged(timed, path, junk)))
    except ResultError:
        pass


# ---- the invariants: each damage, and what the message names

def add(path, delta):
    def damage(d):
        at = d
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] += delta
    return damage


def setter(path, value):
    def damage(d):
        at = d
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value(at[path[-1]]) if callable(value) else value
    return damage


def both(*damages):
    def damage(d):
        for f in damages:
            f(d)
    return damage


def queue_alone(d):
    """vCPU 0's queue stage taken away from the others, or where the run has
    no stages (KVM moved the guest's TSC offset), given without them."""
    v = d["vcpus"][0]
    v["queue_latency"] = None if v["queue_latency"] else copy.deepcopy(v["service_latency"])


def one_more_service(d, v=0):
    """vCPU v's service histogram holds one fault more (a bucket and its count)."""
    h = d["vcpus"][v]["service_latency"]
    h["counts"][5] += 1
    h["count"] += 1


# (name, fixture, damage, the message) : each check of uffdkvm._invariants
BROKEN = [
    ("negative-count", "timed", setter(("faults",), -1), r"\$\.faults: -1 is outside 0"),
    ("negative-reader-count", "timed", setter(("readers", 1, "eexist"), -3),
     r"\$\.readers\[1\]\.eexist: -3 is outside 0"),
    ("negative-seconds", "timed", setter(("vcpus", 1, "seconds"), -0.5),
     r"\$\.vcpus\[1\]\.seconds: -0\.5 is negative"),
    ("trace-vcpu-below-minus-1", "timed", setter(("fault_trace", "vcpu", 0), -2),
     r"\$\.fault_trace\.vcpu\[0\]: -2 is outside -1"),
    ("faults-sum", "timed", add(("faults",), 1), r"\$\.faults: .*\$\.readers\[\*\]\.faults sum to"),
    ("eexist-sum", "timed", add(("eexist",), 1), r"\$\.eexist: .*sum to"),
    ("spurious-sum", "timed", add(("spurious_wakeups",), 1), r"\$\.spurious_wakeups: .*sum to"),
    ("wakes-sum", "timed", add(("wakes",), 1), r"\$\.wakes: .*sum to"),
    ("source-bytes-sum", "prefetched", add(("source_bytes",), 4096),
     r"\$\.source_bytes: .*pusher_source_bytes sum to"),
    ("source-seconds-sum", "prefetched", setter(("source_seconds",), lambda s: s * 2),
     r"\$\.source_seconds: .*sum to"),
    ("prefetch-eexist-below-readers", "prefetched",
     add(("readers", 0, "prefetch_eexist"), 5), r"\$\.prefetch_eexist: .*fewer than"),
    ("guest-accesses-sum", "timed", add(("guest_accesses",), 1),
     r"\$\.guest_accesses: .*\$\.vcpus\[\*\]\.pages sum to"),
    ("vcpus-count", "timed", setter(("vcpus",), lambda v: v[:1]),
     r"\$\.vcpus: 1 vCPUs, but config\.vcpus is 2"),
    ("vcpu-index", "timed", setter(("vcpus", 1, "index"), 0), r"\$\.vcpus\[1\]\.index: 0"),
    ("vcpu-passes", "timed", setter(("vcpus", 0, "pass_seconds"), lambda p: [*p, 0.1]),
     r"\$\.vcpus\[0\]\.pass_seconds: 2 passes, but config\.passes is 1"),
    ("run-passes", "timed", setter(("pass_seconds",), lambda p: [*p, 0.1]),
     r"\$\.pass_seconds: 2 passes"),
    ("vcpu-stages", "timed", add(("vcpus", 0, "faults"), 1),
     r"\$\.vcpus\[0\]\.service_latency\.count: its stages hold \d+ faults, but"),
    ("vcpu-stages-together", "timed", queue_alone,
     r"\$\.vcpus\[0\]: queue, resume and fault latencies are measured together"),
    ("vcpu-faults-over-run", "timed", both(add(("vcpus", 0, "faults"), 1), one_more_service),
     r"\$\.vcpus\[\*\]\.faults: \d+, more than \$\.faults"),
    ("vcpu-eexist-over-run", "timed",
     both(add(("vcpus", 0, "eexist"), 1), one_more_service),
     r"\$\.vcpus\[\*\]\.eexist: \d+, more than \$\.eexist"),
    ("histogram-count", "timed", add(("vcpus", 1, "service_latency", "count"), 1),
     r"\$\.vcpus\[1\]\.service_latency: counts: they add up to"),
    ("histogram-min-max", "timed", setter(("readers", 0, "service_latency", "min"), 1e12),
     r"\$\.readers\[0\]\.service_latency\.min: .* is above max"),
    ("reader-uffd", "timed", setter(("readers", 3, "uffd"), 7),
     r"\$\.readers\[3\]\.uffd: 7, but the run had \d uffds"),
    ("reader-spurious", "timed", setter(("readers", 0, "spurious_wakeups"),
                                        lambda s: 10 ** 9),
     r"\$\.readers\[0\]\.spurious_wakeups: 1000000000, more than its wakeups"),
    ("reader-reads", "timed", add(("readers", 0, "reads"), 1),
     r"\$\.readers\[0\]\.reads: .*read_sizes\[1:\] sum to"),
    ("reader-messages", "timed", both(add(("readers", 0, "reads"), 1),
                                      add(("readers", 0, "read_sizes", 1), 1)),
     r"\$\.readers\[0\]\.faults: .*the messages of"),
    ("reader-ioctls", "timed", add(("readers", 0, "copies"), 10 ** 6),
     r"\$\.readers\[0\]\.copies: .*more than faults \+ eexist"),
    ("verified-with-bad-pages", "timed", setter(("bad_pages",), 1),
     r"\$\.verified: true, with 1 bad pages"),
    ("unverified-without-message", "timed", setter(("verified",), False),
     r"\$\.verify_message: empty, but verified is false"),
    ("clock-message-beside-a-conversion", "timed",
     both(setter(("clock_sync",), "kvm_tsc_offset"), setter(("clock_error_ns",), 21.0),
          setter(("clock_sync_message",), "KVM's TSC offset of vCPU 0 moved")),
     r"\$\.clock_sync_message: set, but clock_sync is 'kvm_tsc_offset'"),
    ("clock-message-empty", "timed",
     both(setter(("clock_sync",), None), setter(("clock_error_ns",), None),
          setter(("clock_sync_message",), "")),
     r"\$\.clock_sync_message: empty; null where there is nothing to say"),
    ("clock-message-without-timing", "prefetched",
     setter(("clock_sync_message",), "KVM's TSC offset of vCPU 0 moved"),
     r"\$\.clock_sync_message: set, but the run asked for no clock conversion"),
    ("wasted-over-prefetched", "prefetched",
     setter(("wasted_prefetch_pages",), lambda w: 10 ** 6),
     r"\$\.wasted_prefetch_pages: 1000000, more than \$\.prefetched_pages"),
    ("prefetched-sum", "prefetched", add(("readers", 1, "prefetched"), 1),
     r"\$\.prefetched_pages: .*\$\.readers\[\*\]\.prefetched and \$\.pushed_pages sum to"),
    ("trace-columns", "timed", setter(("fault_trace", "gpa"), lambda g: g[:-1]),
     r"\$\.fault_trace: its columns differ in length"),
]


@pytest.mark.parametrize("name, fixture, damage, match", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_result_that_breaks_an_invariant_is_refused(request, name, fixture, damage, match):
    data = copy.deepcopy(request.getfixturevalue(fixture))
    assert Result.from_json(json.dumps(data))  # whole, it is read
    damage(data)
    refused(data, match)


def test_minus_one_is_a_trace_vcpu_of_no_known_vcpu(timed):
    d = copy.deepcopy(timed)
    d["fault_trace"]["vcpu"][0] = -1
    assert Result.from_json(json.dumps(d)).fault_trace.vcpu[0] == -1


def test_the_old_nan_and_infinity_in_the_config_are_still_read(kvm):
    r = uffdkvm.run(vcpus=1, mem_per_vcpu="64K", timeout_s=math.inf)
    text = r.to_json().replace('"timeout_s": "inf"', '"timeout_s": Infinity')
    assert Result.from_json(text).config.timeout_s == math.inf


# ---- what the core makes passes

@pytest.mark.parametrize("case", [c for c in soak.MATRIX if c.expect in ("verified", "unverified")],
                         ids=lambda c: c.name)
def test_every_mode_of_the_soak_matrix_makes_results_that_pass(kvm, case, tmp_path):
    snap = tmp_path / "snap"
    uffdkvm.make_snapshot(snap, 4 << 20)
    try:
        r = case.run(str(snap))
    except uffdkvm.HostUnsupportedError as e:  # the soak leaves these out, and lists them
        host_skip(facts_for_run(**case.fields), f"this host cannot: {e}")
    check_result(r)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Result.from_json(r.to_json()) == r
